"""The fits in order, each on top of the last: fabric (nccl-tests), GEMM curve (traces),
sustained factor (logs); then the per-input residuals and the traced vs simulated breakdown.
With ``fixed`` (``clustersim calibrate --check``) nothing is fitted: the inputs are re-run
against the profile's constants.
"""

from dataclasses import dataclass, field, replace
import math

import numpy as np

from ..hardware.calibration import Calibration
from ..hardware.gpus import gpu_preset
from ..model.compute import SUSTAINED, ComputeModel
from ..outputs.host import verdict
from . import fabric, kernels, kineto, steps


@dataclass
class Fitted:
    """What the fits found: profile sections, changes, and the per-input detail of the report."""

    cal: Calibration
    fabric: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)
    changes: list = field(default_factory=list)
    tables: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    traces: list = field(default_factory=list)

    def report(self, out: str, meta: dict, inputs: list[dict]) -> dict:
        """The report ``clustersim calibrate`` prints (``--json``: this object)."""
        return {"profile": str(out), **meta, "inputs": inputs, "changes": self.changes,
                "nccl_tests": self.tables, "runs": self.runs, "traces": self.traces}


def fit_all(items, topo: str, gpu: str, picture: str | None, fixed: Calibration | None = None) -> Fitted:
    """Run every fit the inputs allow (or, with ``fixed``, none) and collect the report."""
    cal = fixed or Calibration(source="calibrate", gpu=gpu)
    out = Fitted(cal)
    tables = [i.parsed for i in items if i.kind == "nccl-tests"]
    if tables:
        out.cal = _fabric(out, tables, topo, gpu, fixed)
    traces = [i for i in items if i.kind == "trace"]
    if traces and fixed is None:
        out.cal = _gemm(out, [i.parsed for i in traces], gpu)
        out.cal = _attention(out, [i.parsed for i in traces], gpu)
    runs = [steps.Run(i.path, i.scenario, i.parsed.step_s) for i in items if i.kind == "log"]
    if runs:
        out.cal = _sustained(out, runs, gpu, fixed)
    if fixed is None:
        out.compute = _compute_section(out.cal, gpu)
    if traces:
        out.traces = _compare(traces, out.cal, gpu, picture)
    return out


def _fabric(out: Fitted, tables, topo: str, gpu: str, fixed: Calibration | None) -> Calibration:
    bench = fabric.Bench(tables, topo, gpu)
    start = fabric.presets(gpu)
    params = fabric.params_of(tables, bench.spec)
    before = bench.residuals(None)
    if fixed is None:
        values, free, _, after = fabric.fit(bench, start, params, out.cal)
    else:
        cal, after = fixed, bench.residuals(fixed)
        free, values = [], {}
    for p in free:
        scale = 1e6 if p.field == "latency" else 1.0
        out.changes.append({"constant": p.name, "before": start[p] * scale, "after": values[p] * scale,
                            "points": len(before), "residual_before": _mean_abs(before),
                            "residual_after": _mean_abs(after), "source": "nccl-tests"})
    for p in params:
        if p not in free and fixed is None:
            out.changes.append({"constant": p.name, "before": start[p] * (1e6 if p.field == "latency" else 1),
                                "after": None, "points": len(before), "source": "nccl-tests",
                                "note": "not determined by these sizes: the preset stays"})
    out.fabric = {"efficiency": {p.kind: values[p] for p in free if p.field == "efficiency"},
                  "latency_us": {p.kind: values[p] * 1e6 for p in free if p.field == "latency"}}
    cal = fabric.calibration_of({p: values[p] for p in free}, out.cal) if fixed is None else cal
    out.tables = _table_rows(tables, bench, before, after)
    return cal


def _table_rows(tables, bench, before, after) -> list[dict]:
    rows, i = [], 0
    for t in tables:
        detail = []
        for r in t.rows:
            detail.append({"bytes": r.bytes, "line": r.line, "measured_us": t.time_s(r) * 1e6,
                           "preset_us": t.time_s(r) * math.exp(before[i]) * 1e6,
                           "calibrated_us": t.time_s(r) * math.exp(after[i]) * 1e6, "error": math.expm1(after[i])})
            i += 1
        rows.append({"file": t.path, "op": t.op, "gpus": t.gpus, "algo": t.algo, "nvls": t.nvls, "rows": detail,
                     "max_abs_error": max(abs(d["error"]) for d in detail)})
    return rows


def _gemm(out: Fitted, traces, gpu: str) -> Calibration:
    sustained = out.cal.sustained if out.cal.sustained is not None else SUSTAINED[gpu]
    points = kernels.gemm_points(traces)
    found = kernels.gemm_changes(points, gpu_preset(gpu).peak_flops, gpu, sustained)
    if not found:
        out.changes.append({"constant": "compute.gemm_kernel", "before": None, "after": None, "points": len(points),
                            "source": "traces", "note": "fewer than 3 BF16/FP16 GEMM shapes recorded "
                                                        "(record_shapes=True): the curve stays"})
        return out.cal
    if found["gemm_half_size"] is None:  # one smallest dimension: the level only
        out.changes.append({"constant": "compute.gemm_kernel", "before": found["before"]["gemm_kernel"],
                            "after": found["gemm_kernel"], "points": found["points"],
                            "residual_after": found["residual"], "source": "traces",
                            "note": f"every shape's smallest dim is {found['min_dim']:.0f}: the level is fitted, "
                                    "gemm_half_size keeps its preset"})
        return replace(out.cal, gemm_kernel=found["gemm_kernel"])
    for key in ("gemm_kernel", "gemm_half_size"):
        out.changes.append({"constant": f"compute.{key}", "before": found["before"][key], "after": found[key],
                            "points": found["points"], "residual_after": found["residual"], "source": "traces"})
    return replace(out.cal, gemm_kernel=found["gemm_kernel"], gemm_half_size=found["gemm_half_size"])


def _attention(out: Fitted, traces, gpu: str) -> Calibration:
    sustained = out.cal.sustained if out.cal.sustained is not None else SUSTAINED[gpu]
    found = kernels.attention_changes(traces, gpu_preset(gpu).peak_flops, gpu, sustained)
    for key, c in found.items():
        out.changes.append({"constant": f"compute.{key}", "before": c["before"], "after": c["after"],
                            "points": c["points"], "residual_after": c["residual"], "source": "traces"})
    return replace(out.cal, **{k: tuple(c["after"]) for k, c in found.items()})


def _sustained(out: Fitted, runs, gpu: str, fixed: Calibration | None) -> Calibration:
    if fixed is None:
        fit = steps.fit_sustained(runs, out.cal, gpu)
        cal = replace(out.cal, sustained=fit.value) if fit.value is not None else out.cal
        before, after, host = fit.before, fit.after, fit.host
        out.changes.append(_sustained_change(fit, runs))
    else:
        cal, fit = fixed, None
        before = [steps.step_time(r, Calibration()) for r in runs]
        results = [steps.result_of(r, fixed) for r in runs]
        after, host = [x.summary["step_time_s"] for x in results], [verdict(x) for x in results]
    out.runs = []
    for i, (r, b, a, h) in enumerate(zip(runs, before, after, host)):
        entry = {"file": r.label, "scenario": r.scenario.name, "measured_s": r.measured_s, "preset_s": b,
                 "calibrated_s": a, "error": a / r.measured_s - 1,
                 "host_bound": bool(h and h["host_bound"]), "host_wait_s": h["wait_s"] if h else 0.0}
        if fit is not None:
            entry.update(elasticity=fit.elasticity[i], in_fit=fit.informs(i))
        out.runs.append(entry)
    return cal


def _sustained_change(fit, runs) -> dict:
    used = [i for i in range(len(runs)) if fit.informs(i)]
    res_b = [math.log(fit.before[i] / runs[i].measured_s) for i in used]
    res_a = [math.log(fit.after[i] / runs[i].measured_s) for i in used]
    change = {"constant": "compute.sustained", "before": fit.preset, "after": fit.value, "points": len(used),
              "residual_before": _mean_abs(res_b) if used else None,
              "residual_after": _mean_abs(res_a) if used else None, "source": "logs"}
    left = len(runs) - len(used)
    bound = sum(1 for i in range(len(runs)) if not fit.informs(i) and fit.host[i] and fit.host[i]["host_bound"])
    if left:
        why = (f"{left} of {len(runs)} runs' steps do not move with the factor (elasticity < "
               f"{steps.MIN_ELASTICITY}), {bound} of them host-bound (the GPU waits for its host to issue "
               "work), the rest set by communication or latency")
        change["note"] = why + (": left out of the fit" if used else ": the preset stays")
    return change


def _compute_section(cal: Calibration, gpu: str) -> dict:
    values = {k: getattr(cal, k) for k in ("sustained", "gemm_kernel", "gemm_half_size", "attention_forward",
                                           "attention_backward") if getattr(cal, k) is not None}
    return {"gpu": gpu, **values} if values else {}


def _compare(items, cal: Calibration, gpu: str, picture: str | None) -> list[dict]:
    """Per trace: the kernel classes and, with a scenario, traced vs simulated breakdown."""
    from ..step import simulate

    out, bars = [], []
    for i in items:
        t = i.parsed
        entry = {"file": i.path, "rank": t.rank, "steps": t.steps, "launched_before": t.launched_before,
                 "classes": kineto.class_table(t),
                 "gemm_shapes": kernels.gemm_table([t], ComputeModel(gpu_preset(gpu)),
                                                   ComputeModel(gpu_preset(gpu), calibration=cal)),
                 "traced": kineto.traced_breakdown(t)}
        if i.scenario is not None:
            s = i.scenario
            s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"calibration": cal})})
            result = simulate(s, baseline=False, force=True)
            entry["simulated"] = kernels.simulated_breakdown(result, t.rank)
            entry["scenario"] = s.name
            bars += [{"label": f"traced r{t.rank}", **entry["traced"]},
                     {"label": f"simulated r{t.rank}", **entry["simulated"]}]
        out.append(entry)
    if picture and bars:
        kernels.picture(bars, picture, "traced vs simulated step (clustersim calibrate)")
    return out


def _mean_abs(residuals) -> float:
    return float(np.mean(np.abs(residuals))) if len(residuals) else 0.0
