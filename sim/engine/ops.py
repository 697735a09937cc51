"""What the engine runs: a rank program is the ops one rank issues in one step, in order.

An :class:`Op` is a compute kernel (its duration) or one member's part of a :class:`Collective`
call, on a named stream, after its ``deps`` (earlier ops of the same program), issued by the
rank's host at a cost (``Op.issue``; the host waits on ``Op.sync`` ops:
:meth:`RankProgram.anchors`). The builders (sim/parallel) make them; :mod:`sim.engine.core`
runs them; the spans table (:data:`SPAN_COLUMNS`) joins them with when they ran.

Run: ``python -m pytest -q tests/test_engine.py tests/test_host_sync.py``
"""

from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from ..collectives.kinds import Algorithm, CollectiveOp
from .kinds import Category, Phase
from .traffic import SiblingGroups


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call. ``key`` matches the calls of all members of one instance."""

    key: tuple
    op: CollectiveOp
    group: tuple[int, ...]
    nbytes: float
    algo: Algorithm | str = Algorithm.AUTO  # or "algorithm:protocol" text (a benchmark's ring:ll)
    siblings: tuple[tuple[int, ...], ...] | SiblingGroups = ()
    shares: tuple | None = None  # all_to_all: (send, receive) weights per member (uneven)
    sms: float = 0.0  # share of the compute rate its kernels take from each member, arrival to end (DeepEP's
    #                   measured cost of its SMs: sim/parallel/ep.py ``sm_share``)


def rekeyed(call: Collective, key: tuple, group: tuple | None = None, siblings=None) -> Collective:
    """``call`` under another ``key`` (another instance of the same call: a replayed step's
    micro-batch, sim/parallel/replay.py), and, where given, on another ``group`` with its
    ``siblings`` (a copied program's call: sim/parallel/copies.py), every other field the same
    object. Its slots are set directly: the frozen dataclass's ``__init__`` sets each through
    ``object.__setattr__``'s lookup, ~60% more CPU per call (one per replayed collective op,
    ~0.6M in the ``mz-q235-tp2pp32ep8`` row). Equal to ``Collective(key, call.op, ...)``:
    tests/test_replay.py."""
    new = _NEW(Collective)
    _SET_KEY(new, key)
    _SET_OP(new, call.op)
    _SET_GROUP(new, call.group if group is None else group)
    _SET_NBYTES(new, call.nbytes)
    _SET_ALGO(new, call.algo)
    _SET_SIBLINGS(new, call.siblings if group is None else siblings)
    _SET_SHARES(new, call.shares)
    _SET_SMS(new, call.sms)
    return new


def rekeyed_all(calls: list, keys) -> list[Collective]:
    """``[rekeyed(c, k) for c, k in zip(calls, keys)]`` field by field rather than call by
    call: each slot set over all the calls by one ``map`` of its descriptor (no Python frame
    per call: a replayed step's collectives, sim/parallel/replay.py). tests/test_replay.py
    compares it with :func:`rekeyed`."""
    new = list(map(_NEW, repeat(Collective, len(calls))))
    _consume(map(_SET_KEY, new, keys))
    for get, setter in _FIELDS:
        _consume(map(setter, new, map(get, calls)))
    return new


_consume = deque(maxlen=0).extend  # (runs an iterator to its end in C, keeping nothing)
_NEW = object.__new__
_SET_KEY, _SET_OP, _SET_GROUP, _SET_NBYTES, _SET_ALGO, _SET_SIBLINGS, _SET_SHARES, _SET_SMS = (
    Collective.__dict__[name].__set__ for name in ("key", "op", "group", "nbytes", "algo", "siblings", "shares", "sms"))
_FIELDS = tuple(zip(map(attrgetter, Collective.__slots__[1:]),  # (getter, setter) of each slot but the key
                    (_SET_OP, _SET_GROUP, _SET_NBYTES, _SET_ALGO, _SET_SIBLINGS, _SET_SHARES, _SET_SMS)))
assert Collective.__slots__ == ("key", "op", "group", "nbytes", "algo", "siblings", "shares", "sms")  # (rekeyed sets each)
_ISSUE = attrgetter("issue")  # an op's host cost (RankProgram.release)
_SYNC = attrgetter("sync")  # whether the host waits for an op's end (RankProgram.anchors)
_STREAM = attrgetter("stream")  # the stream an op runs on (stream_indices)
NO_LAYER = -1  # Op.layer of an op of no layer (the optimizer; as the embedding's id: the phase differs)


class Op(NamedTuple):
    """One operation of a rank program, immutable (program copies share ops); a NamedTuple,
    as fast to build as a slotted dataclass (a frozen dataclass took 15% more time to simulate
    scenarios/llama3-405b-16k-h100.toml). ``deps`` index earlier ops of the same program;
    ``phase`` is None only for ops built outside a training step (engine tests)."""

    name: str
    category: Category
    stream: str
    duration: float = 0.0  # seconds, compute ops
    comm: Collective | None = None
    deps: tuple[int, ...] = ()
    layer: int = NO_LAYER
    micro_batch: int = -1
    stage: int = -1
    phase: Phase | None = None
    issue: float = 0.0  # seconds of host time to issue it (sim.model.host; 0: built outside a step)
    sync: bool = False  # the host waits for this op to end before it issues the next (sim.model.host.SYNC)


@dataclass
class RankProgram:
    """The ops one rank executes in one step, in issue order. ``released``: when the host
    has issued each op (:meth:`release`; copies of a program share their base's array)."""

    rank: int
    ops: list[Op] = field(default_factory=list)
    released: array | None = None
    holds_sms: bool = False  # some collective of it holds SMs (``Collective.sms``): the engine times its compute
    #                          against them (:class:`sim.engine.sms.SmLedger`)
    _anchored: tuple | None = None  # (ops seen, :meth:`anchors`'s answer), kept

    def add(self, op: Op) -> int:
        """Append ``op``; return its index for later ``deps``."""
        self.ops.append(op)
        return len(self.ops) - 1

    def release(self, keep: bool = True) -> array:
        """Seconds from the step's start at which the host has issued each op: the running
        sum of the issue costs up to and including it (one host thread, program order;
        computed once, then kept as an ``array('d')``: 8 bytes per op, not a float object).
        ``keep=False``: not kept if not already (the engine, which copies it per stream)."""
        if self.released is None or len(self.released) != len(self.ops):
            released = array("d", accumulate(map(_ISSUE, self.ops)))  # (map: no Python frame per op)
            if not keep:
                return released
            self.released = released
        return self.released

    def share_host(self, base: "RankProgram") -> None:
        """Take ``base``'s :meth:`release` and :meth:`anchors`, computed once for both: for a
        copy whose ops have ``base``'s issue costs and sync flags in the same order (a copy
        of a 24k-op program computed its own anchors in 50 ms, the GPT 530B row of
        ``clustersim validate`` has 280 copies)."""
        self.released = base.release()
        base.anchors()
        self._anchored = base._anchored

    def anchors(self) -> tuple[array, array] | None:
        """The host's waits (ops with ``sync``: a device-to-host read, ``.tolist()`` or
        ``cudaEventSynchronize``): for each op, the last sync op before it (-1: none) and the
        issue seconds from there up to and including it. The host issues op i at
        ``end[anchor] + offset`` (its clock jumps to the sync op's end, then runs on), or at
        :meth:`release` without an anchor. None when the program has no sync op. (Arrays of
        int64 and float64: no int or float object per op.)"""
        if self._anchored is None or self._anchored[0] != len(self.ops):
            self._anchored = (len(self.ops), _anchored(self.ops))
        return self._anchored[1]

    def issued(self, end) -> list[float] | array:
        """When the host issued each op, given ``end[i]``, when op i ended (after a run):
        :meth:`release` moved on past every sync op to its end (:meth:`anchors`)."""
        found = self.anchors()
        if found is None:
            return self.release()
        anchor, offset = found
        static = self.release()
        return [static[i] if a < 0 else end[a] + offset[i] for i, a in enumerate(anchor)]


def _anchored(ops: list[Op]) -> tuple[array, array] | None:
    """:meth:`RankProgram.anchors` of ``ops``, a run of ops per stretch between sync ops
    rather than a Python step per op: each stretch's anchor repeated, its offsets the running
    sum of its issue costs from 0.0 (``accumulate`` with ``initial=0.0``: the same additions in
    the same order as ``since += op.issue`` from ``since = 0.0``, so the same floats;
    tests/test_host_sync.py compares it with the per-op loop)."""
    syncs = list(compress(range(len(ops)), map(_SYNC, ops)))
    if not syncs:
        return None
    issue = list(map(_ISSUE, ops))
    anchor, offset, a, lo = array("q"), array("d"), -1, 0
    for s in syncs + [len(ops) - 1]:  # (stretches end at each sync op, the last at the program's end)
        if s < lo:  # (the last op is a sync op: no stretch after it)
            break
        anchor.extend(array("q", (a,)) * (s + 1 - lo))
        sums = accumulate(issue[lo:s + 1], initial=0.0)
        next(sums)  # (the initial 0.0 itself)
        offset.extend(sums)
        a, lo = s, s + 1
    return anchor, offset


def stream_indices(ops: list[Op]) -> list[array]:
    """The op indices of each stream of a program, streams in order of their first op, each
    in program order: what a loop appending every op's index to its stream's list gives, as
    int64 arrays (not int objects: ~30 bytes per op less held throughout the run, ``python
    bench/step.py --only 405b-1k``). Each op's stream is numbered through a dict in C
    (``map``), then one stable sort: no Python step per op (the loop was ~2% of the
    ``mz-q235-tp2pp32ep8`` row's CPU, 1.5M ops)."""
    names = list(map(_STREAM, ops))
    number = {name: k for k, name in enumerate(dict.fromkeys(names))}  # (equal names one stream, as the dict did)
    codes = np.fromiter(map(number.__getitem__, names), dtype=np.int64, count=len(names))
    order = np.argsort(codes, kind="stable")
    bounds = np.cumsum(np.bincount(codes, minlength=len(number)))
    return [_as_int64(order[lo:hi]) for lo, hi in zip([0, *bounds[:-1].tolist()], bounds.tolist())]


def _as_int64(values: np.ndarray) -> array:
    out = array("q")
    out.frombytes(values.astype(np.int64, copy=False).tobytes())
    return out


SPAN_COLUMNS = ("rank", "stream", "name", "category", "start_s", "end_s", "layer",
                "micro_batch", "stage", "bytes", "op", "phase")
OP_COLUMNS = ("stream", "name", "category", "layer", "micro_batch", "stage", "phase")  # the op's own fields
