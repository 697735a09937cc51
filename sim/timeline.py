"""PNG timelines of a simulated step: a Gantt chart that shows overlap, bubbles and waits.

``clustersim run SCENARIO --timeline out.png``, ``clustersim plot SCENARIO -o out.png``,
or :func:`plot_timeline` / :func:`plot_panels` from Python.

Rows: for every shown rank, its compute stream, then one row per kind of communication
(tp, cp, dp, pp, ep; a kind's streams share its row). Colours per kind; on the compute
row, hatched grey where the GPU computes nothing (pipeline bubbles, waits) and a red strip
where communication runs while nothing computes (exposed communication). Large runs show
the representative ranks of :func:`sim.trace.select_ranks`, labelled with their stage.
Spans are drawn as one ``broken_barh`` per row and kind, so 100k spans plot in seconds;
spans narrower than a pixel are widened to one so that short collectives stay visible.
"""

from pathlib import Path

import numpy as np

from .errors import InputError

COLORS = {"compute": "#4C72B0", "forward": "#86A9DB", "backward": "#2F4B7C", "tp": "#DD8452", "cp": "#8C8C3C", "dp": "#55A868", "pp": "#8172B3",
          "ep": "#937860", "idle": "#BBBBBB", "exposed": "#D62728"}
KIND_ORDER = ("compute", "tp", "cp", "ep", "pp", "dp", "idle")
MAX_ROWS = 28  # beyond this, fewer ranks are shown
MAX_LABELS = 400  # micro-batch numbers written inside compute blocks, at most
PX_WIDTH = 1400  # plot width in pixels at the saved dpi (for the minimum bar width)


def _union(intervals: np.ndarray) -> np.ndarray:
    """Sorted, merged [start, end] intervals."""
    if len(intervals) == 0:
        return np.zeros((0, 2))
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    out = [list(iv[0])]
    for a, b in iv[1:]:
        if a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out)


def _subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of union ``a`` not covered by union ``b`` (both merged and sorted)."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return np.array(out) if out else np.zeros((0, 2))


def exposed_comm(spans, rank: int) -> np.ndarray:
    """Intervals where ``rank`` communicates and computes nothing."""
    mine = spans[spans["rank"] == rank]
    comp = _union(mine.loc[mine.category == "compute", ["start_s", "end_s"]].to_numpy())
    comm = _union(mine.loc[~mine.category.isin(["compute", "idle"]), ["start_s", "end_s"]].to_numpy())
    return _subtract(comm, comp)


def idle_compute(spans, rank: int, end: float) -> np.ndarray:
    """Intervals of [0, end] where ``rank``'s compute stream is idle."""
    mine = spans[(spans["rank"] == rank) & (spans.category == "compute")]
    comp = _union(mine[["start_s", "end_s"]].to_numpy())
    return _subtract(np.array([[0.0, end]]), comp)


def _rank_label(result, rank: int) -> str:
    layout = result.info.get("layout")
    if layout is None:
        return f"rank {rank}"
    from .trace import straggler_ranks

    c = layout.coords(rank)
    parts = [f"{a}{c[a]}" for a in ("pp", "tp", "cp", "dp") if layout.sizes[a] > 1]
    slow = " SLOW" if rank in straggler_ranks(result) else ""
    return f"rank {rank}" + (f" ({' '.join(parts)})" if parts else "") + slow


def _rows(result, ranks) -> list[tuple[int, str]]:
    sp = result.spans
    rows = []
    for r in ranks:
        kinds = set(sp.loc[sp["rank"] == r, "category"].unique()) - {"idle"}
        rows += [(r, k) for k in KIND_ORDER if k in kinds or k == "compute"]
    return rows


def _fit_ranks(result, ranks) -> list[int]:
    """Drop ranks until the rows fit: stragglers stay, the others are thinned evenly
    (keeping the first and the last)."""
    from .trace import straggler_ranks

    ranks = list(ranks)
    must = [r for r in ranks if r in straggler_ranks(result)]
    while len(_rows(result, ranks)) > MAX_ROWS and len(ranks) > max(1, len(must)):
        others = [r for r in ranks if r not in must]
        keep = max(1, len(others) * 2 // 3) if len(others) > 1 else 0
        idx = np.unique(np.linspace(0, len(others) - 1, keep).round().astype(int)) if keep else []
        ranks = sorted(set(must) | {others[i] for i in idx})
    return ranks


def waits(result, ranks) -> list[tuple[int, str, float, float]]:
    """(rank, kind, start, end) of every collective of ``ranks`` that waited for its last
    member to arrive: from this rank's arrival to the last member's."""
    held, sp = result.info.get("held_by", {}), result.spans
    wanted = set(ranks)
    mine = [(k, v) for k, v in held.items() if k[0] in wanted]
    if not mine:
        return []
    need = {k for k, _ in mine} | {v for _, v in mine}
    at = {(int(r), int(o)): (float(s), c) for r, o, s, c in zip(sp["rank"], sp["op"], sp["start_s"], sp["category"])
          if (int(r), int(o)) in need}
    out = []
    for key, last in mine:
        if key in at and last in at and at[last][0] > at[key][0]:
            out.append((key[0], at[key][1], at[key][0], at[last][0]))
    return out


def _phase(name: str) -> str:
    return "forward" if name.endswith("_fwd") else "backward" if "_bwd" in name else "compute"


def _compute_blocks(ax, g, y: float, min_w: float, px: float, labels_left: int) -> int:
    """Compute spans merged into blocks of one micro-batch and direction, outlined so the
    schedule reads (as in the pipeline papers' figures); returns labels still allowed."""
    g = g.sort_values("start_s", kind="stable")
    phase = g.name.map(_phase).to_numpy()
    mb = g.micro_batch.to_numpy()
    starts, ends = g.start_s.to_numpy(), g.end_s.to_numpy()
    new = np.ones(len(g), dtype=bool)
    new[1:] = (phase[1:] != phase[:-1]) | (mb[1:] != mb[:-1]) | (starts[1:] - ends[:-1] > px)
    b_start = starts[new]
    b_end = np.maximum.reduceat(ends, np.flatnonzero(new)) if len(g) else ends
    b_phase, b_mb = phase[new], mb[new]
    outline = len(b_start) < 2000
    for kind in ("forward", "backward", "compute"):
        sel = b_phase == kind
        if sel.any():
            w = np.maximum(b_end[sel] - b_start[sel], min_w)
            ax.broken_barh(list(zip(b_start[sel] * 1e3, w * 1e3)), (y + 0.1, 0.8), facecolors=COLORS[kind],
                           edgecolors="white" if outline else "none", linewidth=0.6 if outline else 0)
    for a, b, m in zip(b_start, b_end, b_mb):
        if labels_left <= 0:
            break
        if m >= 0 and (b - a) > 14 * px:
            ax.text((a + b) / 2 * 1e3, y + 0.5, str(int(m)), ha="center", va="center", fontsize=6, color="white")
            labels_left -= 1
    return labels_left


def draw(ax, result, ranks=None, window=None, title=None, legend=True) -> list[int]:
    """Draw ``result``'s timeline on ``ax`` (time in ms); returns the ranks shown."""
    from matplotlib.patches import Patch

    from .trace import select_ranks

    if ranks is None or isinstance(ranks, str):
        ranks = select_ranks(result, ranks)
    ranks = _fit_ranks(result, ranks)
    sp = result.spans
    end = float(sp.end_s.max()) if len(sp) else 0.0
    lo, hi = (0.0, end) if window is None else window
    if hi <= lo:
        raise InputError("--end-ms", f"the window [{lo * 1e3:g}, {hi * 1e3:g}] ms is empty")
    min_w = (hi - lo) / PX_WIDTH  # one pixel
    rows = _rows(result, ranks)
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    shown = sp[sp["rank"].isin(ranks) & (sp.end_s >= lo) & (sp.start_s <= hi)]
    labels_left = MAX_LABELS
    for rank, g in shown[shown.category == "compute"].groupby("rank"):
        labels_left = _compute_blocks(ax, g, y_of[(int(rank), "compute")], min_w, (hi - lo) / PX_WIDTH, labels_left)
    for (rank, kind), g in shown.groupby(["rank", "category"]):
        if kind in ("idle", "compute"):
            continue
        y = y_of[(int(rank), kind)]
        starts = g.start_s.to_numpy()
        widths = np.maximum(g.end_s.to_numpy() - starts, min_w)
        ax.broken_barh(list(zip(starts * 1e3, widths * 1e3)), (y + 0.1, 0.8), facecolors=COLORS.get(kind, "k"),
                       linewidth=0)
    for rank, kind, a, b in waits(result, ranks):  # paler where a collective waits for its peers
        if (rank, kind) in y_of:
            ax.broken_barh([(a * 1e3, (b - a) * 1e3)], (y_of[(rank, kind)] + 0.1, 0.8), facecolors="white",
                           alpha=0.6, linewidth=0)
    for rank in ranks:
        y = y_of[(rank, "compute")]
        idle = idle_compute(sp, rank, end)
        if len(idle):
            ax.broken_barh(list(zip(idle[:, 0] * 1e3, (idle[:, 1] - idle[:, 0]) * 1e3)), (y + 0.1, 0.8),
                           facecolors="none", edgecolors=COLORS["idle"], hatch="////", linewidth=0)
        exp = exposed_comm(sp, rank)
        if len(exp):
            w = np.maximum(exp[:, 1] - exp[:, 0], min_w)
            ax.broken_barh(list(zip(exp[:, 0] * 1e3, w * 1e3)), (y + 0.1, 0.18), facecolors=COLORS["exposed"],
                           linewidth=0)
    labels = []
    for rank, kind in rows:
        labels.append(f"{_rank_label(result, rank)}  {kind}" if kind == "compute" else kind)
    ax.set_yticks([y_of[row] + 0.5 for row in rows], labels, fontsize=7 if len(rows) > 16 else 8)
    for rank in ranks[1:]:  # separate ranks
        ax.axhline(y_of[(rank, "compute")] + 1, color="0.3", lw=0.6)
    ax.set_ylim(0, len(rows))
    ax.set_xlim(lo * 1e3, hi * 1e3)
    ax.set_xlabel("time (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    if title is not None:
        ax.set_title(title, fontsize=10, loc="left")
    if legend:
        kinds = [k for k in KIND_ORDER if k not in ("idle", "compute") and (shown.category == k).any()]
        handles = [Patch(facecolor=COLORS["forward"], label="compute fwd (number: micro-batch)"),
                   Patch(facecolor=COLORS["backward"], label="compute bwd"),
                   Patch(facecolor=COLORS["compute"], label="optimizer, other")]
        handles += [Patch(facecolor=COLORS[k], label=k) for k in kinds]
        handles.append(Patch(facecolor="white", edgecolor=COLORS["idle"], hatch="////", label="compute idle"))
        handles.append(Patch(facecolor=COLORS["exposed"], label="exposed comm"))
        if result.info.get("held_by"):
            handles.append(Patch(facecolor="#A8D4B4", label="pale: waiting for peers"))
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0 if title is None else 1.06),
                  ncol=len(handles), fontsize=8, frameon=False, borderaxespad=0.2)
    return ranks


def headline(result) -> str:
    """'name: 64 GPUs, step 887.5 ms, MFU 54.1%'."""
    s = result.summary
    return f"{s['name']}: {s['num_gpus']:,} GPUs, step {s['step_time_s'] * 1e3:.1f} ms, MFU {s['mfu']:.1%}"


def _shown_note(result, ranks) -> str:
    total, sim = result.summary["num_gpus"], len(result.info["simulated_ranks"])
    note = f"showing {len(ranks)} of {total:,} ranks"
    if sim < total:
        note += f" ({sim:,} simulated; the others are identical to one of them)"
    return note


def plot_timeline(result, path: str, ranks=None, window=None, title: str | None = None) -> None:
    """One result's timeline as a PNG."""
    plot_panels([(result, title)], path, ranks, window)


def plot_panels(items, path: str, ranks=None, window=None, suptitle: str | None = None) -> None:
    """Several results stacked on one shared time axis: ``items`` = [(result, title), ...]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not str(path).endswith(".png"):
        raise InputError("--timeline", f"expected a .png path, got {path!r}")
    from .trace import select_ranks

    heights = []
    for result, _ in items:
        r = _fit_ranks(result, select_ranks(result, ranks) if ranks is None or isinstance(ranks, str) else ranks)
        heights.append(max(2, len(_rows(result, r))))
    fig_h = sum(0.28 * h + 1.1 for h in heights) + 0.6
    fig, axes = plt.subplots(len(items), 1, figsize=(PX_WIDTH / 100 + 2.5, fig_h), squeeze=False,
                             gridspec_kw={"height_ratios": [h + 4 for h in heights]}, sharex=len(items) > 1)
    end = max(float(res.spans.end_s.max()) for res, _ in items)
    for i, ((result, title), ax) in enumerate(zip(items, axes[:, 0])):
        win = window if window is not None else ((0.0, end) if len(items) > 1 else None)
        shown = draw(ax, result, ranks, win, title=None, legend=(i == 0))
        label = (title + " -- " if title else "") + headline(result) + "  |  " + _shown_note(result, shown)
        ax.set_title(label, fontsize=9, loc="left", pad=18 if i == 0 else 4)
        if i < len(items) - 1:
            ax.set_xlabel("")
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
