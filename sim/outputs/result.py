"""The result of one simulated step: the summary dict, the spans DataFrame and the step's
facts (:class:`StepFacts`: what traces, timelines and reports read besides the spans)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain, islice
from operator import itemgetter

import numpy as np
import pandas as pd

from ..parallel.step_end import STEP_SYNCS
from ..engine.ops import OP_COLUMNS, SPAN_COLUMNS, Op, RankProgram
from ..hardware.topology import Topology
from ..input.scenario import Scenario
from ..parallel.folding import Folding
from ..parallel.layout import Layout
from ..parallel.memory import Memory


@dataclass(frozen=True)
class StepFacts:
    """What a simulated step knew besides its summary and spans. A timeline of the RL loop
    (:mod:`sim.rl.exports`) has no programs, layout or folding: those are None."""

    topology: Topology
    simulated_ranks: list[int]  # ascending
    programs: list[RankProgram] | None = None  # the simulated ranks' programs (spans' ``op`` indexes them)
    layout: Layout | None = None
    folding: Folding | None = None  # whose timeline each rank shares
    gpu: str | None = None  # the GPU preset's name
    micro_batches: int = 0  # per pipeline, per step
    link_bytes: np.ndarray | None = None  # bytes carried per directed link (Network.bytes_by_link)
    held_by: Mapping = field(default_factory=dict)  # (rank, op) that waited -> (rank, op) it waited for
    arrived: Mapping = field(default_factory=dict)  # (rank, op) that waited -> when it arrived, s
    #                                                 (the engine's: sim/engine/waits.py, arrays)
    link_log: list | None = None  # every rate change of every transfer, when recorded (Network.log)

    @property
    def folded(self) -> bool:
        """Whether fewer ranks were simulated than the layout has."""
        return self.layout is not None and len(self.simulated_ranks) < self.layout.world


@dataclass
class Result:
    """``summary``: CONTRACT.md's JSON object; ``spans``: one row per op and rank."""

    summary: dict
    spans: pd.DataFrame
    scenario: Scenario | None = None
    memory: Memory | None = None
    facts: StepFacts | None = None
    # A steady-state run (sim/steady.py): the largest simulated run, with its own summary (its
    # ``steady_shown`` says what it is); ``spans`` and ``facts`` are that run's, not the whole
    # step's. Traces, timelines and reports draw it. None when the spans are the whole step.
    shown: "Result | None" = None

    def to_chrome_trace(self, ranks=None) -> dict:
        """Chrome/Perfetto trace of the spans (see :mod:`sim.outputs.trace`)."""
        from .trace import chrome_trace

        return chrome_trace(self, ranks)


def spans_frame(engine, release: bool = False) -> pd.DataFrame:
    """The spans of a finished :class:`~sim.engine.core.Engine` run (SPAN_COLUMNS): when each op
    ran, from ``engine.times``, beside the op's own fields; sorted by rank and start (ties
    in program order, which on one stream is the order the ops ended). Built column by
    column in C (``np.fromiter`` over the ops' fields; each text column from its distinct
    values and their codes, ``pd.factorize``) and sorted once (``np.lexsort``, stable, as
    ``sort_values`` sorts): the same frame, dtypes included, as one built from rows.
    ``release``: empty ``engine.times`` once its columns are built, for a caller that reads
    the times from the frame alone (sim/step.py). The sort order is found first (rank, start,
    stream), then each column is built and sorted in turn, so at most one unsorted column is
    held beside the frame (the peak RSS of a run is here: ~80 bytes per op less at
    ``python bench/step.py --only 405b-1k`` than building them all first)."""
    programs = engine.programs
    ops = _AllOps(programs)  # (iterated per column: no list of 8 bytes per op)
    times = [engine.times[prog.rank] for prog in programs]
    rank = np.repeat([prog.rank for prog in programs], [len(prog.ops) for prog in programs]).astype(np.int64)
    start = _numbers([ts.start for ts in times])
    codes, names = _codes(ops, Op._fields.index("name"))
    _step_syncs_start_together(engine, np.isin(codes, [k for k, v in enumerate(names) if v in STEP_SYNCS]), start)
    text = {"name": (codes, names)}
    codes, streams = text["stream"] = _codes(ops, Op._fields.index("stream"))
    rank_of = np.argsort(np.argsort(np.array(streams, dtype=object), kind="stable"))  # (stream values by str order)
    order = np.lexsort((rank_of[codes], start, rank))
    out = {"rank": rank[order], "start_s": start[order]}
    del rank, start
    out["end_s"] = _numbers([ts.end for ts in times])[order]
    out["bytes"] = _numbers([ts.sent for ts in times])[order]
    del times
    if release:
        engine.times = {}
    out["op"] = np.concatenate([np.arange(len(prog.ops), dtype=np.int64) for prog in programs]
                               or [np.zeros(0, np.int64)])[order]
    for c in OP_COLUMNS:
        if c in TEXT_COLUMNS:
            out[c] = _strings(*(text.pop(c) if c in text else _codes(ops, Op._fields.index(c))), order)
        else:
            out[c] = _ints(ops, Op._fields.index(c))[order]
    del ops
    out = {c: out[c] for c in SPAN_COLUMNS}
    # (copy=False: one block per column, the sorted arrays themselves; consolidating them
    # into 2-D blocks would copy every numeric column while the originals are still held:
    # ~0.16 GB of the peak RSS of ``python bench/step.py --only 405b-1k``)
    return pd.DataFrame(out, copy=False)


TEXT_COLUMNS = ("stream", "name", "category", "phase")  # str or StrEnum (phase: None outside a step)


class _AllOps:
    """Every op of ``programs``, program after program: sized and iterable, without a list."""

    __slots__ = ("programs", "n")

    def __init__(self, programs: list):
        self.programs, self.n = programs, sum(len(prog.ops) for prog in programs)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return chain.from_iterable(prog.ops for prog in self.programs)


def _numbers(arrays: list) -> np.ndarray:
    """The values of ``arrays`` (the engine's ``array('d')`` columns, :class:`~sim.engine.core.OpTimes`) end to
    end as one float64 array, copied from their buffers without a float object per value."""
    if not arrays:
        return np.zeros(0, np.float64)
    return np.concatenate([np.frombuffer(a, np.float64) for a in arrays])


def _ints(ops, index: int) -> np.ndarray:
    """Field ``index`` of every op (an int: layer, micro-batch, stage) as int64."""
    return np.fromiter(map(itemgetter(index), ops), np.int64, count=len(ops))


CHUNK = 1 << 16  # ops factorized at a time by _codes


def _codes(ops, index: int) -> tuple[np.ndarray, list]:
    """Field ``index`` of every op as (codes, distinct values in order of first appearance,
    as ``pd.factorize`` gives them), None a value of its own. Factorized :data:`CHUNK` ops
    at a time, each chunk's distinct values mapped to the whole's: ``pd.factorize`` sizes its
    hash table by its input, ~80 bytes per op at once over all of them."""
    get, seen, distinct, out = itemgetter(index), {}, [], np.empty(len(ops), np.int32)
    values = iter(ops)
    for lo in range(0, len(ops), CHUNK):
        part = np.fromiter(map(get, islice(values, CHUNK)), object, count=min(CHUNK, len(ops) - lo))
        codes, uniques = pd.factorize(part, use_na_sentinel=False)
        lut = []
        for u in uniques:  # (None comes back as a NaN, a new one per chunk: one key for all)
            key = _MISSING if u is None or u != u else u
            if key not in seen:
                seen[key] = len(distinct)
                distinct.append(u)
            lut.append(seen[key])
        out[lo:lo + len(part)] = np.array(lut, np.int32)[codes]
    return out, distinct  # (a few hundred distinct values at most)


_MISSING = object()  # _codes's key for None (a NaN once factorized)


def _strings(codes: np.ndarray, uniques: list, order: np.ndarray) -> pd.Series:
    """The Series pandas builds from the list of the values (its dtype inferred from the
    distinct values, as from all of them), in ``order`` (indexed once: ``Series.take`` and
    ``reset_index`` each held another copy and its index)."""
    distinct = pd.Series(uniques)
    return pd.Series(distinct.to_numpy()[codes[order]], dtype=distinct.dtype, copy=False)


def _step_syncs_start_together(engine, syncs: np.ndarray, starts: np.ndarray) -> None:
    """A step-end synchronization (the gradient-norm all-reduce over every pipeline stage, the
    loss all-reduce: :data:`sim.parallel.step_end.STEP_SYNCS`) begins, on every member, when
    the last one arrives: a stage that finished its backward early waits there for the
    pipeline to drain, a rank for a slower one's optimizer, and that wait is idle (the
    bubble), not communication -- as a posted receive waiting for its send is
    (sim/engine/core.py). ``syncs``: whether each op (flat, program after program) is
    one; ``starts``: the flat start column, set in place."""
    where = np.flatnonzero(syncs).tolist()
    if not where:
        return
    offsets = np.cumsum([0] + [len(prog.ops) for prog in engine.programs])
    index = {prog.rank: k for k, prog in enumerate(engine.programs)}
    held_by = engine.held_by
    for flat in where:
        k = int(np.searchsorted(offsets, flat, side="right")) - 1
        last = held_by.get((engine.programs[k].rank, flat - int(offsets[k])))
        if last is not None:
            starts[flat] = starts[int(offsets[index[last[0]]]) + last[1]]
