"""Which rows a PNG timeline draws and what their labels say (:mod:`sim.outputs.timeline`).

For every shown rank: its compute row, then one row per kind of communication (tp, cp, ep,
pp, dp; RL's tail and weights), then one row per stream of any other category (a stream
this module does not know, such as a host's issue stream, is drawn as a row of its own
under its category's name rather than dropped). Streams of one kind share a row unless they
run at the same time (:func:`lanes`). A rank's label names its coordinates and, when ranks
were folded (:mod:`sim.parallel.folding`), exactly which ranks its rows stand for
(:func:`stands_for_text`): ``rank 0 (dp0) = ranks 0-2,4-15`` where rank 3 is a straggler.

Run: ``clustersim run scenarios/straggler-dp.toml --timeline t.png``.
"""

import os

import numpy as np

from ..engine.kinds import Category
from .host import with_spans as with_host
from .metrics import length, subtract, union

# known non-compute rows, in this order: what can be exposed communication
COMM_KINDS = (Category.TP, Category.CP, Category.EP, Category.PP, Category.DP, Category.TAIL, Category.WEIGHTS)
KIND_ORDER = (Category.COMPUTE,) + COMM_KINDS + (Category.IDLE,)
EXPOSED_KINDS = tuple(str(c) for c in COMM_KINDS)  # (as the spans' category column holds them)
SHOWN_AXES = (Category.PP, Category.TP, Category.CP, Category.DP)  # a rank's coordinates, in the order labels give them
MAX_ROWS = 24  # beyond this, fewer ranks are shown
LANE_OVERLAP = (0.10, 0.005)  # streams of one kind get their own rows when they overlap by more
                              # than this share of the shorter one's busy time and of the step
SHORT_RANKS = 40  # characters: a longer list of folded ranks is described by coordinates


def other_kinds(spans) -> list[str]:
    """Categories of ``spans`` that are neither compute, idle nor a known communication kind
    (e.g. a host stream added later), sorted: each gets rows of its own."""
    known = set(KIND_ORDER)
    return sorted(str(c) for c in spans.category.unique() if str(c) not in known)


def ranges_text(ranks) -> str:
    """[0, 1, 2, 4, 5] -> '0-2,4-5'."""
    r = np.unique(np.asarray(ranks, dtype=np.int64))
    if not len(r):
        return ""
    cut = np.flatnonzero(np.diff(r) != 1) + 1
    parts = [f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in np.split(r, cut)]
    return ",".join(parts)


def _axis_text(axis: str, values: np.ndarray, size: int) -> str:
    return "" if len(values) == size else f"{axis}{ranges_text(values)}"


def _box_text(layout, members: np.ndarray) -> str:
    """Members described by coordinates: 'pp0' (every rank of stage 0), 'pp0 except 3'
    (all of a box but a few ranks), or '' when neither is short."""
    axes = [a for a in SHOWN_AXES if layout.sizes[a] > 1]
    values = {a: np.unique((members // layout.strides[a]) % layout.sizes[a]) for a in axes}
    box = " ".join(t for t in (_axis_text(a, values[a], layout.sizes[a]) for a in axes) if t) or "every rank"
    in_box = np.arange(layout.world)
    for a in axes:
        in_box = in_box[np.isin((in_box // layout.strides[a]) % layout.sizes[a], values[a])]
    missing = np.setdiff1d(in_box, members)
    if not len(missing):
        return box
    text = ranges_text(missing)
    return f"{box} except {text}" if len(text) <= SHORT_RANKS else ""


def stands_for_text(result, rank: int) -> str:
    """Which ranks ``rank``'s rows stand for when ranks were folded ('' when only itself):
    ' = ranks 0-2,4-15', or by coordinates ' = 2,048 ranks: pp0 except 12345'."""
    folding = getattr(result.facts, "folding", None)
    if folding is None:
        return ""
    members = np.flatnonzero(folding.representative == rank)
    if len(members) <= 1:
        return ""
    listed = ranges_text(members)
    if len(listed) <= SHORT_RANKS:
        return f" = ranks {listed}"
    box = _box_text(result.facts.layout, members) if result.facts.layout is not None else ""
    return f" = {len(members):,} ranks" + (f": {box}" if box else "")


def rows_stand_for(result, ranks) -> int:
    """How many ranks the rows of ``ranks`` stand for, exactly."""
    folding = getattr(result.facts, "folding", None)
    if folding is None:
        return len(ranks)
    return int(np.isin(folding.representative, list(ranks)).sum())


def rank_label(result, rank: int) -> str:
    """'rank 0 (dp0) = ranks 0-2,4-15', with SLOW / FAULTY NIC for flagged ranks."""
    from .rank_selection import fault_ranks, straggler_ranks

    layout = result.facts.layout  # (None: the RL loop's ranks, labelled by number)
    c = layout.coords(rank) if layout is not None else {}
    parts = [f"{a}{c[a]}" for a in SHOWN_AXES if layout is not None and layout.sizes[a] > 1]
    flag = " SLOW" if rank in straggler_ranks(result) else " FAULTY NIC" if rank in fault_ranks(result) else ""
    return f"rank {rank}" + (f" ({' '.join(parts)})" if parts else "") + stands_for_text(result, rank) + flag


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
    prefix = os.path.commonprefix(sorted(g.name.unique())).rstrip("_")
    return prefix if len(prefix) >= 3 else "+".join(streams)


def per_rank(sp, ranks) -> dict:
    """rank -> its spans, for ``ranks`` (one pass over the spans, however many there are)."""
    sub = sp[sp["rank"].isin(list(ranks))]
    frames = {int(r): g for r, g in sub.groupby("rank")}
    return {int(r): frames.get(int(r), sub.iloc[:0]) for r in ranks}


def rank_rows(result, r: int, mine, step: float, label: bool = True) -> tuple[list, dict, dict]:
    """One rank's rows (rank, kind, lane), their labels and (rank, stream) -> row."""
    head = f"{rank_label(result, r)}  compute" if label else ""
    rows, labels, row_of = [(r, "compute", 0)], {(r, "compute", 0): head}, {(r, "compute"): (r, "compute", 0)}
    for kind in COMM_KINDS + tuple(other_kinds(mine)):
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


def layout_rows(result, ranks, frames=None) -> tuple[list[tuple], dict, dict]:
    """Rows top to bottom as (rank, kind, lane), their labels, and (rank, stream) -> row."""
    sp = result.spans
    step = float(sp.end_s.max()) if len(sp) else 0.0
    frames = frames if frames is not None else per_rank(sp, ranks)
    rows, labels, row_of = [], {}, {}
    for r in ranks:
        a, b, c = rank_rows(result, r, frames[r], step)
        rows += a
        labels.update(b)
        row_of.update(c)
    return rows, labels, row_of


def fit_ranks(result, ranks) -> list[int]:
    """Drop ranks until the rows fit: flagged ranks (stragglers, faulty NICs) stay, the
    others are thinned evenly (keeping the first and the last)."""
    from .rank_selection import flagged_ranks

    ranks = list(ranks)
    frames = per_rank(with_host(result), ranks)
    step = float(result.spans.end_s.max()) if len(result.spans) else 0.0
    n_rows = {r: len(rank_rows(result, r, frames[r], step, label=False)[0]) for r in ranks}
    flagged = flagged_ranks(result)
    must = [r for r in ranks if r in flagged]
    while sum(n_rows[r] for r in ranks) > MAX_ROWS and len(ranks) > max(1, len(must)):
        others = [r for r in ranks if r not in must]
        keep = max(1, len(others) * 2 // 3) if len(others) > 1 else 0
        idx = np.unique(np.linspace(0, len(others) - 1, keep).round().astype(int)) if keep else []
        ranks = sorted(set(must) | {others[i] for i in idx})
    return ranks


def shown_ranks(result, ranks) -> list[int]:
    """A selector string, None or a list of ranks -> simulated ranks (folded ranks show as
    their representative)."""
    from .rank_selection import representative, select_ranks

    if ranks is None or isinstance(ranks, str):
        return select_ranks(result, ranks, "--ranks")
    return sorted({representative(result, int(r)) for r in ranks})


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


def shown_note(result, ranks) -> str:
    """'showing 2 of 16 ranks; the rows stand for all 16 (2 simulated)'."""
    total, sim = result.summary["num_gpus"], len(result.facts.simulated_ranks)
    note = f"showing {len(ranks)} of {total:,} ranks"
    if sim < total:
        covered = rows_stand_for(result, ranks)
        whom = f"all {covered:,}" if covered == total else f"{covered:,}"
        note += f"; the rows stand for {whom} ({sim:,} simulated)"
    return note
