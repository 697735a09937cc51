"""Multi-token prediction (``model.mtp_layers``; DeepSeek-V3 section 2.2, Megatron-Core
multi_token_prediction.py): every depth is one more transformer layer on the last
pipeline stage, with its input (shifted-token embedding, two norms, eh_proj) and its own
pass through the output head.

Run: ``python -m pytest tests/test_mtp.py``
"""

import copy

import pytest

from conftest import assert_input_error, clustersim
from sim.input.load import scenario_from_dict
from sim.model import transformer as costs
from sim.parallel.dp import EMBEDDING_SYNC
from sim.parallel.memory import activations
from sim.parallel.params import rank_params
from sim.parallel.workload import make_context
from sim.step import simulate

TINY_MOE = {"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 512, "vocab": 1000, "mlp": "swiglu",
            "moe": {"experts": 8, "top_k": 2, "dense_layers": 1, "routing": "uniform", "expert_ffn_hidden": 256}}


def scenario(mtp: int, **parallel) -> dict:
    par = {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True, **parallel}
    return {"model": {**copy.deepcopy(TINY_MOE), "mtp_layers": mtp},
            "training": {"seq_len": 512, "global_batch": 8},
            "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": par}


def run(mtp: int, **parallel):
    return simulate(scenario_from_dict(scenario(mtp, **parallel)))


def test_mtp_runs_on_the_last_stage_only_as_one_more_moe_layer_and_an_output_head():
    r0, r1 = run(0), run(1)
    sp = r1.spans
    mtp = sp[sp.name.str.startswith("mtp_")]
    assert set(mtp.stage) == {1}
    micro = 8 // 2
    # forward and backward of the input and of the head, once per micro-batch
    for name in ("mtp_input_fwd", "mtp_input_bwd", "mtp_logits_fwd", "mtp_logits_bwd"):
        assert (mtp[mtp["rank"] == mtp["rank"].min()].name == name).sum() == micro, name
    # the MTP layer is an MoE layer: its dispatch runs once per micro-batch and direction
    last = sp[(sp.stage == 1) & (sp["rank"] == sp[sp.stage == 1]["rank"].min())]
    assert (last[last.name == "a2a_dispatch_fwd"].layer == 5).sum() == micro  # id layers + 1
    first0 = r0.spans[r0.spans.stage == 0]
    first1 = sp[sp.stage == 0]
    # stage 0 untouched but for the all-reduce keeping its embedding equal to the MTP stage's
    # copy (sim/parallel/dp.py embedding_grad_sync; tests/test_embedding_grad.py)
    assert sorted(set(first0.name) | {EMBEDDING_SYNC}) == sorted(set(first1.name))
    assert r1.summary["step_time_s"] > r0.summary["step_time_s"]


def test_mtp_memory_and_parameters_sit_on_the_last_stage():
    c0 = make_context(scenario_from_dict(scenario(0)), [], "h100-sxm")
    c1 = make_context(scenario_from_dict(scenario(1)), [], "h100-sxm")
    d = c1.dims
    assert rank_params(c1, 0) == rank_params(c0, 0)
    dense0, expert0 = rank_params(c0, 1)
    dense1, expert1 = rank_params(c1, 1)
    attn = costs.attention_params(d)
    shared_and_router = costs.mlp_params(d, d.layers, False) - d.experts * d.mats * d.h * d.f_expert
    # the layer (tp-sharded), eh_proj (column parallel), three norms, and an embedding copy
    extra = (attn + shared_and_router + 2 * d.h * d.h + d.v * d.h) / 2 + 3 * d.h
    assert dense1 - dense0 == pytest.approx(extra)
    routed = d.experts * d.mats * d.h * d.f_expert
    assert expert1 - expert0 == pytest.approx(routed / (c1.layout.etp * c1.layout.ep))
    assert activations(c1, 0) == activations(c0, 0)
    assert activations(c1, 1) > activations(c0, 1)


def test_mtp_layer_runs_under_ep_overlap_and_full_recompute():
    s = scenario(1, pp=1, dp=4, ep=4, ep_comm_overlap=True)
    s["training"]["global_batch"] = 8
    r = simulate(scenario_from_dict(s))
    names = set(r.spans.name)
    assert {"mtp_input_fwd", "mtp_logits_bwd"} <= names
    s = scenario(1, pp=2)
    s["training"]["recompute"] = "full"
    r = simulate(scenario_from_dict(s))
    sp = r.spans
    # full recompute reruns the MTP layer's transformer part, not its input or head
    assert (sp.layer == 5).any() and "attn_pre_recompute" in set(sp[sp.layer == 5].name)
    assert not any(n.startswith("mtp_") and "recompute" in n for n in set(sp.name))


@pytest.mark.parametrize("value", ["-1", "17", "1.5"])
def test_mtp_layers_out_of_range_is_exit_2_naming_the_key(value, tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(
        '[model]\nlayers = 4\nhidden = 256\nheads = 4\nvocab = 1000\nmtp_layers = ' + value + '\n'
        '[training]\nseq_len = 512\nglobal_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n'
        '[parallel]\ndp = 8\n')
    assert_input_error(clustersim("run", str(f)), "model.mtp_layers")
