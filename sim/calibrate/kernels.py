"""Kernel efficiency curves from traced GEMMs, and the traced vs simulated step breakdown.

The simulator times a BF16 GEMM at ``e_max * x / (x + h)`` of the dense peak, x its smallest
dimension (sim/model/compute.py). A traced BF16/FP16 GEMM whose operator recorded its shape
gives one point ``E = FLOPs / (peak * duration)``; ``1 / E = 1 / e_max + (h / e_max) / x`` is
linear in ``1 / x``, so (e_max, h) is a least-squares line. The profile stores the kernel share
``e_max / S`` (S the sustained factor in use) and ``h``: with no training log the traced level
is reproduced; with logs, the logs' fitted factor sets the level and the trace the shape.
"""

import numpy as np

from ..input.choices import AttentionBackend
from ..model.compute import ATTENTION_KERNEL, GEMM_KERNEL, ComputeModel
from ..model.gemm_sources import GEMM_HALF_SIZE
from .kineto import Trace, breakdown
from ..engine.kinds import Category
from ..outputs import host

MIN_POINTS = 3  # GEMM shapes needed for a curve (two parameters and one to spare)


def points(traces: list[Trace], cls: str, op: str = "") -> list[tuple[float, float]]:
    """(curve variable, FLOPs/s over every launch) of every traced BF16/FP16 kernel of class
    ``cls`` (and direction ``op``, attention) with a recorded shape: a GEMM's smallest
    dimension, the keys an attention query attends."""
    calls: dict[tuple, float] = {}  # one launch per operator call: the kernels it ran add up (SDPA)
    for n, t in enumerate(traces):
        for i, k in enumerate(t.kernels):
            if k.cls == cls and k.flops and k.half and k.dur > 0 and (not op or k.op == op):
                key = (k.flops, k.min_dim, n, k.call or i)
                calls[key] = calls.get(key, 0.0) + k.dur
    by_shape: dict[tuple, list[float]] = {}
    for (flops, dim, *_), dur in calls.items():
        by_shape.setdefault((flops, dim), []).append(dur)
    return [(dim, flops * len(durs) / sum(durs)) for (flops, dim), durs in sorted(by_shape.items())]


def gemm_points(traces: list[Trace]) -> list[tuple[float, float]]:
    """(smallest dim, FLOPs/s) of every traced BF16/FP16 GEMM with a shape."""
    return points(traces, "gemm")


def fit_curve(pts: list[tuple[float, float]], peak: float) -> tuple[float, float, float] | None:
    """(top share, half size, mean |log error|) of ``top * x / (x + half)`` through the points,
    or None when too few."""
    if len(pts) < MIN_POINTS or len({p[0] for p in pts}) < 2:
        return None
    x = np.array([p[0] for p in pts])
    eff = np.array([p[1] / peak for p in pts])
    slope, icept = np.polyfit(1 / x, 1 / eff, 1)
    if icept <= 0:
        return None
    top, half = 1 / icept, max(slope / icept, 0.0)
    model = top * x / (x + half)
    return float(top), float(half), float(np.mean(np.abs(np.log(model / eff))))


fit_gemm = fit_curve


def fit_level(pts: list[tuple[float, float]], peak: float, half: float) -> tuple[float, float] | None:
    """(top share, mean |log error|) of ``top * x / (x + half)`` at a given half size: the level
    alone, for points that all share one smallest dimension (a transformer's GEMMs at a token
    count past the hidden size all have x = hidden, so the curve's bend is not in the trace).
    The top is the geometric mean of each point's ``E (x + half) / x`` (least squares in log)."""
    if len(pts) < MIN_POINTS:
        return None
    x = np.array([p[0] for p in pts])
    eff = np.array([p[1] / peak for p in pts])
    top = float(np.exp(np.mean(np.log(eff * (x + half) / x))))
    return top, float(np.mean(np.abs(np.log(top * x / (x + half) / eff))))


def gemm_changes(pts, peak: float, gpu_name: str, sustained: float) -> dict:
    """The [compute] values the GEMM points give (empty when they are too few): the curve, or
    with one smallest dimension only its level (``gemm_half_size`` None: the preset stays)."""
    before = {"gemm_kernel": GEMM_KERNEL[gpu_name]["bf16"], "gemm_half_size": float(GEMM_HALF_SIZE)}
    found = fit_curve(pts, peak)
    if found is None:
        level = fit_level(pts, peak, GEMM_HALF_SIZE) if len({p[0] for p in pts}) == 1 else None
        if level is None:
            return {}
        return {"gemm_kernel": level[0] / sustained, "gemm_half_size": None, "points": len(pts),
                "residual": level[1], "before": before, "min_dim": pts[0][0]}
    e_max, half, residual = found
    return {"gemm_kernel": e_max / sustained, "gemm_half_size": half, "points": len(pts),
            "residual": residual, "before": before}


def attention_changes(traces: list[Trace], peak: float, gpu_name: str, sustained: float) -> dict:
    """``attention_forward`` / ``attention_backward`` = [kernel share, half keys] from traced
    flash/cuDNN attention kernels whose SDPA operator recorded its shapes (per direction)."""
    out = {}
    for i, op in enumerate(("forward", "backward")):
        pts = points(traces, "attention", op)
        found = fit_curve(pts, peak)
        if found is not None:
            top, half, residual = found
            before = ATTENTION_KERNEL[gpu_name][AttentionBackend.CUDNN][i]
            out[f"attention_{op}"] = {"after": [top / sustained, half], "before": list(before),
                                      "points": len(pts), "residual": residual}
    return out


def gemm_table(traces: list[Trace], preset: ComputeModel, calibrated: ComputeModel, top: int = 8) -> list[dict]:
    """The traced GEMM shapes that took most time: per shape its launches, seconds, traced
    share of the peak and what the simulator's curve gives, preset and calibrated (BF16/FP16
    only: the curve is theirs)."""
    shapes: dict[tuple, list] = {}
    for t in traces:
        for k in t.kernels:
            if k.cls == "gemm" and k.flops:
                shapes.setdefault((k.flops, k.min_dim, k.half), []).append((k.dur, t.steps))
    rows = []
    for (flops, dim, half), durs in sorted(shapes.items(), key=lambda kv: -sum(d for d, _ in kv[1]))[:top]:
        traced = flops * len(durs) / sum(d for d, _ in durs) / preset.gpu.peak_flops
        rows.append({"min_dim": dim, "gflop": flops / 1e9, "launches": len(durs),
                     "time_s": sum(d / steps for d, steps in durs),
                     "traced_eff": traced, "half": half,
                     "preset_eff": preset.efficiency(dim) if half else None,
                     "calibrated_eff": calibrated.efficiency(dim) if half else None})
    return rows


def simulated_breakdown(result, rank: int = 0) -> dict[str, float]:
    """Compute, exposed communication and idle of one simulated rank's step, and of its idle the
    wait for its host (:func:`sim.outputs.host.waits`: the issue costs of sim/model/host.py)."""
    spans = result.spans
    mine = spans[spans["rank"] == (rank if rank in set(spans["rank"]) else spans["rank"].min())]
    comp = list(zip(mine.start_s[mine.category == Category.COMPUTE], mine.end_s[mine.category == Category.COMPUTE]))
    comm = list(zip(mine.start_s[mine.category != Category.COMPUTE], mine.end_s[mine.category != Category.COMPUTE]))
    programs = result.facts.programs if result.facts is not None else None
    wait = host.waits(spans, programs) if programs else {}
    return breakdown(comp, comm, (0.0, result.summary["step_time_s"])) | {
        "host_wait_s": wait.get(int(mine["rank"].iloc[0]), 0.0) if len(mine) else 0.0}


def picture(rows: list[dict], path: str, title: str) -> None:
    """Stacked bars: compute, exposed communication and idle per step, traced beside simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = [r["label"] for r in rows]
    left = np.zeros(len(rows))
    for key, colour in (("compute_s", "#4c72b0"), ("exposed_comm_s", "#dd8452"), ("idle_s", "#bbbbbb")):
        values = np.array([r[key] * 1e3 for r in rows])
        ax.barh(labels, values, left=left, color=colour, label=key.removesuffix("_s").replace("_", " "))
        left += values
    ax.set_xlabel("ms per step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    from ..outputs.paths import written

    with written(path, "--picture") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
