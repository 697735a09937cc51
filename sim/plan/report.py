"""What ``clustersim plan`` prints and writes: the ranked table (rich), the one-object JSON
of CONTRACT.md, the CSV / Parquet of every evaluated layout, and the winner's timeline.
"""

import io
import os
from pathlib import Path

from ..input.choices import Schedule
from ..hardware.gpus import gpu_preset
from ..outputs.paths import write_bytes
from ..units import format_bytes, format_duration
from .rank import AXES
from .rules import BY_ID
from .select import WHY as PICKED

CONTRACT_KEYS = ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_stages", "zero", "recompute", "micro_batch",
                 "schedule", "step_time_s", "mfu", "memory_per_gpu_bytes", "fits_in_memory", "simulated")
EXTRA_KEYS = ("rank", "tp_comm_overlap", "ep_comm_overlap", "estimate_s", "bubble_fraction") \
    + tuple(f"exposed_{a}_s" for a in AXES) + ("limit", "sim_wall_s", "extrapolated", "picked")


def layout_dict(row) -> dict:
    """One table row as the JSON layout object (the contract's keys, then this repo's)."""
    out = {k: _plain(row[k]) for k in CONTRACT_KEYS + EXTRA_KEYS}
    out["sequence_parallel"] = out["tp"] > 1
    if out["sim_wall_s"] != out["sim_wall_s"]:  # NaN: not simulated
        out["sim_wall_s"] = None
    out["picked"] = out["picked"] or None  # why it was picked for simulation (select.WHY's key); None if it was not
    return out


def summary(plan, req, top: int) -> dict:
    """``clustersim plan --json``: evaluated, rejected, layouts (best first), and more."""
    t = req.scenario.training
    return {"evaluated": plan.evaluated, "rejected": plan.rejected,
            "layouts": [layout_dict(r) for _, r in plan.table.head(top).iterrows()],
            "candidates": plan.candidates, "simulated": plan.simulated, "model": req.scenario.model.name,
            "gpus": req.gpus, "gpu": req.gpu, "topology": req.data["cluster"]["topology"], "seq_len": t.seq_len,
            "global_batch": t.global_batch, "precision": t.precision, "headroom": plan.headroom,
            "budget_s": plan.budget_s, "predicted_simulation_s": round(plan.spent_s, 3),
            "rank_correlation": plan.rank_correlation, "rank_correlation_front": plan.rank_correlation_front,
            "estimated_only": plan.evaluated - plan.simulated, "stopped": plan.stopped, "picked": pick_counts(plan),
            "estimate_scale": plan.estimate_scale, "failed": {str(k): v for k, v in plan.failures.items()},
            "refused": {str(k): v for k, v in plan.refused.items()},
            "resumed": plan.stats.get("resumed", 0), "seconds": plan.seconds}


def pick_counts(plan) -> dict:
    """Why the layouts picked for simulation were picked: reason (select.WHY's keys, :data:`PICKED`) -> count,
    stopped and failed picks included."""
    return {k: sum(v == k for v in plan.picked.values()) for k in PICKED}


def print_text(plan, req, top: int, file=None) -> None:
    """The heading, the rich table of the ``top`` best, and what the search measured."""
    from rich.console import Console

    console = Console(file=file, width=None if file is None and os.isatty(1) else 200, highlight=False)
    gpu = gpu_preset(req.gpu)
    t = req.scenario.training
    console.print(f"plan: {req.scenario.model.name} on {req.gpus:,} x {gpu.name} ({req.data['cluster']['topology']}), "
                  f"seq {t.seq_len:,}, {t.global_batch:,} sequences ({t.global_batch * t.seq_len / 1e6:.1f}M tokens) "
                  f"per step, {t.precision}")
    console.print(_counts_line(plan))
    console.print(_table(plan, top, gpu))
    for line in _notes(plan, gpu):
        console.print(line)


def _counts_line(plan) -> str:
    rejected = sum(plan.rejected.values())
    why = ", ".join(f"{BY_ID[k].text if k in BY_ID else k} {v:,}" for k, v in
                    sorted(plan.rejected.items(), key=lambda kv: -kv[1]))
    picks = ", ".join(f"{n} {k}" for k, n in pick_counts(plan).items() if n)
    stopped = f", {plan.stopped} stopped at the point limit" if plan.stopped else ""
    return (f"{plan.candidates:,} layouts: {rejected:,} rejected ({why}); {plan.evaluated:,} evaluated: "
            f"{plan.simulated} simulated, {plan.evaluated - plan.simulated:,} estimated only (picked for simulation: "
            f"{picks or 'none'}{stopped}; predicted {plan.spent_s:.0f} s of simulation, budget {plan.budget_s:.0f} s)")


def _table(plan, top: int, gpu):
    from rich.table import Table

    moe = bool((plan.table["ep"] > 1).any())
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    heads = ["#", "tp", "pp", "dp", "cp"] + (["ep", "etp"] if moe else []) + \
        ["v", "schedule", "zero", "recompute", "mb", "overlap", "step", "MFU", "memory", "bubble",
         "exp TP", "exp CP"] + (["exp EP"] if moe else []) + ["exp PP", "exp DP", "limited by", "from", "picked"]
    for h in heads:
        table.add_column(h, justify="left" if h in ("schedule", "recompute", "overlap", "limited by", "from", "picked")
                         else "right")
    for _, r in plan.table.head(top).iterrows():
        overlap = "+".join(k for k, on in (("tp", r.tp_comm_overlap), ("ep", r.ep_comm_overlap)) if on) or "-"
        cells = [r["rank"], r.tp, r.pp, r.dp, r.cp] + ([r.ep, r.expert_tp] if moe else []) + \
            [r.virtual_stages, r.schedule, r.zero, r.recompute, r.micro_batch, overlap,
             format_duration(r.step_time_s), f"{r.mfu:.1%}", format_bytes(r.memory_per_gpu_bytes, gpu.hbm_unit),
             f"{r.bubble_fraction:.1%}"] + \
            [format_duration(r[f"exposed_{a}_s"]) for a in (("tp", "cp", "ep") if moe else ("tp", "cp"))] + \
            [format_duration(r.exposed_pp_s), format_duration(r.exposed_dp_s), r.limit,
             _source(r), r.picked or "-"]
        table.add_row(*(str(c) for c in cells))
    return table


def _source(row) -> str:
    """Where a row's step time comes from: ``sim`` (every micro-batch simulated), ``steady``
    (simulated at a few micro-batch counts and extrapolated, sim/steady.py) or ``est``."""
    return ("steady" if row.extrapolated else "sim") if row.simulated else "est"


def _notes(plan, gpu) -> list[str]:
    out = []
    if plan.rank_correlation is not None:
        front = f" ({plan.rank_correlation_front:.2f} over the best-estimated ones)" \
            if plan.rank_correlation_front is not None else ""
        out.append(f"estimate vs simulation: Spearman {plan.rank_correlation:.2f} over {plan.simulated} simulated "
                   f"layouts{front}; estimated rows are scaled by {plan.estimate_scale:.3f} (median simulated / "
                   "estimated)")
    if plan.picked:
        out.append("picked: " + "; ".join(f"{k}: {PICKED[k]}" for k, n in pick_counts(plan).items() if n))
    if plan.failures:
        out.append(f"{len(plan.failures)} simulations failed and keep their estimate: "
                   + "; ".join(sorted(set(plan.failures.values()))[:3]))
    if plan.refused:
        out.append(f"{len(plan.refused)} layouts picked for simulation were refused by the work budget and left "
                   "out: " + "; ".join(sorted(set(plan.refused.values()))[:2]))
    if plan.stats.get("resumed"):
        out.append(f"{plan.stats['resumed']} simulations resumed from a previous run")
    best = plan.table.iloc[0]
    out.append(f"best: {describe(best)}: {format_duration(best.step_time_s)} per step, {best.mfu:.1%} MFU (of the dense "
               f"BF16 peak, {gpu.peak_flops / 1e12:,.0f} TFLOP/s, under every precision, as in the MFU column), "
               f"{format_bytes(best.memory_per_gpu_bytes, gpu.hbm_unit)} per GPU; limited by {best.limit}"
               + ("" if best.simulated else " (estimated: no layout could be simulated within the budget)"))
    if best.schedule in WHY:
        out.append(f"why {best.schedule}: {WHY[best.schedule]}")
    return out


WHY = {  # what the planner says when its best layout runs one of the newer schedules
    Schedule.ZB_H1: "weight gradients deferred into the pipeline bubbles (Qi et al. 2024): bubble (p-1)(F+B-W), a third "
             "of 1F1B's for equal passes, at 1F1B's activation memory",
    Schedule.DUALPIPE: "micro-batches fed from both ends, forward and backward of two micro-batches overlapped "
                "(DeepSeek-V3): bubble (PP/2-1)(F&B+B-3W) and the MoE all-to-alls under compute, for a second "
                "copy of each stage's parameters and PP+1 micro-batches' activations",
    Schedule.DUALPIPEV: "DualPipe cut in half (a V, two chunks per GPU): its small bubble with one parameter copy",
}


def describe(row) -> str:
    """``tp 8 x pp 16 (v 6, interleaved) x dp 32 x cp 4, zero 1, recompute none, mb 1, tp overlap``."""
    text = f"tp {row.tp} x pp {row.pp}"
    if row.pp > 1:
        text += f" (v {row.virtual_stages}, {row.schedule})"
    text += f" x dp {row.dp} x cp {row.cp}"
    if row.ep > 1:
        text += f", ep {row.ep} (expert tp {row.expert_tp})"
    text += f", zero {row.zero}, recompute {row.recompute}, micro-batch {row.micro_batch}"
    flags = [name for name, on in (("tp overlap", row.tp_comm_overlap), ("ep overlap", row.ep_comm_overlap)) if on]
    return text + "".join(f", {f}" for f in flags)


def write_table(plan, path) -> None:
    """Every evaluated layout, ranked, to ``path`` (.csv or .parquet), replaced atomically."""
    path = Path(path)
    frame = plan.table.drop(columns=["position"])
    buf = io.BytesIO()
    if path.suffix == ".parquet":
        frame.to_parquet(buf, index=False)
    else:
        buf.write(frame.to_csv(index=False).encode())
    write_bytes(path, buf.getvalue(), "--out")


def _plain(v):
    return v.item() if hasattr(v, "item") else v
