"""How many of a row's events a stream's unobserved op chains could save: the ceiling of
running a stream's consecutive compute ops as one event (docs/scaling.md, issue 28).

Run: ``python bench/chain_census.py ID[,ID...] [--ties lifo|random] [--set K=V ...]``: for each
row of ``clustersim validate`` (its scenario as ``clustersim validate`` runs it, ``force=True``),
one subprocess simulates it with every ``Engine.run`` followed by a census of its ops (read
after the run, before the spans table takes the times; nothing in ``sim`` is changed) and
prints one JSON line: the events, the compute ops, and how many pairs (A, B) of consecutive ops on one stream
could run as one event, A's end then never being an event of its own:

- both compute ops (no collective: a collective's end is its meeting's);
- B started the instant A ended (``start[B] == end[A]``), every other dep of B had ended when
  A started (``end[d] <= start[A]``), and the host had issued B by A's end (its release, or
  its anchor's end plus the offset, the anchor ended when A started);
- nobody else observes A's end: no op of another stream depends on A, and A is not a sync
  op (the host's wait, ``Op.sync``). (Later ops of A's own stream that depend on A read it
  after it ended in either case.)
- A's rank has no compute that a collective's kernels slow (``RankProgram.holds_sms``: the
  SM ledger times it at run time, so a chain there would have to be split wherever a
  collective takes or gives back SMs: counted apart as ``sm_ledger``), and the run has no
  compute slowdowns (stragglers: ``compute_scale``, counted apart).

``pairs / events`` is the share of events a chain merge could remove; the other counts say
why the remaining compute-to-compute boundaries are not chainable (first reason that holds,
in the order above; ``not_compute_pair``: A or B a collective). ``share_if_ledger``: the
share were chains also made on SM-ledger ranks and under stragglers. ``chains``: maximal runs
of chainable pairs by length (ops). ``tied_events``: events popped at the same time as the
event before them (superseded wake-ups left out): how often the order at equal times decides.

``--ties lifo``: the same run with events at equal (time, priority) popped last scheduled
first (SimPy's event ids count down instead of up): another order at equal times that is as
valid as SimPy's first-in-first-out; ``--ties random``: popped in a random order (each event
id a seeded random number; two equal ids, which would compare the events, have probability
~n^2 / 2^54); the printed ``summary`` and ``spans`` hashes (bench/
fingerprint.py's, as ``python bench/rows.py`` prints) say whether any result depends on it.

With ``CENSUS_DUMP=DIR`` in the environment each row's summary and spans are also written as
``python bench/rows.py --dump DIR`` writes them, for ``python bench/compare_fingerprints.py A B``.

``python bench/chain_census.py --loop-cost``: CPU per event of the event loop alone (push, pop,
callback), three times: what a chained op saves at most.
"""

from collections import Counter
from heapq import heappush
import os
from pathlib import Path
import subprocess
import sys
import time

import numpy as np
import simpy

from sim.engine.clock import NORMAL, run_until_empty
from sim.engine.ops import stream_indices


def census(engine, totals: Counter, chains: Counter) -> None:
    """Add ``engine``'s run (after ``Engine.run``, before the spans table) to ``totals`` (the
    counts of the module docstring) and ``chains`` (maximal chainable runs by length)."""
    totals["events"] += engine.events
    totals["runs"] += 1
    for prog in engine.programs:
        times = engine.times[prog.rank]
        start, end = np.asarray(times.start), np.asarray(times.end)
        ops = prog.ops
        release = np.asarray(prog.release(keep=False))
        anchored = prog.anchors()
        anchor = None if anchored is None else np.asarray(anchored[0])
        offset = None if anchored is None else np.asarray(anchored[1])
        streams = stream_indices(ops)
        stream_of = np.empty(len(ops), dtype=np.int64)
        for k, idx in enumerate(streams):
            stream_of[np.asarray(idx)] = k
        observed = np.zeros(len(ops), dtype=bool)  # read by an op of another stream
        for j, op in enumerate(ops):
            for d in op.deps:
                if stream_of[d] != stream_of[j]:
                    observed[d] = True
        totals["ops"] += len(ops)
        totals["compute_ops"] += sum(1 for op in ops if op.comm is None)
        for idx in streams:
            run = 1
            for a, b in zip(idx[:-1], idx[1:]):
                A, B = ops[a], ops[b]
                ok = False
                if A.comm is not None or B.comm is not None:
                    totals["not_compute_pair"] += 1
                elif start[b] != end[a]:
                    totals["gap"] += 1
                elif any(end[d] > start[a] for d in B.deps if d != a):
                    totals["dep_pending"] += 1
                elif (anchor is not None and anchor[b] >= 0 and
                      (end[anchor[b]] > start[a] or end[anchor[b]] + offset[b] > end[a])) or \
                        ((anchor is None or anchor[b] < 0) and release[b] > end[a]):
                    totals["host_pending"] += 1
                elif observed[a] or A.sync:
                    totals["observed"] += 1
                elif prog.holds_sms:
                    totals["sm_ledger"] += 1
                elif engine.compute_scale is not None:
                    totals["compute_scale"] += 1
                else:
                    totals["pairs"] += 1
                    ok = True
                if ok:
                    run += 1
                else:
                    if run > 1:
                        chains[run] += 1
                    run = 1
            if run > 1:
                chains[run] += 1


CHILD = r"""
import itertools, json, os, random, sys, time
from collections import Counter
from heapq import heappop
sys.path.insert(0, sys.argv[1])
from sim.engine import core
from sim.engine.clock import VOID
from chain_census import census
from fingerprint import step_fingerprint
from sim.input.load import parse_value, scenario_from_dict
from sim.step import simulate
from sim.studies.validation import load_rows

ties = sys.argv[3]
totals = Counter()
chains = Counter()


run = core.Engine.run
def counted(self):
    run(self)
    census(self, totals, chains)
core.Engine.run = counted


def run_counting_ties(env):  # clock.run_until_empty, counting events popped at the time of the one before
    queue, last, n = env._queue, -1.0, 0
    while queue:
        env._now, _, _, event = heappop(queue)
        if env._now == last and event.callbacks is not VOID:
            n += 1
        last = env._now
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
    totals["tied_events"] += n
core.run_until_empty = run_counting_ties

if ties == "lifo":  # events at equal (time, priority) popped last scheduled first: eids count down
    init = core.Engine.__init__
    def lifo_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.env._eid = itertools.count(0, -1)
    core.Engine.__init__ = lifo_init
    core.Engine.events = property(lambda self: -int(repr(self.env._eid)[6:].split(",")[0]))
elif ties == "random":  # events at equal (time, priority) popped in a random order (seeded)
    class RandomEids:
        def __init__(self):
            self.rng, self.n = random.Random(1), 0
        def __next__(self):
            self.n += 1
            return self.rng.random()
    init = core.Engine.__init__
    def random_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.env._eid = RandomEids()
    core.Engine.__init__ = random_init
    core.Engine.events = property(lambda self: self.env._eid.n)

row = next(r for r in load_rows() if r.id == sys.argv[2])
overrides = {k: parse_value(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
scenario = scenario_from_dict(row.scenario, overrides or None)
cpu = time.process_time()
result = simulate(scenario, force=True)
out = {"row": row.id, "load": os.getloadavg()[0], "cpu_s": round(time.process_time() - cpu, 2),
       "predicted_step_s": repr(result.summary["step_time_s"]), **totals,
       "share": round(totals["pairs"] / totals["events"], 4),
       "share_if_ledger": round((totals["pairs"] + totals["sm_ledger"] + totals["compute_scale"]) / totals["events"], 4),
       "chains": dict(sorted(chains.items())), "ties": ties,
       **{k: v for k, v in step_fingerprint(result).items() if k != "step_time_s"}}
print(json.dumps(out))
if os.environ.get("CENSUS_DUMP"):  # (as bench/rows.py --dump: for bench/compare_fingerprints.py)
    import hashlib
    import numpy as np
    from pathlib import Path
    folder = Path(os.environ["CENSUS_DUMP"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{row.id}.json").write_text(json.dumps(result.summary, sort_keys=True, default=str))
    spans = result.spans
    numeric = {c: spans[c].to_numpy() for c in spans if spans[c].dtype.kind in "iufb"}
    hashed = {c: np.array(hashlib.sha256(spans[c].astype(str).str.cat(sep="\n").encode()).hexdigest())
              for c in spans if c not in numeric}
    np.savez(folder / f"{row.id}.npz", **numeric, **hashed)
"""


class _Looped:
    """An object that is its own event (as ``sim.engine.core.Stream``) and re-queues itself
    ``left`` times, each a microsecond later, as a stream of zero-work compute ops would."""

    __slots__ = ("env", "queue", "eid", "left", "callbacks", "on_end")
    _ok, _value = True, None

    def __init__(self, env, left: int):
        self.env, self.queue, self.eid, self.left = env, env._queue, env._eid, left
        self.on_end, self.callbacks = [self.step], None

    def step(self, _event=None) -> None:
        self.left -= 1
        if self.left:
            self.callbacks = self.on_end
            heappush(self.queue, (self.env._now + 1e-6, NORMAL, next(self.eid), self))


def loop_cost(n: int = 2_000_000, streams: int = 16) -> float:
    """CPU seconds per event of the event loop alone (push, pop, the callback's call), with
    ``streams`` such objects interleaved (a run's queue is shallow: 13 entries on average in
    ``dg-l70-64``, docs/scaling.md): what a chain saves per event at most, the per-op work of
    ``_advance`` and ``_ended`` staying."""
    env = simpy.Environment()
    for looped in [_Looped(env, n // streams) for _ in range(streams)]:
        looped.callbacks = looped.on_end
        heappush(env._queue, (0.0, NORMAL, next(env._eid), looped))
    cpu = time.process_time()
    run_until_empty(env)
    return (time.process_time() - cpu) / n


def main(argv: list[str]) -> None:
    if argv[:1] == ["--loop-cost"]:
        for _ in range(3):
            print(f"{loop_cost() * 1e6:.3f} us of CPU per event (load {os.getloadavg()[0]:.1f})", flush=True)
        return
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    ids, overrides, ties, args = argv[0].split(","), [], "fifo", iter(argv[1:])
    for a in args:
        if a == "--ties":
            ties = next(args)
        elif a == "--set":
            overrides.append(next(args))
        else:
            sys.exit(f"unknown argument {a!r}\n{__doc__}")
    for row in ids:
        out = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), row, ties, *overrides],
                             capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
