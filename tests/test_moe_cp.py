"""Context parallelism (ring attention) and mixture-of-experts expert parallelism.

CP: each of cp ranks holds s/cp tokens; attention runs cp chunks while cp-1 K/V blocks
arrive from the ring neighbour (forward), twice the bytes backward (K/V and their
gradients). Per layer and micro-batch a rank sends (cp-1) * kv * (1 + 2) bytes,
kv = 2 bytes * (s/cp) * b * 2 * kv_heads * head_dim.

EP: every token goes to top_k experts: each all-to-all moves a per-rank buffer of
b * s * top_k * h * 2 bytes, of which (ep-1)/ep leaves the rank; dispatch + combine,
forward and backward = 4 per MoE layer and micro-batch.

Run: ``python -m pytest tests/test_moe_cp.py``
"""

import numpy as np
import pytest

from conftest import host_wait_share
from sim.input.load import scenario_from_dict
from sim.outputs.metrics import overlap, union
from sim.step import simulate

CP_MODEL = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 4, "vocab": 128}


def cp_run(cp, seq=8192, recompute="none", layers=2, dp=1, gb=1):
    return simulate(scenario_from_dict({
        "model": {**CP_MODEL, "layers": layers},
        "training": {"seq_len": seq, "global_batch": gb, "recompute": recompute},
        "cluster": {"topology": "dgx-h100", "gpus": cp * dp}, "parallel": {"cp": cp, "dp": dp}}))


def kv_bytes(seq, cp, m=CP_MODEL) -> float:
    head_dim = m["hidden"] // m["heads"]
    return 2 * (seq / cp) * 2 * m["kv_heads"] * head_dim


@pytest.mark.parametrize("cp, recompute, passes", [
    (2, "none", 1 + 2), (4, "none", 1 + 2), (2, "selective", 1 + 1 + 2)])
def test_cp_bytes_per_gpu_are_cp_minus_1_kv_shifts(cp, recompute, passes):
    """Forward (cp-1) shifts of kv, backward (cp-1) of 2 kv; selective recompute redoes the
    forward attention core and its shifts."""
    seq, layers = 8192, 2
    result = cp_run(cp, seq, recompute, layers)
    expected = layers * (cp - 1) * kv_bytes(seq, cp) * passes
    assert result.summary["comm_bytes_per_gpu"]["cp"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("cp", [2, 4])
def test_kv_shifts_overlap_attention_compute(cp, free_host):
    """The GPU-side overlap (a host that issues in no time: the toy model at cp 4 is
    host-bound with the measured 17.1 us per attention launch, and the shifts then wait for
    the host, not for the attention chunks)."""
    result = cp_run(cp)
    sp = result.spans[result.spans["rank"] == 0]
    shifts = sp[sp.category == "cp"]
    cores = sp[sp.name.str.startswith("attn_core")]
    assert len(shifts) == 2 * (cp - 1) * CP_MODEL["layers"]  # forward + backward per layer
    assert set(shifts.name) == {"kv_shift_fwd", "kv_shift_bwd"}
    for _, shift in shifts.iterrows():
        same = cores[(cores.layer == shift.layer) & (cores.micro_batch == shift.micro_batch)
                     & (cores.start_s < shift.end_s) & (cores.end_s > shift.start_s)]
        assert len(same) >= 1  # an attention chunk computes while the next K/V block arrives
    hidden = overlap(union(shifts[["start_s", "end_s"]].to_numpy()), union(cores[["start_s", "end_s"]].to_numpy()))
    assert hidden == pytest.approx((shifts.end_s - shifts.start_s).sum(), rel=1e-9)  # fully hidden


def test_cp_shortens_the_step_of_one_long_sequence():
    one, two = cp_run(1, 32768), cp_run(2, 32768)
    # attention ~ s^2 dominates at 32k tokens: two ranks share it, minus little
    assert two.summary["step_time_s"] < 0.6 * one.summary["step_time_s"]


def long_context(cp):
    """Llama 3 8B on 131072-token sequences, FSDP over dp = 4, full recompute."""
    s = scenario_from_dict({"model": {"preset": "llama3-8b"},
                            "training": {"seq_len": 131072, "global_batch": 4, "recompute": "full"},
                            "cluster": {"topology": "dgx-h100", "gpus": 4 * cp},
                            "parallel": {"dp": 4, "cp": cp, "zero": 3}})
    return simulate(s)


def test_cp_2_fits_a_long_sequence_that_cp_1_does_not():
    one, two = long_context(1), long_context(2)
    assert one.summary["fits_in_memory"] is False and two.summary["fits_in_memory"] is True
    # activations with full recompute (Korthikanti et al. 2022): the layer inputs 2sh per
    # layer, one layer's 34sh during its recompute, fp32 logits 4sV -- s = tokens per rank
    h, L, V = 4096, 32, 128256
    for result, cp in ((one, 1), (two, 2)):
        s = 131072 / cp
        assert result.memory.activations == pytest.approx(2 * s * h * L + 34 * s * h + 4 * s * V, rel=1e-9)


# --- MoE ------------------------------------------------------------------------------

MIX = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 3584, "moe": {"experts": 8, "top_k": 2, "routing": "uniform"}}


def moe_run(ep=8, gpus=8, routing="uniform", skew=0.0, fold=False, seq=1024, **moe):
    model = {**MIX, "moe": {**MIX["moe"], "routing": routing, "skew": skew, **moe}}
    return simulate(scenario_from_dict({"model": model, "training": {"seq_len": seq, "global_batch": gpus},
                                        "cluster": {"topology": "dgx-h100", "gpus": gpus},
                                        "parallel": {"dp": gpus, "ep": ep, "fold": fold}}))


def durations(sp):
    return (sp.end_s - sp.start_s).to_numpy()


@pytest.mark.parametrize("ep, gpus", [(8, 8), (4, 16)])
def test_balanced_router_gives_even_all_to_all_and_expert_compute(ep, gpus):
    seq = 1024
    result = moe_run(ep, gpus)
    sp = result.spans
    for (name, layer), g in sp[sp.name.str.startswith("experts_")].groupby(["name", "layer"]):
        assert len(g) == gpus and np.ptp(durations(g)) <= 1e-12 * durations(g).max()
    a2a = sp[sp.name.str.startswith("a2a_")]
    per_call = seq * 2 * MIX["hidden"] * 2 * (ep - 1) / ep  # b*s*k*h*2 * (ep-1)/ep
    assert np.allclose(a2a.bytes, per_call, rtol=1e-12)
    counts = sp[sp.name == "moe_counts_fwd"]  # each forward all-gathers one int64 count per expert (ring)
    assert np.allclose(counts.bytes, 8 * MIX["moe"]["experts"] * (ep - 1), rtol=1e-12)
    per_gpu = 4 * MIX["layers"] * per_call + MIX["layers"] * 8 * MIX["moe"]["experts"] * (ep - 1)
    assert result.summary["comm_bytes_per_gpu"]["ep"] == pytest.approx(per_gpu, rel=1e-9)
    combine = a2a[a2a.name == "a2a_combine_fwd"]
    for _, g in combine.groupby("layer"):  # nobody waits for anybody
        assert np.ptp(g.start_s) <= 1e-12 and np.ptp(g.end_s) <= 1e-12



# tokens per rank for checks of the GPU side with the host as modelled: at 1024 the toy is
# host-bound (sim/model/host.py STEP_PYTHON_S per launch; the GPU waits for its host 14% of
# the step at 4096, 2% at 8192), so a rank's ops start when issued, not when ready
GPU_BOUND_SEQ = 8192


def test_skewed_router_makes_the_hot_experts_ranks_stragglers():
    uniform = moe_run(routing="uniform", fold=True, seq=GPU_BOUND_SEQ)
    skewed = moe_run(routing="token_choice", skew=1.0, fold=True, seq=GPU_BOUND_SEQ)
    assert host_wait_share(uniform) < 0.05 and host_wait_share(skewed) < 0.05  # (not host-bound)
    assert skewed.summary["step_time_s"] > uniform.summary["step_time_s"]
    sp = skewed.spans
    for layer in range(MIX["layers"]):
        experts = sp[(sp.name == "experts_fwd") & (sp.layer == layer) & (sp.micro_batch == 0)].set_index("rank")
        combine = sp[(sp.name == "a2a_combine_fwd") & (sp.layer == layer) & (sp.micro_batch == 0)].set_index("rank")
        assert len(experts) == 8  # the whole expert group is simulated when routing is uneven
        took = experts.end_s - experts.start_s
        hot = took.idxmax()
        assert took.max() > 1.2 * took.min()  # the hot experts' rank computes longer
        # everyone leaves the combine together; the others waited there for the hot rank
        assert np.ptp(combine.end_s) <= 1e-12
        waited = combine.loc[hot, "start_s"] - combine.start_s
        assert np.allclose(waited, took[hot] - took, atol=1e-9)
        assert (combine.end_s - combine.start_s).idxmin() == hot


def expert_time(result):
    """Per (op, layer, micro-batch): the longest expert GEMM over the ep group."""
    e = result.spans[result.spans.name.str.startswith("experts_")]
    return e.assign(d=e.end_s - e.start_s).groupby(["name", "layer", "micro_batch"]).d.max()


def a2a_transfer(result):
    """Per all-to-all call: its transfer time, seen by the member that arrived last."""
    a = result.spans[result.spans.category == "ep"]
    return a.assign(d=a.end_s - a.start_s).groupby(["name", "layer", "micro_batch"]).d.min()


@pytest.mark.parametrize("routing, skew", [("token_choice", 1.0), ("token_choice", 0.3), ("token_drop", 1.0)])
def test_skewed_routing_costs_exactly_the_hot_experts_extra_tokens(routing, skew, free_host):
    moe = {"pad_to_capacity": False} if routing == "token_drop" else {}  # dropped, not padded: uneven
    uniform, skewed = moe_run(routing="uniform", fold=True), moe_run(routing=routing, skew=skew, fold=True, **moe)
    compute = (expert_time(skewed) - expert_time(uniform)).sum()
    traffic = (a2a_transfer(skewed) - a2a_transfer(uniform)).sum()
    assert compute > 0 and traffic > 0  # hot ranks compute longer and receive more
    # everything else is unchanged: the step grows by exactly the hot ranks' extra tokens
    assert skewed.summary["step_time_s"] - uniform.summary["step_time_s"] == pytest.approx(compute + traffic,
                                                                                         rel=1e-9)


def test_skewed_all_to_all_is_held_by_the_hot_ranks_port():
    from sim.model.routing import expert_loads
    from sim.hardware.gpus import FABRIC_EFFICIENCY, LINK_LATENCY, gpu_preset

    skewed = moe_run(routing="token_choice", skew=1.0, fold=True)
    w = gpu_preset("h100-sxm").nvlink_bw * FABRIC_EFFICIENCY["nvlink"]
    # forward: in backward a layer's all-to-all may share NVLink with the gradient all-reduce
    a = skewed.spans[skewed.spans.name.str.startswith("a2a_") & skewed.spans.name.str.endswith("_fwd")]
    seq, ep = 1024, 8
    loads = expert_loads("token_choice", seq * ep, 8, 2, 1.25, 0, 1.0)
    for (name, layer), g in a.groupby(["name", "layer"]):
        hot = loads.max()  # one expert per rank: the busiest expert's rank, wherever the layer put it
        per_rank = 2 * MIX["hidden"] * loads.sum() / ep  # bf16 token vectors of the kept assignments
        # dispatch: the hot rank receives (ep-1) * per_rank * f_hot; the combine sends it back
        expected = 2 * LINK_LATENCY["nvlink"] + (ep - 1) * per_rank * hot / loads.sum() / w  # GPU-switch-GPU
        assert (g.end_s - g.start_s).min() == pytest.approx(expected, rel=1e-6)


def test_expert_choice_is_balanced_in_the_simulator():
    sp = moe_run(routing="expert_choice", skew=1.0, fold=True).spans
    for _, g in sp[sp.name.str.startswith("experts_")].groupby(["name", "layer", "micro_batch"]):
        assert np.ptp(durations(g)) <= 1e-12 * durations(g).max()  # every rank the same tokens


def test_token_dropping_pads_every_expert_to_its_capacity_by_default():
    """GShard / Switch static buffers (Megatron --moe-pad-expert-input-to-capacity): every
    expert computes ceil(cf * T * k / E) tokens however skewed the router, so the step is
    the uniform router's scaled by capacity_factor in expert compute and all-to-all bytes."""
    from sim.model.routing import capacity

    padded = moe_run(routing="token_drop", skew=1.0, fold=True)
    sp = padded.spans
    for _, g in sp[sp.name.str.startswith("experts_")].groupby(["name", "layer", "micro_batch"]):
        assert np.ptp(durations(g)) <= 1e-12 * durations(g).max()  # every rank the same tokens
    uniform = moe_run(routing="uniform", fold=True)
    per_expert = capacity(1024 * 8, 8, 2, 1.25)  # MIX: top-2 of 8 experts, default capacity factor 1.25
    even = 1024 * 8 * 2 / 8
    a2a = lambda r: r.spans[r.spans.name.str.startswith("a2a_")].bytes.sum()  # (dropless also sends its counts)
    assert a2a(padded) == pytest.approx(a2a(uniform) * per_expert / even, rel=1e-12)
    assert not padded.spans.name.eq("moe_counts_fwd").any()  # padded: the sizes are known, no counts


def test_pad_to_capacity_needs_token_dropping():
    from sim.errors import InputError

    with pytest.raises(InputError) as info:
        moe_run(routing="token_choice", pad_to_capacity=True)
    assert info.value.key == "model.moe" and "token_drop" in info.value.reason
