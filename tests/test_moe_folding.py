"""MoE parallel folding (``parallel.expert_tp``): expert layers get a mesh of their own.

Megatron-Core builds the expert groups with a second RankGenerator over the same ranks
(order tp-ep-dp-pp with sizes expert_tp, ep, expert_dp, pp): a rank's place is the
mixed-radix number (etp, ep, edp, pp), fastest first, and a group varies one digit. The
reference below computes exactly that, independently of sim/parallel/layout.py.

Closed forms for ep 32 over tp 2 x dp 16 (expert_tp 1, Qwen3-235B's layout): one
all-to-all group per pipeline stage holding all 32 ranks; each rank dispatches its own
sequence-parallel shard, (s/tp) * top_k * h * 2 bytes, and sends (ep-1)/ep of it; each
rank holds experts/ep whole experts and no expert gradient is reduced (expert_dp = 1).

Run: ``python -m pytest tests/test_moe_folding.py``
"""

import json
from pathlib import Path

import numpy as np
import pytest

import sim
from conftest import assert_input_error, clustersim, host_wait_share
from sim.input.load import scenario_from_dict
from sim.input.scenario import Parallel
from sim.parallel.layout import Layout
from sim.step import simulate

GOLDEN = Path(__file__).resolve().parent / "golden"
REPO = Path(__file__).resolve().parent.parent


def megatron_group(rank: int, sizes: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """Ranks whose mixed-radix digits (fastest first) equal ``rank``'s except digit ``axis``."""
    stride = int(np.prod(sizes[:axis]))
    base = rank - (rank // stride % sizes[axis]) * stride
    return tuple(base + i * stride for i in range(sizes[axis]))


@pytest.mark.parametrize("tp, dp, pp, ep, etp", [
    (2, 16, 2, 32, 1),  # Qwen3-235B: ep 32 spans tp 2 x dp 16
    (2, 16, 2, 8, 1),
    (2, 8, 1, 4, 2),  # expert_tp = tp: today's groups
    (1, 16, 2, 4, 2),  # expert_tp > tp
    (4, 4, 1, 4, 2),
])
def test_expert_groups_are_megatrons(tp, dp, pp, ep, etp):
    layout = Layout.from_parallel(Parallel(tp=tp, dp=dp, pp=pp, ep=ep, expert_tp=etp))
    sizes = (etp, ep, tp * dp // (etp * ep), pp)
    for rank in range(tp * dp * pp):
        assert layout.expert_tp_group(rank) == megatron_group(rank, sizes, 0)
        assert layout.ep_group(rank) == megatron_group(rank, sizes, 1)
        assert layout.expert_dp_group(rank) == megatron_group(rank, sizes, 2)
    if (tp, pp, ep) == (2, 2, 32):
        assert layout.ep_group(5) == tuple(range(32)) and layout.ep_group(40) == tuple(range(32, 64))


def test_default_expert_tp_keeps_the_unfolded_groups():
    for p in (Parallel(tp=2, dp=16, pp=2, ep=8), Parallel(tp=1, dp=16, ep=4), Parallel(tp=2, cp=2, dp=4, ep=4)):
        plain, explicit = Layout.from_parallel(p), Layout.from_parallel(p.model_copy(update={"expert_tp": p.tp}))
        world = plain.world
        for rank in range(world):
            dc = plain.group(rank, "cp", "dp")  # the unfolded rule: ep consecutive ranks of cp*dp
            i = plain.dc_index(rank)
            assert plain.ep_group(rank) == explicit.ep_group(rank) == dc[i // p.ep * p.ep:i // p.ep * p.ep + p.ep]
            assert plain.expert_dp_group(rank) == explicit.expert_dp_group(rank) == dc[i % p.ep::p.ep]


def test_explicit_expert_tp_equal_to_tp_changes_nothing():
    path = REPO / "scenarios" / "mixtral-small-ep-h100.toml"
    got = simulate(sim.load_scenario(path, ["parallel.expert_tp=1"])).summary
    want = json.loads((GOLDEN / "mixtral-small-ep-h100.json").read_text())
    assert {k: v for k, v in got.items() if k in want} == want


MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 2048, "moe": {"experts": 32, "top_k": 2, "routing": "uniform", "expert_ffn_hidden": 512}}
SEQ = 1024


def folded_run(seq=SEQ, **parallel):
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": seq, "global_batch": 16},
        "cluster": {"topology": "dgx-h100", "gpus": 32},
        "parallel": {"tp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True, **parallel}}))


def test_ep_32_over_tp_2_x_dp_16_all_to_all_groups_and_bytes():
    result = folded_run()
    h, k, ep, tp = MOE["hidden"], MOE["moe"]["top_k"], 32, 2
    per_call = SEQ / tp * k * h * 2 * (ep - 1) / ep  # own SP shard, bf16, sent to the 31 others
    for prog in result.facts.programs:
        ep_ops = [op for op in prog.ops if op.category == "ep"]
        a2a = [op for op in ep_ops if op.name.startswith("a2a_")]  # (and the forward's counts: sim/parallel/ep.py)
        assert len(a2a) == 4 * MOE["layers"] and all(op.comm.group == tuple(range(32)) for op in ep_ops)
        assert len(ep_ops) == len(a2a) + MOE["layers"]
    a2a = result.spans[result.spans.name.str.startswith("a2a_")]
    assert np.allclose(a2a.bytes, per_call, rtol=1e-12)
    counts = 8 * MOE["moe"]["experts"] * (ep - 1)  # each forward's ring all-gather of int64 counts per expert
    assert result.summary["comm_bytes_per_gpu"]["ep"] == pytest.approx(MOE["layers"] * (4 * per_call + counts),
                                                                       rel=1e-9)
    # expert_dp = 1: expert gradients are not reduced; no tp collectives inside the MoE MLP
    names = set(result.spans.name)
    assert not any(n.endswith("_expert") for n in names) and not any(n.startswith(("mlp_", "etp_")) for n in names)


def test_folded_expert_weights_and_gradients():
    """Each rank holds experts/ep whole experts (expert_tp 1): 3 h f_e each, per MoE layer;
    dense weights are split over tp as before."""
    h, f_e, E, L = MOE["hidden"], MOE["moe"]["expert_ffn_hidden"], MOE["moe"]["experts"], MOE["layers"]
    folded, plain = folded_run(), folded_run(ep=8, expert_tp=2)  # 8 x 2: the unfolded layout
    expert_folded = L * (E // 32) * 3 * h * f_e
    expert_plain = L * (E // 8) * 3 * h * f_e / 2
    assert folded.memory.weights - plain.memory.weights == pytest.approx(2 * (expert_folded - expert_plain), rel=1e-9)
    # unfolded: expert_dp = 2 reduces expert gradients; folded: none
    assert "dp_ar_expert" in set(plain.spans.name) and "dp_ar_expert" not in set(folded.spans.name)


# tokens per sequence long enough that the host as modelled (sim/model/host.py, STEP_PYTHON_S per
# launch) issues ahead of the GPU: at SEQ the uniform step is the host's (5.91 ms at 1024 and
# 4096 tokens alike), so the hot experts' extra GPU time would hide under it
GPU_BOUND_SEQ = 16384


def test_folded_skewed_routing_loads_the_hot_experts_ranks_across_tp():
    result = folded_run(seq=GPU_BOUND_SEQ)
    skewed = simulate(scenario_from_dict({
        "model": {**MOE, "moe": {**MOE["moe"], "routing": "token_choice", "skew": 1.0}},
        "training": {"seq_len": GPU_BOUND_SEQ, "global_batch": 16}, "cluster": {"topology": "dgx-h100", "gpus": 32},
        "parallel": {"tp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True}}))
    assert host_wait_share(result) < 0.05 and host_wait_share(skewed) < 0.05  # (not host-bound)
    assert sorted(skewed.facts.simulated_ranks) == list(range(32))  # the whole expert group
    e = skewed.spans[(skewed.spans.name == "experts_fwd") & (skewed.spans.layer == 0) & (skewed.spans.micro_batch == 0)]
    took = (e.end_s - e.start_s).to_numpy()
    assert took.max() > 1.5 * took.min() and skewed.summary["step_time_s"] > result.summary["step_time_s"]


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    (["parallel.expert_tp=4"], "parallel.expert_tp"),  # ep * expert_tp = 32 does not divide 16
    (["parallel.expert_tp=1", "parallel.sequence_parallel=false"], "parallel.expert_tp"),  # folding needs SP
    (["parallel.expert_tp=1", "parallel.ep=32"], "parallel.ep"),  # experts = 8
    (["model.moe.experts=64", "parallel.tp=1", "parallel.dp=16", "parallel.ep=32", "parallel.expert_tp=2"],
     "parallel.ep"),  # ep = 32 does not divide tp*cp*dp = 16
])
def test_expert_tp_is_checked_at_the_edge(overrides, key):
    proc = clustersim("run", "scenarios/mixtral-8x7b-ep-h100.toml", "--set", "cluster.nodes=2",
                      "--set", "parallel.dp=8", "--set", "training.global_batch=16",
                      *[a for o in overrides for a in ("--set", o)])
    assert_input_error(proc, key)


def test_expert_tp_needs_an_moe_model():
    proc = clustersim("run", "scenarios/llama3-8b-fsdp-h100.toml", "--set", "parallel.expert_tp=1")
    assert_input_error(proc, "parallel.expert_tp")


@pytest.mark.parametrize("sp", [True, False])
def test_expert_tp_equal_to_tp_dispatches_the_own_shard_under_sp(sp):
    """Megatron-Core's alltoall dispatcher (token_dispatcher.py, MoEAlltoAllTokenDispatcher:
    permute -> A2A(EP) -> AG(expert TP)) routes each rank's sequence-parallel shard even when
    expert_tp = tp: the all-to-all carries s/tp tokens, and the expert-tp (= tp) group
    gathers what the ep group dispatched. Without SP every tp rank holds, routes and sends
    all s tokens (no gather)."""
    tp, ep = 2, 8
    result = folded_run(ep=ep, expert_tp=None, sequence_parallel=sp)
    h, k = MOE["hidden"], MOE["moe"]["top_k"]
    tokens = SEQ / tp if sp else SEQ
    a2a = result.spans[result.spans.name.str.startswith("a2a_")]
    assert np.allclose(a2a.bytes, tokens * k * h * 2 * (ep - 1) / ep, rtol=1e-12)
    gathers = result.spans[result.spans.name.str.startswith("etp_ag")]
    if not sp:
        assert gathers.empty
        return
    # uniform routing: a rank's experts get tokens * k of the ep group's tokens; the expert-tp
    # all-gather's output is tp times that (bytes: the whole output, sim/collectives)
    assert len(gathers) and np.allclose(gathers.bytes, tp * tokens * k * h * 2 * (tp - 1) / tp, rtol=1e-12)
    layout = Layout.from_parallel(Parallel(tp=tp, dp=16, ep=ep, sequence_parallel=True))
    assert all(layout.expert_tp_group(r) == layout.group(r, "tp") for r in range(32))


@pytest.mark.parametrize("order, sizes, ep", [("tp-cp-dp-pp", (2, 1, 4, 2), 1), ("tp-cp-dp-pp", (2, 2, 4, 1), 4),
                                              ("tp-pp-dp-cp", (4, 2, 2, 3), 2), ("pp-dp-tp-cp", (2, 1, 6, 2), 3)])
def test_expert_tp_groups_equal_to_tp_are_the_tp_table(order, sizes, ep):
    """expert_tp = tp: every rank's expert-tp group is its tp group in order, so folding
    takes the tp table for it rather than building it again (16,384 groups at 131k GPUs)."""
    from sim.parallel.folding import group_tables

    layout = Layout(dict(zip(("tp", "cp", "dp", "pp"), sizes)), tuple(order.split("-")), ep, None, True)
    assert all(layout.expert_tp_group(r) == layout.group(r, "tp") for r in range(layout.world))
    tables = group_tables(layout)
    assert tables["etp"] is tables["tp"]
