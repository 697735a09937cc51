"""Chrome / Perfetto traces of a simulated step (the Trace Event Format, JSON).

``clustersim run SCENARIO --trace out.json [--trace-ranks SEL]`` or
``Result.to_chrome_trace()``. Open the file in https://ui.perfetto.dev or chrome://tracing.

- a process per server ("node N"), a thread per rank and stream (compute, then each comm
  stream), named and sorted;
- every span as a complete event (``"ph": "X"``), category compute / tp / dp / pp / ep /
  cp / idle, args: layer, micro-batch, stage, bytes sent, op index and the collective's
  group; gaps on a compute stream as ``idle`` events, so bubbles are visible;
- a ``host`` thread per rank: one span per pass the host issued (sim/outputs/host.py);
- flow events (``"s"`` -> ``"f"``) from every pipeline send to its recv;
- counter tracks (``"ph": "C"``) of the busiest links' utilization (% of the link's
  usable bandwidth ``topo.caps``), exact and piecewise constant, when the run recorded its
  transfers (``simulate(..., record_links=True)``; the CLI does it with ``--trace``).

Timestamps are microseconds, as the format expects. Large runs show a selection of ranks
(:func:`sim.outputs.rank_selection.select_ranks`) so the file stays openable; a folded rank shows
as the simulated rank it is identical to, whose compute thread says how many it stands for.
"""

import json
from pathlib import Path

import numpy as np

from ..collectives.kinds import SEND_RECV
from ..errors import InputError
from .host import spans as host_spans
from .rank_selection import representative, select_ranks, stands_for
from ..engine.kinds import StreamName

__all__ = ["chrome_trace", "write_trace", "link_series", "series_from_log", "link_names"]

US = 1e6  # seconds -> microseconds
IDLE_MIN_S = 1e-7  # compute-stream gaps shorter than this are not drawn as idle
TOP_LINKS = 8  # counter tracks for the busiest links
LARGE_TRACE_EVENTS = 2_000_000  # beyond this, warn that viewers will struggle


# --- the trace --------------------------------------------------------------------------------

def _stream_order(streams) -> list[str]:
    return sorted(streams, key=lambda s: (s != StreamName.COMPUTE, s))


def _describe(group: tuple[int, ...]) -> str:
    if len(group) <= 8:
        return ",".join(map(str, group))
    step = group[1] - group[0]
    regular = all(b - a == step for a, b in zip(group, group[1:]))
    return f"{group[0]}..{group[-1]} step {step} ({len(group)} ranks)" if regular else \
        ",".join(map(str, group[:8])) + f",... ({len(group)} ranks)"


def chrome_trace(result, ranks=None) -> dict:
    """The trace of ``result`` for ``ranks`` (a list, a selector string, or None; folded
    ranks show as their representative; a steady run's largest simulated run, ``Result.shown``,
    its ``otherData`` saying so)."""
    result = getattr(result, "shown", None) or result
    if ranks is None or isinstance(ranks, str):
        ranks = select_ranks(result, ranks)
    ranks = sorted({representative(result, int(r)) for r in ranks})
    topo, programs = result.facts.topology, {p.rank: p for p in result.facts.programs or ()}
    sp = result.spans[result.spans["rank"].isin(ranks)]
    events, tids, nodes = _threads(result, sp, ranks, topo)
    sends, recvs = {}, {}
    for r in sp.itertuples(index=False):
        rank, op_index = int(r.rank), int(r.op)
        comm = programs[rank].ops[op_index].comm if programs else None  # (None: spans of no program, RL)
        args = {"layer": int(r.layer), "micro_batch": int(r.micro_batch), "stage": int(r.stage),
                "bytes": float(r.bytes), "op": op_index}
        if comm is not None:
            args["group"] = _describe(comm.group)
            args["collective"] = comm.op
        ev = {"ph": "X", "name": r.name, "cat": r.category, "pid": topo.server(rank),
              "tid": tids[(rank, r.stream)], "ts": r.start_s * US, "dur": (r.end_s - r.start_s) * US, "args": args}
        events.append(ev)
        if comm is not None and comm.op is SEND_RECV:
            (sends if rank == comm.group[0] else recvs)[comm.key] = ev  # (a send/recv's group: src, dst)
    events += _idle_events(sp, tids, topo)
    events += _host_events(programs, ranks, topo, result.spans)
    events += _flows(sends, recvs)
    events += _link_counters(result, pid=max(nodes, default=0) + 1)
    s = result.summary
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": s.get("name"), "step_time_s": s.get("step_time_s"), "mfu": s.get("mfu"),
                          "ranks_shown": ranks, "simulated_ranks": len(result.facts.simulated_ranks),
                          "num_gpus": s.get("num_gpus"),
                          **({"steady_shown": s["steady_shown"]} if "steady_shown" in s else {})}}  # (sim/steady.py)


def _threads(result, sp, ranks, topo) -> tuple[list[dict], dict, dict]:
    """A process per node and a thread per stream of each shown rank (compute first): their
    metadata events, the thread id of each (rank, stream) and the ranks of each node."""
    events, tids, nodes = [], {}, {}
    for rank in ranks:
        node = topo.server(rank)
        nodes.setdefault(node, []).append(rank)
        streams = _stream_order(sp.loc[sp["rank"] == rank, "stream"].unique()) or [StreamName.COMPUTE]
        for j, stream in enumerate(streams):
            tids[(rank, stream)] = rank * 64 + j
    for node, members in sorted(nodes.items()):
        events.append({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": node, "args": {"sort_index": node}})
    for (rank, stream), tid in tids.items():
        pid, n = topo.server(rank), stands_for(result, rank)
        stands = f" (stands for {n:,} identical ranks)" if n > 1 and stream == StreamName.COMPUTE else ""
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"rank {rank} {stream}" + stands}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events, tids, nodes


def _host_events(programs: dict, ranks, topo, spans_table) -> list[dict]:
    """Each shown rank's host track (sim/outputs/host.py): a ``host`` thread of its node
    with one span per pass the host issued."""
    spans = host_spans(programs.values(), set(ranks), spans_table)
    events = []
    for rank in sorted(set(spans["rank"].tolist())):
        pid, tid = topo.server(rank), rank * 64 + 63
        events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"rank {rank} host"}},
                   {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    for r in spans.itertuples(index=False):
        events.append({"ph": "X", "name": r.name, "cat": r.category, "pid": topo.server(int(r.rank)),
                       "tid": int(r.rank) * 64 + 63, "ts": r.start_s * US, "dur": (r.end_s - r.start_s) * US,
                       "args": {"micro_batch": int(r.micro_batch), "stage": int(r.stage), "phase": r.phase}})
    return events


def _idle_events(sp, tids, topo) -> list[dict]:
    """Gaps on each compute stream, from the step's start to its end: bubbles, waits."""
    from .metrics import subtract, union

    out = []
    end = float(sp.end_s.max()) if len(sp) else 0.0
    comp = sp[sp.stream == StreamName.COMPUTE]
    for rank, g in comp.groupby("rank"):
        gaps = subtract(np.array([[0.0, end]]), union(g[["start_s", "end_s"]].to_numpy()))
        out += [{"ph": "X", "name": "idle", "cat": "idle", "pid": topo.server(int(rank)),
                 "tid": tids[(int(rank), StreamName.COMPUTE)], "ts": a * US, "dur": (b - a) * US, "args": {}}
                for a, b in gaps if b - a > IDLE_MIN_S]
    return out


def _flows(sends: dict, recvs: dict) -> list[dict]:
    """An arrow from each pipeline send to the recv that completes it. Both ends sit at
    the middle of their slice, so viewers bind them to it (``"bp": "e"``: the enclosing
    slice) whatever order they give events that share a timestamp."""
    out = []
    for n, (key, s) in enumerate(sorted(sends.items(), key=lambda kv: kv[1]["ts"])):
        r = recvs.get(key)
        if r is None:
            continue
        out.append({"ph": "s", "id": n, "name": s["name"], "cat": "pp", "pid": s["pid"], "tid": s["tid"],
                    "ts": s["ts"] + s["dur"] / 2})
        out.append({"ph": "f", "bp": "e", "id": n, "name": s["name"], "cat": "pp", "pid": r["pid"],
                    "tid": r["tid"], "ts": max(r["ts"] + r["dur"] / 2, s["ts"] + s["dur"] / 2)})
    return out


def link_names(topo) -> dict[int, str]:
    """Directed link id -> 'gpu 3 -> nvswitch 0' style names."""
    def node(n):
        return " ".join(str(x) for x in n) if isinstance(n, tuple) else str(n)

    return {lid: f"{node(a)} -> {node(b)}" for lid, (a, b) in enumerate(topo.link_ends)}


def series_from_log(log, bucket) -> dict:
    """Throughput over time per bucket of links from a network log (``Network.log``:
    (time, transfer, phase, rates per chain or None at its end) at every rate change).
    ``bucket(link id)`` names a bucket, or None to skip the link. Returns bucket ->
    (times, bytes/s): the value holds from each time to the next."""
    from ..engine.links import link_bytes

    deltas: dict = {}
    live: dict = {}  # transfer -> (since, [(bucket, rate), ...])
    for t, act, phase, rates in log:
        prev = live.pop(act, None)
        if prev is not None and t > prev[0]:
            for key, rate in prev[1]:
                deltas.setdefault(key, []).extend([(prev[0], rate), (t, -rate)])
        if rates is None:
            continue
        per_link = link_bytes(phase, np.asarray(rates, dtype=float))
        use = [(bucket(lid), r) for lid, r in zip(phase.links.tolist(), per_link.tolist()) if r > 0]
        live[act] = (t, [(k, r) for k, r in use if k is not None])
    out = {}
    for key, d in deltas.items():
        d.sort()
        times = np.array([t for t, _ in d])
        rates = np.maximum(np.cumsum([r for _, r in d]), 0.0)
        keep = np.append(times[1:] != times[:-1], True)  # the value after all changes at an instant
        times, rates = times[keep], rates[keep]
        rates[np.abs(rates) < 1e-6 * max(1.0, rates.max())] = 0.0  # float residue of +r -r
        out[key] = (times, rates)
    return out


def link_series(result, top: int = TOP_LINKS) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The busiest links' throughput over time: link id -> (times, bytes/s)."""
    log = result.facts.link_log
    if not log:
        return {}
    totals = np.asarray(result.facts.link_bytes)
    busiest = {int(i) for i in np.argsort(-totals, kind="stable")[:top] if totals[i] > 0}
    series = series_from_log(log, lambda lid: lid if lid in busiest else None)
    return {lid: series[lid] for lid in sorted(series, key=lambda lid: -totals[lid])}


def _link_counters(result, pid: int) -> list[dict]:
    series = link_series(result)
    if not series:
        return []
    topo = result.facts.topology
    names = link_names(topo)
    out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network: busiest links"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": -1}}]
    for lid, (times, rates) in series.items():
        cap = float(topo.caps[lid])
        name = f"{names[lid]} ({topo.kinds[lid]}, {cap / 1e9:.0f} GB/s)"
        out += [{"ph": "C", "name": name, "pid": pid, "ts": t * US, "args": {"util %": round(100 * r / cap, 3)}}
                for t, r in zip(times.tolist(), rates.tolist())]
    return out


def write_trace(result, path: str, ranks_text: str | None = None) -> dict:
    """Write the trace JSON to ``path``; returns it."""
    if not str(path).endswith(".json"):
        raise InputError("--trace", f"expected a .json path, got {path!r}")
    trace = chrome_trace(result, select_ranks(result, ranks_text))
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    events = len(trace["traceEvents"])
    if events > LARGE_TRACE_EVENTS:
        import sys

        print(f"warning: {path} holds {events:,} events ({Path(path).stat().st_size / 1e6:,.0f} MB); "
              "Perfetto struggles past a few million: pick fewer ranks with --trace-ranks", file=sys.stderr)
    return trace
