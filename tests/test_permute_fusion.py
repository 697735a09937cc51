"""The MoE token permutation fused or not (``parallel.moe_permute_fusion``, sim/model/moe_kernels.py
``permute`` / ``unpermute``).

Closed forms: both move ``permute_bytes`` = 2 x tokens x h x (4 + 5 top_k) bytes forward +
backward; fused at ``HBM_EFFICIENCY`` of the HBM bandwidth, unfused (Megatron-Core's PyTorch
operators) at ``UNFUSED_PERMUTE_SHARE``, which reproduces the H200 measurement
(bench/measured/h200-2026-11-26-permute.json, Grok-1's shape) at kernel level; a step's permute
and unpermute ops differ by exactly those bytes at the two rates. The DeepSeek-V3 row runs it
fused (NeMo's script), the Grok-1 rows unfused. Bad values exit 2 naming the key.
Run ``python -m pytest -q tests/test_permute_fusion.py``.
"""

import json

import pytest

from conftest import REPO, assert_input_error, clustersim
from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import GEMM_KERNEL, HBM_EFFICIENCY, LAUNCH_S, ComputeModel
from sim.model.layers import backward
from sim.model.moe_kernels import UNFUSED_PERMUTE_SHARE, permute, permute_bytes, unpermute
from sim.model.transformer import Dims
from sim.step import build, build_topology
from sim.studies import validation

D = Dims(layers=2, h=6144, a=48, g=8, f=32768, v=131072, mats=3, experts=8, top_k=2, f_expert=32768)


def _spec(**parallel) -> dict:
    return {"model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                      "moe": {"experts": 8, "top_k": 2, "routing": "uniform"}},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8, **parallel},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 8}}


def _both(fused: bool, tokens: float) -> tuple:
    kernels = (permute(D, tokens, fused),) + unpermute(D, tokens, fused)
    return kernels + backward(kernels)


def test_the_unfused_cost_is_its_bytes_at_the_measured_rate():
    """Forward + backward of permute and unpermute unfused: six launches plus the bytes over
    UNFUSED_PERMUTE_SHARE of the HBM bandwidth; the fused: the same at HBM_EFFICIENCY."""
    tokens = 4096
    for gpu in ("h100-sxm", "h200", "mi355x"):
        cm, bw = ComputeModel(gpu_preset(gpu)), gpu_preset(gpu).hbm_bw
        nbytes = 2 * tokens * D.h * (4 + 5 * D.top_k)
        assert sum(k.bytes for k in _both(False, tokens)) == nbytes == permute_bytes(D.h, D.top_k, tokens)
        unfused, fused = cm.time(_both(False, tokens)), cm.time(_both(True, tokens))
        assert unfused == pytest.approx(6 * LAUNCH_S + nbytes / (bw * UNFUSED_PERMUTE_SHARE), rel=1e-12)
        assert fused == pytest.approx(6 * LAUNCH_S + nbytes / (bw * HBM_EFFICIENCY), rel=1e-12)


def test_the_rate_reproduces_the_h200_measurement():
    """At the measured shape (Grok-1, 1,024 routed tokens of 6,144, top 2) the unfused kernels
    at kernel level take the profiled device time of the file; the fused ones 4.6x less."""
    data = json.loads((REPO / "bench/measured/h200-2026-11-26-permute.json").read_text())
    measured = next(p for p in data["profile"] if p["layout"] == "grok1")["device_fwd_bwd_s"]
    cm = ComputeModel(gpu_preset("h200"), e_max=GEMM_KERNEL["h200"]["bf16"])
    assert cm.time(_both(False, 1024)) == pytest.approx(measured, rel=1e-9)
    assert measured / cm.time(_both(True, 1024)) == pytest.approx(4.6, abs=0.1)
    assert UNFUSED_PERMUTE_SHARE == pytest.approx(0.1225, abs=5e-5)


def _ops(spec: dict) -> dict:
    s = scenario_from_dict(spec)
    ops = build(s, build_topology(s))[1][0].ops
    names = ("router_fwd", "permute_fwd", "router_bwd", "unpermute_fwd", "unpermute_bwd")
    return {name: [op for op in ops if op.name == name] for name in names}


def test_a_step_charges_exactly_the_difference():
    """In a built rank program the permutation (its own op forward, where the host reads the
    split sizes; the router's last kernel backward) and the unpermute ops change, each by its
    bytes over the bandwidth at the two rates; the rest of the router does not."""
    fused, unfused = _ops(_spec(moe_permute_fusion=True)), _ops(_spec())
    tokens, h, k = 1024, 1024, 2  # the micro-batch's tokens on a rank (tp 1, cp 1), hidden, top-k
    per = 2 * tokens * h * (1 + k)  # one direction's permute bytes, and unpermute's forward
    bw = gpu_preset("h100-sxm").hbm_bw
    extra = 1 / (bw * UNFUSED_PERMUTE_SHARE) - 1 / (bw * HBM_EFFICIENCY)
    expected = {"router_fwd": 0, "permute_fwd": per, "router_bwd": per, "unpermute_fwd": per,
                "unpermute_bwd": 2 * tokens * h * (1 + 2 * k)}
    for name, nbytes in expected.items():
        assert len(fused[name]) == len(unfused[name]) > 0
        for a, b in zip(fused[name], unfused[name]):
            assert b.duration - a.duration == pytest.approx(nbytes * extra, rel=1e-9, abs=1e-15), name


def test_the_default_is_megatrons_and_the_rows_follow_their_sources():
    assert scenario_from_dict(_spec()).parallel.moe_permute_fusion is False
    rows = {r.id: r for r in validation.load_rows()}
    assert rows["dg-dsv3-1024"].scenario["parallel"]["moe_permute_fusion"] is True
    assert rows["nb_b200_q30b_8g_mxfp8"].scenario["parallel"]["moe_permute_fusion"] is True  # qwen3_moe.py line 177
    for row in ("dg-grok-512", "dg-grok-2048", "dg-grok-fp8-2048", "amd_mi355x_mixtral8x22b_64g_bf16"):
        assert "moe_permute_fusion" not in rows[row].scenario["parallel"]
    assert all(r.scenario["parallel"]["moe_permute_fusion"] is True for r in rows.values() if r.id.startswith("tt_"))


@pytest.mark.parametrize("value", [1, 0, "true", "yes", 1.0])
def test_bad_values_are_refused_naming_the_key(value):
    with pytest.raises(InputError) as err:
        scenario_from_dict(_spec(moe_permute_fusion=value))
    assert err.value.key == "parallel.moe_permute_fusion"


def test_a_bad_value_exits_2_through_the_cli(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[model.moe]\nexperts = 8\n'
                    '[training]\nseq_len = 1024\nglobal_batch = 8\n'
                    '[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\nep = 8\n'
                    'moe_permute_fusion = "yes"\n')
    assert_input_error(clustersim("run", str(path), timeout=120), "parallel.moe_permute_fusion")
