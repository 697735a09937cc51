"""How big the rank programs of a scenario will be, counted without building them all.

:func:`ops_per_rank` counts the ops :mod:`sim.parallel.workload` gives its busiest rank,
exactly: per layer and micro-batch it reads the builder's own layer programs
(:mod:`.layer_program`: what the builder produces for one layer of each kind, MTP depths
included), and the rest (pipeline transfers, gradient buckets, parameter gathers, FSDP
reduce-scatters, the optimizer) from the builder run on each stage with the fewest
micro-batches its schedule takes. tests/test_work.py checks it equals the built programs'
count for every bundled scenario and for MTP, FP8 and MoE variants. :func:`simulated_ranks`
asks the workload's own folding rule (:func:`sim.parallel.workload.folding`). sim/work.py
turns both into the work estimate.

Run ``python bench/work.py`` to see estimates next to measured runs.
"""

import numpy as np

from ..collectives.kinds import ALL_TO_ALL
from . import layer_program, workload
from .layout import Layout
from ..input.choices import ExpertRouting
from ..input.load import topology_spec
from ..model import transformer as model_costs
from ..engine.kinds import Category


def simulated_ranks(s) -> int:
    """How many ranks the workload simulates: its own folding decision
    (:func:`workload.folding`: classes under stragglers and faults, sampled jitter) on the
    cluster's topology spec, before any graph or program is built. Expert loads count as
    uneven whenever the routing can make them so (:func:`uneven_routing`), without drawing
    them: an upper estimate where they come out even."""
    layout = Layout.from_parallel(s.parallel)
    return ranks_of(s, layout, topology_spec(s), uneven_routing(s, layout))


def ranks_of(s, layout: Layout, spec, uneven: bool) -> int:
    """The ranks the workload's folding rule simulates for ``layout`` of scenario ``s`` on the
    topology ``spec`` (what :func:`simulated_ranks` counts; the planner's cost predictor asks it
    per layout: sim/plan/cost.py ``folded_ranks``)."""
    domains = np.arange(layout.world) // spec.gpus_per_domain  # (as topology.fat_tree places GPUs)
    return int(workload.folding(s, layout, spec, domains, uneven).simulated.sum())


def uneven_routing(s, layout: Layout) -> bool:
    """Whether routing may load an expert group's ranks unevenly (balanced routing and
    buffers padded to capacity never do; expert choice draws even loads but is counted)."""
    moe = s.model.moe
    return moe is not None and layout.ep > 1 and not (moe.routing is ExpertRouting.UNIFORM and moe.skew == 0) \
        and not moe.padded


def micro_batches(s) -> int:
    """Micro-batches each data-parallel rank runs per step."""
    return s.training.global_batch // (s.parallel.dp * s.training.micro_batch)


def layers_per_rank(s) -> int:
    """Most layers one rank holds (all its virtual stages), the embedding, output and MTP
    pseudo layers included (:func:`layer_program.stage_layers`)."""
    return max(len(ids) for ids in layer_program.stage_layers(s))


def gpu_of(s) -> str:
    """The GPU the scenario runs on."""
    return s.cluster.gpu or topology_spec(s).gpu


def ops_per_stage(s) -> list[int]:
    """Ops of each pipeline stage's rank program, exactly: the builder's own program of that
    rank with the fewest micro-batches its schedule takes (:func:`layer_program.step_skeleton`:
    the per-step ops and those micro-batches), plus, for every further micro-batch, the ops
    of its layers' :class:`~.layer_program.LayerProgram` and its pipeline transfers."""
    gpu, d = gpu_of(s), model_costs.dims(s.model)
    programs, m = layer_program.counted(s, gpu), micro_batches(s)
    out = []
    for stage, ids in enumerate(layer_program.stage_layers(s)):
        built, m0, transfers = layer_program.step_skeleton(s, gpu, stage)
        per_micro_batch = sum(programs[layer_program.kind_of(d, l)].count for l in ids) + transfers
        out.append(built + (m - m0) * per_micro_batch)
    return out


def ops_per_rank(s) -> int:
    """Ops of the busiest rank's program (tests/test_work.py: equal to the built programs')."""
    return max(ops_per_stage(s))


def routed_scores(s) -> tuple[int, int]:
    """(elements of router scores drawn per step, most held at once): tokens x experts of
    one micro-batch of an expert group, as :func:`workload.expert_loads` routes them; token
    choice routes in chunks of 2^24 scores, the other policies the whole batch at once."""
    moe = s.model.moe
    if moe is None or (moe.routing is ExpertRouting.UNIFORM and moe.skew == 0):
        return 0, 0
    p, t = s.parallel, s.training
    elements = t.micro_batch * t.seq_len // p.cp * p.ep * moe.experts
    held = min(elements, max(1 << 24, moe.experts)) if moe.routing in (ExpertRouting.UNIFORM, ExpertRouting.TOKEN_CHOICE) \
        else elements
    return elements, held


def alltoalls(s) -> int:
    """All-to-alls per step of the rank holding the most MoE layers (MTP depths included):
    the expert-parallel collectives of its layer programs (:mod:`.layer_program`), each
    micro-batch (0 without experts or expert parallelism)."""
    if s.model.moe is None or s.parallel.ep == 1:
        return 0
    d, programs = model_costs.dims(s.model), layer_program.counted(s, gpu_of(s))
    per_stage = [sum(sum(1 for c in programs[layer_program.kind_of(d, l)].collectives(Category.EP) if c.op is ALL_TO_ALL)
                     for l in ids if model_costs.is_moe_layer(d, l))
                 for ids in layer_program.stage_layers(s)]
    return micro_batches(s) * max(per_stage)


def expert_kernels(s) -> int:
    """Kernels timed per step in the MoE layers (MTP depths included) of the rank holding
    the most: each compute op's kernel list is hashed by the compute-time memo, and an
    MoE layer's expert ops list several kernels per local expert (the layer programs'
    own kernel counts; an upper bound: :func:`layer_program.counting_loads`)."""
    if s.model.moe is None:
        return 0
    d, programs = model_costs.dims(s.model), layer_program.counted(s, gpu_of(s))
    per_stage = [sum(programs[layer_program.kind_of(d, l)].kernels for l in ids if model_costs.is_moe_layer(d, l))
                 for ids in layer_program.stage_layers(s)]
    return micro_batches(s) * max(per_stage)
