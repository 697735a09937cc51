"""The scale-trend picture of ``clustersim validate --plot PATH``: every row's signed step-time
error (percent) against its GPU count on a log2 axis, the rows of each series (one model and
layout scaled out, :mod:`.validation_reports`) in one colour joined by their least-squares
line, the other rows grey, and the fit over all rows as a dashed black line. The band
+-15% is the issue-27 target of every row.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import plotting  # noqa: E402
from .validation_reports import ROW_TARGET, Fit, ScaleTrend  # noqa: E402

OVERALL = "all rows"  # the overall fit line's label
SERIES_COLORS = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive",
                                           "cyan"))  # matplotlib's tab10 less its grey (the other rows')


def _line(ax, fit: Fit, gpus: list[int], color: str, label: str, style: str) -> None:
    """The fit drawn between the smallest and largest GPU count (y = a + b log2 x)."""
    x = [min(gpus), max(gpus)]
    ax.plot(x, [fit.intercept + fit.slope * math.log2(g) for g in x], style, color=color, lw=1.5, label=label)


def _slope_text(fit: Fit) -> str:
    se = f" +- {fit.stderr:.2f}" if fit.stderr is not None else ""
    return f"{fit.slope:+.2f}{se} pt/doubling, n={fit.n}"


def draw(ax, trend: ScaleTrend) -> None:
    """Scatter, series lines and the overall fit onto ``ax``."""
    in_series = {p.id for s in trend.series for p in s.points}
    rest = [p for p in trend.points if p.id not in in_series]
    ax.scatter([p.gpus for p in rest], [100 * p.error for p in rest], color="0.6", s=18, label="other rows")
    for i, s in enumerate(trend.series):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        ax.scatter([p.gpus for p in s.points], [100 * p.error for p in s.points], color=color, s=26)
        if s.fit is not None:
            _line(ax, s.fit, [p.gpus for p in s.points], color, f"{s.label}: {_slope_text(s.fit)}", "-")
    if trend.fit is not None:
        _line(ax, trend.fit, [p.gpus for p in trend.points], "black", f"{OVERALL}: {_slope_text(trend.fit)}", "--")
    ax.axhspan(-100 * ROW_TARGET, 100 * ROW_TARGET, color="tab:green", alpha=0.06)
    ax.axhline(0, color="0.3", lw=0.8)
    plotting.gpu_axis(ax)
    ax.set_ylabel("step-time error, predicted / published - 1 (%)\nnegative: predicted faster than measured")
    ax.set_title("clustersim validate: signed error against scale")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, framealpha=0.9)


def plot(trend: ScaleTrend, path) -> None:
    """Draw the trend and save it as a PNG at ``path``."""
    fig, ax = plotting.figure(width=10, height=6.5)
    draw(ax, trend)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")  # "tight": the legend right of the axes stays in
    plt.close(fig)
