"""ZeRO-3 / FSDP (Rajbhandari et al. 2020; PyTorch FSDP, Zhao et al. 2023; FSDP2 as
torchtitan applies it).

Every rank keeps 1/N of each layer's parameters. Before a layer's forward, and again
before its backward, the layer is all-gathered and discarded after use; after its
backward the gradients are reduce-scattered (once per step, on the last micro-batch).
Weights do not depend on the previous layer, so the next layer's all-gather is issued
while the current layer computes (prefetch): the gather of layer l waits only for the
compute of layer l-2 to finish, which bounds memory to two gathered layers. Per step
each rank sends 3x its parameter bytes (the seeds' 50% over DP's 2x).

``parallel.reshard_after_forward`` (FSDP2 ``fully_shard(reshard_after_forward=...)``): true
frees a layer's gathered parameters after its forward, so the backward gathers them again
(above); false keeps them from the forward to the backward: no backward all-gather, more
memory (:func:`sim.parallel.memory.gathered`). Under pipeline parallelism the pipelining
schedule also keeps them (and the unsharded gradients) across micro-batches until the last
backward (torch.distributed.pipelining stage: ``set_reshard_after_backward`` and
``set_requires_gradient_sync`` only on the last backward), so each layer is gathered once
per step. Default: torchtitan's "default" policy, ``reshard_after_forward = not pp_enabled``
(torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``).

HSDP (``parallel.dp_shard`` < dp; torchtitan ``data_parallel_shard_degree`` with
``data_parallel_replicate_degree`` = dp / dp_shard): gathers and reduce-scatters run within
the rank's shard group, and each reduce-scattered shard (1/dp_shard of the layer's
gradients) is then all-reduced across the dp / dp_shard replicas (FSDP2 on a 2-D mesh:
reduce-scatter over the shard dim, all-reduce over the replicate dim).

``parallel.grad_reduce_in_fp32`` (FSDP2 ``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)``, as the Llama 3 paper states Meta ran it: Sec. 3.3.2 "Numerical
stability", "FP32 gradient accumulation during backward computation over multiple micro-batches
and also reduce-scatter gradients in FP32 across data parallel workers in FSDP"): the
reduce-scatter (and HSDP's all-reduce) moves fp32 gradients (:func:`.dp.grad_bytes`, the
width Megatron's fp32 buffer has under zero 0-2); and with several micro-batches the unsharded gradients are accumulated in fp32 by
kernels of their own, after each layer's backward on the compute stream (pytorch/pytorch
002a76fb, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``;
_fsdp_param.py ``to_accumulated_grad_if_needed``, ``accumulate_unsharded_grad_if_needed``; added
by PR #125191, 2024-04-29, "for microbatching use cases (e.g. PP) ... accumulate the unsharded
gradients in fp32 across microbatches until reduce-scattering in fp32 upon the last
microbatch"): autograd writes each micro-batch's bf16 weight gradient; on the first micro-batch
it is cast to a new fp32 buffer (:data:`CAST_BYTES` a parameter), on every later one added to it
(:data:`ADD_BYTES`: read fp32 and bf16, write fp32). Plain PyTorch's weight-gradient GEMM cannot
write into an fp32 buffer (Megatron's ``gradient_accumulation_fusion`` does, through APEX's
``fused_weight_gradient_mlp_cuda`` or Transformer Engine's ``fuse_wgrad_accumulation``, which
the zero 0-2 path assumes: no kernel of its own), so these are memory-bound kernels, one per
parameter tensor (:func:`accumulation`). With one micro-batch nothing is accumulated.
"""

from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from ..model.compute import elementwise
from ..model.layer_ids import is_block
from ..model.layers import Direction
from .dp import FP32_GRAD_BYTES, grad_bytes
from .params import layer_params
from ..engine.kinds import Category, StreamName

AXIS = Category.DP
PARAM_BYTES = 2  # bf16 weights and gradients on the wire
CAST_BYTES = PARAM_BYTES + FP32_GRAD_BYTES  # first micro-batch: bf16 gradient read, fp32 copy written
ADD_BYTES = FP32_GRAD_BYTES + PARAM_BYTES + FP32_GRAD_BYTES  # later ones: fp32 += bf16, in place
BLOCK_NORMS, ATTENTION_MATRICES = 2, 4  # a block's tensors (torchtitan Llama: attention_norm, ffn_norm; wq wk wv wo)


def enabled(b) -> bool:
    """ZeRO stage 3 with more than one data-parallel rank."""
    return b.ctx.scenario.parallel.zero == 3 and len(grad_group(b)) > 1


def grad_group(b) -> tuple[int, ...]:
    """The ranks sharding the same parameters (HSDP: the shard group)."""
    return b.ctx.layout.shard_group(b.rank)


def _group_of(b):
    return b.ctx.layout.shard_group


def reshards(p) -> bool:
    """``parallel.reshard_after_forward`` with torchtitan's default (true without PP)."""
    return p.reshard_after_forward if p.reshard_after_forward is not None else p.pp == 1


def layer_bytes(b, layer: int, width: int = PARAM_BYTES) -> float:
    """Bytes of one layer's (tp-sharded) parameters at ``width`` bytes each (bf16 by default);
    layer -1 is the embedding, layer ``layers`` the output layer."""
    dense, expert = layer_params(b.ctx, layer)
    return (dense + expert) * width


class Gatherer:
    """Issues the per-layer all-gathers of one pass with one-layer-ahead prefetch."""

    def __init__(self, b, layers: list[int], mb: int, direction: Direction):
        self.b, self.layers, self.mb, self.direction = b, layers, mb, direction
        self.gathers: dict[int, int] = {}
        self.computed: dict[int, int] = {}

    def before(self, layer: int) -> int | None:
        """The all-gather op the first compute of ``layer`` must wait for."""
        if not enabled(self.b) or not self._gathers():
            return None
        depth = 1 if self.b.ctx.scenario.training.fsdp_prefetch else 0
        pos = self.layers.index(layer)
        for ahead in self.layers[pos:pos + depth + 1]:
            if ahead not in self.gathers:
                self.gathers[ahead] = self._gather(ahead)
        return self.gathers[layer]

    def _gathers(self) -> bool:
        """Whether this pass gathers at all: not a backward whose forward kept the layers
        (no reshard after forward), nor, under PP, a forward after the first micro-batch's."""
        p = self.b.ctx.scenario.parallel
        if reshards(p):
            return True
        return self.direction is Direction.FWD and (p.pp == 1 or self.mb == 0)

    def _gather(self, layer: int) -> int:
        pos = self.layers.index(layer)
        depth = 1 if self.b.ctx.scenario.training.fsdp_prefetch else 0
        behind = self.layers[pos - depth - 1] if pos - depth - 1 >= 0 else None
        deps = self.computed.get(behind) if behind is not None else None
        return self.b.collective(f"fsdp_ag_{self.direction}", AXIS, ALL_GATHER, grad_group(self.b),
                                 layer_bytes(self.b, layer), deps, stream=StreamName.DP, layer=layer, mb=self.mb,
                                 algo=self.b.ctx.scenario.parallel.dp_algo, group_of=_group_of(self.b))

    def after(self, layer: int, last_op: int) -> None:
        """Record that ``layer`` finished computing (frees its buffer for the next gather)."""
        self.computed[layer] = last_op


def reduce_scatter(b, layer: int, mb: int, deps) -> int | None:
    """Reduce-scatter a layer's gradients after its backward (last micro-batch only)."""
    if not enabled(b):
        return None
    p = b.ctx.scenario.parallel
    group, algo, nbytes = grad_group(b), p.dp_algo, layer_bytes(b, layer, grad_bytes(p))
    op = b.collective("fsdp_rs", AXIS, REDUCE_SCATTER, group, nbytes, deps,
                      stream=StreamName.DP_RS, layer=layer, mb=mb, algo=algo, group_of=_group_of(b))
    replicas = b.ctx.layout.replica_group(b.rank)
    if len(replicas) == 1:
        return op
    return b.collective("hsdp_ar", AXIS, ALL_REDUCE, replicas, nbytes / len(group), op,
                        stream=StreamName.DP_RS, layer=layer, mb=mb, algo=algo, group_of=b.ctx.layout.replica_group)


def accumulation(d, layer: int, params: float, first: bool) -> list:
    """The kernels accumulating ``layer``'s unsharded gradients (``params`` of them) in fp32
    after one micro-batch's backward (module docstring): the cast on the ``first`` micro-batch,
    the add on later ones; one launch per parameter tensor (FSDP2 casts and adds parameter by
    parameter): a block's norms, attention matrices and MLP matrices, the embedding's or the
    output layer's one matrix."""
    tensors = BLOCK_NORMS + ATTENTION_MATRICES + d.mats if is_block(d, layer) else 1
    return [elementwise((CAST_BYTES if first else ADD_BYTES) * params, tensors)]


def accumulate(b, layer: int, mb: int, deps) -> int | None:
    """Accumulate ``layer``'s gradients of micro-batch ``mb`` in fp32 (FSDP2 ``reduce_dtype =
    float32`` with several micro-batches; None otherwise); the reduce-scatter reads the sum."""
    if not (enabled(b) and b.ctx.scenario.parallel.grad_reduce_in_fp32 and b.ctx.micro_batches > 1):
        return None
    dense, expert = layer_params(b.ctx, layer)
    return b.compute("fsdp_grad_acc", accumulation(b.ctx.dims, layer, dense + expert, mb == 0), deps, layer, mb)


def accumulation_s(compute, p, d, layer: int, params: float, micro: int) -> float:
    """Seconds a micro-batch spends, averaged over ``micro`` of them, accumulating the
    gradients of ``layer`` (``params`` of them) under parallel settings ``p``: the kernels
    :func:`accumulate` issues (the cast once, the add on the others), timed by ``compute``; 0
    without fp32 gradients or with one micro-batch. The planner's estimate reads it."""
    if not p.grad_reduce_in_fp32 or micro <= 1:
        return 0.0
    cast, add = (compute.time(accumulation(d, layer, params, first)) for first in (True, False))
    return (cast + (micro - 1) * add) / micro
