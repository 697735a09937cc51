"""Scenario -> rank programs. Reads top to bottom like torchtitan's ``parallelize_llama``:
a pipeline schedule drives forward/backward passes over each rank's layers
(:mod:`.passes`: each layer is compute wrapped by TP (and CP, EP) collectives; FSDP
gathers layers around it); with ``ep_comm_overlap`` a steady-state forward and backward
run as one step (:mod:`.ep_overlap`); DP or ZeRO reduce gradients in buckets; the
optimizer closes the step.

Folding: with no stragglers, jitter or faults, ranks at the same pipeline stage do
identical work, so only one per stage is simulated (all ep ranks of one expert group
when routing is uneven); the others' traffic is still put on the network (siblings).
"""

import numpy as np

from ..model import transformer as model_costs
from ..model.compute import ComputeModel
from ..hardware.gpus import gpu_preset
from ..model.layers import Shard
from . import dp, ep_overlap, pp, zero
from .layout import Layout
from .params import rank_params, stage_layer_ids
from .passes import Pass
from .program import Context, RankBuilder
from ..input.scenario import Scenario


def make_context(s: Scenario, domains: list[int], gpu_name: str, e_max: float | None = None,
                 jitter=None) -> Context:
    """Resolve everything the builders share."""
    p, t = s.parallel, s.training
    layout = Layout.from_parallel(p)
    d = model_costs.dims(s.model)
    shard = Shard(t.micro_batch * t.seq_len // p.cp, t.seq_len, t.micro_batch, p.tp, p.sequence_parallel,
                  t.flash_attention, t.precision == "fp8")
    ctx = Context(s, d, layout, shard, ComputeModel(gpu_preset(gpu_name), e_max), domains,
                  frozenset(), t.global_batch // (p.dp * t.micro_batch),
                  pp.split_layers(d.layers, p.pp * p.virtual_stages, p.stage_layers), jitter=jitter)
    ctx.expert_loads = expert_loads(s, d, shard, layout)
    ctx.simulated = simulated_ranks(s, layout, folded=jitter is None and can_fold(s),
                                    uneven=any(np.ptp(x) > 0 for x in ctx.expert_loads.values()))
    return ctx


def can_fold(s: Scenario) -> bool:
    """Folding is exact only while every rank of a stage does the same work."""
    return s.parallel.fold and not s.stragglers and s.jitter.sigma == 0 and not s.cluster.faults


def simulated_ranks(s: Scenario, layout: Layout, folded: bool, uneven: bool = False) -> frozenset[int]:
    """One rank per stage when folded (a whole expert group when the experts' loads are
    uneven: its ranks then do different work), else all."""
    if not folded:
        return frozenset(range(layout.world))
    reps = {layout.rank(tp=0, cp=0, dp=0, pp=st) for st in range(layout.sizes["pp"])}
    if uneven and layout.ep > 1:
        reps |= {r for rep in reps for r in layout.ep_group(rep)}
    return frozenset(reps)


def expert_loads(s: Scenario, d, shard: Shard, layout: Layout) -> dict[int, np.ndarray]:
    """Tokens per expert for every MoE layer, from the routing policy (seeded)."""
    moe = s.model.moe
    if moe is None:
        return {}
    tokens = layout.moe_tokens(shard.tokens) * layout.ep
    from ..model.routing import capacity, expert_loads as route

    if moe.routing == "uniform" and moe.skew == 0:
        base = np.full(d.experts, tokens * d.top_k / d.experts)
    elif moe.padded:  # every expert computes and exchanges exactly its capacity
        base = np.full(d.experts, float(capacity(tokens, d.experts, d.top_k, moe.capacity_factor)))
    else:
        policy = "token_choice" if moe.routing == "uniform" else moe.routing
        base = np.asarray(route(policy, tokens, d.experts, d.top_k, moe.capacity_factor, s.seed, moe.skew), float)
    rng = np.random.default_rng(s.seed)
    return {layer: np.roll(base, int(rng.integers(d.experts)))  # hot experts move between layers
            for layer in range(d.layers) if model_costs.is_moe_layer(d, layer)}


def build_programs(ctx: Context) -> list:
    """The program of every simulated rank."""
    return [build_rank(ctx, r).program for r in sorted(ctx.simulated)]


def build_rank(ctx: Context, rank: int) -> RankBuilder:
    """One rank's step: pipeline schedule, gradient sync, optimizer."""
    b = RankBuilder(ctx, rank)
    par = ctx.scenario.parallel
    p, v = ctx.layout.sizes["pp"], par.virtual_stages
    chunks = {c: stage_layer_ids(ctx, c * p + b.stage) for c in range(v)}
    param_waits = zero.gather_params(b, [l for c in range(v) for l in chunks[c]]) if zero.enabled(b) else {}
    sync_cls = zero.ShardedGradSync if zero.enabled(b) else dp.GradSync
    syncs = {c: sync_cls(b) for c in range(v)} if par.zero < 3 else {}
    final = []
    for step in pp.steps(par.schedule, p, v, ctx.micro_batches, b.stage, par.ep_comm_overlap):
        passes = [open_pass(b, chunks, syncs, param_waits, item) for item in step]
        if len(passes) == 2:
            ep_overlap.interleave(*passes)
        else:
            passes[0].run()
        for ps, (direction, mb, chunk) in zip(passes, step):
            final += close_pass(b, ps, chunk * p + b.stage)
    final += [op for s in syncs.values() for op in s.issued]
    optimizer_step(b, final)
    return b


def open_pass(b, chunks: dict, syncs: dict, param_waits: dict, item: tuple) -> Pass:
    """Receive a chunk's input (activations or gradients) and set up its pass."""
    direction, mb, chunk = item
    p = b.ctx.layout.sizes["pp"]
    vs, last_vs = chunk * p + b.stage, len(b.ctx.stage_layers) - 1
    if direction == "F":
        deps = pp.transfer(b, "F", mb, vs - 1, vs, (), sending=False) if vs > 0 else ()
        return Pass(b, chunks[chunk], mb, deps, "F", param_waits=param_waits)
    deps = pp.transfer(b, "B", mb, vs + 1, vs, (), sending=False) if vs < last_vs else ()
    last = mb == b.ctx.micro_batches - 1
    return Pass(b, chunks[chunk], mb, deps, "B", sync=syncs.get(chunk) if last else None, last_mb=last)


def close_pass(b, ps: Pass, vs: int) -> list[int]:
    """Send a chunk's output on; returns the FSDP reduce-scatters the optimizer waits for."""
    if ps.direction == "F":
        if vs < len(b.ctx.stage_layers) - 1:
            pp.transfer(b, "F", ps.mb, vs, vs + 1, ps.x, sending=True)
        return []
    ps.finish()
    if vs > 0:
        pp.transfer(b, "B", ps.mb, vs, vs - 1, ps.x, sending=True)
    return ps.rs_ops


def optimizer_step(b, deps: list[int]) -> int:
    """Adam on this rank's parameter shard, after every gradient reduction."""
    from ..model.layers import optimizer

    dense, expert = rank_params(b.ctx, b.stage)
    fp8_weights = dense + expert if b.ctx.shard.fp8 else 0.0  # TE casts the full local weights
    if b.ctx.scenario.parallel.zero >= 1:
        dense /= len(b.ctx.layout.group(b.rank, "cp", "dp"))
        expert /= len(b.ctx.layout.expert_dp_group(b.rank))
    return b.compute("optimizer", optimizer(dense + expert, fp8_weights), tuple(deps))
