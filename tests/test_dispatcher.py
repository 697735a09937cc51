"""Megatron-Core's token dispatcher as memory traffic (MoEAlltoAllTokenDispatcher, core_v0.12.0
token_dispatcher.py and moe_utils.py): permute before the all-to-all, a re-sort by local
expert around the experts when a rank holds more than one, and unpermute after the combine.

Closed forms are written here from the dispatcher's tensors (T tokens routed by the rank,
k copies each, h wide, bf16) and the roofline of sim/model/compute.py (HBM bandwidth x 0.8,
one launch per kernel); nothing is read back from the code under test.

Run: ``python -m pytest tests/test_dispatcher.py``
"""

import pytest

from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model import layers as L
from sim.model import moe_kernels as M
from sim.model import transformer as T
from sim.step import simulate

H100 = gpu_preset("h100-sxm")
HBM = 3350e9 * 0.8  # H100 SXM HBM3 3.35 TB/s at the streaming share
LAUNCH = 4e-6
MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 2048, "moe": {"experts": 16, "top_k": 2, "routing": "uniform", "expert_ffn_hidden": 512}}
SEQ = 2048


def dims():
    return T.dims(scenario_from_dict({"model": MOE, "training": {"seq_len": SEQ, "global_batch": 1},
                                      "cluster": {"gpus": 1}}).model)


def run(ep: int, overlap: bool = False):
    """dp 8 on one DGX H100, experts over ``ep`` of them (pp = 1: the overlap pairs each
    forward with the previous micro-batch's backward), Transformer Engine's fused permutation
    (its roofline is the closed form here; the unfused rate: tests/test_permute_fusion.py)."""
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": SEQ, "global_batch": 32},
        "cluster": {"topology": "dgx-h100", "gpus": 8},
        "parallel": {"dp": 8, "ep": ep, "ep_comm_overlap": overlap, "moe_permute_fusion": True}}))


def test_permute_and_unpermute_move_the_k_copies():
    d, t, h, k = dims(), 1000.0, MOE["hidden"], MOE["moe"]["top_k"]
    sh = L.Shard(tokens=t, seq=SEQ, micro=1, tp=1, sp=False, flash=True)
    permute = M.router(d, sh)[-1]
    assert permute.flops == 0 and permute.bytes == 2 * t * h * (1 + k)  # read T x h, write T x k x h
    assert L.backward([permute])[0].bytes == 2 * t * h * (1 + k)  # the same copies, reversed
    (unpermute,) = M.unpermute(d, t)
    assert unpermute.bytes == 2 * t * h * (k + 1)  # read k copies, write T x h
    # backward: read the output gradient, write k copies, read the forward copies (probs' gradient)
    assert L.backward([unpermute])[0].bytes == pytest.approx(2 * t * h * (1 + 2 * k), rel=1e-12)


def test_local_sort_only_with_more_than_one_local_expert():
    d, h = dims(), MOE["hidden"]
    sh = L.Shard(tokens=SEQ, seq=SEQ, micro=1, tp=1, sp=False, flash=True)
    one = M.experts(d, sh, (700.0,))
    two = M.experts(d, sh, (300.0, 400.0))
    assert all(k.flops for k in one[:1])  # the first kernel is the expert's FC1, no sort
    for sort in (two[0], two[-2]):  # before the experts, and back after (then dropout + residual)
        assert sort.flops == 0 and sort.bytes == 2 * 2 * 700.0 * h
    assert len(two) - len(one) == 2 + len(L.mlp(d, sh, 512, 300.0))


@pytest.mark.parametrize("overlap", [False, True])
def test_unpermute_follows_each_combine_on_the_stream_megatron_uses(overlap):
    """Its span is the roofline of its bytes; with ep_comm_overlap Megatron-Core runs it in
    the combine node on the communication stream."""
    result = run(8, overlap)
    sp = result.spans
    h, k, t = MOE["hidden"], MOE["moe"]["top_k"], SEQ
    mine = sp[sp["rank"] == 0]
    for direction, nbytes in (("fwd", 2 * t * h * (1 + k)), ("bwd", 2 * t * h * (1 + 2 * k))):
        un = mine[mine.name == f"unpermute_{direction}"]
        combine = mine[mine.name == f"a2a_combine_{direction}"]
        assert len(un) == len(combine) == MOE["layers"] * 4  # per MoE layer and micro-batch
        assert set(un.stream) == {"ep" if overlap else "compute"}
        dur = (un.end_s - un.start_s).to_numpy()
        assert dur == pytest.approx(LAUNCH * (1 if direction == "fwd" else 2) + nbytes / HBM, rel=1e-9)
        for (_, u), (_, c) in zip(un.sort_values("start_s").iterrows(), combine.sort_values("start_s").iterrows()):
            assert u.start_s >= c.end_s - 1e-15


def test_no_all_to_all_still_permutes():
    """ep = 1: no all-to-all, but the dispatcher still permutes and unpermutes."""
    sp = run(1).spans
    assert "a2a_combine_fwd" not in set(sp.name) and "unpermute_fwd" in set(sp.name)
