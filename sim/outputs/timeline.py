"""PNG timelines of a simulated step: a Gantt chart that shows overlap, bubbles and waits.

``clustersim run SCENARIO --timeline out.png``, ``clustersim plot SCENARIO -o out.png``,
or :func:`plot_timeline` / :func:`plot_panels` from Python.

Rows: for every shown rank, its compute stream, its host (the passes it issued, olive), then one row per kind of communication
(tp, cp, ep, pp, dp); streams of one kind share a row unless they run at the same time
(FSDP's all-gathers and reduce-scatters), then each gets its own. Compute is light blue
forward, dark blue backward (paler shades: an interleaved rank's second model chunk),
grey for the optimizer; blocks of one micro-batch are separated by white lines and carry
its number. On the compute row, hatched grey where the GPU computes nothing (pipeline
bubbles, waits) and a red strip where communication runs while nothing computes (exposed
communication); pale communication bars are collectives waiting for a peer. Large runs show
the representative ranks of :func:`sim.outputs.rank_selection.select_ranks`, labelled with their
coordinates. Spans are drawn as one ``broken_barh`` per row and colour, so 100k spans plot
in seconds; spans narrower than a pixel are widened to one so short collectives stay
visible.
"""


import numpy as np
import pandas as pd

from ..engine.kinds import Phase
from ..errors import InputError
from .host import spans as host_spans
from .metrics import length, subtract, union

COLORS = {"compute": "#5A5A5A", "forward": "#86A9DB", "backward": "#2F4B7C",
          "forward2": "#C4D6EF", "backward2": "#5E80B8",  # a rank's second model chunk (interleaved)
          "tp": "#DD8452", "cp": "#8C8C3C", "dp": "#55A868", "pp": "#8172B3", "ep": "#937860",
          "idle": "#BBBBBB", "exposed": "#D62728", "host": "#BCBD22",
          "tail": "#E8A33D", "weights": "#17BECF"}  # RL (clustersim rl): underfull batches, weight sync
KIND_ORDER = ("compute", "host", "tp", "cp", "ep", "pp", "dp", "tail", "weights", "idle")
MAX_ROWS = 24  # beyond this, fewer ranks are shown
LANE_OVERLAP = (0.10, 0.005)  # streams of one kind get their own rows when they overlap by more
                              # than this share of the shorter one's busy time and of the step
MAX_LABELS = 400  # micro-batch numbers written inside compute blocks, at most
PX_WIDTH = 1400  # plot width in pixels at the saved dpi (for the minimum bar width)


def exposed_comm(spans, rank: int) -> np.ndarray:
    """Intervals where ``rank`` communicates and computes nothing."""
    mine = spans[spans["rank"] == rank]
    comp = union(mine.loc[mine.category == "compute", ["start_s", "end_s"]].to_numpy())
    comm = union(mine.loc[~mine.category.isin(["compute", "idle", "host"]), ["start_s", "end_s"]].to_numpy())
    return subtract(comm, comp)


def idle_compute(spans, rank: int, end: float) -> np.ndarray:
    """Intervals of [0, end] where ``rank``'s compute stream is idle."""
    mine = spans[(spans["rank"] == rank) & (spans.category == "compute")]
    comp = union(mine[["start_s", "end_s"]].to_numpy())
    return subtract(np.array([[0.0, end]]), comp)


def with_host(result) -> pd.DataFrame:
    """The spans with each simulated rank's host spans (category ``host``, drawn on a host
    row under its compute row: sim/outputs/host.py)."""
    programs = result.facts.programs if result.facts is not None else None
    if not programs:
        return result.spans
    extra = host_spans(programs)
    return pd.concat([result.spans, extra], ignore_index=True) if len(extra) else result.spans


def _rank_label(result, rank: int) -> str:
    from .rank_selection import fault_ranks, straggler_ranks

    layout = result.facts.layout  # (None: the RL loop's ranks, labelled by number)
    c = layout.coords(rank) if layout is not None else {}
    parts = [f"{a}{c[a]}" for a in ("pp", "tp", "cp", "dp") if layout is not None and layout.sizes[a] > 1]
    flag = " SLOW" if rank in straggler_ranks(result) else " FAULTY NIC" if rank in fault_ranks(result) else ""
    return f"rank {rank}" + (f" ({' '.join(parts)})" if parts else "") + flag


def _busy(sp) -> np.ndarray:
    return union(sp[["start_s", "end_s"]].to_numpy())


def lanes(sp_kind, step: float) -> dict[str, int]:
    """Stream -> row index within one rank's kind: streams share a row unless they
    overlap by more than :data:`LANE_OVERLAP` (then one would hide the other)."""
    busy = {st: _busy(g) for st, g in sp_kind.groupby("stream", sort=True)}
    rows: list[list[str]] = []
    out = {}
    for st, iv in busy.items():
        for i, members in enumerate(rows):
            other = union(np.concatenate([busy[m] for m in members]))
            both = length(iv) - length(subtract(iv, other))
            if both <= max(LANE_OVERLAP[0] * min(length(iv), length(other)), LANE_OVERLAP[1] * step):
                members.append(st)
                out[st] = i
                break
        else:
            rows.append([st])
            out[st] = len(rows) - 1
    return out


def _lane_name(g, streams: list[str]) -> str:
    """What a row of one kind carries: the ops' common name ('fsdp_ag' for fsdp_ag_fwd and
    fsdp_ag_bwd), else its streams."""
    import os

    prefix = os.path.commonprefix(sorted(g.name.unique())).rstrip("_")
    return prefix if len(prefix) >= 3 else "+".join(streams)


def _per_rank(sp, ranks) -> dict:
    """rank -> its spans, for ``ranks`` (one pass over the spans, however many there are)."""
    sub = sp[sp["rank"].isin(list(ranks))]
    frames = {int(r): g for r, g in sub.groupby("rank")}
    return {int(r): frames.get(int(r), sub.iloc[:0]) for r in ranks}


def _rank_rows(result, r: int, mine, step: float) -> tuple[list, dict, dict]:
    rows, labels, row_of = [(r, "compute", 0)], {(r, "compute", 0): f"{_rank_label(result, r)}  compute"}, {}
    row_of[(r, "compute")] = (r, "compute", 0)
    for kind in KIND_ORDER[1:-1]:
        g = mine[mine.category == kind]
        if not len(g):
            continue
        lane = lanes(g, step)
        n = max(lane.values()) + 1
        for i in range(n):
            rows.append((r, kind, i))
            streams = [st for st, j in lane.items() if j == i]
            labels[(r, kind, i)] = kind if n == 1 else f"{kind} {_lane_name(g[g.stream.isin(streams)], streams)}"
        for st, i in lane.items():
            row_of[(r, st)] = (r, kind, i)
    return rows, labels, row_of


def _layout_rows(result, ranks, frames=None) -> tuple[list[tuple], dict, dict]:
    """Rows top to bottom as (rank, kind, lane), their labels, and (rank, stream) -> row."""
    sp = with_host(result)
    step = float(sp.end_s.max()) if len(sp) else 0.0
    frames = frames if frames is not None else _per_rank(sp, ranks)
    rows, labels, row_of = [], {}, {}
    for r in ranks:
        a, b, c = _rank_rows(result, r, frames[r], step)
        rows += a
        labels.update(b)
        row_of.update(c)
    return rows, labels, row_of


def _rows(result, ranks) -> list[tuple]:
    return _layout_rows(result, ranks)[0]


def _fit_ranks(result, ranks) -> list[int]:
    """Drop ranks until the rows fit: flagged ranks (stragglers, faulty NICs) stay, the
    others are thinned evenly (keeping the first and the last)."""
    from .rank_selection import flagged_ranks

    ranks = list(ranks)
    frames = _per_rank(with_host(result), ranks)
    step = float(result.spans.end_s.max()) if len(result.spans) else 0.0
    n_rows = {r: len(_rank_rows(result, r, frames[r], step)[0]) for r in ranks}
    flagged = flagged_ranks(result)
    must = [r for r in ranks if r in flagged]
    while sum(n_rows[r] for r in ranks) > MAX_ROWS and len(ranks) > max(1, len(must)):
        others = [r for r in ranks if r not in must]
        keep = max(1, len(others) * 2 // 3) if len(others) > 1 else 0
        idx = np.unique(np.linspace(0, len(others) - 1, keep).round().astype(int)) if keep else []
        ranks = sorted(set(must) | {others[i] for i in idx})
    return ranks


def waits(result, ranks) -> list[tuple[int, str, float, float, str]]:
    """(rank, kind, start, end, stream) of every collective of ``ranks`` that waited for
    its last member to arrive: from this rank's arrival to the last member's."""
    held, sp = result.facts.held_by, result.spans
    wanted = set(ranks)
    mine = [(k, v) for k, v in held.items() if k[0] in wanted]
    if not mine:
        return []
    need = {k for k, _ in mine} | {v for _, v in mine}
    sp = sp[sp["rank"].isin(list({r for r, _ in need}))]
    cols = zip(sp["rank"], sp["op"], sp["start_s"], sp["category"], sp["stream"])
    at = {(int(r), int(o)): (float(s), c, st) for r, o, s, c, st in cols if (int(r), int(o)) in need}
    out = []
    for key, last in mine:
        if key in at and last in at and at[last][0] > at[key][0]:
            out.append((key[0], at[key][1], at[key][0], at[last][0], at[key][2]))
    return out


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


def _compute_blocks(ax, g, y: float, px: float, labels_left: int) -> int:
    """One rank's compute row: spans (merged across gaps under a pixel) coloured by
    direction and chunk; a white line where the micro-batch, direction or chunk changes
    and the micro-batch number inside blocks wide enough; returns labels still allowed."""
    g = g.sort_values("start_s", kind="stable")
    phase = g.phase.map(drawn_phase).to_numpy()
    chunk = _chunks(g.layer.to_numpy(), phase)
    mb = g.micro_batch.to_numpy()
    starts, ends = g.start_s.to_numpy(), g.end_s.to_numpy()
    color = np.where(phase == "compute", "compute", np.where(chunk % 2 == 1, np.char.add(phase.astype(str), "2"),
                                                             phase.astype(str)))
    for kind in np.unique(color):
        sel = color == kind
        iv = union(np.stack([starts[sel], np.maximum(ends[sel], starts[sel] + px)], axis=1))
        if len(iv) > 1:  # close sub-pixel gaps: they would only draw as noise
            keep = np.append(True, iv[1:, 0] - iv[:-1, 1] > px)
            iv = np.stack([iv[keep, 0], np.maximum.reduceat(iv[:, 1], np.flatnonzero(keep))], axis=1)
        ax.broken_barh(list(zip(iv[:, 0] * 1e3, (iv[:, 1] - iv[:, 0]) * 1e3)), (y + 0.1, 0.8),
                       facecolors=COLORS[kind], linewidth=0)
    new = np.ones(len(g), dtype=bool)  # blocks: one micro-batch, direction and chunk
    new[1:] = (phase[1:] != phase[:-1]) | (mb[1:] != mb[:-1]) | (chunk[1:] != chunk[:-1])
    first = np.flatnonzero(new)
    b_start, b_end = starts[first], np.maximum.reduceat(ends, first) if len(g) else ends
    b_mb, b_dark = mb[first], np.char.startswith(color[first].astype(str), "backward")
    if 1 < len(first) < 3000:
        edges = b_start[1:]
        ax.vlines(edges * 1e3, y + 0.1, y + 0.9, colors="white", linewidth=0.8)
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
        ax.text(x * 1e3, y + 0.5, str(int(m)), ha="center", va="center", fontsize=6,
                color="white" if dark else "#1A1A1A", clip_on=True)
        labels_left -= 1
    return labels_left


def _shown_ranks(result, ranks) -> list[int]:
    """A selector string, None or a list of ranks -> simulated ranks (folded ranks show as
    their representative)."""
    from .rank_selection import representative, select_ranks

    if ranks is None or isinstance(ranks, str):
        return select_ranks(result, ranks, "--ranks")
    return sorted({representative(result, int(r)) for r in ranks})


def _bars(ax, intervals, y: float, min_w: float, height=(0.1, 0.8), **style) -> None:
    iv = np.asarray(intervals, dtype=float).reshape(-1, 2)
    if len(iv):
        w = np.maximum(iv[:, 1] - iv[:, 0], min_w)
        ax.broken_barh(list(zip(iv[:, 0] * 1e3, w * 1e3)), (y + height[0], height[1]), **style)


def draw(ax, result, ranks=None, window=None, title=None, legend=True) -> dict:
    """Draw ``result``'s timeline on ``ax`` (time in ms). Returns what it drew, for
    :func:`add_legend`: ``ranks`` shown, comm ``kinds``, ``chunked`` (interleaved model
    chunks) and the kinds of ``pale`` (waiting) bars."""
    ranks = _fit_ranks(result, _shown_ranks(result, ranks))
    sp = with_host(result)
    end = float(sp.end_s.max()) if len(sp) else 0.0
    lo, hi = (0.0, end) if window is None else window
    if hi <= lo:
        raise InputError("--end-ms", f"the window [{lo * 1e3:g}, {hi * 1e3:g}] ms is empty")
    px = (hi - lo) / PX_WIDTH  # one pixel
    frames = _per_rank(sp, ranks)
    rows, labels, row_of = _layout_rows(result, ranks, frames)
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    mine = pd.concat(list(frames.values())) if frames else sp.iloc[:0]
    shown = mine[(mine.end_s >= lo) & (mine.start_s <= hi)]
    labels_left = MAX_LABELS
    chunked = False
    for rank, g in shown[shown.category == "compute"].groupby("rank"):
        labels_left = _compute_blocks(ax, g, y_of[(int(rank), "compute", 0)], px, labels_left)
        chunked |= bool((_chunks(g.layer.to_numpy(), g.phase.map(drawn_phase).to_numpy()) > 0).any())
    comm = shown[~shown.category.isin(["idle", "compute"])]
    for (rank, stream, kind), g in comm.groupby(["rank", "stream", "category"]):
        _bars(ax, g[["start_s", "end_s"]].to_numpy(), y_of[row_of[(int(rank), stream)]], px,
              facecolors=COLORS.get(kind, "k"), linewidth=0)
    pale: dict = {}
    pale_kinds = set()
    for rank, kind, a, b, stream in waits(result, ranks):  # paler where a collective waits for its peers
        if b >= lo and a <= hi:
            pale.setdefault(row_of[(rank, stream)], []).append((a, b))
            pale_kinds.add(kind)
    for row, iv in pale.items():
        _bars(ax, iv, y_of[row], 0.0, facecolors="white", alpha=PALE, linewidth=0)
    for rank in ranks:
        y = y_of[(rank, "compute", 0)]
        idle = idle_compute(frames[rank], rank, end)
        _bars(ax, idle, y, 0.0, facecolors="none", edgecolors=COLORS["idle"], hatch="////", linewidth=0)
        _bars(ax, exposed_comm(frames[rank], rank), y, px, height=(0.1, 0.18), facecolors=COLORS["exposed"], linewidth=0)
    ax.set_yticks([y_of[row] + 0.5 for row in rows], [labels[row] for row in rows],
                  fontsize=7 if len(rows) > 16 else 8)
    for rank in ranks[1:]:  # separate ranks
        ax.axhline(y_of[(rank, "compute", 0)] + 1, color="0.3", lw=0.6)
    ax.set_ylim(0, len(rows))
    ax.set_xlim(lo * 1e3, hi * 1e3)
    ax.set_xlabel("time (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    if title is not None:
        ax.set_title(title, fontsize=10, loc="left")
    shown_kinds = {k for k in KIND_ORDER if k not in ("idle", "compute") and (shown.category == k).any()}
    features = {"ranks": ranks, "kinds": shown_kinds, "chunked": chunked, "pale": pale_kinds}
    if legend:
        add_legend(ax, [features])
    return features


PALE = 0.6  # white over a waiting collective's colour


def _pale(color: str) -> tuple:
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * PALE for c in to_rgb(color))


def add_legend(ax, features: list[dict], ncol: int = 6) -> int:
    """A legend above ``ax`` for what the panels drawn (``draw``'s return values) show,
    in at most ``ncol`` columns; returns its number of lines."""
    from matplotlib.patches import Patch

    kinds = set().union(*(f["kinds"] for f in features))
    pale = sorted(set().union(*(f["pale"] for f in features)))
    handles = [Patch(facecolor=COLORS["forward"], label="compute fwd (number: micro-batch)"),
               Patch(facecolor=COLORS["backward"], label="compute bwd (and recompute)")]
    if any(f["chunked"] for f in features):
        handles += [Patch(facecolor=COLORS["forward2"], label="fwd, 2nd model chunk"),
                    Patch(facecolor=COLORS["backward2"], label="bwd, 2nd model chunk")]
    handles.append(Patch(facecolor=COLORS["compute"], label="optimizer"))
    handles += [Patch(facecolor=COLORS[k], label=k) for k in KIND_ORDER if k in kinds]
    handles.append(Patch(facecolor="white", edgecolor=COLORS["idle"], hatch="////", label="compute idle"))
    handles.append(Patch(facecolor=COLORS["exposed"], label="exposed comm (strip under compute)"))
    if pale:
        handles.append(Patch(facecolor=_pale(COLORS[pale[0]]), label=f"pale {'/'.join(pale)}: waiting for peers"))
    ncol = min(len(handles), ncol)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=ncol, fontsize=8, frameon=False,
              borderaxespad=0.2)
    return -(-len(handles) // ncol)


def headline(result) -> str:
    """'name: 64 GPUs, step 887.5 ms, MFU 54.1%'."""
    s = result.summary
    return f"{s['name']}: {s['num_gpus']:,} GPUs, step {s['step_time_s'] * 1e3:.1f} ms, MFU {s['mfu']:.1%}"


def _shown_note(result, ranks) -> str:
    total, sim = result.summary["num_gpus"], len(result.facts.simulated_ranks)
    note = f"showing {len(ranks)} of {total:,} ranks"
    if sim < total:
        note += f"; each stands for {total // sim:,} identical ranks ({sim:,} simulated)"
    return note


def plot_timeline(result, path: str, ranks=None, window=None, title: str | None = None) -> None:
    """One result's timeline as a PNG."""
    plot_panels([(result, title)], path, ranks, window)


def plot_panels(items, path: str, ranks=None, window=None, suptitle: str | None = None) -> None:
    """Several results stacked on one shared time axis, one legend: ``items`` =
    [(result, title), ...]; ``ranks`` a selector or list (see :mod:`sim.outputs.rank_selection`),
    ``window`` (start_s, end_s) or None for the whole (longest) step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not str(path).endswith(".png"):
        raise InputError("--timeline", f"expected a .png path, got {path!r}")
    heights = []
    for result, _ in items:
        r = _fit_ranks(result, _shown_ranks(result, ranks))
        heights.append(max(2, len(_rows(result, r))))
    fig_h = sum(0.28 * h + 1.1 for h in heights) + 0.9
    fig, axes = plt.subplots(len(items), 1, figsize=(PX_WIDTH / 100 + 2.5, fig_h), squeeze=False,
                             gridspec_kw={"height_ratios": [h + 4 for h in heights]}, sharex=len(items) > 1)
    end = max(float(res.spans.end_s.max()) for res, _ in items)
    features = []
    for i, ((result, title), ax) in enumerate(zip(items, axes[:, 0])):
        win = window if window is not None else ((0.0, end) if len(items) > 1 else None)
        features.append(draw(ax, result, ranks, win, title=None, legend=False))
        label = (title + " -- " if title else "") + headline(result) + "  |  " + _shown_note(result,
                                                                                             features[-1]["ranks"])
        if i < len(items) - 1:
            ax.set_xlabel("")
        ax.set_title(label, fontsize=9, loc="left", pad=4)
    lines = add_legend(axes[0, 0], features)
    axes[0, 0].set_title(axes[0, 0].get_title(loc="left"), fontsize=9, loc="left", pad=6 + 13 * lines)
    if suptitle:  # (placed in a strip of its own: a tall figure's tight_layout would run under it)
        fig.suptitle(suptitle, fontsize=11, y=1 - 0.15 / fig_h, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig_h) if suptitle else None)
    fig.savefig(path, dpi=100)
    plt.close(fig)
