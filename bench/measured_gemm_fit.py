"""Hopper's FP8 GEMM curve fitted to the GEMMs one H100 and one H200 measured.

Run: ``python bench/measured_gemm_fit.py`` (reads the ``gemm`` sections of
bench/measured/h100-2026-11-26.json and h200-2026-11-26.json, written by bench/gpu_measure.py:
BF16 ``F.linear`` and FP8 ``torch._scaled_mm`` with tensor-wise scales at the same 74 shapes each;
no GPU needed here). The simulator's GEMM time (sim/model/compute.py, ``ComputeModel.flop_time``)
is ``FLOPs / (peak x e_max) x (1 + c / x)`` in BF16 and ``... x (1 + c / x + c_K / K)`` in FP8 on
Hopper: x the smallest of m, n, k (c = 128 BF16, 256 FP8), K the reduction dim. This fits the one
constant c_K (:data:`sim.model.gemm_sources.FP8_K_HALF`) GLOBALLY, on what an FP8 row is compared by --
FP8 against BF16 at the same shape: every shape of both files that is launch-bound in neither
precision (time >= twice the file's fastest GEMM of that precision; the squares of 256-2048 are
not), the ratio (FP8 share / its curve) / (BF16 share / its curve), one level per GPU (its median:
what the FP8 kernel share holds), the integer c_K in 0-800 with the least mean |log error|. BF16's
own curve stays as shipped: it is too optimistic at small K too (fitted alone it would take a c_K
of 82, printed, not applied: that moves every BF16 row), so c_K is FP8's excess over it.
It prints the fit, the K-sweep (m = n = 8192) of that ratio and of the FP8 share alone, at the
level, before and after, and the FP8 kernel shares (:data:`sim.model.compute.GEMM_KERNEL`)
re-derived through the fitted curve as they were through the old one: 0.806 x the median over the
60 layer shapes of the ratio.

tests/test_fp8_k_curve.py checks that the shipped constants are what this fits and derives.
"""

import json
import math
import statistics
from pathlib import Path

from sim.hardware.gpus import gpu_preset
from sim.model.compute import GEMM_KERNEL, ComputeModel, gemm

HERE = Path(__file__).parent / "measured"
FILES = {"h100-sxm": "h100-2026-11-26.json", "h200": "h200-2026-11-26.json"}
GRID = range(0, 801)
BF16_SHARE = GEMM_KERNEL["h100-sxm"]["bf16"]  # the BF16 kernel share both Hopper presets hold (0.806)


def measured(gpu: str) -> list[dict]:
    return json.loads((HERE / FILES[gpu]).read_text())["gemm"]["rows"]


def points(gpu: str) -> list[dict]:
    """The rows of ``gpu``'s file launch-bound in neither precision (time >= 2x the file's fastest)."""
    rows = measured(gpu)
    floor = {p: min(r[p + "_s"] for r in rows) for p in ("bf16", "fp8")}
    return [r for r in rows if all(r[p + "_s"] >= 2 * floor[p] for p in floor)]


def model(gpu: str, k_half: float | None = None) -> ComputeModel:
    """The preset's compute model at kernel level (sustained factor 1), FP8's c_K set to ``k_half``."""
    cm = ComputeModel(gpu_preset(gpu), e_max=GEMM_KERNEL[gpu]["bf16"])
    if k_half is not None:
        cm.low_k_half = k_half
    return cm


def curve(cm: ComputeModel, r: dict, fp8: bool) -> float:
    """The model's share of the precision's dense peak at the row's shape, over its kernel share."""
    k = gemm(r["m"], r["n"], r["k"], fp8=fp8)
    peak, top = (cm.low_flops, cm.e_max_fp8) if fp8 else (cm.gpu.peak_flops, cm.e_max)
    return k.flops / (peak * cm.flop_time(k)) / top


def ratio(cm: ComputeModel, r: dict) -> float:
    """(measured FP8 share / the FP8 curve) / (measured BF16 share / the BF16 curve)."""
    return (r["fp8_share_of_peak"] / curve(cm, r, True)) / (r["bf16_share_of_peak"] / curve(cm, r, False))


def alone(cm: ComputeModel, r: dict, prec: str, k_half: float) -> float:
    """Measured share / the curve of one precision (BF16 with a c_K of ``k_half``: the fit only)."""
    if prec == "fp8":
        return r["fp8_share_of_peak"] / curve(cm, r, True)
    k = gemm(r["m"], r["n"], r["k"])
    return r["bf16_share_of_peak"] * (1 / curve(cm, r, False) + k_half * k.inv_k)


def errors(k_half: float, prec: str = "ratio") -> dict[str, tuple[float, list[tuple[dict, float]]]]:
    """Per GPU: (level, [(row, value / level - 1)]), value the FP8 / BF16 ``ratio`` or one precision
    ``alone``."""
    out = {}
    for gpu in FILES:
        cm = model(gpu, k_half if prec != "bf16" else 0.0)
        pts = [(r, ratio(cm, r) if prec == "ratio" else alone(cm, r, prec, k_half)) for r in points(gpu)]
        level = statistics.median(e for _, e in pts)
        out[gpu] = (level, [(r, e / level - 1) for r, e in pts])
    return out


def score(k_half: float, prec: str = "ratio") -> float:
    """Mean |log error| over both GPUs' points after one level each."""
    errs = [abs(math.log1p(e)) for _, pts in errors(k_half, prec).values() for _, e in pts]
    return sum(errs) / len(errs)


def fit(prec: str = "ratio") -> int:
    """The integer c_K of :data:`GRID` with the least :func:`score`."""
    return min(GRID, key=lambda c: score(c, prec))


def kernel_share(gpu: str, k_half: float) -> float:
    """0.806 x the median over the 60 layer shapes of :func:`ratio`."""
    cm = model(gpu, k_half)
    return BF16_SHARE * statistics.median(ratio(cm, r) for r in measured(gpu) if r["shape"] not in ("square", "ksweep"))


def sweep_lines(k_half: float, prec: str) -> list[str]:
    out = []
    for gpu, (level, pts) in errors(k_half, prec).items():
        out.append(f"  {prec:5s} c_K {k_half:3.0f} {gpu:8s} level {level:.3f}, K-sweep: " +
                   ", ".join(f"K {r['k']} {e:+.1%}" for r, e in pts if r["shape"] == "ksweep"))
    return out


def report() -> str:
    c_k = fit()
    n = sum(len(points(g)) for g in FILES)
    out = [f"Hopper GEMM curve fitted on bench/measured/{FILES['h100-sxm']} and {FILES['h200']} "
           f"({n} shapes launch-bound in neither precision), one level per GPU",
           f"  FP8 / BF16 ratio: c_K = {c_k}, mean |log error| {score(0):.4f} -> {score(c_k):.4f}"]
    out += sweep_lines(0, "ratio") + sweep_lines(c_k, "ratio") + sweep_lines(0, "fp8") + sweep_lines(c_k, "fp8")
    bf16 = fit("bf16")
    out.append(f"  BF16 alone (not applied): c_K = {bf16}, mean |log error| {score(0, 'bf16'):.4f} -> "
               f"{score(bf16, 'bf16'):.4f}")
    out += sweep_lines(0, "bf16")
    for gpu in FILES:
        out.append(f"  FP8 kernel share {gpu}: {kernel_share(gpu, 0):.4f} with c_K 0, {kernel_share(gpu, c_k):.4f} "
                   f"with c_K {c_k} (shipped {GEMM_KERNEL[gpu]['fp8']})")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(report(), end="")
