"""The GEMM size curve against what a real GPU measured (bench/measured/h200-2026-11-26.json).

sim/model/compute.py's half-efficiency sizes for Hopper (BF16 212, FP8 554) are the curve
``e * x / (x + c)`` fitted to every measured shape whose smallest side is >= 256 (the Llama 3
layer GEMMs and a K-sweep, one H200); these tests fit the same curve to the shipped
measurement and check the constants and the simulator's closed forms against it."""

import json
import math
from pathlib import Path

import pytest

from sim.hardware.gpus import gpu_preset
from sim.model.compute import GEMM_HALF, HALF_RATIO, ComputeModel, gemm

MEASURED = json.loads((Path(__file__).parents[1] / "bench" / "measured" / "h200-2026-11-26.json").read_text())
SHAPES = [r for r in MEASURED["gemm"]["rows"] if r["shape"] != "square" and r["min_dim"] >= 256]


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(e, c) of share = e * x / (x + c), least squares in log, c on a 1-unit grid."""
    best = None
    for c in range(20, 2000):
        logs = [math.log(y) - math.log(x / (x + c)) for x, y in points]
        e = math.exp(sum(logs) / len(logs))
        err = sum((math.log(y) - math.log(e * x / (x + c))) ** 2 for x, y in points)
        if best is None or err < best[0]:
            best = (err, e, c)
    return best[1], best[2]


def points(key: str) -> list[tuple[float, float]]:
    return [(r["min_dim"], r[key]) for r in SHAPES]


def test_the_measurement_is_what_it_says():
    assert MEASURED["env"]["gpu"] == "NVIDIA H200" and MEASURED["env"]["torch"].startswith("2.11")
    assert len(SHAPES) == 66 and {r["shape"] for r in SHAPES if r["shape"] == "ksweep"} == {"ksweep"}


def test_hopper_half_sizes_are_the_measured_fits():
    _, c_bf16 = fit(points("bf16_share_of_peak"))
    _, c_fp8 = fit(points("fp8_share_of_peak"))
    assert GEMM_HALF["h100-sxm"] == GEMM_HALF["h200"] == GEMM_HALF["b200"] == c_bf16 == 212
    assert GEMM_HALF["h200"] * HALF_RATIO["fp8"] == pytest.approx(c_fp8, rel=1e-9) and c_fp8 == 554
    assert GEMM_HALF["a100-80gb"] == 128  # no A100 measurement: the tile's 128


def test_simulator_uses_the_curve_in_closed_form():
    cm = ComputeModel(gpu_preset("h100-sxm"))
    for x in (256, 1024, 8192):
        assert cm.efficiency(x) == pytest.approx(cm.e_max * x / (x + 212.0), rel=1e-12)
        assert cm.fp8_efficiency(x) == pytest.approx(cm.e_max_fp8 * x / (x + 554.0), rel=1e-12)
    mx = ComputeModel(gpu_preset("b200"), precision="nvfp4")
    assert mx.fp8_efficiency(1108) == pytest.approx(mx.e_max_fp8 / 2, rel=1e-12)  # NVFP4: twice FP8's c
    a100 = ComputeModel(gpu_preset("a100-80gb"))
    assert a100.efficiency(128) == pytest.approx(a100.e_max / 2, rel=1e-12)


def test_fp8_gain_shrinks_for_small_gemms_as_measured():
    """FP8's speed-up over BF16 at K = 512 relative to K = 8192 (M = N = 8192): simulated vs
    measured, within 10%."""
    cm = ComputeModel(gpu_preset("h200"))
    sweep = {r["k"]: r for r in SHAPES if r["shape"] == "ksweep"}
    sim = {k: cm.flop_time(gemm(8192, 8192, k)) / cm.flop_time(gemm(8192, 8192, k, fp8=True)) for k in (512, 8192)}
    real = {k: sweep[k]["bf16_s"] / sweep[k]["fp8_s"] for k in (512, 8192)}
    assert sim[512] < sim[8192]
    assert sim[512] / sim[8192] == pytest.approx(real[512] / real[8192], rel=0.10)
