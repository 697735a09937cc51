"""PNG timelines of a simulated step: a Gantt chart that shows overlap, bubbles and waits.

``clustersim run SCENARIO --timeline out.png [--timeline-window 100:250]``, ``clustersim plot
SCENARIO -o out.png [--start-ms A --end-ms B]``, or :func:`plot_timeline` / :func:`plot_panels`
from Python.

Rows (:mod:`sim.outputs.timeline_rows`): for every shown rank, its compute stream, then one row
per kind of communication (tp, cp, ep, pp, dp), then a row per stream of any other kind. Compute
is light blue forward, dark blue backward (paler shades: an interleaved rank's second model
chunk), grey for the optimizer; blocks of one micro-batch are separated by white lines and carry
its number. On the compute row, hatched grey where the GPU computes nothing (pipeline bubbles,
waits) and a red strip where communication runs while nothing computes (exposed communication:
drawn nowhere else); pale communication bars are collectives waiting for a peer. Large runs
show representative ranks (:func:`sim.outputs.rank_selection.select_ranks`), each labelled with
its coordinates and exactly which folded ranks it stands for.

The picture is true at every zoom (:mod:`sim.outputs.timeline_paint`): nothing is widened to a
pixel; time in spans narrower than a pixel fills its pixel column to the share it was busy, so
the area drawn in a colour is the time spent in it. The time axis is in us, ms or s; a window
other than the whole step is named in the title.
"""

import numpy as np
import pandas as pd

from ..engine.kinds import Category, Phase
from ..errors import InputError
from .host import with_spans as with_host
from .metrics import subtract, union
from .timeline_paint import (CHAR_WIDTH, COLORS, PALE, STRIP, add_legend, color_of, fit_title, paint, paint_stacked,
                             time_unit)
from .timeline_rows import (EXPOSED_KINDS, KIND_ORDER, fit_ranks, layout_rows,
                            per_rank, shown_note, shown_ranks, waits)

__all__ = ["COLORS", "KIND_ORDER", "add_legend", "color_of", "draw", "drawn_phase",
           "exposed_comm", "headline", "idle_compute", "plot_panels", "plot_timeline", "waits"]
_fit_ranks, _layout_rows, _shown_ranks = fit_ranks, layout_rows, shown_ranks  # (older names, used by tests)
MAX_LABELS = 400  # micro-batch numbers written inside compute blocks, at most
PX_WIDTH = 1400  # plot width in pixels at the saved dpi (what a pixel column is)
SEPARATOR_PX = 3  # white lines between compute blocks only where both blocks are at least this wide
TITLE_PT = 9  # panel titles, points
STACK = ("forward", "forward2", "backward", "backward2", "compute")  # a compute row's colours, bottom up


def exposed_comm(spans, rank: int) -> np.ndarray:
    """Intervals where ``rank`` communicates and computes nothing."""
    mine = spans[spans["rank"] == rank]
    comp = union(mine.loc[mine.category == Category.COMPUTE, ["start_s", "end_s"]].to_numpy())
    comm = union(mine.loc[mine.category.isin(EXPOSED_KINDS), ["start_s", "end_s"]].to_numpy())
    return subtract(comm, comp)


def idle_compute(spans, rank: int, end: float) -> np.ndarray:
    """Intervals of [0, end] where ``rank``'s compute stream is idle."""
    mine = spans[(spans["rank"] == rank) & (spans.category == Category.COMPUTE)]
    comp = union(mine[["start_s", "end_s"]].to_numpy())
    return subtract(np.array([[0.0, end]]), comp)


DRAWN_PHASE = {Phase.FORWARD: "forward", Phase.BACKWARD: "backward", Phase.RECOMPUTE: "backward"}


def drawn_phase(phase) -> str:
    """How a compute span of ``phase`` is drawn: forward, backward (recomputation belongs to
    the backward pass) or other compute (the optimizer)."""
    return DRAWN_PHASE.get(phase, "compute")


def _chunks(layer: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Model chunk of each compute span: a rank's fwd/bwd layers form contiguous runs, one
    per chunk it holds (two or more under interleaved 1F1B); -1 for the optimizer."""
    out = np.full(len(layer), -1)
    model = phase != "compute"
    held = np.unique(layer[model])
    if not len(held):
        return out
    chunk_of = np.concatenate([[0], np.cumsum(np.diff(held) > 1)])
    out[model] = chunk_of[np.searchsorted(held, layer[model])]
    return out


def _compute_blocks(ax, g, y: float, window, px: float, scale: float, labels_left: int) -> int:
    """One rank's compute row, coloured by direction and chunk (:func:`paint_stacked`); a
    white line between blocks (one micro-batch, direction and chunk) that are both wide enough
    to see, and the micro-batch number inside blocks wide enough; returns labels still allowed."""
    g = g.sort_values("start_s", kind="stable")
    phase = g.phase.map(drawn_phase).to_numpy()
    chunk = _chunks(g.layer.to_numpy(), phase)
    mb = g.micro_batch.to_numpy()
    starts, ends = g.start_s.to_numpy(), g.end_s.to_numpy()
    color = np.where(phase == "compute", "compute", np.where(chunk % 2 == 1, np.char.add(phase.astype(str), "2"),
                                                             phase.astype(str)))
    layers = [(np.column_stack([starts[color == k], ends[color == k]]), COLORS[k]) for k in STACK if (color == k).any()]
    paint_stacked(ax, layers, y, window, px, scale)
    new = np.ones(len(g), dtype=bool)  # blocks: one micro-batch, direction and chunk
    new[1:] = (phase[1:] != phase[:-1]) | (mb[1:] != mb[:-1]) | (chunk[1:] != chunk[:-1])
    first = np.flatnonzero(new)
    b_start, b_end = starts[first], np.maximum.reduceat(ends, first) if len(g) else ends
    b_mb, b_dark = mb[first], np.char.startswith(color[first].astype(str), "backward")
    wide = (b_end - b_start) >= SEPARATOR_PX * px
    edges = b_start[1:][wide[1:] & wide[:-1] & (b_start[1:] - b_end[:-1] < px)]
    if len(edges):
        ax.vlines(edges * scale, y + 0.1, y + 0.9, colors="white", linewidth=0.8)
    bounds = np.append(first, len(g))
    for i, (a, b, m, dark) in enumerate(zip(b_start, b_end, b_mb, b_dark)):
        if labels_left <= 0:
            break
        if m < 0 or (b - a) <= 11 * px:
            continue
        x = (a + b) / 2
        st, en = starts[bounds[i]:bounds[i + 1]], ends[bounds[i]:bounds[i + 1]]
        if not ((st <= x) & (x <= en + px)).any():  # the middle is a gap: write on the widest span
            j = int(np.argmax(en - st))
            x = (st[j] + en[j]) / 2 if en[j] - st[j] > 8 * px else x
        ax.text(x * scale, y + 0.5, str(int(m)), ha="center", va="center", fontsize=6,
                color="white" if dark else "#1A1A1A", clip_on=True)
        labels_left -= 1
    return labels_left


def _comm_rows(ax, shown, waiting, y_of, row_of, window, px, scale) -> set:
    """Communication and other streams, one union per (rank, stream); pale where a
    collective waits for its peers (``waiting``: :func:`waits`). Returns the pale kinds."""
    comm = shown[~shown.category.isin([Category.COMPUTE, Category.IDLE])]
    for (rank, stream), g in comm.groupby(["rank", "stream"]):
        paint(ax, g[["start_s", "end_s"]].to_numpy(), y_of[row_of[(int(rank), stream)]], window, px, scale,
              facecolors=color_of(str(g.category.iloc[0])))
    rows, kinds = {}, set()
    for rank, kind, a, b, stream in waiting:
        rows.setdefault(row_of[(rank, stream)], []).append((a, b))
        kinds.add(str(kind))
    for row, iv in rows.items():
        paint(ax, iv, y_of[row], window, px, scale, facecolors="white", alpha=PALE)
    return kinds


def draw(ax, result, ranks=None, window=None, title=None, legend=True) -> dict:
    """Draw ``result``'s timeline on ``ax``. Returns what it drew, for :func:`add_legend`
    and tests: ``ranks`` shown, comm ``kinds``, ``chunked`` (interleaved model chunks), the
    kinds of ``pale`` (waiting) bars, the time ``unit`` and ``window``, and ``exposed_s``
    (rank -> exposed communication inside the window, as the red strip's area draws it)."""
    ranks = fit_ranks(result, shown_ranks(result, ranks))
    sp = with_host(result)  # (the host's issue spans: a row of their own, sim/outputs/host.py)
    end = float(result.spans.end_s.max()) if len(result.spans) else 0.0
    lo, hi = (0.0, end) if window is None else window
    if hi <= lo:
        raise InputError("--end-ms", f"the window [{lo * 1e3:g}, {hi * 1e3:g}] ms is empty")
    unit, scale = time_unit(lo, hi)
    px = (hi - lo) / PX_WIDTH  # one pixel column
    frames = per_rank(sp, ranks)
    rows, labels, row_of = layout_rows(result, ranks, frames)
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    mine = pd.concat(list(frames.values())) if frames else sp.iloc[:0]
    shown = mine[(mine.end_s >= lo) & (mine.start_s <= hi)]
    labels_left, chunked = MAX_LABELS, False
    for rank, g in shown[shown.category == Category.COMPUTE].groupby("rank"):
        labels_left = _compute_blocks(ax, g, y_of[(int(rank), "compute", 0)], (lo, hi), px, scale, labels_left)
        chunked |= bool((_chunks(g.layer.to_numpy(), g.phase.map(drawn_phase).to_numpy()) > 0).any())
    waiting = [w for w in waits(result, ranks) if w[3] >= lo and w[2] <= hi]
    pale_kinds = _comm_rows(ax, shown, waiting, y_of, row_of, (lo, hi), px, scale)
    exposed_s = {}
    for rank in ranks:
        y = y_of[(rank, "compute", 0)]
        idle = np.clip(idle_compute(frames[rank], rank, end), lo, hi)
        paint(ax, idle[idle[:, 1] > idle[:, 0]], y, (lo, hi), 0.0, scale, facecolors="none",
              edgecolors=COLORS["idle"], hatch="////")
        exposed = np.clip(exposed_comm(frames[rank], rank), lo, hi)
        exposed_s[rank] = float((exposed[:, 1] - exposed[:, 0]).sum()) if len(exposed) else 0.0
        paint(ax, exposed, y, (lo, hi), px, scale, band=STRIP, facecolors=COLORS["exposed"])
    _axes(ax, rows, labels, y_of, ranks, (lo, hi), unit, scale, title)
    shown_kinds = {str(k) for k in shown.category.unique() if k not in (Category.IDLE, Category.COMPUTE)}
    features = {"ranks": ranks, "kinds": shown_kinds, "chunked": chunked, "pale": pale_kinds, "unit": unit,
                "window": (lo, hi), "step": end, "exposed_s": exposed_s}
    if legend:
        add_legend(ax, [features])
    return features


def _axes(ax, rows, labels, y_of, ranks, window, unit, scale, title) -> None:
    ax.set_yticks([y_of[row] + 0.5 for row in rows], [labels[row] for row in rows],
                  fontsize=7 if len(rows) > 16 else 8)
    for rank in ranks[1:]:  # separate ranks
        ax.axhline(y_of[(rank, "compute", 0)] + 1, color="0.3", lw=0.6)
    ax.set_ylim(0, len(rows))
    ax.set_xlim(window[0] * scale, window[1] * scale)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(True, axis="x", alpha=0.3)
    if title is not None:
        ax.set_title(title, fontsize=10, loc="left")


def headline(result) -> str:
    """'name: 64 GPUs, step 887.5 ms, MFU 54.1%'."""
    from ..units import format_duration

    s = result.summary
    text = f"{s['name']}: {s['num_gpus']:,} GPUs, step {format_duration(s['step_time_s'])}, MFU {s['mfu']:.1%}"
    return text + (f" -- {s['steady_shown']}" if "steady_shown" in s else "")  # (sim/steady.py)


def window_note(window, step: float, whole: str = "step") -> str:
    """'window 100-250 ms of the 887.5 ms step' ('' for the whole step); ``whole`` names what
    the time axis spans (an RL loop's timeline spans a ``run`` of several steps)."""
    from ..units import format_duration

    lo, hi = window
    if lo <= 0 and hi >= step:
        return ""
    unit, scale = time_unit(lo, hi)
    digits = max(0, 1 - int(np.floor(np.log10((hi - lo) * scale))))  # enough to tell the ends apart
    return f"window {lo * scale:,.{digits}f}-{hi * scale:,.{digits}f} {unit} of the {format_duration(step)} {whole}"


def plot_timeline(result, path: str, ranks=None, window=None, title: str | None = None, whole: str = "step") -> None:
    """One result's timeline as a PNG (``whole``: what its time axis spans, see :func:`window_note`);
    a steady run's shows its largest simulated run (``Result.shown``), its title says so."""
    plot_panels([(result.shown or result, title)], path, ranks, window, whole=whole)


def _rows(result, ranks) -> list[tuple]:
    return layout_rows(result, ranks)[0]


def _label_inches(result, ranks) -> float:
    """Width of the widest row label (the axes start after it), at 8 points."""
    labels = layout_rows(result, ranks)[1].values()
    return max((len(t) for t in labels), default=10) * 8 * CHAR_WIDTH / 72 + 0.4


def _titles(items, ranks, window, fig_w: float, whole: str = "step") -> list[str]:
    """Each panel's title (its own, the headline, the ranks shown, the window), wrapped to
    the width left of the figure after the row labels."""
    out = []
    for result, title in items:
        shown = fit_ranks(result, shown_ranks(result, ranks))
        own = float(result.spans.end_s.max())
        parts = [(title + " -- " if title else "") + headline(result), shown_note(result, shown),
                 window_note(window if window is not None else (0.0, own), own, whole)]
        out.append(fit_title("  |  ".join(p for p in parts if p), fig_w - _label_inches(result, shown), TITLE_PT))
    return out


def plot_panels(items, path: str, ranks=None, window=None, suptitle: str | None = None, whole: str = "step") -> None:
    """Several results stacked on one shared time axis, one legend, as a PNG: ``items`` =
    [(result, title), ...]; ``ranks`` a selector or list (see :mod:`sim.outputs.rank_selection`),
    ``window`` (start_s, end_s) or None for the whole (longest) step."""
    import matplotlib.pyplot as plt

    if not str(path).endswith(".png"):
        raise InputError("--timeline", f"expected a .png path, got {path!r}")
    fig = timeline_figure(items, ranks, window, suptitle, whole)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def timeline_figure(items, ranks=None, window=None, suptitle: str | None = None, whole: str = "step"):
    """The figure :func:`plot_panels` saves (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [max(2, len(_rows(result, fit_ranks(result, shown_ranks(result, ranks))))) for result, _ in items]
    fig_w = PX_WIDTH / 100 + 2.5
    titles = _titles(items, ranks, window, fig_w, whole)
    extra = [0.16 * t.count("\n") for t in titles]
    fig_h = sum(0.28 * h + 1.1 + x for h, x in zip(heights, extra)) + 0.9
    fig, axes = plt.subplots(len(items), 1, figsize=(fig_w, fig_h), squeeze=False,
                             gridspec_kw={"height_ratios": [h + 4 + x / 0.28 for h, x in zip(heights, extra)]},
                             sharex=len(items) > 1)
    end = max(float(res.spans.end_s.max()) for res, _ in items)
    features = []
    for i, ((result, _), ax) in enumerate(zip(items, axes[:, 0])):
        win = window if window is not None else ((0.0, end) if len(items) > 1 else None)
        features.append(draw(ax, result, ranks, win, title=None, legend=False))
        if i < len(items) - 1:
            ax.set_xlabel("")
        ax.set_title(titles[i], fontsize=TITLE_PT, loc="left", pad=4)
    lines = add_legend(axes[0, 0], features)
    axes[0, 0].set_title(titles[0], fontsize=TITLE_PT, loc="left", pad=6 + 13 * lines)
    if suptitle:  # (placed in a strip of its own: a tall figure's tight_layout would run under it)
        fig.suptitle(fit_title(suptitle, fig_w, 11), fontsize=11, y=1 - 0.15 / fig_h, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig_h) if suptitle else None)
    return fig
