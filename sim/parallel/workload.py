"""Scenario -> rank programs. Reads top to bottom like torchtitan's ``parallelize_llama``:
a pipeline schedule drives forward/backward passes over each rank's layers; each layer
is compute wrapped by TP (and CP, EP) collectives; FSDP gathers layers around it; DP or
ZeRO reduce gradients in buckets; the optimizer closes the step.

Folding: ranks whose timelines are provably identical (same stage, same compute scale,
same link conditions, interchangeable peers in every group) are simulated once; the
others' traffic is still put on the network (siblings). :mod:`sim.parallel.folding`
says which ranks those are under stragglers, faults and skewed experts.
"""

import numpy as np

from ..model import transformer as model_costs
from ..model.compute import ComputeModel
from ..hardware.gpus import gpu_preset
from ..hardware.topology import FatTreeSpec
from ..model.layers import Shard, attention_post, attention_pre, backward, embedding, logits, mlp_block
from . import cp, dp, ep, fsdp, pp, tp, zero
from .layout import Layout
from .params import EMBEDDING, rank_params, stage_layer_ids
from . import copies, jitter
from .folding import fold, unfolded
from .program import Context, RankBuilder
from ..input.scenario import Scenario


def make_context(s: Scenario, domains: list[int], gpu_name: str, e_max: float | None = None,
                 fabric: FatTreeSpec | None = None) -> Context:
    """Resolve everything the builders share. ``fabric``: the cluster's topology spec
    (servers, scalable units: what straggling nodes and NIC faults reach; default: the
    spec's defaults with the scenario's ``cluster.gpus_per_node``)."""
    p, t = s.parallel, s.training
    layout = Layout.from_parallel(p)
    d = model_costs.dims(s.model)
    shard = Shard(t.micro_batch * t.seq_len // p.cp, t.seq_len, t.micro_batch, p.tp, p.sequence_parallel,
                  t.flash_attention)
    ctx = Context(s, d, layout, shard, ComputeModel(gpu_preset(gpu_name), e_max), domains,
                  frozenset(), t.global_batch // (p.dp * t.micro_batch),
                  pp.split_layers(d.layers, p.pp * p.virtual_stages, p.stage_layers))
    ctx.expert_loads = expert_loads(s, d, shard, layout)
    fabric = fabric or FatTreeSpec("default", gpus_per_node=s.cluster.gpus_per_node or 8)
    uneven = uneven_experts(s, layout)
    folding = None
    if s.jitter.sigma > 0 and s.parallel.fold and jitter.mode(s, layout.world) == "sampled":
        folding = jitter.sampled(s, layout, fabric, domains, uneven)  # None: too few replicas to sample
    elif can_fold(s, fabric):
        folding = fold(s, layout, fabric, domains, uneven)
    ctx.folding = folding or unfolded(layout, uneven)
    ctx.simulated = frozenset(np.flatnonzero(ctx.folding.simulated).tolist())
    return ctx


def can_fold(s: Scenario, fabric: FatTreeSpec) -> bool:
    """Folding applies unless switched off or every rank draws its own jitter (stragglers,
    faults and skewed experts only split the classes: :mod:`sim.parallel.folding`), or a
    perturbed step runs on an oversubscribed fabric, where a late or slowed flow changes
    what its leaf's other flows get (folding's exactness argument needs a non-blocking tree)."""
    perturbed = bool(s.stragglers or s.cluster.faults)
    return s.parallel.fold and s.jitter.sigma == 0 and not (perturbed and fabric.oversubscription > 1)


def uneven_experts(s: Scenario, layout: Layout) -> bool:
    """Whether routing loads experts unevenly, so ranks of an expert group differ."""
    moe = s.model.moe
    return moe is not None and layout.ep > 1 and (moe.routing != "uniform" or moe.skew > 0)


def expert_loads(s: Scenario, d, shard: Shard, layout: Layout) -> dict[int, np.ndarray]:
    """Tokens per expert for every MoE layer, from the routing policy (seeded)."""
    moe = s.model.moe
    if moe is None:
        return {}
    tokens = shard.tokens * layout.ep
    if moe.routing == "uniform" and moe.skew == 0:
        base = np.full(d.experts, tokens * d.top_k / d.experts)
    else:
        from ..model.routing import expert_loads as route

        policy = "token_choice" if moe.routing == "uniform" else moe.routing
        base = np.asarray(route(policy, tokens, d.experts, d.top_k, moe.capacity_factor, s.seed, moe.skew), float)
    rng = np.random.default_rng(s.seed)
    return {layer: np.roll(base, int(rng.integers(d.experts)))  # hot experts move between layers
            for layer in range(d.layers) if model_costs.is_moe_layer(d, layer)}


def build_programs(ctx: Context) -> list:
    """The program of every simulated rank: one built per stage (and expert position), the
    other ranks' copies of it with their own groups and jitter (:mod:`sim.parallel.copies`)."""
    return copies.programs(ctx, lambda r: build_rank(ctx, r).program)


def build_rank(ctx: Context, rank: int) -> RankBuilder:
    """One rank's step: pipeline schedule, gradient sync, optimizer."""
    b = RankBuilder(ctx, rank)
    p, v = ctx.layout.sizes["pp"], ctx.scenario.parallel.virtual_stages
    chunks = {c: stage_layer_ids(ctx, c * p + b.stage) for c in range(v)}
    param_waits = zero.gather_params(b, [l for c in range(v) for l in chunks[c]]) if zero.enabled(b) else {}
    sync_cls = zero.ShardedGradSync if zero.enabled(b) else dp.GradSync
    syncs = {c: sync_cls(b) for c in range(v)} if ctx.scenario.parallel.zero < 3 else {}
    last_vs, final = p * v - 1, []
    for direction, mb, chunk in pp.order(ctx.scenario.parallel.schedule, p, v, ctx.micro_batches, b.stage):
        vs = chunk * p + b.stage
        if direction == "F":
            deps = pp.transfer(b, "F", mb, vs - 1, vs, (), sending=False) if vs > 0 else ()
            out = forward_pass(b, chunks[chunk], mb, deps, param_waits)
            if vs < last_vs:
                pp.transfer(b, "F", mb, vs, vs + 1, out, sending=True)
        else:
            deps = pp.transfer(b, "B", mb, vs + 1, vs, (), sending=False) if vs < last_vs else ()
            last = mb == ctx.micro_batches - 1
            out, rs_ops = backward_pass(b, chunks[chunk], mb, deps, syncs.get(chunk) if last else None, last)
            final += rs_ops
            if vs > 0:
                pp.transfer(b, "B", mb, vs, vs - 1, out, sending=True)
    final += [op for s in syncs.values() for op in s.issued]
    optimizer_step(b, final)
    return b


def forward_pass(b, layer_ids: list[int], mb: int, deps, param_waits: dict) -> int:
    """Forward of one chunk for one micro-batch, FSDP-gathering layers ahead."""
    gather = fsdp.Gatherer(b, layer_ids, mb, "fwd")
    x = deps
    for layer in layer_ids:
        x = layer_forward(b, layer, mb, (x, gather.before(layer), param_waits.get(layer)))
        gather.after(layer, x)
    return x


def backward_pass(b, layer_ids: list[int], mb: int, deps, sync, last_mb: bool) -> tuple[int, list[int]]:
    """Backward of one chunk (recomputing the forward first under full recompute)."""
    order = layer_ids[::-1]
    gather = fsdp.Gatherer(b, order, mb, "bwd")
    x, rs_ops = deps, []
    for layer in order:
        x = (x, gather.before(layer))
        if b.ctx.scenario.training.recompute == "full" and EMBEDDING < layer < b.ctx.dims.layers:
            x = layer_forward(b, layer, mb, x, recompute=True)
        x = layer_backward(b, layer, mb, x)
        gather.after(layer, x)
        if last_mb:
            rs = fsdp.reduce_scatter(b, layer, mb, x)
            rs_ops += [rs] if rs is not None else []
        if sync is not None:
            sync.add(layer, x)
    if sync is not None:
        sync.flush(x)
    return x, rs_ops


def layer_forward(b, layer: int, mb: int, deps, recompute: bool = False) -> int:
    """Embedding, output layer, or a transformer layer: attention then MLP."""
    d, sh, tag = b.ctx.dims, b.ctx.shard, "recompute" if recompute else "fwd"
    if layer == EMBEDDING:
        x = b.compute("embedding_fwd", embedding(d, sh), deps, layer, mb)
        return tp.exit(b, "embed", layer, mb, x)
    if layer == d.layers:
        x = tp.enter(b, "logits", layer, mb, deps, tag=(tag,))
        return b.compute(f"logits_{tag}", logits(d, sh), x, layer, mb)
    x = tp.enter(b, "attn", layer, mb, deps, tag=(tag,))
    x = b.compute(f"attn_pre_{tag}", attention_pre(d, sh), x, layer, mb)
    x = cp.attention(b, layer, mb, x, "fwd", "" if tag == "fwd" else "_recompute")
    x = b.compute(f"attn_post_{tag}", attention_post(d, sh), x, layer, mb)
    x = tp.exit(b, "attn", layer, mb, x, tag=(tag,))
    x = tp.enter(b, "mlp", layer, mb, x, tag=(tag,))
    if model_costs.is_moe_layer(d, layer):
        x = ep.moe_mlp(b, layer, mb, x, "fwd", "" if tag == "fwd" else "_recompute")
    else:
        x = b.compute(f"mlp_{tag}", mlp_block(d, sh), x, layer, mb)
    return tp.exit(b, "mlp", layer, mb, x, tag=(tag,))


def layer_backward(b, layer: int, mb: int, deps) -> int:
    """Backward of one layer, mirror image of :func:`layer_forward`."""
    d, sh = b.ctx.dims, b.ctx.shard
    if layer == EMBEDDING:
        x = tp.enter_backward(b, "embed", layer, mb, deps)
        return b.compute("embedding_bwd", backward(embedding(d, sh)), x, layer, mb)
    if layer == d.layers:
        x = b.compute("logits_bwd", backward(logits(d, sh)), deps, layer, mb)
        return tp.exit_backward(b, "logits", layer, mb, x)
    x = tp.enter_backward(b, "mlp", layer, mb, deps)
    if model_costs.is_moe_layer(d, layer):
        x = ep.moe_mlp(b, layer, mb, x, "bwd")
    else:
        x = b.compute("mlp_bwd", backward(mlp_block(d, sh)), x, layer, mb)
    x = tp.exit_backward(b, "mlp", layer, mb, x)
    x = tp.enter_backward(b, "attn", layer, mb, x)
    x = b.compute("attn_post_bwd", backward(attention_post(d, sh)), x, layer, mb)
    if b.ctx.scenario.training.recompute == "selective":
        x = cp.attention(b, layer, mb, x, "fwd", "_recompute")  # recompute the attention core
    x = cp.attention(b, layer, mb, x, "bwd")
    x = b.compute("attn_pre_bwd", backward(attention_pre(d, sh)), x, layer, mb)
    return tp.exit_backward(b, "attn", layer, mb, x)


def optimizer_step(b, deps: list[int]) -> int:
    """Adam on this rank's parameter shard, after every gradient reduction."""
    from ..model.layers import optimizer

    dense, expert = rank_params(b.ctx, b.stage)
    if b.ctx.scenario.parallel.zero >= 1:
        dense /= len(b.ctx.layout.group(b.rank, "cp", "dp"))
        expert /= len(b.ctx.layout.expert_dp_group(b.rank))
    return b.compute("optimizer", optimizer(dense + expert), tuple(deps))
