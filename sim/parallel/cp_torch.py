"""Context parallelism as PyTorch's experimental implementation runs it (torchtitan's CP).

torchtitan 9dec370 (the commit of its docs/performance.md tables) enters
``torch.distributed.tensor.experimental.context_parallel`` with
``set_rotate_method(job_config.experimental.context_parallel_rotate_method)``, default
``"allgather"`` (torchtitan/utils.py ``create_context_parallel_ctx``, config_manager.py).
PyTorch's torch/distributed/tensor/experimental/_attention.py (``_templated_ring_attention``
and ``_templated_ring_attention_backward``, the December 2024 version) then costs what a
Megatron / Transformer Engine ring (sim/parallel/cp.py) does not:

- K and V reach SDPA after torchtitan's ``repeat_kv`` (torchtitan/models/llama/model.py), so
  they carry the query heads, not the kv heads: every exchange moves ``heads / kv_heads``
  times a GQA ring's bytes.
- Forward: ``torch.cat([key.flatten(), value.flatten()])`` copies K and V; the
  ``_AllGatherRotater`` all-gathers them once, waited before the second chunk (the first
  chunk's SDPA is all it hides under). Each later chunk's out and logsumexp merge into an
  fp32 accumulator (``_SDPAMerger``, ``convert_to_f32=True``):
  ``out = out - sigmoid(block_lse - lse) * (out - block_out)``; ``results()`` casts it back.
- Backward: the same all-gather; dq, dk, dv accumulate in fp32 (``accum_dtype``); after
  every chunk the fp32 dk, dv travel to the next rank (``_RotateMethod.ALL_TO_ALL``:
  ``ft_c.permute_tensor``, a ring shift), the last one waited after the loop (exposed);
  then the accumulators are cast back to BF16.

Under torch.compile (torchtitan compiles each TransformerBlock with ``fullgraph=True``) a
step's merge is one fused kernel; eager, one kernel per operator. Bytes per element below;
``n`` is elements of one query-headed tensor (tokens x heads x head dim / tp). The merge of a
load-balanced chunk that updates half the queries (``partial``) is charged as a whole one
(its ``_partial_update`` copies the other half: 9 instead of 10 bytes an element fused).
The chunks' SDPA calls are timed by the attention backend's curve (torchtitan: "flash2", on
the H100 PyTorch's FA2 as measured; the row, its op-by-op step and what is still unexplained:
docs/context_parallel.md).
Run: ``clustersim validate --rows tt_h100_l8b_cp8_262k --explain tt_h100_l8b_cp8_262k``.
"""

from ..collectives.kinds import ALL_GATHER, RING_SHIFT
from ..model.compute import Kernel, elementwise
from ..model.layers import ELEM
from ..engine.kinds import Category

AXIS = Category.CP
F32 = 4  # bytes of the fp32 accumulators (convert_to_f32 = True)
# Fused (compiled) bytes per element: merge reads the fp32 accumulator and the BF16 chunk
# output, writes the accumulator; the final cast reads fp32, writes BF16.
MERGE_FUSED = F32 + ELEM + F32  # 10
CAST = F32 + ELEM  # 6
# Eager merge: out.to(f32) (2 + 4), out - block_out (4 + 4 + 4), sigmoid(...) * diff (4 + 4),
# out - that (4 + 4 + 4): 38 bytes an element in 4 kernels, plus 5 logsumexp kernels
# (to(f32), sub, sigmoid, sub, logsigmoid) over tokens x heads fp32 values (read 2, write 1).
MERGE_EAGER, MERGE_EAGER_KERNELS = CAST + 3 * F32 + 2 * F32 + 3 * F32, 4
LSE_KERNELS, LSE_BYTES = 5, 3 * F32


def sizes(b) -> tuple[float, float, float]:
    """(elements of q / k at query heads, of v / out, logsumexp values) on this rank."""
    d, sh = b.ctx.dims, b.ctx.shard
    return sh.tokens * d.a * d.dq / sh.tp, sh.tokens * d.a * d.dv / sh.tp, sh.tokens * d.a / sh.tp


def _cat(b, name, deps, layer, mb) -> int:
    """K and V copied into one buffer (``torch.cat([key.flatten(), value.flatten()])``)."""
    nq, nv, _ = sizes(b)
    return b.compute(f"cp_kv_cat_{name}", [elementwise(2 * ELEM * (nq + nv))], deps, layer, mb)


def _gather(b, name, deps, layer, mb):
    """K, V copied into one buffer and all-gathered over the cp ranks."""
    nq, nv, _ = sizes(b)
    cp = b.ctx.layout.sizes[Category.CP]
    cat = _cat(b, name, deps, layer, mb)
    return cat, b.collective(f"cp_kv_allgather_{name}", AXIS, ALL_GATHER, b.group(AXIS), cp * ELEM * (nq + nv), (cat,),
                             layer=layer, mb=mb, group_of=lambda r: b.ctx.layout.group(r, Category.CP))


def merge_kernels(b) -> list[Kernel]:
    """One chunk's out / logsumexp merge into the fp32 accumulator (_SDPAMerger.step)."""
    _, nv, nl = sizes(b)
    if not b.ctx.shard.eager:
        return [elementwise(MERGE_FUSED * nv + (ELEM + 2 * F32) * nl)]
    return [elementwise(MERGE_EAGER * nv, MERGE_EAGER_KERNELS), elementwise(LSE_KERNELS * LSE_BYTES * nl, LSE_KERNELS)]


def forward(b, kernels, layer, mb, deps, name):
    """The chunks' SDPA calls, merged in fp32, the K/V all-gathered once."""
    _, nv, nl = sizes(b)
    cp = b.ctx.layout.sizes[Category.CP]
    cat, gather = _gather(b, name, deps, layer, mb)
    last = b.compute(f"attn_core_{name}", kernels, (cat,), layer, mb)
    for step in range(1, cp):
        if b.ctx.shard.eager and step < cp - 1:  # next_kv = torch.cat(...) runs every step eagerly
            last = _cat(b, name, (last,), layer, mb)
        last = b.compute(f"attn_core_{name}", kernels, (last, gather), layer, mb)
        last = b.compute(f"cp_merge_{name}", merge_kernels(b), (last,), layer, mb)
    return b.compute(f"cp_merge_{name}", [elementwise(CAST * (nv + nl))], (last,), layer, mb)  # results()


def accumulate_kernels(b, first: bool) -> list[Kernel]:
    """dq, dk, dv of one chunk added into the fp32 accumulators (dk, dv: the received
    ones); eager also zero-fills them first and concatenates dk, dv for the send."""
    nq, nv, _ = sizes(b)
    add = MERGE_FUSED * (2 * nq + nv)
    if not b.ctx.shard.eager:
        return [elementwise(add)]
    zeros = [elementwise(F32 * (2 * nq + nv), 3)] if first else []
    return zeros + [elementwise(add, 3), elementwise(2 * F32 * (nq + nv))]


def backward(b, kernels, layer, mb, deps, name):
    """The chunks' SDPA backward calls, fp32 dk, dv passed round the ring after each."""
    nq, nv, _ = sizes(b)
    cp = b.ctx.layout.sizes[Category.CP]
    cat, gather = _gather(b, name, deps, layer, mb)
    last, shift = cat, None
    for step in range(cp):
        if b.ctx.shard.eager and 0 < step < cp - 1:
            last = _cat(b, name, (last,), layer, mb)
        last = b.compute(f"attn_core_{name}", kernels, (last,) if step == 0 else (last, gather), layer, mb)
        last = b.compute(f"cp_grad_acc_{name}", accumulate_kernels(b, step == 0),
                         (last,) if shift is None else (last, shift), layer, mb)
        shift = b.collective(f"cp_dkv_shift_{name}", AXIS, RING_SHIFT, b.group(AXIS), F32 * (nq + nv), (last,),
                             layer=layer, mb=mb, tag=(step,), group_of=lambda r: b.ctx.layout.group(r, Category.CP))
    return b.compute(f"cp_grad_acc_{name}", [elementwise(CAST * (2 * nq + nv), 1 if not b.ctx.shard.eager else 3)],
                     (last, shift), layer, mb)
