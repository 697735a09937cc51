"""Peak memory per GPU: weights, gradients, Adam state, activations, gathered layers.

Mixed-precision Adam holds 16 bytes per parameter (ZeRO paper, Rajbhandari et al. 2020,
section 3.1): 2 (bf16 weights) + 2 (bf16 gradients) + 12 (fp32 master weights, momentum,
variance). ZeRO-1 shards the 12, ZeRO-2 also the gradients, ZeRO-3 also the weights,
over the data-parallel ranks. Activations follow Korthikanti et al. 2022 for the
micro-batches a schedule keeps in flight (counted from the schedule itself). Under a
quantized precision Transformer Engine keeps two quantized copies of each weight, its
rowwise one and the columnwise (transposed) one the dgrad GEMM reads (FP8: weight_fp8 and
weight_t_fp8, transformer_engine/pytorch/module/linear.py; MXFP8 and NVFP4: rowwise_data and
columnwise_data with their scales), each at the format's bytes per element with its scales
(``sim.model.compute.QUANTIZED``: 1, 1 + 1/32, 0.5 + 1/16), beside the BF16 weights, and saves
quantized linear-layer inputs (sim/model/transformer.py). With ``training.fp8_params`` the
weights are those quantized copies alone (:func:`weight_bytes`).
"""

from dataclasses import dataclass

from ..engine.kinds import Category
from ..input.choices import Recompute
from ..model.compute import QUANTIZED, quantized
from ..model.layers import ELEM
from ..model.transformer import activation_bytes_per_layer
from . import pp, pp_zero_bubble as zb
from .dp import grad_bytes
from .fsdp import reshards
from .params import block_ids, held_stages, layer_params, rank_params, stage_layer_ids

RUNTIME_BYTES = 2**30  # CUDA context, cuBLAS workspace and NCCL buffers: ~1 GiB in practice


@dataclass(frozen=True)
class Memory:
    """Bytes on the fullest GPU, by kind."""

    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    gathered: float
    runtime: float = RUNTIME_BYTES

    @property
    def total(self) -> float:
        """Sum of every kind."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.gathered + self.runtime


def stage_memory(ctx, stage: int) -> Memory:
    """Memory of a rank at pipeline ``stage``."""
    p, zero = ctx.scenario.parallel, ctx.scenario.parallel.zero
    dense, expert = rank_params(ctx, stage)
    nd = (p.dp_shard or p.dp) * p.cp  # the shard group (HSDP: dp_shard of the dp ranks)
    ne = ctx.layout.expert_dp
    sharded = dense / nd + expert / ne
    full = dense + expert
    t = ctx.scenario.training
    weights = shard_bytes(t) * sharded if zero >= 3 else weight_bytes(t) * full
    grads = grad_bytes(p) if zero < 3 else 2  # (fp32 buffer with parallel.grad_reduce_in_fp32: sim/parallel/dp.py)
    return Memory(stage, weights, grads * (sharded if zero >= 2 else full),
                  12 * (sharded if zero >= 1 else full), activations(ctx, stage), gathered(ctx, stage))


def quantized_copies(t) -> float:
    """Bytes per parameter of Transformer Engine's two quantized copies of a weight (rowwise and
    columnwise, each with its scales: ``QUANTIZED``); 0 under BF16."""
    return 2 * QUANTIZED[t.precision] if quantized(t.precision) else 0.0


def weight_bytes(t) -> float:
    """Bytes per parameter of a weight held whole (ZeRO 0-2, or gathered under ZeRO 3): BF16 and
    its quantized copies; with ``training.fp8_params`` the copies alone. Megatron-Core with
    --fp8-param-gather builds the model's linears as Transformer Engine's quantized parameters;
    with the distributed optimizer and MXFP8 parameters a bucket's param_data is its gradient
    buffer (Megatron-LM d98e8a6 megatron/core/distributed/param_and_grad_buffer.py lines
    1160-1179: ``self.param_data = self.shared_buffer``), which the all-gather borrows and
    ``_post_param_sync`` casts back into the quantized storage (lines 301-330): no BF16 copy
    is kept. Megatron-Bridge's FP8 current-scaling and MXFP8 recipes switch it on
    (NVIDIA-NeMo/Megatron-Bridge@c0b9a000 src/megatron/bridge/training/mixed_precision.py:
    bf16_with_mxfp8_mixed lines 242-253, fp8_param_gather and reuse_grad_buf_for_mxfp8_param_ag
    True; bf16_with_fp8_current_scaling_mixed line 289; bf16_with_nvfp4_mixed line 402: False)."""
    return (0.0 if t.fp8_params else ELEM) + quantized_copies(t)


def shard_bytes(t) -> float:
    """Bytes per parameter of ZeRO 3's shard of a weight: BF16, or its rowwise quantized copy
    with ``training.fp8_params``."""
    return QUANTIZED[t.precision] if t.fp8_params else ELEM


def activations(ctx, stage: int) -> float:
    """Stored activations of the micro-batches in flight (MTP depths are layers of the last
    chunk), plus the fp32 logits on the last stage."""
    t, pl = ctx.scenario.training, ctx.scenario.parallel
    per_layer = activation_bytes_per_layer(ctx.dims, ctx.shard.tokens // t.micro_batch, t.micro_batch, pl.tp,
                                           pl.sequence_parallel, t.recompute, t.flash_attention, ctx.shard.fp8)
    chunks, last = held_stages(ctx, stage), len(ctx.stage_layers) - 1
    layers = sum(len(block_ids(ctx, vs)) for vs in chunks) / len(chunks)
    costs = pp.pass_costs(ctx)
    flight = pp.peak_in_flight(pl.schedule, pl.pp, pl.virtual_stages, ctx.micro_batches, stage, pl.ep_comm_overlap,
                               costs)
    if pl.schedule in zb.ZERO_BUBBLE:  # after its input gradient a chunk holds what its W reads
        share = w_share(ctx.dims, ctx.shard.tokens, ctx.shard.tp, ctx.shard.sp, per_layer)
        flight = zb.held_peak(pl.schedule, pl.pp, ctx.micro_batches, stage, costs, share)
    total = per_layer * layers * flight
    if t.recompute is Recompute.FULL:  # one layer's full activations live during its recompute
        total += activation_bytes_per_layer(ctx.dims, ctx.shard.tokens // t.micro_batch, t.micro_batch, pl.tp,
                                            pl.sequence_parallel, "none", t.flash_attention, ctx.shard.fp8)
    if last in chunks:  # fp32 logits of one micro-batch, and of each MTP depth
        total += 4 * ctx.shard.tokens * ctx.dims.v / pl.tp * (1 + ctx.dims.mtp)
    return total


def w_share(d, tokens: float, tp: int, sp: bool, per_layer: float) -> float:
    """What a chunk waiting for its W holds, relative to its whole activations (at most 1;
    to three decimals, so that schedules' peaks are computed once per value)."""
    need = weight_grad_bytes(d, tokens, tp, sp)
    return min(1.0, round(need / per_layer, 3)) if per_layer else 1.0


def weight_grad_inputs(ctx) -> float:
    """:func:`weight_grad_bytes` of the context's micro-batch shard."""
    return weight_grad_bytes(ctx.dims, ctx.shard.tokens, ctx.shard.tp, ctx.shard.sp)


def weight_grad_bytes(d, tokens: float, tp: int, sp: bool) -> float:
    """Bytes per layer and micro-batch a deferred W pass reads (the wgrad GEMM is
    input^T x output-gradient; Qi et al. 2024, section 2): the four linear layers' saved
    inputs (QKV's and FC1's sequence-sharded under SP, Megatron re-gathers them for the
    wgrad) and their output gradients (QKV and FC1 outputs tp-sharded, the row-parallel
    projections' gradients h wide)."""
    inputs = 2 * d.h / (tp if sp else 1) + (d.h + d.f) / tp
    grads = 2 * d.h + (3 * d.h + (d.mats - 1) * d.f) / tp
    return ELEM * tokens * (inputs + grads)


def gathered(ctx, stage: int) -> float:
    """FSDP: the full weights and gradients of the two layers in use (current + prefetched),
    plus their FP8 copies (weight and transpose) under FP8. Without resharding after the
    forward (``parallel.reshard_after_forward = false``, sim/parallel/fsdp.py) every layer the
    rank holds stays gathered from its forward to its backward (weights and FP8 copies of all
    of them), and under PP the unsharded gradients of all of them too (accumulated until the
    last micro-batch's backward); without PP two layers' gradients, as above. With
    ``parallel.grad_reduce_in_fp32`` the gradients kept are fp32 (sim/parallel/fsdp.py), plus
    the bf16 one autograd writes for the layer in its backward."""
    p = ctx.scenario.parallel
    if p.zero < 3:
        return 0.0
    ids = [l for vs in held_stages(ctx, stage) for l in stage_layer_ids(ctx, vs)]
    sizes = [sum(layer_params(ctx, l)) for l in ids]
    weight, grad = weight_bytes(ctx.scenario.training), grad_bytes(p)
    fresh = max(sizes) * ELEM if grad != ELEM else 0.0  # (fp32: the bf16 gradient before its add)
    if reshards(p):
        return 2 * max(sizes) * (weight + grad) + fresh
    return sum(sizes) * weight + (sum(sizes) if p.pp > 1 else 2 * max(sizes)) * grad + fresh


def peak_memory(ctx) -> Memory:
    """The fullest stage's memory."""
    return max((stage_memory(ctx, s) for s in range(ctx.layout.sizes[Category.PP])), key=lambda m: m.total)
