"""The local experts as one grouped MLP (``parallel.moe_grouped_gemm``, sim/model/layers.py
``grouped_mlp``; Megatron-Core's TEGroupedMLP on Transformer Engine's GroupedLinear).

Closed forms, E local experts of equal load, BF16: the GPU runs the same GEMMs and the
activation's bytes in one launch, (E - 1) launches fewer forward, 2 (E - 1) backward; the host
issues each of fc1 and fc2 as one GEMM call plus E - 1 GEMMs at ``GROUPED_GEMM_ISSUE_S`` and one
activation, where one expert after the other pays E GEMM calls and E activations. The simulated
MoE layer's host time moves by exactly that, forward and backward; bad values exit 2 naming the key.

Run: ``python -m pytest -q tests/test_grouped_gemm.py``
"""

import pytest

from conftest import assert_input_error, clustersim
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.model.compute import LAUNCH_S, ComputeModel
from sim.model.layers import backward
from sim.model.moe_kernels import experts
from sim.model.transformer import dims
from sim.hardware.gpus import gpu_preset
from sim.parallel import layer_program as lp
from sim.parallel.workload import shard_of

SPEC = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 1024, "mlp": "swiglu",
                  "ffn_hidden": 2048, "moe": {"experts": 64, "top_k": 4, "routing": "uniform",
                                              "expert_ffn_hidden": 512}},
        "training": {"seq_len": 4096, "global_batch": 16}, "cluster": {"topology": "dgx-h100", "gpus": 8},
        "parallel": {"dp": 8, "ep": 8}}
GEMM = host.GEMM_ISSUE_S + host.STEP_PYTHON_S
KERNEL = host.KERNEL_ISSUE_S + host.STEP_PYTHON_S


def _scenario(grouped: bool):
    return scenario_from_dict({**SPEC, "parallel": {**SPEC["parallel"], "moe_grouped_gemm": grouped}})


@pytest.mark.parametrize("local", [2, 8, 16])
def test_kernels_gpu_and_host_closed_forms(local):
    s = _scenario(True)
    d, grouped, plain = dims(s.model), shard_of(s), shard_of(_scenario(False))
    loads = (512.0,) * local
    g, p = experts(d, grouped, loads), experts(d, plain, loads)
    assert sorted(k.flops for k in g if k.flops) == sorted(k.flops for k in p if k.flops)  # the same GEMMs
    assert sum(k.bytes for k in g) == pytest.approx(sum(k.bytes for k in p), rel=1e-12)
    assert sum(k.count for k in p) - sum(k.count for k in g) == local - 1  # one activation
    compute = ComputeModel(gpu_preset("h100-sxm"))
    assert compute.time(p) - compute.time(g) == pytest.approx((local - 1) * LAUNCH_S, rel=1e-9)
    assert compute.time(backward(p)) - compute.time(backward(g)) == pytest.approx(2 * (local - 1) * LAUNCH_S, rel=1e-9)
    saved = (local - 1) * (2 * (GEMM - host.GROUPED_GEMM_ISSUE_S) + KERNEL)  # per direction's launch
    assert host.issue_s(p) - host.issue_s(g) == pytest.approx(saved, rel=1e-12)
    assert host.issue_s(backward(p)) - host.issue_s(backward(g)) == pytest.approx(2 * saved, rel=1e-12)


def test_simulated_moe_layer_host_time_moves_by_the_closed_form():
    per = {}
    for grouped in (False, True):
        s = _scenario(grouped)
        per[grouped] = lp.programs(s, "h100-sxm", kinds=(lp.Kind.MOE,))[lp.Kind.MOE].issue_s
    local = SPEC["model"]["moe"]["experts"] // SPEC["parallel"]["ep"]
    saved = (local - 1) * (2 * (GEMM - host.GROUPED_GEMM_ISSUE_S) + KERNEL)
    assert per[False] - per[True] == pytest.approx(3 * saved, rel=1e-9)  # forward, then twice that backward


@pytest.mark.parametrize("value", ["yes", "2"])
def test_bad_values_exit_2(value, tmp_path):
    assert_input_error(clustersim("run", "scenarios/mixtral-small-ep-h100.toml", "--set",
                                  f"parallel.moe_grouped_gemm={value}"), "parallel.moe_grouped_gemm")
