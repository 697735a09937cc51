"""Context parallelism with the K/V all-gathered before a local attention (``parallel.cp_impl =
"all_gather"``): what Llama 3 trained its long-context stage with.

The Llama 3 paper (Llama Team, arXiv 2407.21783 v3, Sec. 3.3.2, "Context parallelism for long
sequences"): the sequence is cut into 2 x cp chunks, rank r holding chunks r and 2cp - 1 - r
(load balance under the causal mask); unlike a ring, "we first all-gather the key (K) and value
(V) tensors, and then compute attention output for the local query (Q) tensor chunk", the
all-gather "exposed in the critical path", kept because it supports any mask (the document mask)
and because under GQA K and V are small beside Q. Meta's code is not public; Transformer Engine
implements the same scheme and cites the paper for it (NVIDIA/TransformerEngine 304078568,
2024-08-16, transformer_engine/pytorch/attention.py ``AttnFuncWithCPAndKVAllGather``:
"KV all-gather between CP ranks is exposed. Refer section 3.3.2 of The Llama 3 Herd of
Models"; Megatron-Core's ``--cp-comm-type all_gather``). What it runs, per layer and micro-batch:

- forward: K and V all-gathered over the CP group (``gather_along_first_dim``, waited before the
  attention); for each of the two local query chunks, the gathered K/V up to the chunk's end
  copied out (``torch.index_select``) and one causal attention call (bottom-right aligned: chunk
  c's queries see c x s / 2cp keys before it plus their own triangle), on two streams; each
  chunk's output copied into ``out``.
- backward: K and V all-gathered again; ``dk``, ``dv`` zero-filled at the gathered size; per
  chunk the same copies, one backward call, ``dq`` copied out and ``dk``, ``dv`` added into the
  buffers (``index_add_``); then ``dk`` and ``dv`` reduce-scattered over the CP group (waited).

The two calls of a rank attend (r + 1/2) and (2cp - r - 1/2) chunks of keys on average: under
the flash curve ``e(k) = top k / (k + half)`` a call's time is linear in its keys, so the pair
costs what two calls of s / 2 keys each cost on every rank (charged so: the ranks stay alike,
and fold). Their FLOPs are the causal sequence's (:func:`sim.model.layers.attention_core` over
the whole sequence). Run: ``clustersim validate --rows l3-405-cp16-16384 --explain l3-405-cp16-16384``
(docs/context_parallel.md).
"""

from ..collectives.kinds import ALL_GATHER, REDUCE_SCATTER
from ..model.compute import Kernel, elementwise
from ..model.layers import ELEM, Direction, attention_core, backward
from ..engine.kinds import Category

AXIS = Category.CP
CALLS = 2  # query chunks per rank (r and 2cp - 1 - r), one attention call each


def sizes(b) -> tuple[float, float, float]:
    """(K/V elements of this rank's tokens, K/V elements the two calls copy out of the gathered
    ones, query-headed elements of q or out) on this rank, at its tp share of the heads."""
    d, sh = b.ctx.dims, b.ctx.shard
    cp = b.ctx.layout.sizes[Category.CP]
    kv = sh.tokens * d.kv_width / sh.tp
    prefixes = kv * (2 * cp + 1) / 2  # chunks r + 1 and 2cp - r: (2cp + 1) of the 2cp chunks, half a rank's each
    return kv, prefixes, sh.tokens * d.a * d.dq / sh.tp


def calls(b) -> Kernel:
    """The two attention calls of a rank: the whole causal sequence's FLOPs, two launches."""
    core = attention_core(b.ctx.dims, b.ctx.shard)
    return core._replace(count=CALLS)


def _gathered(b, name: str, op, deps, layer: int, mb: int) -> int:
    """A collective of the gathered K/V's size over the CP group: the forward's and backward's
    all-gather of K and V, the backward's reduce-scatter of dK and dV."""
    kv, _, _ = sizes(b)
    cp = b.ctx.layout.sizes[Category.CP]
    return b.collective(name, AXIS, op, b.group(AXIS), cp * ELEM * kv, deps, layer=layer, mb=mb,
                        group_of=lambda r: b.ctx.layout.group(r, Category.CP))


def forward(b, layer: int, mb: int, deps, name: str) -> int:
    """All-gather K/V, copy each chunk's keys out, two causal calls, their outputs copied back."""
    _, prefixes, nq = sizes(b)
    gather = _gathered(b, f"cp_kv_allgather_{name}", ALL_GATHER, deps, layer, mb)
    copy = b.compute(f"cp_kv_copy_{name}", [elementwise(2 * ELEM * prefixes, CALLS)], (gather,), layer, mb)
    core = b.compute(f"attn_core_{name}", [calls(b)], (copy,), layer, mb)
    return b.compute(f"cp_out_copy_{name}", [elementwise(2 * ELEM * nq, CALLS)], (core,), layer, mb)


def backward_pass(b, layer: int, mb: int, deps, name: str) -> int:
    """All-gather K/V again, two backward calls, dk/dv added at the gathered size and
    reduce-scattered."""
    kv, prefixes, nq = sizes(b)
    cp = b.ctx.layout.sizes[Category.CP]
    gather = _gathered(b, f"cp_kv_allgather_{name}", ALL_GATHER, deps, layer, mb)
    zero = b.compute(f"cp_dkv_zero_{name}", [elementwise(ELEM * cp * kv, 2)], deps, layer, mb)
    copy = b.compute(f"cp_kv_copy_{name}", [elementwise(2 * ELEM * prefixes, CALLS)], (gather,), layer, mb)
    core = b.compute(f"attn_core_{name}", list(backward([calls(b)])), (copy, zero), layer, mb)
    # dq copied into dq (read, write), dk and dv added into the buffers (read both, write)
    add = b.compute(f"cp_dkv_add_{name}", [elementwise(2 * ELEM * nq, CALLS), elementwise(3 * ELEM * prefixes, 2 * CALLS)],
                    (core,), layer, mb)
    return _gathered(b, f"cp_dkv_reducescatter_{name}", REDUCE_SCATTER, (add,), layer, mb)


def attention(b, layer: int, mb: int, deps, direction: Direction, name: str) -> int:
    """The attention core of one layer and micro-batch under the all-gather scheme."""
    run = forward if direction is Direction.FWD else backward_pass
    return run(b, layer, mb, deps, name)
