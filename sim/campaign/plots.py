"""Pictures of a campaign: one run's progress against wall time, and ETTR against the
checkpoint interval.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12
--plot-run plots/campaign-run.png --plot-interval plots/campaign-interval.png``.
"""

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .failures import KINDS  # noqa: E402
from .trials import Campaign  # noqa: E402

DAY, HOUR = 86400.0, 3600.0
KIND_COLORS = {"hardware": "tab:red", "software": "tab:orange", "planned": "tab:blue"}


def plot_run(c: Campaign, history: list, title: str, path, zoom_hours: float = 12.0) -> None:
    """Top: trial 0's whole run, progress vs days, failures marked by kind. Bottom: its first
    ``zoom_hours`` step by step, checkpoints and roll-backs visible."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 8.5))
    _whole(ax, c, history)
    ax.set_title(title, fontsize=10)
    _zoom(bx, c, history, zoom_hours * HOUR)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _whole(ax, c: Campaign, history: list) -> None:
    """Progress against days beside the failure-free line; one rug row of ticks per kind."""
    xs, ys = [], []
    for start, end, s0, reached, kept, _ in history:
        xs += [start / DAY, end / DAY, end / DAY, np.nan]
        ys += [s0 / c.steps, reached / c.steps, kept / c.steps, np.nan]
    free = c.finish_s(np.zeros(1, dtype=np.int64))[0] / DAY
    ax.plot([0, free], [0, 1], "--", color="0.5", lw=1, label=f"no failures, checkpoints only ({free:.1f} days)")
    ax.plot(xs, ys, "-", color="black", lw=1.2, label=f"simulated run ({history[-1][1] / DAY:.1f} days)")
    for row, (kind, color) in enumerate(KIND_COLORS.items()):
        days = [end / DAY for _, end, _, _, _, cause in history if cause >= 0 and KINDS[c.kinds[cause]] == kind]
        ax.plot(days, [-0.04 - 0.035 * row] * len(days), "|", color=color, ms=6,
                label=f"{kind} interruptions ({len(days)})")
    ax.set_ylim(-0.15, 1.05)
    ax.set_xlabel("wall time (days)")
    ax.set_ylabel("training progress (share of steps)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)


def _failure_marks(ax, c: Campaign, history: list, unit: float, scale: float) -> None:
    for kind, color in KIND_COLORS.items():
        pts = [(end / unit, reached / scale) for _, end, _, reached, _, cause in history
               if cause >= 0 and KINDS[c.kinds[cause]] == kind]
        if pts:
            x, y = zip(*pts)
            ax.plot(x, y, "v", color=color, ms=4, label=f"{kind} interruption ({len(pts)})")


def _zoom(ax, c: Campaign, history: list, window_s: float) -> None:
    """The first window step by step: training, checkpoint stalls, roll-backs, restarts."""
    shown = [h for h in history if h[0] < window_s]
    for start, end, s0, reached, kept, cause in shown:
        x, y, marks = _segment(c, start, min(end, window_s), s0)
        ax.plot(np.array(x) / HOUR, y, "-", color="black", lw=1)
        ax.plot(np.array(marks[0]) / HOUR, marks[1], "|", color="tab:green", ms=7)
        if cause >= 0 and end <= window_s:
            ax.plot([end / HOUR] * 2, [reached, kept], ":", color=KIND_COLORS[KINDS[c.kinds[cause]]], lw=1.5)
    _failure_marks(ax, c, [h for h in shown if h[1] <= window_s], HOUR, 1)
    ax.plot([], [], "|", color="tab:green", label="checkpoint durable")
    ax.set_xlim(0, window_s / HOUR)
    ax.set_xlabel("wall time (hours)")
    ax.set_ylabel("steps trained")
    ax.set_title(f"first {window_s / HOUR:.0f} hours: checkpoints every {c.interval} steps, roll-back to the last "
                 f"durable one on a failure, flat while restarting", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)


def _segment(c: Campaign, start: float, end: float, s0: int):
    """Corner points of a run from ``start`` to ``end`` and its durable checkpoints."""
    x, y, mx, my = [start], [s0], [], []
    k, L, t, s = c.interval, c.cycle_s, start, s0
    while t < end and s < c.steps:
        n = min(k, c.steps - s, int((end - t) // c.step_s))
        x += [t + n * c.step_s, min(t + L, end)]
        y += [s + n, s + n]
        if n == k and t + L + c.ckpt.write_s <= end:
            mx.append(t + L + c.ckpt.write_s)
            my.append(s + k)
        t, s = t + L, s + k
        if n < k:
            break
    return x, y, (mx, my)


def plot_interval(curve, best_row, young_s: float, daly_s: float, step_s: float, title: str, path) -> None:
    """Mean ETTR (P10-P90 band) against the checkpoint interval, the best simulated interval
    and Young's and Daly's optimum."""
    fig, ax = plt.subplots(figsize=(9, 5.5))
    minutes = curve["interval_s"] / 60
    ax.fill_between(minutes, curve["ettr_p10"], curve["ettr_p90"], color="tab:blue", alpha=0.2,
                    label="P10-P90 over trials")
    ax.plot(minutes, curve["ettr"], "o-", color="tab:blue", lw=2, label="simulated mean ETTR")
    ax.axvline(best_row["interval_s"] / 60, color="tab:blue", ls=":",
               label=f"best simulated: {best_row['interval_s'] / 60:.1f} min, ETTR {best_row['ettr']:.2%}")
    for value, name, color in ((young_s, "Young sqrt(2CM)", "tab:red"), (daly_s, "Daly 2006", "tab:purple")):
        if np.isfinite(value):
            ax.axvline(value / 60, color=color, ls="--", lw=1.2, label=f"{name}: {value / 60:.1f} min")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(f"checkpoint interval (minutes of training; one step = {step_s:.2f} s)")
    ax.set_ylabel("effective training time ratio")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower center", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
