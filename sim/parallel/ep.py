"""Expert parallelism for MoE layers (GShard, Lepikhin et al. 2020; Megatron-Core MoE).

Experts are sharded over the ep ranks of an expert group. Per MoE layer: router, an
all-to-all dispatching every token to the ranks holding its top-k experts, the local
experts' GEMMs sized by the tokens each expert actually received, and an all-to-all
combining the results. Both all-to-alls are on the critical path (unless
``parallel.ep_comm_overlap`` runs them under another micro-batch's compute, see
:mod:`.ep_overlap`). When the routing policy loads experts unevenly, the ranks holding
hot experts compute longer and every other rank of the group waits for them at the
combine. The dispatcher's copies are memory traffic (:func:`~sim.model.moe_kernels.permute`
in the router, the re-sort by local expert around the experts, the unpermutation after the
combine).

Two paths (:attr:`.layout.Layout.folded_experts`):

- Megatron-Core's alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
  MoEAlltoAllTokenDispatcher since MCore 0.10: permute -> A2A(EP) -> AG(expert TP) -> experts
  -> RS(expert TP) -> A2A(EP)), taken whenever tp > 1 with sequence parallelism, expert_tp =
  tp included, and for every folded layout (expert_tp != tp, MoE parallel folding): each rank
  routes its own sequence-parallel shard (tokens/tp) over an ep group that may span tp ranks,
  the expert-tp group gathers the dispatched tokens, each rank holds 1/expert_tp of its
  experts' weights. Shared experts stay on the attention's tp group (gathered before,
  reduce-scattered after; megatron/core/transformer/moe/shared_experts.py).
- tp > 1 without sequence parallelism (Megatron refuses MoE so): every tp rank holds all the
  tokens, routes and dispatches them all, and holds 1/tp of its experts' weights; plain TP
  collectives around the MoE MLP. With tp = 1 both paths are the same.

Megatron-Core's flex dispatcher with the DeepEP backend (``parallel.ep_dispatcher = "deepep"``,
token_dispatcher.py MoEFlexTokenDispatcher) sends each token once per rank and once per node
holding its experts instead of once per expert (:func:`exchange`, sim/collectives/direct.py);
its CPU also waits for the received counts (DeepEP docs/legacy.md: "the CPU will wait for GPU's
signal to arrive"), so :func:`split_sizes` holds for it too. (Megatron-Core waits inside DeepEP's
dispatch, fused_a2a.py ``FusedDispatch.forward``, i.e. in the dispatch node; here the wait is in the
router, one piece earlier. The same without EP overlap; under ``ep_comm_overlap`` the host then
issues the other micro-batch's expert backward after the wait, not before it: a what-if moving it
takes the overlapped Qwen3 row 15.43 -> 13.96 s, docs/moe_costs.md "DeepEP across nodes".)

The host reads the split sizes (:func:`split_sizes`). The dispatcher's all-to-alls take
their split sizes, and the grouped GEMM its tokens per expert, as host values: Megatron-Core
(token_dispatcher.py, MoEAlltoAllTokenDispatcher.preprocess) counts each rank's tokens per
expert, all-gathers the counts over the tp x ep group (``gather_from_sequence_parallel_region
(num_local_tokens_per_expert, group=self.tp_ep_group)``), copies the sizes to the host on its
``cuda_dtoh_stream`` and waits for them (``_maybe_dtoh_and_synchronize``): dropless with
ep > 1 or expert tp > 1 at ``before_ep_alltoall``, after the first permutation was issued;
with a capacity but no padding at ``before_permutation_1``, before it; never when every
expert's buffer is padded to capacity (``drop_and_pad``: the sizes are known). torchtitan
does the same in every MoE layer with ep > 1 (torchtitan/distributed/expert_parallel.py
``ExpertParallel._token_dispatch``: an all-to-all of ``num_tokens_per_expert``, then
``.to("cpu", non_blocking=False)``, "NOTE: this would incur a device-to-host sync").
Only forward passes (recomputation too): the backward reuses the sizes. The counts'
collective is modelled as Megatron's all-gather over the ep group (with expert tp > 1 and
ep > 1, Megatron's group is expert tp x ep; ep alone here), ``COUNT_BYTES`` per expert.
"""

from dataclasses import replace

from ..collectives.direct import Dedup, hit
from ..collectives.kinds import ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER
from ..model.layers import ELEM, Direction, backward
from ..model.moe_kernels import experts, router, routed_experts, unpermute
from . import tp
from ..engine.kinds import Category, StreamName
from ..input.choices import Dispatcher, ExpertRouting

AXIS = Category.EP
COUNT_BYTES = 8  # one int64 token count per expert (routing_map.sum(dim=0).long())
# SMs DeepEP's normal (training) dispatch and combine kernels run on: Megatron-Core's
# --moe-deepep-num-sms, default 20 (NVIDIA/Megatron-LM 8333bd5b, 2025-06-16, which added it:
# megatron/training/arguments.py, transformer_config.py ``moe_deepep_num_sms: int = 20``, passed to
# DeepEP's ``Buffer.set_num_sms`` by fused_a2a.py ``set_deepep_num_sms``); DeepEP's own default
# is the same (deepseek-ai/DeepEP e02e4d2 deep_ep/buffer.py ``num_sms: int = 20``), and
# DeepSeek-V3 ran its all-to-alls on 20 SMs (arXiv 2412.19437 section 3.2.2). The Qwen3 rows'
# launch script (Megatron-MoE-ModelZoo b0b92ff sbatch_benchmarking.sh) sets no count and, with
# A2A_OVERLAP=1, NVTE_{FWD,BWD}_LAYERNORM_SM_MARGIN=20: Transformer Engine's norms leave those 20
# SMs to DeepEP.
DEEPEP_SMS = 20
# What compute beside DeepEP's kernels loses, measured with those 20 SMs held on H100: "The
# report's DeepEP example reserves 20 SMs per GPU and observes about a 20% GEMM-efficiency cost"
# (NVIDIA/Megatron-LM fc81b209 docs/user-guide/features/moe_a2a_overlap.md, "Performance results",
# quoting the Megatron-Core MoE report, arXiv 2603.07685 section 4.2.3: DeepSeek-V3 on H100 under
# combined-1F1B EP overlap). More than the SMs' own share, 20/132 = 15.2% (the candidates: grids
# sized for 132 SMs run in more waves on 112; DeepEP's copies take HBM bandwidth; not measured
# apart). :func:`sm_share` charges it.
DEEPEP_COMPUTE_COST = 0.20
# DeepEP's normal kernels slowed beside GEMMs on the other stream, time beside / time alone:
# deepseek-ai/DeepEP issue 184 (its benchmark of overlapped compute and communication): dispatch
# 3.54 -> 4.18 ms, combine +0.9%. Charged to the all-to-alls of a combined-1F1B layer pair
# (``parallel.ep_comm_overlap``, sim/parallel/ep_overlap.py), each beside the other micro-batch's
# compute; never without the overlap, where the compute waits for each all-to-all.
DEEPEP_BESIDE_COMPUTE = {False: 4.18 / 3.54, True: 1.009}  # keyed by ``combine``


def _group(b):
    return b.ctx.layout.ep_group(b.rank)


def tokens(b) -> float:
    """Tokens this rank routes per micro-batch (:meth:`.layout.Layout.moe_tokens`)."""
    return b.ctx.layout.moe_tokens(b.ctx.shard.tokens)


def dispatch_bytes(b, layer: int) -> float:
    """Per-rank all-to-all buffer: the token-expert assignments the router kept (each
    rank's tokens x top_k when nothing is dropped), a hidden vector each."""
    d = b.ctx.dims
    loads = b.ctx.expert_loads.get(layer)
    if loads is None:
        return ELEM * tokens(b) * d.top_k * d.h
    key = ("a2a_bytes", layer)  # (every micro-batch asks again: memoized per layer)
    found = b.ctx.memo.get(key)
    if found is None:
        found = b.ctx.memo[key] = ELEM * float(loads.sum()) / b.ctx.layout.ep * d.h
    return found


def shares(b, layer: int, combine: bool) -> tuple | None:
    """Uneven all-to-all weights when experts are loaded unevenly: the dispatch sends
    each member's tokens to rank j in proportion to the load f_j of j's experts; the
    combine sends them back (j -> i: nbytes * f_j). None when the loads are even.
    Memoized per (layer, group, direction): the loads are the layer's for every
    micro-batch, and each all-to-all of a MoE program asked again (half the time of
    building the Qwen3-235B programs of ``python bench/step.py --only qwen``)."""
    group = _group(b)
    key = ("a2a_shares", layer, group, combine)
    memo = b.ctx.memo
    if key not in memo:
        memo[key] = _shares(b, layer, group, combine)
    return memo[key]


def _shares(b, layer: int, group: tuple, combine: bool) -> tuple | None:
    loads = b.ctx.expert_loads.get(layer)
    if loads is None or loads.min() == loads.max():
        return None
    ep = b.ctx.layout.ep
    per = len(loads) // ep
    held = [float(loads[j * per:(j + 1) * per].sum()) for j in (b.ctx.layout.ep_index(r) for r in group)]
    f = tuple(x / sum(held) for x in held)
    n = len(group)
    if combine:
        return tuple(n * x for x in f), (1.0 / n,) * n
    return (1.0,) * n, f


def local_loads(ctx, rank: int, layer: int) -> tuple[float, ...]:
    """Tokens each local expert processes in one micro-batch on ``rank`` (memoized per
    layer and expert slice, as :func:`shares`)."""
    j = ctx.layout.ep_index(rank)
    key = ("local_loads", layer, j)
    found = ctx.memo.get(key)
    if found is None:
        loads = ctx.expert_loads[layer]  # tokens per expert, over the whole ep group
        per = len(loads) // ctx.layout.ep
        found = ctx.memo[key] = tuple(float(x) for x in loads[j * per:(j + 1) * per])
    return found


def expert_kernels(ctx, rank: int, layer: int, direction: Direction) -> tuple:
    """The kernels of ``rank``'s local experts in one micro-batch (its expert slice's loads;
    folded: on the expert-tp gathered tokens), memoized per layer, slice and direction: a
    step asks for every micro-batch, and :mod:`.copies` again for each slice it retimes."""
    key = ("expert_kernels", layer, ctx.layout.ep_index(rank), direction)
    found = ctx.memo.get(key)
    if found is None:
        d, sh, layout = ctx.dims, ctx.shard, ctx.layout
        loads = local_loads(ctx, rank, layer)
        if layout.folded_experts:
            found = tuple(routed_experts(d, replace(sh, tp=layout.etp), loads, layout.etp))
        else:
            found = experts(d, sh, loads)
        found = ctx.memo[key] = _kernels(found, direction)
    return found


def _kernels(kernels, direction: Direction):
    return kernels if direction is Direction.FWD else backward(kernels)


def route(b, layer: int, mb: int, deps, direction: Direction = Direction.FWD, tag: str = "") -> int:
    """The router (folded: on this rank's own tokens, then the shared experts on the
    attention's tp group)."""
    d, sh, layout = b.ctx.dims, b.ctx.shard, b.ctx.layout
    launches = b.ctx.scenario.model.moe.router_kernels
    if not layout.folded_experts:
        return _router(b, router(d, sh, launches), layer, mb, deps, direction, tag)
    own = replace(sh, tokens=tokens(b), tp=1, sp=False)
    x = _router(b, router(d, own, launches), layer, mb, deps, direction, tag)
    name = f"shared_experts_{direction}{tag}"
    kernels = _kernels(experts(d, sh, ()), direction)  # no routed tokens: shared experts + residual
    if d.shared == 0:  # the block's dropout and residual only, on the shard
        return b.compute(name, kernels, x, layer, mb)
    if direction is Direction.FWD:  # plain TP collectives: Megatron's shared experts bypass userbuffers
        x = tp.enter(b, "shared", layer, mb, x, tag=(direction + tag,))
        return tp.exit(b, "shared", layer, mb, b.compute(name, kernels, x, layer, mb), tag=(direction + tag,))
    x = tp.enter_backward(b, "shared", layer, mb, x)
    return tp.exit_backward(b, "shared", layer, mb, b.compute(name, kernels, x, layer, mb))


def syncs(b) -> bool:
    """Whether the host reads this layer's split sizes in its forward (module docstring)."""
    moe, layout = b.ctx.scenario.model.moe, b.ctx.layout
    return not moe.padded and (layout.ep > 1 or layout.etp > 1)


def _router(b, kernels, layer: int, mb: int, deps, direction: Direction, tag: str) -> int:
    """The router's kernels (the permutation last); forward with :func:`syncs`, the
    permutation apart, around the host's read of the split sizes."""
    if direction is not Direction.FWD or not syncs(b):
        return b.compute(f"router_{direction}{tag}", _kernels(kernels, direction), deps, layer, mb)
    x = b.compute(f"router_{direction}{tag}", kernels[:-1], deps, layer, mb)
    return split_sizes(b, layer, mb, x, kernels[-1:], tag)


def split_sizes(b, layer: int, mb: int, deps, permutation, tag: str = "") -> int:
    """The counts' all-gather, the first permutation and the host's wait for the sizes
    (dropless: the permutation is issued before the wait and runs under it; with a
    capacity, after it); returns the permutation."""
    layout, d = b.ctx.layout, b.ctx.dims
    group_of = layout.ep_group if layout.ep > 1 else layout.expert_tp_group
    group = group_of(b.rank)
    x = b.collective(f"moe_counts_fwd{tag}", AXIS, ALL_GATHER, group, COUNT_BYTES * d.experts * len(group),
                     deps, layer=layer, mb=mb, group_of=group_of)
    name, dropless = f"permute_fwd{tag}", b.ctx.scenario.model.moe.routing is not ExpertRouting.TOKEN_DROP
    if dropless:
        permuted = b.compute(name, permutation, x, layer, mb)
        b.host_sync(f"moe_splits_d2h{tag}", x, layer, mb, stream=AXIS)
        return permuted
    b.host_sync(f"moe_splits_d2h{tag}", x, layer, mb, stream=AXIS)
    return b.compute(name, permutation, x, layer, mb)


def dispatch(b, layer: int, mb: int, deps, direction: Direction = Direction.FWD, tag: str = "") -> int:
    """The first all-to-all (backward too: it carries gradients of tokens to the experts)."""
    if b.ctx.layout.ep == 1:
        return deps
    nbytes, weights = exchange(b, layer, False)
    return b.collective(f"a2a_dispatch_{direction}{tag}", AXIS, ALL_TO_ALL, _group(b), nbytes,
                        deps, layer=layer, mb=mb, group_of=b.ctx.layout.ep_group, shares=weights,
                        sms=sm_share(b.ctx.scenario.parallel))


def sm_share(parallel) -> float:
    """The share of the compute rate the dispatcher's all-to-all kernels take while they run
    (``Collective.sms``; the engine slows the compute beside them to ``1 -`` it,
    :class:`sim.engine.sms.SmLedger`): DeepEP's measured :data:`DEEPEP_COMPUTE_COST` with its
    :data:`DEEPEP_SMS` of an H100's 132 held (at least their share); none for NCCL's all-to-all (not
    modelled: its channels' SMs are not counted anywhere else either). The planner prices the same
    share (sim/plan/estimate.py ``_ep_exposed``, through :mod:`.layer_program`)."""
    return DEEPEP_COMPUTE_COST if parallel.ep_dispatcher is Dispatcher.DEEPEP else 0.0


def paired_stretch(parallel) -> float:
    """How much longer a layer's DeepEP all-to-alls last inside a combined-1F1B pair (:func:`dedup`):
    the mean of :data:`DEEPEP_BESIDE_COMPUTE` (a dispatch and a combine each way, of the same bytes);
    1 for NCCL's all-to-all. The planner prices the same (sim/plan/estimate.py ``_ep_exposed``)."""
    if parallel.ep_dispatcher is not Dispatcher.DEEPEP:
        return 1.0
    return (DEEPEP_BESIDE_COMPUTE[False] + DEEPEP_BESIDE_COMPUTE[True]) / 2


def exchange(b, layer: int, combine: bool) -> tuple[float, tuple | None]:
    """The all-to-all's bytes and shares: Megatron's alltoall dispatcher, every token-expert copy
    (:func:`dispatch_bytes`, uneven :func:`shares`); DeepEP (``parallel.ep_dispatcher``), each
    token once (tokens x hidden x 2 bytes) with its :class:`~sim.collectives.direct.Dedup`."""
    if b.ctx.scenario.parallel.ep_dispatcher is not Dispatcher.DEEPEP:
        return dispatch_bytes(b, layer), shares(b, layer, combine)
    return ELEM * tokens(b) * b.ctx.dims.h, dedup(b, combine)


def dedup(b, combine: bool = False) -> Dedup:
    """DeepEP's chances that a token hits a rank, a node of this rank's ep group (balanced
    routing, :func:`~sim.collectives.direct.hit`): a rank holds experts / ep of them, a node the
    group's members in it times that; inside a combined-1F1B layer pair (``b.paired``) the
    kernel's :data:`DEEPEP_BESIDE_COMPUTE` slowdown."""
    d, group = b.ctx.dims, _group(b)
    mine = b.ctx.domains[b.rank]
    per_rank = d.experts // b.ctx.layout.ep
    local = sum(1 for r in group if b.ctx.domains[r] == mine)
    slowdown = DEEPEP_BESIDE_COMPUTE[combine] if b.paired else 1.0
    return Dedup(hit(d.experts, d.top_k, per_rank), hit(d.experts, d.top_k, per_rank * local), slowdown)


def combine(b, layer: int, mb: int, deps, direction: Direction = Direction.FWD, tag: str = "") -> int:
    """The second all-to-all, back to the tokens' ranks, then the unpermutation that sums
    each token's k weighted copies. Under ``ep_comm_overlap`` Megatron-Core runs both in its
    combine node on the communication stream (core_v0.14.0 models/gpt/fine_grained_callables.py
    ``submodule_combine_forward``; models/common/model_chunk_schedule_plan.py puts moe_combine
    on comm_stream), so the unpermutation does not hold up the other micro-batch's compute."""
    x = deps
    if b.ctx.layout.ep > 1:
        nbytes, weights = exchange(b, layer, True)
        x = b.collective(f"a2a_combine_{direction}{tag}", AXIS, ALL_TO_ALL, _group(b), nbytes,
                         deps, layer=layer, mb=mb, group_of=b.ctx.layout.ep_group, shares=weights,
                         sms=sm_share(b.ctx.scenario.parallel))
    stream = AXIS if b.ctx.scenario.parallel.ep_comm_overlap else StreamName.COMPUTE
    return b.compute(f"unpermute_{direction}{tag}", _kernels(unpermute(b.ctx.dims, tokens(b), b.ctx.shard.fused_permute), direction), x,
                     layer, mb, stream=stream)


def compute_experts(b, layer: int, mb: int, deps, direction: Direction = Direction.FWD, tag: str = "") -> int:
    """The local experts' GEMMs (folded with expert_tp > 1: between an all-gather and a
    reduce-scatter of the dispatched tokens over the expert-tp group)."""
    d, layout = b.ctx.dims, b.ctx.layout
    name = f"experts_{direction}{tag}"
    kernels = expert_kernels(b.ctx, b.rank, layer, direction)
    if not layout.folded_experts or layout.etp == 1:
        return b.compute(name, kernels, deps, layer, mb, loads=(layer, direction))
    etp = layout.etp
    nbytes = etp * ELEM * sum(local_loads(b.ctx, b.rank, layer)) * d.h  # every expert-tp rank's dispatched tokens
    group_of = layout.expert_tp_group
    x = b.collective(f"etp_ag_{direction}{tag}", tp.AXIS, ALL_GATHER, group_of(b.rank), nbytes, deps,
                     layer=layer, mb=mb, group_of=group_of)
    x = b.compute(name, kernels, x, layer, mb)  # (the collectives' bytes vary too: built per expert slice)
    return b.collective(f"etp_rs_{direction}{tag}", tp.AXIS, REDUCE_SCATTER, group_of(b.rank), nbytes, x,
                        layer=layer, mb=mb, group_of=group_of)
