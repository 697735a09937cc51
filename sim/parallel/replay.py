"""Steady-state pipeline steps built once and replayed: a rank's schedule repeats the same
step (a forward or backward pass of one chunk, or a combined forward/backward pair) for
micro-batch after micro-batch, and every such step adds the same ops but for the
micro-batch they carry (``Op.micro_batch``, the collective's key) and where they sit in
the program (their ``deps`` on each other).

:class:`StepMemo` keys a step by its shape (each item's kind, chunk and micro-batch
relative to the first) and the builder's state entering it (host seconds pending, CUDA-graph
capture, phase). The first step of a shape is built and kept as a template; the second is
built too and compared, op for op, with the template replayed at its place: equal ops,
equal ops of another rank's expert slice to retime (``RankBuilder.varying``), equal host
state after it and equal results (the ops the optimizer waits for, each chunk's last op),
so its dependencies on ops before it are the same and its micro-batch enters only where
the replay puts it. Only then are later steps of that shape replayed instead of built
(each op: its template with the micro-batch shifted and its own deps moved by the
distance between the two steps). A step that differs from its template (the first
micro-batch's FSDP gathers) becomes the new template and is checked again, up to
:data:`RETRIES` times; then that shape is always built. Steps whose builds differ by
design are never memoized: the last backward of each chunk (gradient buckets), the
zero-bubble schedules' deferred input-gradient passes, and the W passes.
``tests/test_replay.py`` builds programs with and without it and compares every op.

Used by :func:`sim.parallel.workload.build_rank`; ``ENABLED`` switches it off (tests).
"""

from collections import deque
from itertools import accumulate, repeat
from operator import add, mul

from ..engine.ops import Op, rekeyed, rekeyed_all

ENABLED = True
RETRIES = 3  # templates replaced (a step unlike the last) before a shape is always built
# Steps of at least this many ops are replayed column by column, shorter ones op by op: the columns'
# fixed cost per step (a dozen list and map objects) outweighs their saving on short steps. Measured
# building whole programs, both ways alternating (docs/scaling.md, i28-build): dg-l405-512 (~107 ops per
# step) and dg-dsv3-1024 (~64) 18-28% faster by columns; mz-q235-tp2pp32ep8 (~16) 5-15% slower.
COLUMNS_FROM = 48
_COMM, _DEPS, _LAYER, _MB = (Op._fields.index(f) for f in ("comm", "deps", "layer", "micro_batch"))
assert (_DEPS, _LAYER, _MB) == (_COMM + 1, _COMM + 2, _COMM + 3)  # (replayed zips the columns in this order)
_MAKE = tuple.__new__  # (Op's own __new__ takes 3x as long)
_consume = deque(maxlen=0).extend  # (runs an iterator to its end in C)


class _Template:
    """One built step: its ops as (op, deps before the step, deps inside it relative to its
    start), what it appended to ``varying``, the host seconds pending after it, its results;
    and the same ops as columns (:meth:`replayed` builds a replay from them)."""

    __slots__ = ("start", "mb", "ops", "varying", "pending", "out", "verified", "misses", "columns",
                 "moving", "exts", "rels", "spans", "calls", "call_at", "call_mbs", "heads", "tails")

    def __init__(self, ops, start: int, mb: int, varying, pending: float, out):
        self.start, self.mb, self.varying, self.pending, self.out = start, mb, varying, pending, out
        self.ops = []
        for op in ops:
            if op.comm is not None and op.comm.key[2] != op.micro_batch:
                raise _Unreplayable  # (RankBuilder.collective puts the micro-batch third in every key)
            ext = tuple(d for d in op.deps if d < start)
            rel = tuple(d - start for d in op.deps if d >= start)
            self.ops.append((op, ext, rel))
        self.verified, self.misses = False, 0
        self._columns(ops)

    def _columns(self, ops) -> None:
        """The ops' fields as columns (``Op``'s order) with which micro-batches move (``>= 0``: 1,
        else 0), each op's deps before the step and its deps inside it (all of them end to end,
        each op's as a slice), and the collectives that move: where they sit, their calls, their
        micro-batches, and their keys' parts before and after the micro-batch."""
        self.columns = list(zip(*ops)) if ops else [()] * len(Op._fields)
        self.moving = [int(m >= 0) for m in self.columns[_MB]]
        self.exts = [ext for _op, ext, _rel in self.ops]
        self.rels = [d for _op, _ext, rel in self.ops for d in rel]
        ends = list(accumulate(len(rel) for _op, _ext, rel in self.ops))
        self.spans = list(map(slice, [0, *ends[:-1]], ends))
        self.call_at = [k for k, op in enumerate(ops) if op.comm is not None and op.micro_batch >= 0]
        self.calls = [ops[k].comm for k in self.call_at]
        self.call_mbs = [ops[k].micro_batch for k in self.call_at]
        self.heads = [c.key[:2] for c in self.calls]
        self.tails = [c.key[3:] for c in self.calls]

    def replayed(self, base: int, mb: int) -> list[Op]:
        """The ops of this step at program index ``base`` for micro-batch ``mb``: each op its
        template's fields with the micro-batch shifted (where ``>= 0``), its collective rekeyed
        to it, its deps inside the step moved to ``base``; built column by column in C
        (``map``/``zip``: no Python step per op, nor numpy's fixed cost per call on the one-layer
        steps of ``mz-q235-tp2pp32ep8``), the same ops as
        ``Op(..., comm=rekeyed(c, key[:2] + (m,) + key[3:]), deps=ext + moved, micro_batch=m)``
        op by op (tests/test_replay.py builds programs both ways)."""
        if len(self.ops) < COLUMNS_FROM:
            return self._replayed_op_by_op(base, mb)
        shift, cols = mb - self.mb, self.columns
        mbs = list(map(add, cols[_MB], map(mul, self.moving, repeat(shift)))) if shift else cols[_MB]
        at = list(range(base, base + len(self.ops)))  # (one int object per op, shared by its dependants' deps)
        moved = list(map(at.__getitem__, self.rels))
        deps = map(add, self.exts, map(tuple, map(moved.__getitem__, self.spans)))
        comms = list(cols[_COMM])
        if self.calls:
            keys = map(add, map(add, self.heads, zip(map(add, self.call_mbs, repeat(shift)))), self.tails)
            _consume(map(comms.__setitem__, self.call_at, rekeyed_all(self.calls, keys)))
        return list(map(_MAKE, repeat(Op), zip(*cols[:_COMM], comms, deps, cols[_LAYER], mbs,
                                                *cols[_MB + 1:])))

    def _replayed_op_by_op(self, base: int, mb: int) -> list[Op]:
        """:meth:`replayed` one op at a time (main 7e862e0's loop): cheaper for a short step."""
        shift, out = mb - self.mb, []
        append = out.append
        at = list(range(base, base + len(self.ops)))
        for op, ext, rel in self.ops:
            deps = ext + tuple(map(at.__getitem__, rel)) if rel else ext  # (map: no comprehension frame per op)
            m = op.micro_batch
            c = op.comm
            if m >= 0:
                m += shift
                if c is not None:
                    key = c.key
                    c = rekeyed(c, key[:2] + (m,) + key[3:])
            append(_MAKE(Op, (op.name, op.category, op.stream, op.duration, c, deps, op.layer, m, op.stage,
                              op.phase, op.issue, op.sync)))
        return out

    def moved(self, value, base: int):
        """A result of the step (an op index, None, nested tuples or lists) moved to ``base``."""
        if isinstance(value, int):
            return value + base - self.start if value >= self.start else value
        if value is None:
            return None
        return type(value)(self.moved(v, base) for v in value)

    def moved_varying(self, base: int) -> list:
        """The step's ``varying`` records at ``base`` (:meth:`.program.Varying.moved`)."""
        shift = base - self.start
        return [v.moved(shift) for v in self.varying]


class _Unreplayable(Exception):
    pass


class StepMemo:
    """The templates of one rank's steps (:func:`sim.parallel.workload.build_rank`)."""

    def __init__(self, b):
        self.b = b
        self.templates: dict[tuple, _Template | None] = {}  # None: a shape always built

    def run(self, step: tuple, build):
        """The results of ``build()`` (which adds ``step``'s ops to the rank's program):
        built, or replayed from a verified template of the same shape."""
        b = self.b
        first = step[0][1]
        key = (tuple((kind, chunk, mb - first) for kind, mb, chunk in step), b.pending, b.captured, b.phase,
               b.deferred is None, b.varying is None)
        found = self.templates.get(key, False)
        ops = b.program.ops
        if found is not None and found is not False and found.verified:
            base = len(ops)
            ops += found.replayed(base, first)
            if found.varying:
                b.varying += found.moved_varying(base)
            b.pending = found.pending
            return found.moved(found.out, base)
        start, vstart = len(ops), None if b.varying is None else len(b.varying)
        out = build()
        if found is None or (vstart is not None and b.varying is None):
            if vstart is not None and b.varying is None:
                self.templates[key] = None  # (a split expert op: this rank's copies are built, not retimed)
            return out
        try:
            new = _Template(ops[start:], start, first, [] if vstart is None else b.varying[vstart:], b.pending, out)
        except _Unreplayable:
            self.templates[key] = None
            return out
        if found is False:
            self.templates[key] = new
        elif _same(found, new, start, first):
            found.verified = True
        else:
            new.misses = found.misses + 1
            self.templates[key] = new if new.misses <= RETRIES else None
        return out


def _same(old: _Template, new: _Template, base: int, mb: int) -> bool:
    """Whether ``new`` (built at ``base`` for micro-batch ``mb``) is ``old`` replayed there."""
    return (old.pending == new.pending and old.replayed(base, mb) == [op for op, _e, _r in new.ops]
            and old.moved_varying(base) == new.varying and old.moved(old.out, base) == new.out)
