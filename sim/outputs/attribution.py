"""What held the step: the critical path walked backwards, and who made others wait.

Starting from the op that ends last, each op is explained by what let it start: the
op before it on its stream or one of its dependencies (whichever finished last), or —
for a collective that waited — the member that arrived last. Following those links back
to time zero gives the critical path; its compute segments name the ranks that held the
step, its communication segments the collectives. Separately, every wait at a
collective is charged to the member that arrived last.

The report's communication figures reconcile with the summary's: besides the critical
path's communication (which runs through other ranks' collectives too), it splits the
summary's ``exposed_comm_s`` (the critical rank's communication time while it computes
nothing) by axis (:func:`exposed_by_axis`); those lines sum to the summary's figure.

Run ``clustersim run scenarios/straggler-dp.toml --report``.
"""

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..hardware.faults import straggler_slowdowns
from .host import report_lines as host_report
from ..engine.kinds import Category


@dataclass
class Attribution:
    """Critical path totals and the waits each rank imposed on others."""

    path: list[tuple[int, int]]  # (rank, op) from the last op back to the first
    compute_by_rank: dict[int, float]
    comm_by_category: dict[str, float]
    waits_imposed: dict[int, float]  # rank -> seconds other ranks waited for it
    step_s: float


def critical_path(result) -> Attribution:
    """Walk the dependencies of ``result`` backwards from the end of the step."""
    spans, facts = result.spans, result.facts
    ends = {(r, i): e for r, i, e in zip(spans["rank"], spans["op"], spans["end_s"])}
    starts = {(r, i): s for r, i, s in zip(spans["rank"], spans["op"], spans["start_s"])}
    held_by, arrived = facts.held_by, facts.arrived
    preds = _predecessors(facts.programs)
    current = max(ends, key=lambda k: (ends[k], -k[0]))
    path, compute, comm = [], defaultdict(float), defaultdict(float)
    cats = {(r, i): c for r, i, c in zip(spans["rank"], spans["op"], spans["category"])}
    while current is not None:
        path.append(current)
        begin = starts[current]
        (compute if cats[current] == Category.COMPUTE else comm)[current[0] if cats[current] == Category.COMPUTE
                                                         else cats[current]] += ends[current] - begin
        if current in held_by:  # waited for the last member: continue from its arrival
            current = held_by[current]
            begin = starts[current] if current not in arrived else arrived[current]
        current = _latest(preds.get(current, ()), ends, begin)
    waits = defaultdict(float)
    for op, last in held_by.items():
        waits[last[0]] += starts.get(last, 0.0) - arrived[op] if last not in arrived else arrived[last] - arrived[op]
    step = float(spans["end_s"].max())
    return Attribution(path, dict(compute), dict(comm), {r: w for r, w in waits.items() if w > 0}, step)


def _predecessors(programs) -> dict:
    out = {}
    for prog in programs:
        last_on_stream = {}
        for i, op in enumerate(prog.ops):
            before = [d for d in op.deps]
            if op.stream in last_on_stream:
                before.append(last_on_stream[op.stream])
            out[(prog.rank, i)] = [(prog.rank, d) for d in before]
            last_on_stream[op.stream] = i
    return out


def _latest(candidates, ends, begin: float):
    """The predecessor that finished last, if it finished when the op began."""
    best = max(candidates, key=lambda k: ends.get(k, -1.0), default=None)
    if best is None or ends.get(best, -1.0) < begin - 1e-12 or begin <= 0:
        return None
    return best


def busiest_links(result, top: int = 5) -> list[tuple[str, float]]:
    """(link name, average utilization over the step) of the most loaded links."""
    topo, used = result.facts.topology, result.facts.link_bytes
    step = result.summary["step_time_s"]
    util = used / (topo.caps * step) if step > 0 else used * 0
    names = topo.link_ends
    order = np.argsort(-util, kind="stable")[:top]  # ties (equally busy ports) in link order
    return [(f"{_node(names[l][0])} -> {_node(names[l][1])} ({topo.kinds[l]})", float(util[l]))
            for l in order if util[l] > 0]


def _node(n) -> str:
    return "/".join(str(x) for x in n)


def _covered(iv: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Which of the times ``t`` lie inside disjoint sorted intervals ``iv``."""
    if not len(iv):
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(iv[:, 0], t, side="right") - 1
    return (i >= 0) & (t < iv[np.maximum(i, 0), 1])


def exposed_by_axis(spans, rank: int) -> dict[str, float]:
    """``rank``'s exposed communication (in flight while it computes nothing) split by
    category: each instant is shared equally among the categories in flight then, so the
    values sum to :func:`sim.outputs.metrics.rank_times`' ``exposed_comm_s`` of the rank."""
    from .metrics import union

    mine = spans[spans["rank"] == rank]
    comp = union(mine.loc[mine.category == Category.COMPUTE, ["start_s", "end_s"]].to_numpy())
    comm = mine[mine.category != Category.COMPUTE]
    axes = {str(c): union(g[["start_s", "end_s"]].to_numpy()) for c, g in comm.groupby("category", sort=True)}
    if not axes:
        return {}
    cuts = np.unique(np.concatenate([iv.ravel() for iv in axes.values()] + [comp.ravel()]))
    mid, width = (cuts[1:] + cuts[:-1]) / 2, np.diff(cuts)
    flying = np.array([_covered(iv, mid) for iv in axes.values()])
    share = np.where(_covered(comp, mid), 0.0, width) / np.maximum(flying.sum(axis=0), 1)
    return {axis: float((share * flying[k]).sum()) for k, axis in enumerate(axes)}


def _exposed_lines(result) -> list[str]:
    """The summary's exposed communication, on its critical rank, by axis."""
    from .metrics import critical_rank, rank_times

    step = float(result.spans["end_s"].max())
    rank = int(critical_rank(rank_times(result.spans, step))["rank"])
    parts = exposed_by_axis(result.spans, rank)
    total = result.summary["exposed_comm_s"]
    lines = [f"exposed communication on rank {rank} (the critical rank; the summary's {total * 1e3:.2f} ms: "
             f"in flight while it computes nothing, shared among the axes in flight):"]
    lines += [f"  {axis}: {t * 1e3:.2f} ms" for axis, t in sorted(parts.items(), key=lambda kv: -kv[1]) if t > 0]
    return lines


def report(result) -> str:
    """Human-readable attribution of the step (a steady run's: of its largest simulated run,
    ``Result.shown``)."""
    result = result.shown or result
    a = critical_path(result)
    s, lines = result.summary, []
    lines.append(f"step {a.step_s * 1e3:.2f} ms; critical path of {len(a.path)} ops"
                 + (f" -- {s['steady_shown']}" if "steady_shown" in s else ""))  # (sim/steady.py)
    slow = straggler_slowdowns(result.scenario, result.facts.topology.spec.gpus_per_node)
    for rank, t in sorted(a.compute_by_rank.items(), key=lambda kv: -kv[1])[:5]:
        note = f"  (straggler, {slow[rank]}x compute)" if rank in slow else ""
        lines.append(f"  compute on rank {rank}: {t * 1e3:.2f} ms of the path{note}")
    for cat, t in sorted(a.comm_by_category.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {cat} communication: {t * 1e3:.2f} ms of the path (collectives of any rank the path runs "
                     "through, waits included)")
    lines += _exposed_lines(result)
    if a.waits_imposed:
        lines.append("ranks others waited for at collectives (total wait imposed):")
        for rank, t in sorted(a.waits_imposed.items(), key=lambda kv: -kv[1])[:5]:
            lines.append(f"  rank {rank}: {t * 1e3:.2f} ms")
    lines.append("busiest links (average utilization over the step):")
    lines += [f"  {name}: {u:.0%}" for name, u in busiest_links(result)]
    for i, f in enumerate(result.scenario.cluster.faults):
        lines.append(f"fault {i}: {f.model_dump(exclude_none=True)}")
    if "straggler_cost_s" in s:
        lines.append(f"straggler cost: {s['straggler_cost_s'] * 1e3:.2f} ms over the clean step")
    lines += host_report(result)
    return "\n".join(lines)
