"""The result of one simulated step: the summary dict, the spans DataFrame and the step's
facts (:class:`StepFacts`: what traces, timelines and reports read besides the spans)."""

from dataclasses import dataclass, field
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
    held_by: dict = field(default_factory=dict)  # (rank, op) that waited -> (rank, op) it waited for
    arrived: dict = field(default_factory=dict)  # (rank, op) that waited -> when it arrived, s
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


def spans_frame(engine) -> pd.DataFrame:
    """The spans of a finished :class:`~sim.engine.core.Engine` run (SPAN_COLUMNS): when each op
    ran, from ``engine.times``, beside the op's own fields; sorted by rank and start (ties
    in program order, which on one stream is the order the ops ended)."""
    programs = engine.programs
    ops = [op for prog in programs for op in prog.ops]
    times = [engine.times[prog.rank] for prog in programs]
    ran = {
        "rank": np.repeat([prog.rank for prog in programs], [len(prog.ops) for prog in programs]).astype(np.int64),
        "op": np.concatenate([np.arange(len(prog.ops), dtype=np.int64) for prog in programs] or [np.zeros(0, np.int64)]),
    }
    for column, field in (("start_s", "start"), ("end_s", "end"), ("bytes", "sent")):
        ran[column] = np.array([v for ts in times for v in getattr(ts, field)])  # float64 (int64 if all ints, as from rows)
    _step_syncs_start_together(engine, ops, ran["start_s"])
    # (a field by its position, in C: Op is a NamedTuple; dtypes as from rows)
    own = {c: pd.Series(list(map(itemgetter(Op._fields.index(c)), ops))) for c in OP_COLUMNS}
    df = pd.DataFrame({c: ran[c] if c in ran else own[c] for c in SPAN_COLUMNS})
    return df.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)


def _step_syncs_start_together(engine, ops: list, starts: np.ndarray) -> None:
    """A step-end synchronization (the gradient-norm all-reduce over every pipeline stage, the
    loss all-reduce: :data:`sim.parallel.step_end.STEP_SYNCS`) begins, on every member, when
    the last one arrives: a stage that finished its backward early waits there for the
    pipeline to drain, a rank for a slower one's optimizer, and that wait is idle (the
    bubble), not communication -- as a posted receive waiting for its send is
    (sim/engine/core.py). ``starts``: the flat start column, set in place."""
    where = [i for i, op in enumerate(ops) if op.name in STEP_SYNCS]
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
