"""The weights' memory under quantized precisions (sim/parallel/memory.py ``weight_bytes``):
Transformer Engine's two quantized copies of each weight at the format's bytes with its scales,
beside the BF16 weights or, with ``training.fp8_params`` (Megatron's --fp8-param-gather), alone."""

import pytest

from conftest import assert_refusals, fp8_flag_refusals
from sim.input.load import scenario_from_dict
from sim.parallel.layer_program import context
from sim.parallel.memory import peak_memory, stage_memory
from sim.parallel.params import rank_params
from sim.studies.validation import load_rows

BASE = {"model": {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 8192},
        "training": {"seq_len": 1024, "global_batch": 8},
        "cluster": {"gpu": "b200", "topology": "dgx-b200", "gpus": 8}, "parallel": {"dp": 8, "zero": 1}}


def _weights(zero: int = 1, **training) -> tuple[float, float]:
    """(weights, gathered) bytes of stage 0 and the rank's parameters (dense, no experts)."""
    data = {**BASE, "training": {**BASE["training"], **training}, "parallel": {"dp": 8, "zero": zero}}
    s = scenario_from_dict(data)
    ctx = context(s, "b200")
    m = stage_memory(ctx, 0)
    dense, expert = rank_params(ctx, 0)
    return m.weights / (dense + expert), m.gathered


@pytest.mark.parametrize("training, per_param", [
    ({}, 2.0),  # BF16
    ({"precision": "fp8"}, 2 + 2 * 1.0),  # + FP8 weight and its transpose
    ({"precision": "mxfp8"}, 2 + 2 * (1 + 1 / 32)),  # + rowwise and columnwise MXFP8, one E8M0 scale per 32
    ({"precision": "nvfp4"}, 2 + 2 * (0.5 + 1 / 16)),  # + rowwise and columnwise NVFP4, one E4M3 scale per 16
    ({"precision": "fp8", "fp8_params": True}, 2 * 1.0),  # the quantized copies alone
    ({"precision": "mxfp8", "fp8_params": True}, 2 * (1 + 1 / 32)),
])
def test_weights_per_parameter_are_bf16_and_the_formats_two_quantized_copies(training, per_param):
    assert _weights(**training)[0] == pytest.approx(per_param, rel=1e-12)


def test_zero3_shards_the_quantized_weight_and_gathers_only_the_copies():
    """ZeRO 3: the shard is BF16 (or, with fp8_params, the rowwise copy); what a gathered layer
    holds per parameter is weight_bytes: BF16 + 2 copies, or the 2 copies alone."""
    plain, plain_gathered = _weights(3, precision="mxfp8")
    alone, alone_gathered = _weights(3, precision="mxfp8", fp8_params=True)
    assert plain == pytest.approx(2 / 8) and alone == pytest.approx((1 + 1 / 32) / 8)
    # gathered = 2 layers x (weight + BF16 gradient) per parameter (resharded after the forward)
    mx = 2 * (1 + 1 / 32)
    assert plain_gathered / alone_gathered == pytest.approx((2 + mx + 2) / (mx + 2), rel=1e-12)


def test_published_gb300_llama3_70b_layouts_fit():
    """Megatron-Bridge's Llama 3 70B on 64 GB300 (tp 1 x pp 4 (v 5) x dp 16, ZeRO 1, no recompute)
    ran: MXFP8 with fp8_param_gather (no BF16 weights) and NVFP4 (BF16 weights and 2 x 0.5625
    bytes of NVFP4 copies) both fit the GB300's 288 GB; both were put at 302.7 GB before, as
    BF16 weights plus 2 bytes of copies (docs/plan.md "Published layouts placed again")."""
    rows = {r.id: r for r in load_rows()}
    for rid in ("nb_gb300_l70b_64g_mxfp8", "nb_gb300_l70b_64g_nvfp4"):
        s = scenario_from_dict(rows[rid].scenario)
        total = peak_memory(context(s, "gb300")).total
        assert total <= 288e9, (rid, total)
    assert rows["nb_gb300_l70b_64g_mxfp8"].scenario["training"]["fp8_params"] is True
    assert "fp8_params" not in rows["nb_gb300_l70b_64g_nvfp4"].scenario["training"]  # (its recipe: False)


def test_bad_values_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\n')
    assert_refusals(path, fp8_flag_refusals("training.fp8_params"))
