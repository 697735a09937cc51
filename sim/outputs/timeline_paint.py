"""How a PNG timeline paints time (:mod:`sim.outputs.timeline`): true at every zoom.

An interval at least a pixel wide is drawn exactly as wide as it is. Intervals narrower than
a pixel are never widened: their time is summed per pixel column and the column is filled
to that share of the row's height (:func:`pixel_bars`), so a column a third busy is a third
full, and the area drawn in a colour is the time spent in it, at any zoom. On a compute row
the colours' partial columns are stacked (forward, backward, optimizer shares of the same
column one above the other). The time axis is in us, ms or s, whichever keeps the window's
numbers short (:func:`time_unit`); titles are wrapped to the figure's width (:func:`fit_title`).

Run: ``clustersim plot scenarios/gpt-1.7b-ptd-interleaved-a100.toml -o t.png``.
"""

import textwrap

import numpy as np

from ..errors import InputError
from .metrics import union

UNITS = (("us", 1e6, 2e-3), ("ms", 1e3, 5.0), ("s", 1.0, float("inf")))  # (name, per second, windows below)
BAR = (0.1, 0.8)  # a row's bars: from y + 0.1, 0.8 tall
STRIP = (0.1, 0.18)  # the exposed-communication strip at the bottom of a compute row
CHAR_WIDTH = 0.55  # a character's mean width in font sizes (DejaVu Sans), to wrap titles


def time_unit(lo: float, hi: float) -> tuple[str, float]:
    """(name, scale): us for windows under 2 ms, ms under 5 s, else s (ticks stay under 5,000)."""
    for name, scale, below in UNITS:
        if hi - lo < below:
            return name, scale
    return UNITS[-1][:2]


def pixel_bars(intervals, lo: float, hi: float, px: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x0, x1, fill) of the bars that draw ``intervals`` (seconds) in [lo, hi] with pixels
    ``px`` wide: merged intervals at least a pixel wide as they are (fill 1); the time of
    narrower ones summed per pixel column, each column drawn a pixel wide and filled to its
    busy share. sum((x1 - x0) * fill) is the intervals' covered time inside the window."""
    iv = union(np.asarray(intervals, dtype=float).reshape(-1, 2))
    iv = np.column_stack([np.maximum(iv[:, 0], lo), np.minimum(iv[:, 1], hi)]) if len(iv) else iv
    iv = iv[iv[:, 1] > iv[:, 0]] if len(iv) else iv
    wide = (iv[:, 1] - iv[:, 0]) >= px
    x0, x1 = iv[wide, 0], iv[wide, 1]
    narrow = iv[~wide]
    if not len(narrow):
        return x0, x1, np.ones(len(x0))
    n = max(1, int(np.ceil((hi - lo) / px)))
    a = np.minimum(((narrow[:, 0] - lo) / px).astype(np.int64), n - 1)
    b = np.minimum(((narrow[:, 1] - lo) / px).astype(np.int64), n - 1)
    edge = lo + (a + 1) * px  # a narrow interval spans at most two columns
    cover = np.zeros(n)
    np.add.at(cover, a, np.where(a == b, narrow[:, 1], edge) - narrow[:, 0])
    split = a != b
    np.add.at(cover, b[split], narrow[split, 1] - edge[split])
    cols = np.flatnonzero(cover > 0)
    c0 = lo + cols * px
    return (np.concatenate([x0, c0]), np.concatenate([x1, c0 + px]),
            np.concatenate([np.ones(len(x0)), np.minimum(cover[cols] / px, 1.0)]))


def rects(ax, x0, x1, y0, height, scale: float, **style) -> None:
    """Rectangles [x0, x1] x [y0, y0 + height] (arrays; x in seconds) as one collection."""
    from matplotlib.collections import PolyCollection

    x0, x1 = np.asarray(x0, dtype=float) * scale, np.asarray(x1, dtype=float) * scale
    if not len(x0):
        return
    y0 = np.broadcast_to(np.asarray(y0, dtype=float), x0.shape)
    y1 = y0 + np.broadcast_to(np.asarray(height, dtype=float), x0.shape)
    verts = np.stack([np.column_stack(p) for p in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)
    style.setdefault("linewidths", 0)
    ax.add_collection(PolyCollection(verts, **style))


def paint(ax, intervals, y: float, window, px: float, scale: float, band=BAR, **style) -> None:
    """``intervals`` on the row at ``y``, in ``band`` (offset, height), by :func:`pixel_bars`."""
    x0, x1, fill = pixel_bars(intervals, window[0], window[1], px)
    rects(ax, x0, x1, y + band[0], band[1] * fill, scale, **style)


def paint_stacked(ax, layers: list[tuple[np.ndarray, str]], y: float, window, px: float, scale: float) -> None:
    """Several colours of one row (a compute row's forward, backward, ...): each colour's
    wide intervals drawn full height, the partial columns of all colours stacked bottom up
    in ``layers``' order so that none hides another."""
    lo, hi = window
    n = max(1, int(np.ceil((hi - lo) / px)))
    base = np.zeros(n)
    for iv, color in layers:
        x0, x1, fill = pixel_bars(iv, lo, hi, px)
        full = fill >= 1.0
        rects(ax, x0[full], x1[full], y + BAR[0], BAR[1], scale, facecolors=color)
        col = np.minimum(np.round((x0[~full] - lo) / px).astype(np.int64), n - 1)
        part = fill[~full]
        rects(ax, x0[~full], x1[~full], y + BAR[0] + BAR[1] * base[col], BAR[1] * part, scale, facecolors=color)
        np.add.at(base, col, part)


def fit_title(text: str, width_in: float, fontsize: float) -> str:
    """``text`` wrapped (at ' | ', ', ' and spaces) so that no line runs past a figure
    ``width_in`` inches wide at ``fontsize`` points."""
    per_line = max(20, int(width_in * 72 / (fontsize * CHAR_WIDTH)))
    lines = []
    for part in text.split("\n"):
        lines += textwrap.wrap(part, per_line, break_long_words=True, break_on_hyphens=False) or [""]
    return "\n".join(lines)


COLORS = {"compute": "#5A5A5A", "forward": "#86A9DB", "backward": "#2F4B7C",
          "forward2": "#C4D6EF", "backward2": "#5E80B8",  # a rank's second model chunk (interleaved)
          "tp": "#DD8452", "cp": "#8C8C3C", "dp": "#55A868", "pp": "#8172B3", "ep": "#937860",
          "idle": "#BBBBBB", "exposed": "#D62728", "host": "#BCBD22",  # host: what the host issued (sim/outputs/host.py)
          "tail": "#E8A33D", "weights": "#17BECF"}  # RL (clustersim rl): underfull batches, weight sync
OTHER_COLORS = ("#E377C2", "#BCBD22", "#7F7F7F", "#9EDAE5", "#C49C94", "#F7B6D2")  # streams of other kinds
PALE = 0.6  # white over a waiting collective's colour


def color_of(kind: str) -> str:
    """A row kind's colour: :data:`COLORS`, or for a kind this module does not know (a
    stream added later, e.g. the host's) one of :data:`OTHER_COLORS` picked by its name."""
    import zlib

    return COLORS.get(kind) or OTHER_COLORS[zlib.crc32(str(kind).encode()) % len(OTHER_COLORS)]


def pale(color: str) -> tuple:
    """``color`` under :data:`PALE` white: a collective waiting for its peers."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * PALE for c in to_rgb(color))


def add_legend(ax, features: list[dict], ncol: int = 6) -> int:
    """A legend above ``ax`` for what the panels drawn (``draw``'s return values) show,
    in at most ``ncol`` columns; returns its number of lines."""
    from matplotlib.patches import Patch

    from .timeline_rows import COMM_KINDS

    kinds = set().union(*(f["kinds"] for f in features))
    waiting = sorted(set().union(*(f["pale"] for f in features)))
    handles = [Patch(facecolor=COLORS["forward"], label="compute fwd (number: micro-batch)"),
               Patch(facecolor=COLORS["backward"], label="compute bwd (and recompute)")]
    if any(f["chunked"] for f in features):
        handles += [Patch(facecolor=COLORS["forward2"], label="fwd, 2nd model chunk"),
                    Patch(facecolor=COLORS["backward2"], label="bwd, 2nd model chunk")]
    handles.append(Patch(facecolor=COLORS["compute"], label="optimizer"))
    handles += [Patch(facecolor=color_of(k), label=k) for k in COMM_KINDS if k in kinds]
    handles += [Patch(facecolor=color_of(k), label=k) for k in sorted(kinds - set(COMM_KINDS))]
    handles.append(Patch(facecolor="white", edgecolor=COLORS["idle"], hatch="////", label="compute idle"))
    handles.append(Patch(facecolor=COLORS["exposed"], label="exposed comm (communicating, not computing)"))
    if waiting:
        handles.append(Patch(facecolor=pale(color_of(waiting[0])),
                             label=f"pale {'/'.join(waiting)}: waiting for peers"))
    handles.append(Patch(facecolor="white", edgecolor="0.5", label="part-filled column: share of a pixel busy"))
    ncol = min(len(handles), ncol)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=ncol, fontsize=8, frameon=False,
              borderaxespad=0.2)
    return -(-len(handles) // ncol)


WINDOW_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _window_time(text: str, flag: str) -> float | None:
    """'250', '250ms', '0.25s', '250000us' -> seconds (a bare number is ms); '' -> None."""
    import math

    t = text.strip().lower()
    if not t:
        return None
    unit = next((u for u in ("us", "ms", "s") if t.endswith(u)), "ms")
    number = t[:-len(unit)] if t.endswith(unit) else t
    try:
        v = float(number)
    except ValueError:
        raise InputError(flag, f"expected START:END like 100:250 (ms) or 0.1s:0.25s, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise InputError(flag, f"expected times >= 0, got {text!r}")
    return v * WINDOW_UNITS[unit]


def parse_window(text: str | None, flag: str = "--timeline-window") -> tuple | None:
    """'START:END' (ms, or with a unit: us, ms, s; either side may be empty: the step's start
    or end) -> (start_s, end_s or None); None -> None. Checked before anything is simulated."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    if not sep:
        raise InputError(flag, f"expected START:END like 100:250 (ms) or 0.1s:0.25s, got {text!r}")
    lo, hi = _window_time(start, flag) or 0.0, _window_time(end, flag)
    if hi is not None and hi <= lo:
        raise InputError(flag, f"the end ({hi * 1e3:g} ms) must be after the start ({lo * 1e3:g} ms)")
    return lo, hi


def resolve_window(window: tuple | None, step: float, flag: str = "--timeline-window",
                   whole: str = "step") -> tuple | None:
    """A parsed window inside a step (``whole``: or an RL run) of ``step`` seconds: an open or
    late end is its end; a start at or past it is bad input."""
    if window is None:
        return None
    lo, hi = window
    if lo >= step:
        raise InputError(flag, f"starts at {lo * 1e3:g} ms, after the {whole}'s end ({step * 1e3:g} ms)")
    return lo, step if hi is None else min(hi, step)
