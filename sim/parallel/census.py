"""How big the rank programs of a scenario will be, counted without building them.

:func:`ops_per_rank` counts the ops :mod:`sim.parallel.workload` gives its busiest rank,
from the scenario alone, op by op as the builders add them (per layer and micro-batch:
tp.py's collectives, layers.py's compute, cp.py's ring steps, ep.py's all-to-alls,
fsdp.py's gathers; per micro-batch pp.py's sends and receives; per step dp.py's or
zero.py's buckets). It is an upper estimate (every layer of the busiest rank is counted
with the embedding and output pseudo layers as full layers, every bucket as a layer):
tests/test_work.py checks it against built programs. :func:`simulated_ranks` asks the
workload's own folding rule (:func:`sim.parallel.workload.folding`). sim/work.py turns
both into the work estimate.

Run ``python bench/work.py`` to see estimates next to measured runs.
"""

import numpy as np

from . import workload
from .layout import Layout
from .pp import virtual_stages_of
from ..input.load import topology_spec


def simulated_ranks(s) -> int:
    """How many ranks the workload simulates: its own folding decision
    (:func:`workload.folding`: classes under stragglers and faults, sampled jitter) on the
    cluster's topology spec, before any graph or program is built. Expert loads count as
    uneven whenever the routing can make them so (:func:`uneven_routing`), without drawing
    them: an upper estimate where they come out even."""
    layout = Layout.from_parallel(s.parallel)
    spec = topology_spec(s)
    domains = np.arange(layout.world) // spec.gpus_per_domain  # (as topology.fat_tree places GPUs)
    return int(workload.folding(s, layout, spec, domains, uneven_routing(s, layout)).simulated.sum())


def uneven_routing(s, layout: Layout) -> bool:
    """Whether routing may load an expert group's ranks unevenly (balanced routing and
    buffers padded to capacity never do; expert choice draws even loads but is counted)."""
    moe = s.model.moe
    return moe is not None and layout.ep > 1 and not (moe.routing == "uniform" and moe.skew == 0) and not moe.padded


def micro_batches(s) -> int:
    """Micro-batches each data-parallel rank runs per step."""
    return s.training.global_batch // (s.parallel.dp * s.training.micro_batch)


def layers_per_rank(s) -> int:
    """Most transformer layers one rank holds (all its virtual stages), plus the embedding
    and output pseudo layers."""
    p = s.parallel
    counts = p.stage_layers or _even(s.model.layers, p.pp * p.virtual_stages)
    return max(sum(counts[vs] for vs in virtual_stages_of(p.schedule, p.pp, p.virtual_stages, st))
               for st in range(p.pp)) + 2


def _even(layers: int, chunks: int) -> list[int]:
    return [-(-layers // chunks)] * chunks  # the largest chunk, for every chunk


def ops_per_layer(s) -> int:
    """Ops one layer adds per micro-batch, forward and backward."""
    p, t, moe = s.parallel, s.training, s.model.moe
    tp, sp = p.tp > 1, p.tp > 1 and p.sequence_parallel
    attention = 1 if p.cp == 1 else 2 * p.cp - 1  # ring attention: cp chunks, cp-1 K/V shifts
    mlp = 1 if moe is None else 2 + (2 if p.ep > 1 else 0)  # router, experts, dispatch, combine
    fsdp = 1 if p.zero == 3 and p.dp * p.cp > 1 else 0  # the layer's all-gather
    # tp_overlap.py: a ring gather is tp GEMM chunks and tp - 1 sends, a pipelined
    # reduce-scatter RS_SPLITS (4) chunks and as many reductions
    chunks = max(p.tp, 4) if p.tp_comm_overlap else 1  # (with the backward factor 3, an upper estimate)
    forward = 2 + attention + mlp + (2 * tp + 2 * sp) * chunks + fsdp  # attn_pre, attn_post, TP collectives
    # tp.split_backward: each TP sublayer's backward splits into the GEMMs beside the input
    # gather and those beside the gradient's reduction (dgrad / wgrad), with one more gather
    backward = (3 if tp else 1) * forward + (attention if t.recompute == "selective" else 0)
    backward += forward if t.recompute == "full" else 0
    return forward + backward


def ops_per_rank(s) -> int:
    """Upper estimate of the ops of the busiest rank's program."""
    p = s.parallel
    layers, m = layers_per_rank(s), micro_batches(s)
    per_micro_batch = layers * ops_per_layer(s) + 4 * p.virtual_stages  # + pipeline sends and receives
    per_step = layers * 4 + 1  # gradient buckets (dense, expert), ZeRO gathers or FSDP reduce-scatters; optimizer
    return m * per_micro_batch + per_step


def routed_scores(s) -> tuple[int, int]:
    """(elements of router scores drawn per step, most held at once): tokens x experts of
    one micro-batch of an expert group, as :func:`workload.expert_loads` routes them; token
    choice routes in chunks of 2^24 scores, the other policies the whole batch at once."""
    moe = s.model.moe
    if moe is None or (moe.routing == "uniform" and moe.skew == 0):
        return 0, 0
    p, t = s.parallel, s.training
    elements = t.micro_batch * t.seq_len // p.cp * p.ep * moe.experts
    held = min(elements, max(1 << 24, moe.experts)) if moe.routing in ("uniform", "token_choice") else elements
    return elements, held


def expert_kernels(s) -> int:
    """Expert GEMM kernels timed per step on the busiest rank: every expert compute op
    (forward, backward, recompute) lists three kernels per local expert."""
    moe = s.model.moe
    if moe is None:
        return 0
    p, t = s.parallel, s.training
    moe_layers = min(layers_per_rank(s) - 2, s.model.layers - moe.dense_layers)
    passes = 2 + (t.recompute == "full")
    return micro_batches(s) * moe_layers * passes * 3 * (moe.experts // p.ep + moe.shared_experts)
