"""The simulator's kernel and host constants against what one real H200 measured.

Run: ``python bench/measured_compare.py`` (reads bench/measured/h200-2026-11-26*.json, written
by bench/gpu_measure.py on the GPU; no GPU needed here). It prints, for the ``h200`` preset:

- GEMMs (BF16 ``F.linear``, FP8 ``torch._scaled_mm``) at the Llama 3 layer shapes and on a
  K-sweep: the measured share of the dense peak over the simulator's curve
  ``e_max * x / (x + c)`` (sim/model/compute.py, x the smallest dimension). The level (their
  median ratio) is what the sustained factor absorbs; what is left after it is the curve's
  shape error, per shape.
- Flash attention (PyTorch's FlashAttention-2 and cuDNN backends), forward and backward, the
  same way against the attention curves.
- Host costs (sim/model/host.py, measured on an H100 machine: tests/test_host_measured.py) and HBM streaming (sim/model/compute.HBM_EFFICIENCY)
  against the measured figures.

tests/test_measured.py checks that this prints what bench/measured/compare.out holds (so the
figures quoted in bench/measured/README.md stay true) and reads its verdicts.
"""

import json
import statistics
from pathlib import Path

from sim.hardware.gpus import gpu_preset
from sim.model import host
from sim.model.compute import HBM_EFFICIENCY, ComputeModel, gemm

HERE = Path(__file__).parent / "measured"
MEASURED = json.loads((HERE / "h200-2026-11-26.json").read_text())
US = 1e-6


def shape_errors(points: list[tuple[str, float, float]]) -> tuple[float, list[tuple[str, float]]]:
    """(level, [(label, measured / model / level - 1)]) of (label, measured, model) points."""
    level = statistics.median(m / s for _, m, s in points)
    return level, [(label, m / s / level - 1) for label, m, s in points]


def curve_share(cm: ComputeModel, r: dict, fp8: bool) -> float:
    """The simulator's share of the precision's dense peak at the row's GEMM shape (its FLOP time:
    the min-dim curve, and Hopper FP8's reduction-dim term, sim/model/gemm_sources.py FP8_K_HALF)."""
    k = gemm(r["m"], r["n"], r["k"], fp8=fp8)
    return k.flops / ((cm.low_flops if fp8 else cm.gpu.peak_flops) * cm.flop_time(k))


def gemm_lines(cm: ComputeModel) -> list[str]:
    rows = [r for r in MEASURED["gemm"]["rows"] if r["shape"] != "square"]
    out = ["GEMMs: measured share of the dense peak / the simulator's curve (level = median ratio)"]
    for key, fp8, name in (("bf16_share_of_peak", False, "BF16"), ("fp8_share_of_peak", True, "FP8")):
        layers = [(r["shape"], r[key], curve_share(cm, r, fp8)) for r in rows if r["shape"] != "ksweep"]
        level, errs = shape_errors(layers)
        worst = max(errs, key=lambda e: abs(e[1]))
        p90 = sorted(abs(e) for _, e in errs)[int(0.9 * len(errs))]
        out.append(f"  {name} layer shapes ({len(errs)}): level {level:.3f}, shape error p90 {p90:.1%}, "
                   f"worst {worst[1]:+.1%} ({worst[0]})")
        sweep = [(r["k"], r[key] / curve_share(cm, r, fp8) / level - 1) for r in rows if r["shape"] == "ksweep"]
        out.append(f"  {name} K-sweep (m = n = 8192) at that level: " + ", ".join(f"K {k} {e:+.1%}" for k, e in sweep))
    return out


def attention_lines() -> list[str]:
    out = ["Flash attention (causal, head dim 128): measured / the simulator's curve, per sequence"]
    for backend, label in (("CUDNN_ATTENTION", "cudnn"), ("FLASH_ATTENTION", "flash2")):
        cm = ComputeModel(gpu_preset("h200"), attention=label)
        rows = [r for r in MEASURED["attention"]["rows"] if r["backend"] == backend and "error" not in r]
        for direction, key in ((1, "fwd_share_of_peak"), (2, "bwd_share_of_peak")):
            pts = [(str(r["seq"]), r[key], cm.attention_efficiency(direction, r["seq"] / 2)) for r in rows]
            level, errs = shape_errors(pts)
            out.append(f"  {label:6s} {'forward ' if direction == 1 else 'backward'} level {level:.3f}: " +
                       ", ".join(f"{s} {e:+.1%}" for s, e in errs))
    return out


def host_lines() -> list[str]:
    h, n = MEASURED["host"], MEASURED["nccl"]
    pairs = [("eager op + launch (KERNEL_ISSUE_S)", host.KERNEL_ISSUE_S, "eager in-place add",
              h["eager_add_inplace"]["host_s"]),
             ("GEMM op + launch (GEMM_ISSUE_S)", host.GEMM_ISSUE_S, "eager F.linear 1024x1024",
              h["eager_linear_1k"]["host_s"]),
             ("bare CUDA launch (CUDA_LAUNCH_S)", host.CUDA_LAUNCH_S, "empty CuPy kernel (with CuPy's call)",
              h["cupy_empty_kernel"]["host_s"]),
             ("CUDA graph launch (GRAPH_LAUNCH_S)", host.GRAPH_LAUNCH_S, "replay of a 100-kernel graph",
              h["cuda_graph_100_adds"]["host_s_per_replay"]),
             ("NCCL call, all-reduce (NCCL_CALL_S)", host.nccl_call_s("all_reduce"), "c10d all_reduce",
              n["all_reduce_4KiB"]["host_s"]),
             ("NCCL call, reduce-scatter", host.nccl_call_s("reduce_scatter"), "c10d reduce_scatter_tensor",
              n["reduce_scatter_4KiB"]["host_s"]),
             ("NCCL call, all-to-all", host.nccl_call_s("all_to_all"), "c10d all_to_all_single",
              n["all_to_all_4KiB"]["host_s"])]
    out = ["Host (sim/model/host.py)                     model us  measured us  ratio  what was measured"]
    for name, model, what, measured in pairs:
        out.append(f"  {name:44s} {model / US:6.1f}  {measured / US:10.1f}  {measured / model:5.2f}  {what}")
    out.append(f"  host-GPU sync round trip (.item() after a kernel): {h['sync_round_trip']['host_s'] / US:.1f} us")
    return out


def hbm_lines() -> list[str]:
    gpu = gpu_preset("h200")
    m = MEASURED["hbm"]
    copy = m["copy_2GiB"]["bytes_per_s"] / gpu.hbm_bw
    adam = m["adamw_fused_fp32"]["bytes_per_s_if_7_tensors"] / gpu.hbm_bw
    return [f"HBM (sim/model/compute.HBM_EFFICIENCY = {HBM_EFFICIENCY} of {gpu.hbm_bw / 1e12:.1f} TB/s): "
            f"device copy {copy:.3f}, fused AdamW (7 FP32 tensor passes) {adam:.3f}, foreach AdamW "
            f"{m['adamw_foreach_fp32']['bytes_per_s_if_7_tensors'] / gpu.hbm_bw:.3f}"]


def report() -> str:
    cm = ComputeModel(gpu_preset("h200"))
    env = MEASURED["env"]
    head = [f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date_utc'][:10]} "
            f"(bench/measured/h200-2026-11-26.json) vs clustersim's h200 preset"]
    return "\n".join(head + gemm_lines(cm) + attention_lines() + host_lines() + hbm_lines()) + "\n"


if __name__ == "__main__":
    print(report(), end="")
