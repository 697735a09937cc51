"""FP8 training (training.precision = "fp8"): Transformer Engine linear layers at the
GPU's dense FP8 peak, their cast kernels as memory-bound ops, BF16 attention, FP8 weight
copies and saved activations in memory, and a refusal on GPUs without FP8 tensor cores.

Closed forms are computed here from the datasheet peaks and the roofline of
sim/model/compute.py; nothing is read back from the code under test.

Run: ``python -m pytest tests/test_fp8.py``
"""

from functools import lru_cache

import pytest

from conftest import assert_input_error, clustersim
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model import layers as L
from sim.model import transformer as T
from sim.model import vocab as V
from sim.model.compute import HBM_EFFICIENCY, LAUNCH_S, ComputeModel, elementwise, gemm
from sim.model.optimizer import optimizer
from sim.step import simulate

H100 = gpu_preset("h100-sxm")
TINY = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 4, "ffn_hidden": 4096, "vocab": 1024, "mlp": "swiglu"}


def shard(fp8: bool, sp: bool = False, tp: int = 2) -> L.Shard:
    return L.Shard(tokens=2048, seq=2048, micro=1, tp=tp, sp=sp, flash=True, fp8=fp8)


def tiny_dims():
    return T.dims(scenario_from_dict({"model": TINY, "training": {"seq_len": 2048, "global_batch": 1},
                                      "cluster": {"gpus": 1}}).model)


def casts(kernels) -> list:
    """The kernel just before each FP8 GEMM: its cast."""
    return [kernels[i - 1] for i, k in enumerate(kernels) if k.fp8]


def test_fp8_gemm_is_half_of_bf16_when_compute_bound_at_equal_efficiency():
    """Datasheet peaks: H100 SXM 989 dense BF16, 1,979 dense FP8 TFLOP/s."""
    cm = ComputeModel(H100, e_max=0.7, e_max_fp8=0.7)
    x = 1e9  # smallest GEMM dimension -> the size-dependent efficiency is e_max itself
    bf16, fp8 = gemm(x, x, x), gemm(x, x, x, fp8=True)
    assert bf16.flops == fp8.flops == 2 * x**3
    assert cm.time([bf16]) - LAUNCH_S == pytest.approx(2 * x**3 / (989e12 * 0.7), rel=1e-6)
    assert cm.time([fp8]) - LAUNCH_S == pytest.approx(2 * x**3 / (1979e12 * 0.7), rel=1e-6)
    assert cm.time([fp8]) / cm.time([bf16]) == pytest.approx(989 / 1979, rel=1e-6)


def test_fp8_backward_gemms_stay_fp8():
    """TE runs dgrad and wgrad in FP8 too (override_linear_precision off by default)."""
    k = gemm(4096, 4096, 4096, fp8=True)
    assert L.backward([k])[0].fp8 and L.backward([k])[0].flops == 2 * k.flops


def test_memory_bound_kernels_and_attention_core_are_unchanged_by_fp8():
    d, cm = tiny_dims(), ComputeModel(H100)
    core16, core8 = L.attention_core(d, shard(False)), L.attention_core(d, shard(True))
    assert core16 == core8 and not core8.fp8  # flash attention stays BF16
    norms16 = [k for k in L.mlp_block(d, shard(False)) if not k.flops]
    norms8 = [k for k in L.mlp_block(d, shard(True)) if not k.flops and k not in casts(L.mlp_block(d, shard(True)))]
    assert norms16 == norms8 and cm.time(norms16) == cm.time(norms8)
    assert V.logits(d, shard(True)) == V.logits(d, shard(False))  # Megatron's output layer is not TE


def test_every_linear_layer_of_a_layer_is_fp8_with_one_cast_kernel():
    d = tiny_dims()
    for fn in (L.attention_pre, L.attention_post, L.mlp_block):
        k16, k8 = fn(d, shard(False)), fn(d, shard(True))
        gemms16 = [k for k in k16 if k.flops]
        gemms8 = [k for k in k8 if k.flops]
        assert [g.flops for g in gemms16] == [g.flops for g in gemms8]
        assert all(g.fp8 for g in gemms8) and not any(g.fp8 for g in gemms16)
        assert len(casts(k8)) == len(gemms8) and all(not c.flops and c.bytes > 0 for c in casts(k8))
        assert [k for k in k8 if not k.fp8 and k not in casts(k8)] == [k for k in k16 if not k.flops]


def test_cast_kernels_cost_their_bytes_at_hbm_bandwidth():
    """QKV (input from the norm, which emits FP8): forward only the FP8 transpose, 2 bytes per
    input element; backward cast + transpose of the output gradient, 4 bytes per element.
    Output projection (input from flash attention): forward cast + transpose, 4 bytes."""
    d, sh, cm = tiny_dims(), shard(True), ComputeModel(H100)
    t, h, tp = sh.tokens, 1024, 2
    qkv_out = t * (1024 + 2 * 4 * 128) / tp  # q: 8 heads x 128, k and v: 4 heads x 128 each, over tp
    cast = L.attention_pre(d, sh)[1]
    assert cast.bytes == 2 * t * h and L.backward([cast])[0].bytes == pytest.approx(4 * qkv_out)
    assert cm.time([cast]) == pytest.approx(LAUNCH_S + 2 * t * h / (3350e9 * HBM_EFFICIENCY), rel=1e-12)
    proj_cast = L.attention_post(d, sh)[0]
    assert proj_cast.bytes == 4 * t * h / tp and L.backward([proj_cast])[0].bytes == pytest.approx(4 * t * h)


def test_weights_are_cast_once_per_step_in_the_optimizer():
    cm, n = ComputeModel(H100), 1e9
    extra = cm.time(optimizer(n, n)) - cm.time(optimizer(n))
    assert extra == pytest.approx(2 * LAUNCH_S + 4 * n / (3350e9 * HBM_EFFICIENCY), rel=1e-9)
    assert optimizer(n) == [elementwise((6 + 28 + 6) * n, count=3)]  # grad cast, Adam, master copy (step_end.py)


def one_node(precision: str) -> dict:
    return {"name": "fp8", "model": {**TINY, "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8,
                                     "ffn_hidden": 14336, "vocab": 32000},
            "training": {"seq_len": 4096, "global_batch": 16, "precision": precision},
            "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"tp": 2, "dp": 4}}


@lru_cache(maxsize=None)
def run(precision: str):
    return simulate(scenario_from_dict(one_node(precision)))


def test_fp8_step_is_faster_but_not_twice_and_model_flops_and_mfu_peak_are_unchanged():
    r16, r8 = run("bf16").summary, run("fp8").summary
    flops16 = r16["tflops_per_gpu"] * r16["step_time_s"]
    assert r8["tflops_per_gpu"] * r8["step_time_s"] == pytest.approx(flops16, rel=1e-12)
    assert r8["mfu"] == pytest.approx(r8["tflops_per_gpu"] / 989, rel=1e-12)  # CONTRACT: bf16 peak
    assert 0.5 * r16["step_time_s"] < r8["step_time_s"] < 0.9 * r16["step_time_s"]


def test_fp8_memory_adds_weight_copies_and_saves_fp8_activations():
    """Weights: 2 + 1 (FP8) + 1 (FP8 transpose) bytes per parameter. Activations per layer,
    no SP (Korthikanti: sbh (10 + 24/tp)): FP8 saves sbh (8 + 21/tp)."""
    d = tiny_dims()
    sbh = 2048 * 1 * 1024
    assert T.activation_bytes_per_layer(d, 2048, 1, 2, False, "none", True) == sbh * (10 + 24 / 2)
    assert T.activation_bytes_per_layer(d, 2048, 1, 2, False, "none", True, fp8=True) == sbh * (8 + 21 / 2)
    m16, m8 = run("bf16").memory, run("fp8").memory
    assert m8.weights == pytest.approx(2 * m16.weights) and m8.gradients == m16.gradients
    assert m8.optimizer == m16.optimizer and m8.activations < m16.activations


def test_fp8_on_a100_is_refused_naming_training_precision():
    p = clustersim("run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml", "--set", "training.precision=fp8")
    assert_input_error(p, "training.precision")
    assert "a100-80gb" in p.stderr
