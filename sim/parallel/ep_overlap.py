"""EP all-to-all overlap (``parallel.ep_comm_overlap``): the MoE dispatch and combine of
one micro-batch run under another micro-batch's compute.

Megatron-Core's ``--overlap-moe-expert-parallel-comm`` (combined 1F1B; the idea of
DeepSeek-V3's DualPipe, arXiv 2412.19437 section 3.2.1): in the 1F1B steady state each
forward is merged with the backward it would otherwise follow, layer by layer
(megatron/core/models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.run``
and ``TransformerModelChunkSchedulePlan.run``). For a pair (forward layer i, backward layer
j) the pieces of :mod:`.passes` are issued in the order

    comm stream:  combine_bwd      | dispatch_fwd, dispatch_bwd      | combine_fwd
    compute:      attention_fwd    | mlp_bwd, ..., mlp_fwd           | attention_bwd

so each all-to-all runs while the other micro-batch computes. Here that is just program
order: the all-to-alls sit on the ``ep`` stream, compute on ``compute``, and what stays
exposed emerges from the dependencies. (The router's backward runs in this simulator's
combine_bwd piece, before its all-to-all; it is one small GEMM.)

Warm-up and cool-down: :func:`sim.parallel.pp.steps` adds one warm-up forward (as
Megatron does) so every paired forward is independent of its backward; the warm-up
forwards and cool-down backwards run alone, with their all-to-alls exposed. With pp = 1
the first forward and the last backward run alone, every other forward with the previous
micro-batch's backward. Within a pair, the embedding forward and the loss backward come
first, unpaired layers (chunks of unequal length) after the pairs, then the output layer
forward and the embedding backward. One more micro-batch's activations stay in flight
(:mod:`.memory` counts the same schedule).
"""

from ..model.layer_ids import is_block, is_embedding, is_output
from .pp_zero_bubble import Kind

# (pass, piece) issue order of one forward/backward layer pair (model_chunk_schedule_plan.py)
F, B = Kind.F, Kind.B
PAIR_ORDER = ((B, 0), (F, 0), (B, 1), (F, 1), (B, 2), (F, 2), (F, 3), (B, 3))


def interleave(fwd, bwd) -> None:
    """Run a forward :class:`~.passes.Pass` and a backward one as one combined step."""
    d = fwd.b.ctx.dims
    f_mid = [l for l in fwd.layers if is_block(d, l)]
    b_mid = [l for l in bwd.layers if is_block(d, l)]
    fwd.run([l for l in fwd.layers if is_embedding(l)])
    bwd.run([l for l in bwd.layers if is_output(d, l)])
    fwd.b.paired = True  # (each all-to-all of a pair runs beside the other micro-batch's compute: ep.dedup)
    for f_layer, b_layer in zip(f_mid, b_mid):
        pieces = {F: fwd.pieces(f_layer), B: bwd.pieces(b_layer)}
        for direction, i in PAIR_ORDER:
            pieces[direction][i]()
    fwd.b.paired = False
    paired = min(len(f_mid), len(b_mid))
    bwd.run(b_mid[paired:])
    fwd.run(f_mid[paired:])
    fwd.run([l for l in fwd.layers if is_output(d, l)])
    bwd.run([l for l in bwd.layers if is_embedding(l)])
