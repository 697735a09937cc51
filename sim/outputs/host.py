"""The host track of a simulated step: when each rank's host (CPU) issued its GPU work, and
how long the GPU waited for it (sim/model/host.py says what issuing costs; the engine starts
no op before :meth:`sim.engine.ops.RankProgram.release`, or after a host wait on a sync op
before that op's end plus what follows: :meth:`~sim.engine.ops.RankProgram.issued`).

Host spans are kept apart from the spans table: they are neither compute nor communication,
so no summary metric counts them. One host span per run of consecutive ops of one pass
(micro-batch, stage, phase): the interval the host spent issuing that pass; the optimizer's
ops make one more. ``clustersim run --trace`` shows them on a ``host`` thread per rank, the
timeline (``--timeline``) on a ``host`` row, and ``--report`` says when the step is host-bound.
"""

import numpy as np
import pandas as pd

from ..engine.kinds import Category, StreamName

HOST_STREAM = "host"
HOST_BOUND = 0.5  # a step is host-bound when waits for the host are at least this share of the GPU's idle time
COLUMNS = ("rank", "stream", "name", "category", "start_s", "end_s", "micro_batch", "stage", "phase")


def ends(spans_table: pd.DataFrame, prog) -> list:
    """When each op of ``prog`` ended in ``spans_table`` (None: not in it)."""
    out = [None] * len(prog.ops)
    mine = spans_table[spans_table["rank"] == prog.rank]
    for i, end in zip(mine["op"], mine["end_s"]):
        if 0 <= int(i) < len(out):
            out[int(i)] = float(end)
    return out


def issued(prog, spans_table: pd.DataFrame | None) -> list[float]:
    """When ``prog``'s host issued each op (its sync ops' ends from ``spans_table``)."""
    if spans_table is None or prog.anchors() is None:
        return prog.release()
    return prog.issued(ends(spans_table, prog))


def spans(programs, ranks=None, spans_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Host spans (COLUMNS) of ``programs`` (of ``ranks``, default all): one per run of
    consecutive ops of the same micro-batch, stage and phase, from when the host began
    issuing its first op to when it had issued its last (after a wait on a sync op, from
    its end: ``spans_table`` says when the ops ended)."""
    rows = []
    for prog in programs:
        if ranks is not None and prog.rank not in ranks:
            continue
        released, start, key, first = issued(prog, spans_table), 0.0, None, 0
        for i, op in enumerate(prog.ops):
            k = (op.micro_batch, op.stage, op.phase)
            if k != key:
                if key is not None and released[i - 1] > start:
                    rows.append(_row(prog, first, start, released[i - 1]))
                key, first, start = k, i, released[i] - op.issue
        if key is not None and released and released[-1] > start:
            rows.append(_row(prog, first, start, released[-1]))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def with_spans(result) -> pd.DataFrame:
    """``result``'s spans and its simulated ranks' host spans (category ``host``, stream
    ``host``: the timeline draws them as a row of their own under each rank's compute row)."""
    programs = result.facts.programs if result.facts is not None else None
    extra = spans(programs, spans_table=result.spans) if programs else None
    return pd.concat([result.spans, extra], ignore_index=True) if extra is not None and len(extra) else result.spans


def _row(prog, first: int, start: float, end: float) -> tuple:
    op = prog.ops[first]
    phase = str(op.phase) if op.phase is not None else ""
    name = f"issue {phase}" + (f" mb {op.micro_batch}" if op.micro_batch >= 0 else "")
    return (prog.rank, HOST_STREAM, name, str(Category.HOST), start, end, op.micro_batch, op.stage, phase)


def waits(spans_table: pd.DataFrame, programs) -> dict[int, float]:
    """Per simulated rank: seconds its compute stream sat idle waiting for the host, i.e.
    summed over compute-stream ops that started at their release time later than their
    stream and dependencies allowed, the time between the two."""
    out, by_rank = {}, dict(iter(spans_table.groupby("rank")))
    for prog in programs:
        released, theirs = issued(prog, spans_table), by_rank.get(prog.rank, spans_table.iloc[:0])
        mine = theirs[theirs["stream"] == StreamName.COMPUTE]
        end = dict(zip(theirs["op"], theirs["end_s"]))
        wait, prev = 0.0, 0.0
        for i, start, stop in sorted(zip(mine["op"], mine["start_s"], mine["end_s"])):
            ready = max([prev] + [end[d] for d in prog.ops[i].deps])
            if start > ready and np.isclose(start, released[i], rtol=0.0, atol=1e-12):
                wait += start - ready
            prev = stop
        out[prog.rank] = wait
    return out


def verdict(result) -> dict | None:
    """The rank whose GPU waited longest for its host, that wait, its GPU's idle time, the wait's
    share of it and whether the step is host-bound (share >= HOST_BOUND); None without programs.
    One definition, read by ``--report`` (:func:`report_lines`) and ``clustersim calibrate``."""
    programs = result.facts.programs if result.facts is not None else None
    if not programs:
        return None
    wait = waits(result.spans, programs)
    step = float(result.summary["step_time_s"])
    rank = max(wait, key=lambda r: (wait[r], -r))
    mine = result.spans[(result.spans["rank"] == rank) & (result.spans["stream"] == StreamName.COMPUTE)]
    idle = max(step - float((mine.end_s - mine.start_s).sum()), 0.0)
    issued_at = issued(programs[[p.rank for p in programs].index(rank)], result.spans)
    share = wait[rank] / idle if idle > 0 else 0.0
    return {"rank": rank, "wait_s": wait[rank], "idle_s": idle, "share": share, "host_bound": share >= HOST_BOUND,
            "issued_s": issued_at[-1] if issued_at else 0.0}


def report_lines(result) -> list[str]:
    """What ``--report`` says of the host: each simulated rank's wait for it, worst first,
    and whether the step is host-bound (waits >= HOST_BOUND of the GPU's idle time)."""
    v = verdict(result)
    if v is None:
        return []
    return [f"host: {'host-bound' if v['host_bound'] else 'not host-bound'}: rank {v['rank']}'s GPU waited "
            f"{v['wait_s'] * 1e3:.2f} ms for its host to issue work, {v['share']:.0%} of its {v['idle_s'] * 1e3:.2f} ms "
            f"idle (the host issued the step in {v['issued_s'] * 1e3:.2f} ms)"]
