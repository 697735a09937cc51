"""The weight-gradient GEMM accumulating into main_grad, and the optimizer step's tail: what one
H100 and one H200 measured against what the simulator charges.

Run: ``python bench/measured_wgrad.py`` (reads bench/measured/h100-2026-11-27-wgrad.json,
h200-2026-11-27-wgrad.json and h100-2026-11-27-wgrad-cold.json, written by
bench/gpu_measure_wgrad.py on the GPUs; no GPU needed here). Two blocks:

1. Per shape, the measured weight gradient with BF16 out (t_g) and accumulated into an FP32
   main_grad inside the GEMM (cuBLAS, FP32 C, beta 1: Megatron's gradient_accumulation_fusion),
   beside the closed form the compute model prices it with,
   :func:`sim.model.compute.wgrad_accumulate_s` -- ``(t_g^P + f^P)^(1/P)``, ``f`` the 8 bytes per
   weight element of C over :data:`~sim.model.compute.WGRAD_ACC_HBM_SHARE` of the GPU preset's
   HBM bandwidth -- fed the measured t_g, and its miss. Shapes whose FP32 C is under 128 MB in
   the warm sections (``wgrad``: the same main_grad replayed back to back, so much of it stays in
   the 50 MB L2) are left out of the fit and marked ``L2``; the cold section (``wgrad_cold``: each
   call into the next of several main_grads, >= 400 MB in all) measures them from HBM. Then the
   fit's figures and the two simpler forms it was chosen over (max, sum), each at its best share.
2. ``step_tail``: the optimizer step's kernels on 2^28-2^30 parameters (PyTorch's foreach / fused
   kernels standing for Megatron's multi-tensor ones), measured GPU time against the model's
   bytes per parameter (sim/model/optimizer.py) at HBM_EFFICIENCY of the preset's bandwidth.

tests/test_wgrad_accumulation.py checks that docs/precision.md quotes what this prints and that
the closed form keeps its fit.
"""

import json
import math
from pathlib import Path

from sim.hardware.gpus import gpu_preset
from sim.model.compute import HBM_EFFICIENCY, WGRAD_ACC_HBM_SHARE, WGRAD_ACC_P, wgrad_accumulate_s
from sim.model.optimizer import ADAM_BYTES, MAIN_GRAD_BYTES, MASTER_COPY_BYTES

HERE = Path(__file__).resolve().parent / "measured"
FILES = {"h100-sxm": "h100-2026-11-27-wgrad.json", "h200": "h200-2026-11-27-wgrad.json"}
COLD = ("h100-sxm", "h100-2026-11-27-wgrad-cold.json")
L2_CLEAR = 128e6  # bytes of FP32 C below which a warm replay keeps part of it in L2 (50 MB on both parts)
C_BYTES = 8  # FP32 main_grad read and written per weight element


def _load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def rows() -> list[dict]:
    """Every measured accumulating wgrad: gpu, name, C bytes, t_g, measured, fitted (whether in the fit)."""
    out = []
    for gpu, name in FILES.items():
        data = _load(name)
        for r in data["wgrad"]["rows"]:
            c = C_BYTES * r["n"] * r["k"]
            out.append(dict(gpu=gpu, name=r["name"], c=c, t_g=r["wgrad_bf16_s"], acc=r["wgrad_fp32_accum_s"],
                            fitted=c >= L2_CLEAR))
        for r in data["grouped_wgrad"]["rows"]:
            out.append(dict(gpu=gpu, name=r["name"], c=C_BYTES * r["n"] * r["k"] * r["experts"], t_g=r["loop_bf16_s"],
                            acc=r["loop_fp32_accum_s"], fitted=True))
    gpu, name = COLD
    for r in _load(name)["wgrad_cold"]["rows"]:
        out.append(dict(gpu=gpu, name=r["name"] + "_cold", c=C_BYTES * r["n"] * r["k"], t_g=r["wgrad_bf16_s"],
                        acc=r["wgrad_fp32_accum_cold_s"], fitted=True))
    for r in out:
        r["model"] = wgrad_accumulate_s(r["t_g"], r["c"], gpu_preset(r["gpu"]).hbm_bw)
        r["miss"] = r["model"] / r["acc"] - 1
    return out


def _form(fitted: list[dict], p: float) -> tuple[float, float]:
    """(best HBM share, mean |log error|) of ``(t_g^p + f^p)^(1/p)`` (p = inf: the max) over the rows."""
    def err(share):
        total = 0.0
        for r in fitted:
            f = r["c"] / (share * gpu_preset(r["gpu"]).hbm_bw)
            t = max(r["t_g"], f) if math.isinf(p) else (r["t_g"] ** p + f ** p) ** (1 / p)
            total += abs(math.log(t / r["acc"]))
        return total / len(fitted)
    share = min((s / 1000 for s in range(300, 900, 5)), key=err)
    return share, err(share)


def stats(fitted: list[dict]) -> dict:
    logs = [abs(math.log(1 + r["miss"])) for r in fitted]
    worst = max(fitted, key=lambda r: abs(r["miss"]))
    by_gpu = {g: sum(r["miss"] for r in fitted if r["gpu"] == g) / sum(r["gpu"] == g for r in fitted) for g in FILES}
    return {"n": len(fitted), "mean_log": sum(logs) / len(logs), "worst": worst, "by_gpu": by_gpu}


def step_tail() -> list[tuple]:
    """(gpu, params, tensors, kernel, measured s, model s, model bytes per parameter)."""
    per = {"zero_grad_buffer": MAIN_GRAD_BYTES, "grad_cast_bf16_to_fp32": 2 + MAIN_GRAD_BYTES,
           "l2norm": MAIN_GRAD_BYTES, "adamw_fused": ADAM_BYTES, "master_to_bf16": MASTER_COPY_BYTES}
    out = []
    for gpu, name in FILES.items():
        bw = gpu_preset(gpu).hbm_bw * HBM_EFFICIENCY
        for r in _load(name)["step_tail"]["rows"]:
            for kernel, nbytes in per.items():
                out.append((gpu, r["params"], r["tensors"], kernel, r[kernel]["gpu_s"], nbytes * r["params"] / bw, nbytes))
    return out


def report() -> str:
    rs = rows()
    lines = [f"accumulating wgrad: t = (t_g^{WGRAD_ACC_P:g} + f^{WGRAD_ACC_P:g})^(1/{WGRAD_ACC_P:g}), "
             f"f = 8 B x n x k / ({WGRAD_ACC_HBM_SHARE:g} x HBM)",
             f"{'gpu':9} {'shape':24} {'C MB':>6} {'t_g us':>8} {'acc us':>8} {'model':>8} {'miss':>7}"]
    for r in rs:
        lines.append(f"{r['gpu']:9} {r['name']:24} {r['c'] / 1e6:6.0f} {r['t_g'] * 1e6:8.1f} {r['acc'] * 1e6:8.1f} "
                     f"{r['model'] * 1e6:8.1f} {100 * r['miss']:+6.1f}%" + ("" if r["fitted"] else "  L2"))
    fitted = [r for r in rs if r["fitted"]]
    s = stats(fitted)
    lines.append(f"fit over {s['n']} shapes (C >= 128 MB or cold): mean |log error| {s['mean_log']:.3f}, worst "
                 f"{100 * s['worst']['miss']:+.1f}% ({s['worst']['gpu']} {s['worst']['name']}); mean miss "
                 + ", ".join(f"{g} {100 * m:+.1f}%" for g, m in s["by_gpu"].items()))
    for label, p in (("max(t_g, f)", math.inf), ("t_g + f", 1.0), (f"p = {WGRAD_ACC_P:g}", WGRAD_ACC_P)):
        share, err = _form(fitted, p)
        lines.append(f"  {label:12} best share {share:.3f}: mean |log error| {err:.3f}")
    lines.append("")
    lines.append(f"optimizer step tail: measured GPU time / model (bytes per parameter at {HBM_EFFICIENCY:g} x HBM)")
    tail, totals = step_tail(), {}
    for gpu, params, tensors, kernel, meas, model, nbytes in tail:
        lines.append(f"{gpu:9} 2^{int(math.log2(params))} params {tensors:5} tensors {kernel:24} {nbytes:3} B "
                     f"{meas * 1e3:8.3f} ms  model {model * 1e3:7.3f} ms  x{meas / model:.2f}")
        got = totals.setdefault((gpu, params, tensors), [0.0, 0.0])
        got[0], got[1] = got[0] + meas, got[1] + model
    lines += [f"{g:9} 2^{int(math.log2(p))} params {t:5} tensors all five: x{m / s:.2f}" for (g, p, t), (m, s) in totals.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(report(), end="")
