"""The local experts as one grouped MLP (``parallel.moe_grouped_gemm``, sim/model/layers.py
``grouped_mlp``; Megatron-Core's TEGroupedMLP on Transformer Engine's GroupedLinear).

Closed forms, E local experts of equal load, BF16: the GPU runs the same GEMMs and the
activation's bytes in one launch, (E - 1) launches fewer forward, 2 (E - 1) backward; the host
issues each of fc1 and fc2 as one GEMM call plus E - 1 GEMMs at ``GROUPED_GEMM_ISSUE_S`` (two
each backward) with each of those experts' Python once per direction (``EXPERT_PYTHON_S``), and
one activation, where one expert after the other pays E GEMM calls (2 E backward) and E
activations. MXFP8 (Transformer Engine's ``split_quantize``, one quantize kernel per expert): each
linear's cast is E launches of the same bytes, E - 1 of them at ``SPLIT_QUANTIZE_S`` on the host
and ``LAUNCH_S`` on the GPU, as many backward (the output gradient's); under FP8 delayed scaling it
stays one launch. The simulated MoE
layer's host time moves by exactly that, forward and backward; bad values exit 2 naming the key.

Run: ``python -m pytest -q tests/test_grouped_gemm.py``
"""

import pytest

from conftest import assert_input_error, clustersim
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.model.compute import LAUNCH_S, ComputeModel, Kernel
from sim.model.layers import backward
from sim.model.layers import mlp
from sim.model.moe_kernels import experts, grouped_mlp, split_quantize
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


def _scenario(grouped: bool, precision: str = "bf16", topology: str = "dgx-h100"):
    return scenario_from_dict({**SPEC, "training": {**SPEC["training"], "precision": precision},
                               "cluster": {**SPEC["cluster"], "topology": topology},
                               "parallel": {**SPEC["parallel"], "moe_grouped_gemm": grouped}})


def _saved(local: int) -> tuple[float, float]:
    """Host seconds one expert after the other pays over the grouped MLP, BF16: forward, backward."""
    fwd = (local - 1) * (2 * (GEMM - host.GROUPED_GEMM_ISSUE_S - host.EXPERT_PYTHON_S) + KERNEL)
    bwd = (local - 1) * (2 * (2 * GEMM - 2 * host.GROUPED_GEMM_ISSUE_S - host.EXPERT_PYTHON_S) + 2 * KERNEL)
    return fwd, bwd


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
    fwd, bwd = _saved(local)
    assert host.issue_s(p) - host.issue_s(g) == pytest.approx(fwd, rel=1e-12)
    assert host.issue_s(backward(p)) - host.issue_s(backward(g)) == pytest.approx(bwd, rel=1e-12)
    assert sum(host.issue_cost(k) for k in g) == pytest.approx(host.issue_s(g), rel=1e-12)


def test_simulated_moe_layer_host_time_moves_by_the_closed_form():
    per = {}
    for grouped in (False, True):
        s = _scenario(grouped)
        per[grouped] = lp.programs(s, "h100-sxm", kinds=(lp.Kind.MOE,))[lp.Kind.MOE].issue_s
    local = SPEC["model"]["moe"]["experts"] // SPEC["parallel"]["ep"]
    assert per[False] - per[True] == pytest.approx(sum(_saved(local)), rel=1e-9)  # forward and backward


@pytest.mark.parametrize("local", [2, 8, 16])
def test_mxfp8_quantizes_each_expert_apart(local):
    """Under MXFP8 the grouped MLP's two casts (fc1's and fc2's inputs) are E launches each where one
    merged cast per linear was: the GPU pays 2 (E - 1) LAUNCH_S more forward and as many backward (the
    output gradient's split_quantize, once per expert), the host 2 (E - 1) SPLIT_QUANTIZE_S each way;
    the bytes do not change. Under
    FP8 (delayed scaling: one fused multi-tensor cast) nothing is split."""
    compute = ComputeModel(gpu_preset("b200"))
    for precision, split in (("mxfp8", True), ("fp8", False)):
        s = _scenario(True, precision, "dgx-b200")
        d, sh = dims(s.model), shard_of(s)
        per_expert = [mlp(d, sh, d.f_expert, 512.0)] * local
        g, one = grouped_mlp(per_expert, split_quantize(sh)), grouped_mlp(per_expert)  # one: a cast per linear
        assert split_quantize(sh) is split
        casts = [k for k in g if not k.flops and k.grouped]
        assert len(casts) == (2 if split and local > 1 else 0)
        assert all(k.count == local - 1 for k in casts)
        assert sum(k.count for k in g) - sum(k.count for k in one) == len(casts) * (local - 1)
        assert sum(k.bytes for k in g) == pytest.approx(sum(k.bytes for k in one), rel=1e-12)
        extra = len(casts) * (local - 1)
        assert compute.time(g) - compute.time(one) == pytest.approx(extra * LAUNCH_S, rel=1e-9)
        assert compute.time(backward(g)) - compute.time(backward(one)) == pytest.approx(extra * LAUNCH_S,
                                                                                        rel=1e-9)
        assert host.issue_s(g) - host.issue_s(one) == pytest.approx(extra * host.SPLIT_QUANTIZE_S, rel=1e-12)
        assert host.issue_s(backward(g)) - host.issue_s(backward(one)) == pytest.approx(
            extra * host.SPLIT_QUANTIZE_S, rel=1e-12)


def test_grouped_kernel_issue_closed_form():
    """One expert's grouped GEMM: GROUPED_GEMM_ISSUE_S per launch, EXPERT_PYTHON_S once; a grouped
    memory-bound kernel of n launches: n SPLIT_QUANTIZE_S; torch.compile's fusion leaves both alone."""
    g = Kernel(1e9, 512, grouped=True)
    assert host.issue_cost(g) == host.GROUPED_GEMM_ISSUE_S + host.EXPERT_PYTHON_S
    assert host.issue_cost(g.backward()) == 2 * host.GROUPED_GEMM_ISSUE_S + host.EXPERT_PYTHON_S
    q = Kernel(bytes=1e6, count=7, grouped=True)
    assert host.issue_cost(q) == 7 * host.SPLIT_QUANTIZE_S == host.issue_s([q])
    assert q.backward().count == 7 and q.backward().bytes == q.bytes * q.bwd  # one per expert backward too
    norm = Kernel(bytes=1e6)
    assert host.fused([norm, q, norm]) == (norm, q, norm)


@pytest.mark.parametrize("value", ["yes", "2"])
def test_bad_values_exit_2(value, tmp_path):
    assert_input_error(clustersim("run", "scenarios/mixtral-small-ep-h100.toml", "--set",
                                  f"parallel.moe_grouped_gemm={value}"), "parallel.moe_grouped_gemm")
