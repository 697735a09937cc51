"""Scenario -> rank programs. Reads top to bottom like torchtitan's ``parallelize_llama``:
a pipeline schedule drives forward/backward passes over each rank's layers
(:mod:`.passes`: each layer is compute wrapped by TP (and CP, EP) collectives; FSDP
gathers layers around it); with ``ep_comm_overlap`` a steady-state forward and backward
run as one step (:mod:`.ep_overlap`); DP or ZeRO reduce gradients in buckets; the
per-step costs (:mod:`.step_end`: gradient buffer zeroed, gradient-norm clipping, the
optimizer, the loss all-reduce) open and close the step.

Folding: ranks whose timelines are provably identical (same stage, same compute scale,
same link conditions, interchangeable peers in every group) are simulated once; the
others' traffic is still put on the network (siblings). :mod:`sim.parallel.folding`
says which ranks those are under stragglers, faults and skewed experts.
"""

from functools import partial

import numpy as np

from ..engine.kinds import Category, Phase
from ..model import transformer as model_costs
from ..model.compute import ComputeModel, quantized
from ..model import host
from ..hardware.gpus import gpu_preset
from ..hardware.specs import FatTreeSpec
from ..hardware.variability import step_slowdown
from ..model.layers import Shard
from . import amax, copies, dp, ep_overlap, jitter, pp, replay, step_end, wgrad_deferral, zero
from .folding import Folding, fold, unfolded
from .layout import Layout
from .params import moe_block_ids, stage_layer_ids
from .passes import Pass, weight_pass
from .pp_zero_bubble import Kind
from .program import Context, RankBuilder
from ..input.choices import ExpertRouting, JitterMode, Kernels, MlaDownProj, Precision, Schedule
from ..input.scenario import Scenario


def shard_of(s: Scenario) -> Shard:
    """What one rank holds of one micro-batch, and how its kernels run."""
    p, t = s.parallel, s.training
    return Shard(t.micro_batch * t.seq_len // p.cp, t.seq_len, t.micro_batch, p.tp, p.sequence_parallel,
                 t.flash_attention, quantized(t.precision), t.precision if quantized(t.precision) else Precision.FP8,
                 recipe=t.fp8_recipe, eager=t.kernels is Kernels.PYTORCH and not t.compile,
                 fused_permute=p.moe_permute_fusion, rope_fused=t.rope_fusion,
                 grouped_gemm=p.moe_grouped_gemm, mla_column=p.mla_down_proj is MlaDownProj.COLUMN and p.tp > 1,
                 main_grad=dp.grad_bytes(p) if p.gradient_accumulation_fusion is not False and p.zero < 3 else 0)


def make_context(s: Scenario, domains: list[int], gpu_name: str, e_max: float | None = None,
                 fabric: FatTreeSpec | None = None) -> Context:
    """Resolve everything the builders share. ``fabric``: the cluster's topology spec
    (servers, scalable units: what straggling nodes and NIC faults reach; default: the
    spec's defaults with the scenario's ``cluster.gpus_per_node``)."""
    p, t = s.parallel, s.training
    layout = Layout.from_parallel(p)
    d = model_costs.dims(s.model)
    shard = shard_of(s)
    loads = expert_loads(s, d, shard, layout)
    fabric = fabric or FatTreeSpec("default", gpus_per_node=s.cluster.gpus_per_node or 8)
    uneven = layout.ep > 1 and any(np.ptp(x) > 0 for x in loads.values())
    folded_by = domains if len(domains) >= layout.world else np.arange(layout.world) // fabric.gpus_per_domain
    found = folding(s, layout, fabric, folded_by, uneven)  # (callers that only account memory pass no domains)
    compute = compute_model(s, gpu_name, e_max, layout.world)
    return Context(s, d, layout, shard, compute, domains, frozenset(np.flatnonzero(found.simulated).tolist()),
                   t.global_batch // (p.dp * t.micro_batch),
                   pp.split_layers(d.layers, p.pp * p.virtual_stages, p.stage_layers), loads, found)


def compute_model(s: Scenario, gpu_name: str, e_max: float | None, world: int) -> ComputeModel:
    """The kernel timer of a scenario's ranks (one definition: the builders' and the layer
    programs'): the GPU, its calibration, the attention backend, the precision, and the slowest
    of the job's ``world`` GPUs under ``variability`` (sim/hardware/variability.py)."""
    t = s.training
    return ComputeModel(gpu_preset(gpu_name), e_max, attention=t.attention_backend, calibration=s.cluster.calibration,
                        precision=t.precision, slowdown=step_slowdown(s, world))


def can_fold(s: Scenario, fabric: FatTreeSpec) -> bool:
    """Folding applies unless switched off or every rank draws its own jitter (stragglers,
    faults and skewed experts only split the classes: :mod:`sim.parallel.folding`), or a
    perturbed step runs on a fabric other than a non-blocking rail-optimised fat tree: an
    oversubscribed one, where a late or slowed flow changes what its leaf's other flows
    get, or a rail-only or multi-plane one, whose routes the link labels do not describe
    (folding's exactness argument needs the first)."""
    perturbed = bool(s.stragglers or s.cluster.faults)
    return s.parallel.fold and s.jitter.sigma == 0 and (fabric.non_blocking_rails or not perturbed)


def folding(s: Scenario, layout: Layout, fabric: FatTreeSpec, domains, uneven: bool) -> Folding:
    """Which ranks are simulated and whose timeline each rank shares: classes under the
    perturbations (:func:`sim.parallel.folding.fold`), the sampled jitter mode
    (:func:`sim.parallel.jitter.sampled`), or every rank on its own. ``uneven``: the
    experts' loads differ, so expert-group positions build different programs."""
    domains = np.asarray(domains)
    key, rest = s.model_dump_json(), (fabric, uneven, layout, domains.tobytes())
    kept = _FOLDINGS.get(key)
    if kept is not None and kept[0] == rest:
        return kept[1]  # (the work census of sim.work asked first, for an equal scenario)
    found = None
    if s.jitter.sigma > 0 and s.parallel.fold and jitter.mode(s, layout.world) is JitterMode.SAMPLED:
        found = jitter.sampled(s, layout, fabric, domains, uneven)  # None: too few replicas to sample
    elif can_fold(s, fabric):
        found = fold(s, layout, fabric, domains, uneven)
    found = found or unfolded(layout, uneven)
    if len(_FOLDINGS) >= 4:
        _FOLDINGS.pop(next(iter(_FOLDINGS)))
    _FOLDINGS[key] = (rest, found)
    return found


_FOLDINGS: dict[str, tuple] = {}  # the last 4 foldings, by the scenario's content: a run reuses its census's


def expert_loads(s: Scenario, d, shard: Shard, layout: Layout) -> dict[int, np.ndarray]:
    """Tokens per expert for every MoE layer, from the routing policy (seeded)."""
    moe = s.model.moe
    if moe is None:
        return {}
    tokens = layout.moe_tokens(shard.tokens) * layout.ep
    from ..model.routing import capacity, expert_loads as route

    if moe.routing is ExpertRouting.UNIFORM and moe.skew == 0:
        base = np.full(d.experts, tokens * d.top_k / d.experts)
    elif moe.padded:  # every expert computes and exchanges exactly its capacity
        base = np.full(d.experts, float(capacity(tokens, d.experts, d.top_k, moe.capacity_factor)))
    else:
        policy = ExpertRouting.TOKEN_CHOICE if moe.routing is ExpertRouting.UNIFORM else moe.routing
        base = np.asarray(route(policy, tokens, d.experts, d.top_k, moe.capacity_factor, s.seed, moe.skew), float)
    rng = np.random.default_rng(s.seed)
    return {layer: np.roll(base, int(rng.integers(d.experts)))  # hot experts move between layers
            for layer in moe_block_ids(d)}


def build_programs(ctx: Context) -> list:
    """The program of every simulated rank: one built per stage (and expert position), the
    other ranks' copies of it with their own groups and jitter (:mod:`sim.parallel.copies`)."""
    return copies.programs(ctx, lambda r: build_rank(ctx, r))


def build_rank(ctx: Context, rank: int) -> RankBuilder:
    """One rank's step: pipeline schedule, gradient sync, optimizer."""
    b = RankBuilder(ctx, rank)
    par = ctx.scenario.parallel
    p, v = ctx.layout.sizes[Category.PP], par.virtual_stages
    vstages = pp.virtual_stages_of(par.schedule, p, v, b.stage)
    chunks = {c: stage_layer_ids(ctx, vs) for c, vs in enumerate(vstages)}
    step_end.start(b)  # (the gradient buffer's memset)
    with b.phase_of(Phase.OPTIMIZER):  # (ZeRO: the gather of the last update's parameters, overlapped)
        param_waits = zero.gather_params(b, chunks) if zero.enabled(b) and zero.overlapped(b) else {}
    sync_cls = zero.ShardedGradSync if zero.enabled(b) else dp.GradSync
    syncs = {c: sync_cls(b, c) for c in chunks} if par.zero < 3 else {}
    steps = pp.steps(par.schedule, p, v, ctx.micro_batches, b.stage, par.ep_comm_overlap, pp.pass_costs(ctx))
    last = {chunk: mb for step in steps for kind, mb, chunk in step if kind is not Kind.F}  # each chunk's last backward
    final, deferred, chunk_end = [], {}, {}
    memo = replay.StepMemo(b) if replay.ENABLED else None
    for step in steps:
        if step[0][0] is Kind.W:
            b.host(host.SCHEDULE_PASS_S)
            with b.phase_of(Phase.BACKWARD):  # (a zero-bubble W: the weight-gradient half of a backward)
                chunk_end[step[0][2]] = weight_pass(deferred.pop(step[0][1:]))
            continue
        run = partial(run_step, b, chunks, vstages, syncs, param_waits, step, last, deferred)
        replayed = memo is not None and steady(step, last) and not wgrad_deferral.in_step(b, chunks, step)
        added, xs = memo.run(step, run) if replayed else run()
        final += added
        for (kind, _mb, chunk), x in zip(step, xs):
            if kind is not Kind.F:
                chunk_end[chunk] = x
    drained = wgrad_deferral.drain(b, tuple(chunk_end.values()))  # (the optimizer waits for it; overlapped buckets not)
    final += [drained] if drained is not None else []
    with b.phase_of(Phase.BACKWARD):  # overlap_grad_reduce = false: every bucket after the whole backward
        for sync in syncs.values():
            sync.after_backward(tuple(chunk_end.values()) + ((drained,) if drained is not None else ()))
    final += [op for s in syncs.values() for op in s.issued]
    with b.phase_of(Phase.BACKWARD):  # tied embeddings on a pipeline: the first and last stages' copies
        tied = dp.embedding_grad_sync(b, tuple(final) or tuple(chunk_end.values()))
    final += [tied] if tied is not None else []
    if par.schedule is Schedule.DUALPIPE:  # the two copies of each stage add their gradients (both ranks in stage order)
        with b.phase_of(Phase.BACKWARD):
            final += [dp.copy_grad_sync(b, vs, tuple(syncs[c].issued) if c in syncs and syncs[c].issued
                                        else chunk_end[c]) for c, vs in sorted(enumerate(vstages), key=lambda x: x[1])]
    update = step_end.finish(b, final)
    if zero.enabled(b) and not zero.overlapped(b):
        with b.phase_of(Phase.OPTIMIZER):  # overlap_param_gather = false: gathered before the step returns
            zero.gather_params(b, chunks, update)
    return b


def steady(step: tuple, last: dict) -> bool:
    """Whether a step builds the same ops as the other steps of its shape but for their
    micro-batch (:mod:`.replay`): forwards and backwards, but not a chunk's last backward
    (its gradient buckets) or a zero-bubble input-gradient pass (its W pass comes later)."""
    return all(kind is Kind.F or (kind is Kind.B and mb != last[chunk]) for kind, mb, chunk in step)


def run_step(b, chunks: dict, vstages: list, syncs: dict, param_waits: dict, step: tuple, last: dict,
             deferred: dict) -> tuple[list[int], list]:
    """One step of the schedule (a pass, or a combined forward/backward pair): the ops the
    optimizer waits for, and each pass's last op."""
    passes = [open_pass(b, chunks, vstages, syncs, param_waits, item, last) for item in step]
    if len(passes) == 2:
        ep_overlap.interleave(*passes)
    else:
        passes[0].run()
    final = []
    for ps, (kind, mb, chunk) in zip(passes, step):
        with b.phase_of(ps.phase):
            final += close_pass(b, ps, vstages[chunk], chunk)
        if kind is Kind.I:
            deferred[mb, chunk] = ps
    return final, [ps.x for ps in passes]


def open_pass(b, chunks: dict, vstages: list, syncs: dict, param_waits: dict, item: tuple, last: dict) -> Pass:
    """Receive a chunk's input (activations or gradients) and set up its pass (kind I: a
    backward whose weight gradients wait for a W item)."""
    b.host(host.SCHEDULE_PASS_S)  # the schedule loop's work for this pass
    with b.phase_of(Phase.FORWARD if item[0] is Kind.F else Phase.BACKWARD):
        return _open_pass(b, chunks, vstages, syncs, param_waits, item, last)


def _open_pass(b, chunks: dict, vstages: list, syncs: dict, param_waits: dict, item: tuple, last: dict) -> Pass:
    kind, mb, chunk = item
    vs, last_vs = vstages[chunk], len(b.ctx.stage_layers) - 1
    if kind is Kind.F:
        receives = pp.neighbours(Kind.F, vs, last_vs)[0]
        deps = pp.transfer(b, Kind.F, mb, vs - 1, vs, (), sending=False, chunk=chunk) if receives else ()
        return Pass(b, chunks[chunk], mb, deps, Kind.F, param_waits=param_waits)
    receives = pp.neighbours(Kind.B, vs, last_vs)[0]
    deps = pp.transfer(b, Kind.B, mb, vs + 1, vs, (), sending=False, chunk=chunk) if receives else ()
    final = mb == last[chunk]
    return Pass(b, chunks[chunk], mb, deps, Kind.B, sync=syncs.get(chunk) if final else None, last_mb=final,
                defer=kind is Kind.I)


def close_pass(b, ps: Pass, vs: int, chunk: int = 0) -> list[int]:
    """Close a chunk's FP8 autocast region (its amax reduction, :mod:`.amax`), send its output
    on; returns the FSDP reduce-scatters the optimizer waits for."""
    sends = pp.neighbours(ps.direction, vs, len(b.ctx.stage_layers) - 1)[1]
    if ps.direction is Kind.F:
        amax.reduce(b, ps, chunk)
        if sends:
            pp.transfer(b, Kind.F, ps.mb, vs, vs + 1, ps.x, sending=True, chunk=chunk)
        return []
    amax.reduce(b, ps, chunk)  # (in the backward of the region's first FP8 module: before the last bucket)
    ps.finish()
    if sends:
        pp.transfer(b, Kind.B, ps.mb, vs, vs - 1, ps.x, sending=True, chunk=chunk)
    return ps.rs_ops
