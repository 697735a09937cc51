"""Tensor parallelism (Megatron column/row split, Shoeybi et al. 2019) and sequence
parallelism (Korthikanti et al. 2022).

Each sublayer (attention, MLP) needs the activations of the whole hidden dimension:
without SP, one all-reduce of the output in forward and one of the input gradient in
backward; with SP, an all-gather before and a reduce-scatter after, in both directions.
These sit on the critical path: the next compute op depends on them (with
``parallel.tp_comm_overlap``, :mod:`.tp_overlap` pipelines them with GEMM chunks instead).
"""

from dataclasses import dataclass

from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from ..model.layers import ELEM, Direction, backward, entry_width, mla_column_pre, mla_column_up, mla_latent_widths
from ..engine.kinds import Category

AXIS = Category.TP


@dataclass(frozen=True)
class Roles:
    """Positions of a sublayer's kernels by TP role (``Kernel.tp``, sim/model/layers.py):
    head (local, before the gather), consumers (column-parallel, read the gathered input),
    middle, producer (row-parallel, write the partial sums), tail (local, after)."""

    head: slice
    consumers: slice
    middle: slice
    producer: slice
    tail: slice


def _run(kernels, role: int) -> tuple[int, int] | None:
    """(first, one past the last) of the kernels with TP role ``role``, or None."""
    found = [i for i, k in enumerate(kernels) if k.tp == role]
    return (found[0], found[-1] + 1) if found else None


def roles(kernels, gather: bool, scatter: bool) -> Roles:
    """Split a sublayer's kernel list by role; consumers only with ``gather``, a producer
    only with ``scatter``."""
    n = len(kernels)
    cons = _run(kernels, 1) if gather else None
    start, end = cons if cons else (0, 0)
    prod = _run(kernels, 2) if scatter else None
    first, last = prod if prod and prod[0] >= end else (n, n)
    return Roles(slice(0, start), slice(start, end), slice(end, first), slice(first, last), slice(last, n))


def half(kernel, wgrad: bool = False):
    """One of the two GEMMs of a GEMM's backward, half its backward work: the dgrad, or with
    ``wgrad`` the weight gradient (which alone accumulates into main_grad: ``Kernel.acc``)."""
    return split(kernel.backward(), wgrad)._replace(count=kernel.count)


def split(bk, wgrad: bool):
    """The dgrad or (``wgrad``) the weight-gradient half of a GEMM's backward kernel ``bk``."""
    return bk._replace(flops=bk.flops / 2, bytes=bk.bytes / 2, count=max(bk.count // 2, 1),
                       acc=bk.acc if wgrad else 0.0, wgrad=1.0 if wgrad and bk.acc else 0.0)


def grad_parts(kernels) -> tuple[tuple, tuple]:
    """(input-gradient, weight-gradient) kernels of a backward op's kernel list: a weight
    GEMM's backward (FLOPs, not flash attention) is its dgrad and its wgrad GEMM, half each
    (:func:`half`'s split); every other kernel (attention core, norms, activations, casts,
    the embedding's scatter-add) stays with the input gradient. The zero-bubble schedules
    run the second part later (:mod:`.pp_zero_bubble`)."""
    dgrad, wgrad = [], []
    for k in kernels:
        if k.flops and not k.attn:
            dgrad.append(split(k, False))
            wgrad.append(split(k, True))
        else:
            dgrad.append(k)
    return tuple(dgrad), tuple(wgrad)


def compute_op(b, name, kernels, deps, layer, mb, weights: bool = True):
    """A compute op of ``kernels``, or ``deps`` itself when there are none (``weights``:
    see :meth:`sim.parallel.program.RankBuilder.compute`)."""
    kernels = tuple(kernels)
    return b.compute(name, kernels, deps, layer, mb, weights=weights) if kernels else deps


def activation_bytes(b) -> float:
    """Bytes of one micro-batch's activations on this rank: tokens * hidden * 2."""
    return b.ctx.shard.tokens * b.ctx.dims.h * ELEM


def sublayer_bytes(b, sublayer: str, gather: bool, entry: bool) -> float:
    """Bytes of one TP collective of a dense sublayer's Transformer Engine linears:
    tokens x width x element. ``entry``: the sublayer's input side (its gather forward, the
    reduction of its input gradient backward), ``sublayer.entry_width`` wide (MLA gathers
    its latents, :func:`sim.model.layers.entry_width`); the output side is hidden wide.
    Under FP8 an all-gather moves one byte per element: TE quantizes before gathering
    (transformer_engine/pytorch/module/layernorm_linear.py, ``gather_along_first_dim(...,
    quantizer=...)``); reductions stay BF16, except the forward reduce-scatter under
    ``parallel.tp_overlap_fp8_rs`` (:func:`fp8_reduce_scatter`)."""
    d = b.ctx.dims
    width = entry_width(d, rotary_key=not b.ctx.shard.mla_column) if entry and sublayer == "attn" else d.h
    one = b.ctx.shard.fp8 and (gather or (not entry and fp8_reduce_scatter(b.ctx.scenario.parallel)))
    return b.ctx.shard.tokens * width * (1 if one else ELEM)


def fp8_reduce_scatter(p) -> bool:
    """Whether the row-parallel forward reduce-scatter (proj_fprop, fc2_fprop) moves FP8:
    Transformer Engine's pipelined userbuffers overlap writes the GEMM's partial sums into an
    FP8 buffer and reduces them from it (``fp8_buf``: transformer_engine/pytorch/module/base.py
    ``initialize_ub``, v1.13 and v2.0, takes it from the config for the "pipeline" layers; its
    default is BF16 there, FP8 only for the all-gather layers). NeMo's FP8 userbuffers configs
    for H100 set it: nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py (NeMo
    d2b21556, the commit dgxc-benchmarking v25.04 llama3.1/setup.sh pins)
    ``userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192`` and ``..._h16384_tp8_cp2_...``:
    ``proj_fprop`` and ``fc2_fprop`` with ``fp8_buf=True``. Only the userbuffers overlap has
    such buffers: without ``tp_comm_overlap`` (NCCL's reduce-scatter, or a planner candidate
    that turns the overlap off) the key changes nothing. The rules (sim/input/rules.py) allow
    it only with Transformer Engine's FP8."""
    return p.tp_overlap_fp8_rs and p.tp_comm_overlap


def enter(b, sublayer: str, layer: int, mb: int, deps, tag=(), nbytes: float | None = None) -> int | tuple:
    """Before a sublayer (SP only): all-gather the sequence-sharded input (``nbytes``,
    default :func:`activation_bytes`)."""
    if b.ctx.layout.sizes[Category.TP] == 1 or not b.ctx.scenario.parallel.sequence_parallel:
        return deps
    return b.collective(f"{sublayer}_ag", AXIS, ALL_GATHER, b.group(AXIS), nbytes or activation_bytes(b), deps,
                        layer=layer, mb=mb, tag=tag, group_of=b.group_of(AXIS))


def exit(b, sublayer: str, layer: int, mb: int, deps, tag=(), nbytes: float | None = None) -> int | tuple:
    """After a sublayer: all-reduce the partial sums (SP: reduce-scatter them)."""
    if b.ctx.layout.sizes[Category.TP] == 1:
        return deps
    op = REDUCE_SCATTER if b.ctx.scenario.parallel.sequence_parallel else ALL_REDUCE
    name = "rs" if op is REDUCE_SCATTER else "ar"
    return b.collective(f"{sublayer}_{name}", AXIS, op, b.group(AXIS), nbytes or activation_bytes(b), deps,
                        layer=layer, mb=mb, tag=tag, group_of=b.group_of(AXIS))


def enter_backward(b, sublayer: str, layer: int, mb: int, deps, nbytes: float | None = None) -> int | tuple:
    """Backward of exit: SP all-gathers the output gradient; without SP nothing."""
    return enter(b, sublayer + "_grad", layer, mb, deps, tag=(Direction.BWD,), nbytes=nbytes)


def exit_backward(b, sublayer: str, layer: int, mb: int, deps, nbytes: float | None = None) -> int | tuple:
    """Backward of enter: all-reduce (SP: reduce-scatter) the input gradient."""
    return exit(b, sublayer + "_grad", layer, mb, deps, tag=(Direction.BWD,), nbytes=nbytes)


def forward_sublayer(b, sublayer: str, name: str, kernels_fn, layer: int, mb: int, deps, tag: str,
                     gather: bool = False, scatter: bool = False) -> int | tuple:
    """Compute op ``name`` (kernels ``kernels_fn(dims, shard)``), after the all-gather of its
    input (``gather``, SP only) and before the reduction of its output (``scatter``);
    :func:`.tp_overlap.forward_sublayer` is the overlapped version."""
    x = enter(b, sublayer, layer, mb, deps, (tag,), sublayer_bytes(b, sublayer, True, True)) if gather else deps
    x = b.compute(name, kernels_fn(b.ctx.dims, b.ctx.shard), x, layer, mb)
    return exit(b, sublayer, layer, mb, x, (tag,), sublayer_bytes(b, sublayer, False, False)) if scatter else x


def backward_sublayer(b, sublayer: str, name: str, kernels_fn, layer: int, mb: int, deps,
                      gathered: bool = False, scattered: bool = False) -> int | tuple:
    """Backward of :func:`forward_sublayer`: the gradient of a reduced output is gathered
    first (``scattered``); the input side runs as :func:`split_backward`."""
    kernels = kernels_fn(b.ctx.dims, b.ctx.shard)
    x = enter_backward(b, sublayer, layer, mb, deps, sublayer_bytes(b, sublayer, True, False)) if scattered else deps
    if not gathered or b.ctx.layout.sizes[Category.TP] == 1:  # nothing to reduce: one op
        return b.compute(name, backward(kernels), x, layer, mb)
    r = roles(kernels, True, False)
    x = compute_op(b, name, backward(kernels[r.consumers.stop:]), x, layer, mb)
    return split_backward(b, sublayer, name, kernels, r, x, layer, mb)


def split_backward(b, sub: str, name: str, kernels, r: Roles, x, layer: int, mb: int, scale: int = 1) -> int | tuple:
    """The input side of a sublayer's backward, from the column-parallel GEMMs down, as
    Megatron-Core runs it (megatron/core/tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward; TE's Linear and
    LayerNormLinear alike): under SP the saved sequence-sharded input is all-gathered
    asynchronously while the dgrad GEMM runs (the wgrad needs it whole); the input gradient
    is reduce-scattered (SP) or all-reduced asynchronously while the wgrad GEMM runs; the
    head's backward (the norm) waits for both. ``scale``: linears of that many times the
    sublayer's input width (each gathering and reducing its own copy)."""
    consumers = kernels[r.consumers]
    if not consumers or b.ctx.layout.sizes[Category.TP] == 1:
        x = compute_op(b, name, backward(consumers), x, layer, mb)
        return compute_op(b, name, backward(kernels[r.head]), exit_backward(b, sub, layer, mb, x), layer, mb)
    gather = None
    if b.ctx.scenario.parallel.sequence_parallel:
        gather = b.collective(f"{sub}_input_ag", AXIS, ALL_GATHER, b.group(AXIS),
                              scale * sublayer_bytes(b, sub, True, True), x, layer=layer, mb=mb,
                              tag=(Direction.BWD, "input"), group_of=b.group_of(AXIS))
    dgrad = compute_op(b, name, [half(k) for k in consumers], x, layer, mb, weights=False)
    reduce = exit_backward(b, sub, layer, mb, dgrad, scale * sublayer_bytes(b, sub, False, True))
    wgrad = b.weight_grad(name, tuple(half(k, True) for k in consumers), (dgrad, gather), layer, mb)
    return compute_op(b, name, backward(kernels[r.head]), (reduce, wgrad), layer, mb)



def mla_column_forward(b, layer: int, mb: int, x, tag: str) -> int | tuple:
    """MLA's pre-attention with column-parallel down projections (``parallel.mla_down_proj =
    "column"``; Megatron-Core 7094270c multi_latent_attention.py ``get_query_key_value_tensors``):
    each down projection all-gathers the hidden input itself (SP), runs on every token, and its
    output is all-gathered along the last dim (``gather_from_tensor_model_parallel_region``; under
    SP then split to the sequence shard, no traffic); then the up projections gather their latents
    as in the duplicated mode (:func:`forward_sublayer`, ``entry_width(d, rotary_key=False)``). The two
    projections' input gathers run as one all-gather of their bytes, as do their last-dim gathers
    (fewer ops; the same bytes, one latency each instead of two). Plain collectives: the rules
    refuse ``tp_comm_overlap`` with it."""
    d, sh = b.ctx.dims, b.ctx.shard
    downs = len(mla_latent_widths(d))  # down projections, each gathering its own copy of the input
    x = enter(b, "attn_down", layer, mb, x, (tag,), downs * sublayer_bytes(b, "attn_down", True, True))
    x = b.compute(f"attn_down_{tag}", mla_column_pre(d, sh), x, layer, mb)
    x = b.collective("attn_latent_ag", AXIS, ALL_GATHER, b.group(AXIS), sh.tokens * sum(mla_latent_widths(d)) * ELEM,
                     x, layer=layer, mb=mb, tag=(tag,), group_of=b.group_of(AXIS))
    return forward_sublayer(b, "attn", f"attn_pre_{tag}", mla_column_up, layer, mb, x, tag, gather=True)


def mla_column_backward(b, layer: int, mb: int, x) -> int | tuple:
    """Backward of :func:`mla_column_forward`: the up projections as :func:`backward_sublayer`; the
    sequence split's backward (SP: an all-gather of the latents' gradients; the rotary key was never
    split); the down projections' column-parallel backward (:func:`split_backward`: their input
    re-gathered beside the dgrad GEMMs, the input gradients reduce-scattered beside the wgrads;
    each of the two at both projections' bytes), then the input norm's."""
    d, sh = b.ctx.dims, b.ctx.shard
    x = backward_sublayer(b, "attn", "attn_pre_bwd", mla_column_up, layer, mb, x, gathered=True)
    x = enter_backward(b, "attn_latent", layer, mb, x, sh.tokens * (sum(mla_latent_widths(d)) - d.qk_rope) * ELEM)
    kernels = mla_column_pre(d, sh)
    return split_backward(b, "attn_down", "attn_down_bwd", kernels, roles(kernels, True, False), x, layer, mb,
                          scale=len(mla_latent_widths(d)))
