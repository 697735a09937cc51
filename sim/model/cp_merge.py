"""Transformer Engine's ring attention beyond its attention kernels: the packing, copies and merges.

Context parallelism's ring (``parallel.cp_impl = "ring"``: Megatron-Core runs Transformer Engine's
``AttnFuncWithCPAndKVP2P``) does more per layer than the cp attention kernels and the K/V shifts
(:mod:`sim.parallel.cp`). Read at TransformerEngine release_v2.9 (70f53666)
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, for a causal mask
on the load-balanced sequence (each rank holds chunks r and 2cp-1-r, split in two halves), BF16
attention, sbhd layout (Megatron's), on the rank whose steps after the first are all "upper-triangle"
(cp rank 0: its second query half against whole K/V; the other ranks copy K/V halves instead, fewer
bytes under GQA), Q, O, K+V the rank's BF16 query, output and key/value bytes (:func:`ring_bytes`):

forward (``AttnFuncWithCPAndKVP2P.forward``)
  - line 1360: ``torch.cat((k.view(-1), v.view(-1)))`` packs K and V into the send buffer: reads and
    writes K+V, one kernel;
  - each step after the first, line 670 (``cp_p2p_fwd_fused_attn``, "upper-triangle"):
    ``q_part.contiguous()`` of the second query half: Q/2 read, Q/2 written;
  - the softmax statistics: ``torch.clone`` of the first step's (line 1591), then one correction per
    later step (lines 1603 / 1615, ``flash_attn_fwd_[second_half_]softmax_lse_correction``): fp32,
    heads x tokens, one kernel each;
  - the output merge (lines 1643-1673): ``flash_attn_fwd_out_correction_init`` reads the first step's
    output and writes the merged one (2 O), each later step's correction reads its half-size partial
    output and reads and writes the merged half (1.5 O); each a ``jit_fuser`` function (torch.compile
    under NVTE_TORCH_COMPILE, transformer_engine/pytorch/jit.py line 37): one kernel each.

backward (``AttnFuncWithCPAndKVP2P.backward``)
  - line 1928: the second half of the softmax statistics made contiguous (one small kernel); line 2038:
    K and V copied into the (2, K+V) send buffer (K+V read and written);
  - each step before the last, line 925 (``cp_p2p_bwd_fused_attn``, "upper-triangle"): the second
    halves of q, out and dout made contiguous: three kernels, Q + 2 O bytes;
  - dq accumulated in the rank's buffer (lines 2289-2325): the first step copies its half (Q), a
    middle step adds into it (1.5 Q), the last step copies one half and adds the other (2.5 Q, two
    kernels);
  - dk, dv (lines 2393-2436): the first step copies both (2 (K+V), two kernels), a middle step adds
    (3 (K+V), two), the last step adds one half and copies the other of each (2.5 (K+V), four).

Every one is a memory-bound kernel at the HBM rate and one eager launch on the host, whatever
the precision of the linears: on a GPU fast enough that its layer's GPU time nears its host's
issue time (a Grace host, sim/hardware/gpus.py ``GRACE_HOST_ISSUE``), these launches are what the
low-precision layers wait for. Not modelled: TE's own Python around them (quantizer and ctx
bookkeeping without a kernel), the separate ``isend`` / ``irecv`` calls it makes on Blackwell
(line 1125: batched only below compute capability 10.0 at cp 2) and the last step's exposed dK/dV
return.
"""

from .compute import Kernel
from .layers import ELEM, Shard
from .transformer import Dims

LSE_BYTES = 4  # the softmax statistics are fp32 (one per head and token)


def ring_bytes(d: Dims, sh: Shard) -> tuple[float, float, float, float]:
    """(Q, O, K+V, lse) bytes of this rank's sequence chunk and tp share of the heads."""
    t, tp = sh.tokens, sh.tp
    return (ELEM * t * d.a * d.dq / tp, ELEM * t * d.a * d.dv / tp, ELEM * t * d.kv_width / tp,
            LSE_BYTES * t * d.a / tp)


def forward_step(d: Dims, sh: Shard, step: int, cp: int) -> tuple[Kernel, ...]:
    """The kernels TE runs around the attention kernel of ring step ``step`` (0..cp-1) in the forward:
    the pack before the first, the query half's copy before each later one, and after the last the
    merge of the statistics and the outputs (module docstring)."""
    q, o, kv, lse = ring_bytes(d, sh)
    out = []
    if step == 0:
        out.append(Kernel(bytes=2 * kv))  # torch.cat of K and V into the send buffer
    else:
        out.append(Kernel(bytes=q))  # q_part.contiguous(): Q/2 read, Q/2 written
    if step == cp - 1:  # the statistics: clone, cp - 1 corrections; the outputs: init, cp - 1 corrections
        out.append(Kernel(bytes=2 * lse + (cp - 1) * 3 * lse, count=cp))
        out.append(Kernel(bytes=2 * o + (cp - 1) * 1.5 * o, count=cp))
    return tuple(out)


def backward_step(d: Dims, sh: Shard, step: int, cp: int) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """(before, after) the attention backward kernel of ring step ``step``: the pack (first step) and
    the half copies (every step but the last) before it, dq, dk and dv accumulated after it."""
    q, o, kv, lse = ring_bytes(d, sh)
    before = []
    if step == 0:
        before += [Kernel(bytes=lse), Kernel(bytes=2 * kv)]  # lse second half; K, V into the send buffer
    last = step == cp - 1
    if not last:
        before.append(Kernel(bytes=q + 2 * o, count=3))  # q, out, dout second halves made contiguous
    if last:
        dq, dkv = Kernel(bytes=2.5 * q, count=2), Kernel(bytes=2.5 * kv, count=4)
    elif step == 0:
        dq, dkv = Kernel(bytes=q), Kernel(bytes=2 * kv, count=2)
    else:
        dq, dkv = Kernel(bytes=1.5 * q), Kernel(bytes=3 * kv, count=2)
    return tuple(before), (dq, dkv)
