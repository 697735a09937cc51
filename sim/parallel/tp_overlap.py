"""TP communication overlap: Megatron's ``--tp-comm-overlap`` (TransformerEngine userbuffers).

With sequence parallelism every TE linear layer of a transformer layer pipelines its TP
collective with chunks of its GEMM, as TransformerEngine does (transformer_engine/common/
comm_gemm_overlap/comm_gemm_overlap.cpp; the method per GEMM is TE's default in
transformer_engine/pytorch/module/base.py ``initialize_ub``, which NVIDIA's H100 recipes
keep, nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py):

- all-gather + GEMM (qkv_fprop, fc1_fprop, and in backward proj_dgrad, fc2_dgrad):
  **ring exchange** (``split_overlap_ag`` of CommOverlapP2PBase). The gathered input is
  tp chunks of tokens/tp; GEMM chunk 0 runs on the local shard while it is sent to the
  next rank; chunk i waits for the chunk received in step i-1; tp-1 point-to-point
  steps in all. Copy-engine sends: no SMs taken from the GEMM.
- GEMM + reduce-scatter (proj_fprop, fc2_fprop): **pipelined** (``split_overlap_rs`` of
  CommOverlapBase): the GEMM in :data:`RS_SPLITS` token chunks, chunk i's partial sums
  reduce-scattered while chunk i+1 computes; the last chunk's reduce-scatter is exposed.
  Its reduce kernels run on :data:`COMM_SM_SHARE` of the SMs, which cuBLAS leaves free
  (``set_sm_margin``), so these GEMM chunks are slower by 1 / (1 - COMM_SM_SHARE).
- backward of the column-parallel GEMMs (qkv_dgrad/wgrad, fc1_dgrad/wgrad): **bulk**
  overlaps: the all-gather of the saved sequence-sharded input (needed by the wgrad)
  runs beside the dgrad GEMM, and the reduce-scatter of the dgrad output beside the wgrad
  GEMM (:func:`.tp.split_backward`, which Megatron runs with async NCCL even without
  userbuffers). (Bulk comm kernels share SMs without a margin; not modelled.)

What stays exposed emerges from streams and dependencies: the last reduce-scatter
chunk, plus any chunk whose communication outlasts its GEMM. The MoE MLP (its TP traffic
lives in the token dispatcher), the embedding and the output layer keep plain
collectives, as in Megatron.

How a sublayer's kernels are split (the roles of :mod:`sim.model.layers`, ``Kernel.tp``):
the kernels before the first column-parallel one run on the local shard before the
gather (the norm; MLA's down projections and latent norms); the column-parallel run
(GEMMs and their FP8 casts) consumes the gathered input; the row-parallel run produces
the partial sums that are reduce-scattered; the kernels after it (dropout, residual)
follow the reduce-scatter. A token chunk of a GEMM is
1/chunks of its work at the whole GEMM's efficiency, one launch each: TE issues
consecutive chunks on up to three compute streams (``_stream_compute[i % size]``,
NVTE_COMM_OVERLAP_MAX_STREAMS = 3), where independent chunks fill each other's tail
waves, so the GPU sees the whole GEMM's tiles. (Timing each chunk as a GEMM of
tokens/chunks rows on its own would cost GPT-3 175B at tp 4 about 5% of its compute.)

The host: one Python-level GEMM is ONE C++ call that issues all its chunks and exchanges
(TransformerEngine v2.9 comm_gemm_overlap.cpp ``split_overlap_ag`` / ``split_overlap_rs``, called once
from transformer_engine/pytorch/cpp_extensions/gemm.py ``general_gemm``): the first chunk pays the
eager GEMM launch, every later chunk a library launch (:func:`sim.model.host.ub_chunk_issue_s`), each
exchange its CUDA calls (:data:`sim.model.host.UB_RING_STEP_S`, :data:`~sim.model.host.UB_RS_STEP_S`), no
c10d call. MXFP8 (TE recipe) adds what TE v2.9 runs around userbuffers (:func:`mx_scale_gather`).

Run ``clustersim run SCENARIO --set parallel.tp_comm_overlap=true`` (needs SP, tp > 1).
"""

from ..collectives.kinds import ALL_GATHER, REDUCE_SCATTER, RING_SHIFT
from ..input.choices import Precision, Recipe
from ..model import host
from ..model.layers import Direction, backward as backward_of
from . import tp
from .tp import compute_op as _compute, half as _half, roles, split_backward, sublayer_bytes
from ..engine.kinds import Category
from ..hardware.gpus import H100_SMS

AXIS = Category.TP
RS_SPLITS = 4  # GEMM chunks of a pipelined reduce-scatter: TE initialize_ub default num_splits=4
# SMs the pipelined reduce-scatter's kernels take from the GEMM: TE initialize_ub's default
# num_sm=16 for "pipeline" (NeMo's H100 configs use 8-24), with set_sm_margin cuBLAS runs on
# the rest; of the 132 SMs of an H100 SXM (NVIDIA H100 whitepaper). One constant for every GPU.
COMM_SM_SHARE = 16 / H100_SMS
MX_BLOCK = 32  # elements per MXFP8 block scale (one E8M0 byte): OCP MX v1.0, TE MXFP8Quantizer


def _ub(b, seconds: float) -> float | None:
    """``seconds`` where Transformer Engine's userbuffers issue the chunks from one C++ call (Megatron-Core,
    NeMo: no ``training.compile``); None (each chunk and exchange an eager call, as issued from Python)
    under torch.compile: torchtitan's async TP (torch/distributed/_symmetric_memory
    ``_pipelined_all_gather_and_consume`` loops over the chunks in Python; not measured)."""
    return None if b.compiled else seconds


def _chunk(kernel, chunks: int):
    """One of ``chunks`` token chunks of a GEMM (see the module docstring)."""
    return kernel._replace(flops=kernel.flops / chunks, bytes=kernel.bytes / chunks)


def ring_gather(b, sub: str, name: str, chunk_kernels, deps, layer, mb, tag, entry: bool, weights: bool = True) -> int:
    """All-gather by ring exchange, GEMM chunk i after the arrival of chunk i (``weights``:
    :meth:`sim.parallel.program.RankBuilder.compute`'s)."""
    tp = b.ctx.layout.sizes[Category.TP]
    nbytes = sublayer_bytes(b, sub, True, entry) / tp
    shift, x = None, deps
    for i in range(tp):
        nxt = None
        if i < tp - 1:
            nxt = b.collective(f"{sub}_ag", AXIS, RING_SHIFT, b.group(AXIS), nbytes, deps if shift is None else shift,
                               layer=layer, mb=mb, tag=tag + ("ring", i), group_of=b.group_of(AXIS),
                               issue=_ub(b, host.UB_RING_STEP_S))
        x = b.compute(name, chunk_kernels, x if shift is None else (x, shift), layer, mb, weights=weights,
                      linears=i == 0, issue=None if i == 0 else _ub(b, host.ub_chunk_issue_s(chunk_kernels)))
        shift = nxt
    return x


def pipelined_scatter(b, sub: str, name: str, chunk_kernels, deps, layer, mb, tag) -> tuple:
    """GEMM in RS_SPLITS chunks on the SMs the reduce kernels leave; each chunk's partial
    sums reduce-scattered while the next computes. Returns the reduce-scatters."""
    slowed = tuple(k._replace(flops=k.flops / (1 - COMM_SM_SHARE)) for k in chunk_kernels)
    nbytes, x, done = sublayer_bytes(b, sub, False, False) / RS_SPLITS, deps, []
    for i in range(RS_SPLITS):
        x = b.compute(name, slowed, x, layer, mb, linears=i == 0,
                      issue=None if i == 0 else _ub(b, host.ub_chunk_issue_s(slowed)))
        done.append(b.collective(f"{sub}_rs", AXIS, REDUCE_SCATTER, b.group(AXIS), nbytes, x, layer=layer, mb=mb,
                                 tag=tag + ("pipe", i), group_of=b.group_of(AXIS), issue=_ub(b, host.UB_RS_STEP_S)))
    return tuple(done)


def mx_userbuffers(b) -> bool:
    """Whether the linears run MXFP8 under Transformer Engine (what :func:`mx_scale_gather` adds)."""
    sh = b.ctx.shard
    return sh.fp8 and sh.quant is Precision.MXFP8 and sh.recipe is Recipe.TE


def mx_scale_gather(b, sub: str, nbytes: float, deps, layer, mb, tag) -> int:
    """MXFP8 under userbuffers: TE v2.9 transformer_engine/pytorch/module/base.py
    ``fill_userbuffers_buffer_for_all_gather`` copies the MXFP8 data into the userbuffer, then runs a
    blocking ``torch.distributed.all_gather_into_tensor`` of the block scales (one byte per
    :data:`MX_BLOCK` of the ``nbytes`` gathered) on the TP group; the GEMM waits for it. A c10d call."""
    return b.collective(f"{sub}_mx_scales", AXIS, ALL_GATHER, b.group(AXIS), nbytes / MX_BLOCK, deps, layer=layer,
                        mb=mb, tag=tag + ("mx_scales",), group_of=b.group_of(AXIS))


def mx_grad_regather(b, sub: str, deps, layer, mb) -> int:
    """MXFP8 row-parallel backward under userbuffers (TE v2.9 module/linear.py ``_Linear.backward``, "UB
    does not support pipelined overlapping grad output all-gather with wgrad GEMM ... we can't convert
    row-scaled MXFP8 to column-scaled"): the output gradient is gathered a second time, columnwise, for
    the wgrad: its scales by :func:`mx_scale_gather`, its data by ``tex.bulk_overlap_ag_with_external_gemm``
    on the dgrad's send / recv streams beside the dgrad chunks. Returns the gather the wgrad waits for."""
    nbytes, tp_size = sublayer_bytes(b, sub, True, False), b.ctx.layout.sizes[Category.TP]
    scales = mx_scale_gather(b, sub + "_grad_wgrad", nbytes, deps, layer, mb, (Direction.BWD,))
    return b.collective(f"{sub}_grad_wgrad_ag", AXIS, ALL_GATHER, b.group(AXIS), nbytes, scales, layer=layer, mb=mb,
                        tag=(Direction.BWD, "mx_wgrad"), group_of=b.group_of(AXIS),
                        issue=host.ub_bulk_gather_issue_s(tp_size))


def forward_sublayer(b, sub: str, name: str, kernels_fn, layer, mb, deps, tag: str, gather: bool = False,
                     scatter: bool = False):
    """:func:`.tp.forward_sublayer` with its all-gather and/or reduce-scatter overlapped."""
    kernels = kernels_fn(b.ctx.dims, b.ctx.shard)
    r = roles(kernels, gather, scatter)
    x = deps
    if gather:
        x = _compute(b, name, kernels[r.head], x, layer, mb)
        if r.consumers.stop > r.consumers.start:
            tp_size = b.ctx.layout.sizes[Category.TP]
            if mx_userbuffers(b):
                x = mx_scale_gather(b, sub, sublayer_bytes(b, sub, True, True), x, layer, mb, (tag,))
            x = ring_gather(b, sub, name, [_chunk(k, tp_size) for k in kernels[r.consumers]], x, layer, mb, (tag,),
                            entry=True)
        else:
            x = tp.enter(b, sub, layer, mb, x, (tag,), sublayer_bytes(b, sub, True, True))
    x = _compute(b, name, kernels[r.middle], x, layer, mb)
    if scatter:
        if r.producer.stop == r.producer.start:
            return tp.exit(b, sub, layer, mb, x, (tag,), sublayer_bytes(b, sub, False, False))
        chunks = [_chunk(k, RS_SPLITS) for k in kernels[r.producer]]
        x = pipelined_scatter(b, sub, name, chunks, x, layer, mb, (tag,))
    return _compute(b, name, kernels[r.tail], x, layer, mb)


def backward_sublayer(b, sub: str, name: str, kernels_fn, layer, mb, deps, gathered: bool = False,
                      scattered: bool = False):
    """The backward of :func:`forward_sublayer`: ring-exchange all-gather of the output
    gradient under the producer's dgrad chunks; bulk input all-gather beside the
    consumers' dgrad, bulk reduce-scatter of the input gradient beside their wgrad."""
    kernels = kernels_fn(b.ctx.dims, b.ctx.shard)
    r = roles(kernels, gathered, scattered)
    x = deps
    if scattered:
        x = _compute(b, name, backward_of(kernels[r.tail]), x, layer, mb)
        if r.producer.stop == r.producer.start:
            x = tp.enter_backward(b, sub, layer, mb, x, sublayer_bytes(b, sub, True, False))
        else:
            dgrad = [_chunk(_half(k), b.ctx.layout.sizes[Category.TP]) for k in kernels[r.producer]]
            regather = None
            if mx_userbuffers(b):
                regather = mx_grad_regather(b, sub, x, layer, mb)
                x = mx_scale_gather(b, sub + "_grad", sublayer_bytes(b, sub, True, False), x, layer, mb,
                                    (Direction.BWD,))
            x = ring_gather(b, sub + "_grad", name, dgrad, x, layer, mb, (Direction.BWD,), entry=False, weights=False)
            x = b.weight_grad(name, tuple(_half(k, True) for k in kernels[r.producer]), (x, regather), layer, mb)
    x = _compute(b, name, backward_of(kernels[r.middle]), x, layer, mb)
    if gathered and mx_userbuffers(b) and r.consumers.stop > r.consumers.start:  # the bulk input gather's scales
        x = mx_scale_gather(b, sub + "_input", sublayer_bytes(b, sub, True, True), x, layer, mb, (Direction.BWD,))
    return split_backward(b, sub, name, kernels, r, x, layer, mb) if gathered else \
        _compute(b, name, backward_of(kernels[r.head]), x, layer, mb)
