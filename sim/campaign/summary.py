"""What a campaign's trials add up to: CONTRACT.md's ``clustersim campaign --json`` object
and the printed report.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12 [--json]``.

Contract keys: ``days`` (mean over trials), ``ettr`` (productive step time / wall time,
mean), ``interruptions`` (mean per run), ``interruptions_by_cause`` (mean per run of each
class), ``gpu_hours`` (the job's GPUs, plus finite spares' GPUs held idle, x wall hours),
``cost_usd`` (with ``--gpu-hour-usd``), ``p10``/``p50``/``p90`` of days. Extensions are
listed in CONTRACT.md; every figure is a plain float or int, so one seed gives one byte
string.
"""

import numpy as np

from .build import Facts
from .trials import Campaign, Outcome

DAY = 86400.0


def summarize(c: Campaign, o: Outcome, facts: Facts, meta: dict) -> dict:
    """The JSON object. ``meta``: name, tokens, trials, seed, mode, causes, gpu_hour_usd.
    With a deadline (``--days``) every trial's wall time is the deadline and what varies is
    the steps it trained: ``tokens`` is their mean, ``tokens_p10``/``p50``/``p90`` added."""
    days = o.wall_s / DAY
    productive = c.steps * c.step_s if c.deadline_s is None else o.steps_done * c.step_s
    ettr = productive / o.wall_s
    held_gpus = facts.fleet.gpus + (c.spares or 0) * facts.gpus_per_node
    gpu_hours = held_gpus * o.wall_s / 3600.0
    p10, p50, p90 = (float(v) for v in np.percentile(days, [10, 50, 90]))
    out = {"days": _f(days.mean()), "ettr": _f(ettr.mean()), "interruptions": _f(o.interruptions.mean()),
           "interruptions_by_cause": {cause: _f(n) for cause, n in zip(meta["causes"], o.by_cause.mean(axis=0))},
           "gpu_hours": _f(gpu_hours.mean())}
    if meta.get("gpu_hour_usd") is not None:
        out["cost_usd"] = _f(gpu_hours.mean() * meta["gpu_hour_usd"])
    out.update(p10=p10, p50=p50, p90=p90)
    out.update(_extensions(c, o, facts, meta, ettr, productive))
    if c.deadline_s is not None:
        trained = o.steps_done * float(facts.tokens_per_step)
        out.update(tokens=_f(trained.mean()), steps=_f(o.steps_done.mean()),
                   **{f"tokens_p{q}": _f(np.percentile(trained, q)) for q in (10, 50, 90)})
    return out


def _extensions(c: Campaign, o: Outcome, facts: Facts, meta: dict, ettr: np.ndarray, productive: float) -> dict:
    wall = o.wall_s
    return {
        "name": meta["name"], "tokens": _f(meta["tokens"]), "trials": int(meta["trials"]), "seed": int(meta["seed"]),
        "gpus": facts.fleet.gpus, "nodes": facts.fleet.nodes, "spares": c.spares,
        "steps": int(c.steps), "step_time_s": _f(c.step_s), "failure_free_days": _f(np.mean(productive) / DAY),
        "ettr_p10": _f(np.percentile(ettr, 10)), "ettr_p90": _f(np.percentile(ettr, 90)),
        "interruptions_per_day": _f(np.mean(o.interruptions / (wall / DAY))),
        "mtbf_hours": _f(1 / np.sum(c.rates) / 3600) if np.sum(c.rates) else None,
        "checkpoint_mode": meta["mode"], "checkpoint_bytes": _f(facts.checkpoint.total_bytes),
        "checkpoint_bytes_per_gpu": _f(facts.checkpoint.per_gpu_bytes),
        "checkpoint_stall_s": _f(c.ckpt.stall_s), "checkpoint_write_s": _f(c.ckpt.write_s),
        "checkpoint_load_s": _f(c.ckpt.load_s), "checkpoint_interval_steps": int(c.interval),
        "checkpoint_interval_s": _f(c.interval * c.step_s), "young_daly_interval_s": _f(facts.young_s),
        "time_shares": _shares(c, o, productive),
        "hardware_waits": _f(o.waits.mean()),
    }


def _shares(c: Campaign, o: Outcome, productive: float) -> dict:
    """Where the wall time went, averaged over trials (sums to 1)."""
    wall = o.wall_s
    ckpt = wall - productive - o.lost_s - o.down_s
    return {"training": _f(np.mean(productive / wall)), "checkpointing": _f(np.mean(ckpt / wall)),
            "lost_work": _f(np.mean(o.lost_s / wall)), "down": _f(np.mean(o.down_s / wall))}


def _f(x) -> float | None:
    """A plain float (JSON), None for an infinity."""
    x = float(x)
    return None if not np.isfinite(x) else x


def _head(s: dict) -> list[str]:
    """What was asked (tokens, or days with ``--days``) and the step."""
    if "tokens_p50" not in s:
        return [f"campaign     {s['name']}: {s['tokens']:.3g} tokens on {s['gpus']:,} GPUs ({s['nodes']:,} nodes), "
                f"{s['trials']:,} trials, seed {s['seed']}",
                f"step         {s['step_time_s']:.3f} s x {s['steps']:,} steps = {s['failure_free_days']:.1f} days "
                f"without failures"]
    return [f"campaign     {s['name']}: {s['days']:g} days on {s['gpus']:,} GPUs ({s['nodes']:,} nodes), "
            f"{s['trials']:,} trials, seed {s['seed']}",
            f"step         {s['step_time_s']:.3f} s; {s['steps']:,.0f} steps trained on average = "
            f"{s['failure_free_days']:.1f} days of it without failures",
            f"tokens       P10 {s['tokens_p10']:.4g}  P50 {s['tokens_p50']:.4g}  P90 {s['tokens_p90']:.4g}  "
            f"(mean {s['tokens']:.4g})"]


def report(summary: dict) -> str:
    """The human-readable report of a summary."""
    s = summary
    lines = [*_head(s),
             f"checkpoint   {s['checkpoint_bytes'] / 1e12:.2f} TB ({s['checkpoint_bytes_per_gpu'] / 1e6:,.0f} MB "
             f"per GPU), {s['checkpoint_mode']}: stall {s['checkpoint_stall_s']:.3g} s, load "
             f"{s['checkpoint_load_s']:.3g} s, every {s['checkpoint_interval_steps']:,} steps "
             f"({s['checkpoint_interval_s'] / 60:.1f} min; Young/Daly {_minutes(s['young_daly_interval_s'])})",
             f"failures     {s['interruptions_per_day']:.2f} per day (MTBF {_hours(s['mtbf_hours'])})",
             *([] if "tokens_p50" in s else
               [f"days         P10 {s['p10']:.1f}  P50 {s['p50']:.1f}  P90 {s['p90']:.1f}  (mean {s['days']:.1f})"]),
             f"ETTR         {s['ettr']:.1%}  (P10 {s['ettr_p10']:.1%}, P90 {s['ettr_p90']:.1%})",
             "time         " + ", ".join(f"{k.replace('_', ' ')} {v:.1%}" for k, v in s["time_shares"].items()),
             f"GPU-hours    {s['gpu_hours']:,.0f}" + (f"   cost ${s['cost_usd']:,.0f}"  # plain units, not "$0.4 M"
                                                          if "cost_usd" in s else ""),
             f"interrupts   {s['interruptions']:,.1f} per run"
             + (f", {s['hardware_waits']:.1f} waited for a node" if s["spares"] is not None else "")]
    width = max(len(c) for c in s["interruptions_by_cause"])
    ranked = sorted(s["interruptions_by_cause"].items(), key=lambda kv: -kv[1])
    lines += [f"  {cause:<{width}}  {n:8.1f}  ({n / max(s['interruptions'], 1e-12):.1%})" for cause, n in ranked]
    return "\n".join(lines)


def _minutes(seconds: float | None) -> str:
    return "none: no failures" if seconds is None else f"{seconds / 60:.1f} min"


def _hours(hours: float | None) -> str:
    return "none" if hours is None else f"{hours:.2f} h"
