"""Matplotlib pieces the study plots share: figure, GPU-count axis, simulated curves
with hollow markers where the point does not fit in memory, notes box, saving.

Run ``clustersim study NAME`` to produce ``out/study-NAME.png`` (``--out-dir plots``: the shipped one).
"""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402

COLORS = ("tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown")


def figure(panels: int = 1, width: float = 8.0, height: float = 5.5):
    """A figure with ``panels`` axes side by side."""
    fig, axes = plt.subplots(1, panels, figsize=(width, height))
    return fig, axes


def sim_line(ax, x, y, fits, color: str, label: str, marker: str = "o") -> None:
    """Simulated points joined by a solid line; hollow markers where memory does not fit."""
    x, y, fits = list(x), list(y), [bool(f) for f in fits]
    ax.plot(x, y, "-", color=color, lw=2, label=label)
    ax.plot([a for a, f in zip(x, fits) if f], [b for b, f in zip(y, fits) if f], marker, color=color, ms=6)
    ax.plot([a for a, f in zip(x, fits) if not f], [b for b, f in zip(y, fits) if not f], marker,
            color=color, ms=6, mfc="white")


def gpu_axis(ax, label: str = "GPUs (log scale)") -> None:
    """Log2 x axis ticked at readable GPU counts."""
    ax.set_xscale("log", base=2)
    lo, hi = ax.get_xlim()
    ticks = [t for t in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
             if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def legend_notes(ax, lines: list[str], loc: str = "lower left", at=(0.02, 0.45)) -> None:
    """The legend, and a box of explanatory lines with its top left corner at ``at``
    (axes fraction; by default above a lower-left legend, where MFU curves leave room)."""
    ax.legend(loc=loc, fontsize=8.5, framealpha=0.9)
    ax.text(*at, "\n".join(lines), transform=ax.transAxes, ha="left", va="top", fontsize=8,
            bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.95))


def times_panel(ax, base, s) -> None:
    """The seeds' picture for one FSDP curve: compute falls as 1/N, communication is flat;
    the simulated step time follows the larger of the two (plus latency)."""
    ax.plot(base["gpus"], base["compute_s_seeds"], "-", color="black", lw=1.5,
            label="compute per step (seeds: 6 x tokens x params / (N x FLOP/s_eff))")
    ax.axhline(s.comm_s_seeds, color="tab:red", ls="--", lw=1.5,
               label="FSDP comm per step (seeds: 3 x params x 2 B / (domain x IB))")
    ax.plot(base["gpus"], base["step_s_sim"], "o-", color="tab:blue", lw=2, label="simulated step time")
    ax.plot(base["gpus"], base["exposed_comm_s_sim"], "s-", color="tab:purple", lw=1.5, ms=5,
            label="simulated exposed comm (not hidden under compute)")
    ax.axvline(s.n_star_seeds, color="tab:red", ls=":", lw=1)
    ax.text(s.n_star_seeds, s.comm_s_seeds * 1.15, f" N* = {s.n_star_seeds:,.0f}",
            color="tab:red", fontsize=9, va="bottom")
    ax.set_yscale("log")
    gpu_axis(ax)
    ax.set_ylabel("seconds per optimizer step (log scale)")
    ax.set_title(f"{s.curve}: why MFU craters")
    ax.legend(loc="upper right", fontsize=8.5, framealpha=0.9)


def save(fig, path) -> None:
    """Tight layout, 130 dpi PNG, figure closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
