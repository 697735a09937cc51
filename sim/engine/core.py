"""The SimPy engine: runs per-rank programs of ops on compute and communication streams.

Each rank has streams like CUDA streams: ops on one stream run in program order, an op
also waits for its ``deps`` (ops of the same rank on any stream) and for its rank's host to
have issued it (:meth:`RankProgram.release`: the host issues the program in order, each op
costing ``Op.issue`` seconds, :mod:`sim.model.host`), compute ops take their
duration (longer while a collective's kernels hold some of the GPU's SMs: :mod:`.sms`), and a collective starts once every *simulated* member of its group has reached
it (a :class:`Meeting`), then runs its schedule's phases on the
:class:`~sim.engine.network.Network`. Overlap of compute and communication is never computed by
a formula: it emerges from the streams and dependencies.

A stream is a :class:`Stream` object driven by callbacks on exactly the SimPy events a
generator process would wait for, so it costs no generator switch per event. The engine
writes when each op ran into per-rank :class:`OpTimes`; :func:`sim.outputs.result.spans_frame`
joins them with the ops into the spans table. ``python bench/collectives.py`` measures
its events per second against a bare SimPy loop.

Folding: a workload may simulate only one rank per class of identical ranks; members of
a group that are not simulated are taken to arrive with the simulated ones (or, with
``folded_arrival``, when that hook says: sampled jitter, :mod:`sim.parallel.jitter`),
and a collective may carry ``siblings`` (the identical groups of the folded ranks) so
their traffic still loads the network (merged phase by phase: :mod:`sim.engine.traffic`).
"""

from array import array
from contextlib import contextmanager
from functools import partial
import gc
from heapq import heappush
from typing import Callable

import numpy as np
import simpy

from ..collectives.kinds import SEND_RECV
from ..collectives.schedule import Schedule
from .clock import NORMAL, Wake, pending, run_until_empty, trigger, wake_after
from .network import Network
from .ops import Collective, Op, RankProgram, stream_indices
from .sms import SmLedger
from .traffic import merged_schedule
from .waits import WaitLog
from ..hardware.topology import Topology


class Stream:
    """One stream of one rank, like a CUDA stream: its ops run in program order, each
    once its ``deps`` have finished.

    A stream is driven by callbacks on SimPy events rather than being a SimPy process:
    it hangs :meth:`_advance` on the event it waits for (a dependency's completion) and
    :meth:`_ended` on the event that ends its op (a compute timeout, a collective's done
    event). These are exactly the events a generator process would yield, in the same
    order, so results are the same (tests/test_engine.py checks it against processes);
    what is saved is a generator switch per event.
    """

    __slots__ = ("env", "rank", "ops", "indices", "count", "starts", "finish", "sent", "waiters", "pos",
                 "meeting", "arrive", "scale_of", "advance", "_end", "release", "held", "anchor", "offset",
                 "queue", "eid", "ledger", "callbacks", "on_end", "on_release")
    # A stream is itself the event of its op's end and of its host's release (what the event loop and
    # SimPy's step read of an event: ``callbacks``, ``_ok``), so those wake-ups allocate no event: a
    # stream has at most one such wake-up in the queue (it runs one op at a time, and waits for the
    # host only with nothing running).
    _ok = True
    _value = None

    def __init__(self, engine: "Engine", prog: RankProgram, indices: array, released: array,
                 ledger: "SmLedger | None" = None):
        self.ledger = ledger  # the rank's SMs held by communication kernels (None: its kernels hold none)
        self.env, self.rank, self.arrive, self.scale_of = engine.env, prog.rank, engine.arrive, engine.compute_scale
        self.queue, self.eid = engine.env._queue, engine.env._eid  # (what wake_after pushes on, inlined)
        self.indices, self.count = indices, len(indices)
        self.ops = list(map(prog.ops.__getitem__, indices))  # this stream's ops, in order
        at = np.asarray(indices)  # (the gathers below in numpy: the same values, no float object per op)
        self.release = _gathered(released, at)  # when the host has issued each
        self.held = -1  # the position whose op already waited for its release
        anchored = prog.anchors()  # (the host's waits on sync ops: None without any)
        self.anchor = None if anchored is None else _gathered(anchored[0], at)
        self.offset = None if anchored is None else _gathered(anchored[1], at)
        times = engine.times[prog.rank]  # shared by the rank's streams
        self.starts, self.finish, self.sent = times.start, times.end, times.sent
        self.waiters = engine._waiters[prog.rank]
        self.pos, self.meeting = 0, None
        self.advance, self._end = self._advance, self._ended  # bound once: they are hung on many events
        self.callbacks = None  # (as an event: what its pending wake-up calls; the loop empties it)
        self.on_end, self.on_release = [self._end], [self.advance]  # (never changed: the loop only reads them)

    def _resume_after(self, i: int) -> None:
        """Advance again when op ``i`` of this rank ends (one event per op, shared by waiters)."""
        ev = self.waiters.get(i)
        if ev is None:
            ev = self.waiters[i] = pending()
        ev.callbacks.append(self.advance)

    def _advance(self, _event=None) -> None:
        """Start the next op whose deps have finished; else wait for the first unfinished one."""
        pos = self.pos
        if pos == self.count:
            return
        op = self.ops[pos]
        finish = self.finish
        for d in op.deps:
            if finish[d] < 0.0:  # (NOT_YET: it has not ended)
                self._resume_after(d)
                return
        now = self.env._now  # (SimPy's Environment.now, without the property call)
        release = self.release[pos]
        anchor = self.anchor
        if anchor is not None and anchor[pos] >= 0:  # issued after the host's last wait
            a = anchor[pos]
            if finish[a] < 0.0:  # the host still waits for that sync op to end
                self._resume_after(a)
                return
            release = finish[a] + self.offset[pos]
        if release > now and self.held != pos:  # the host has not issued it yet
            self.held = pos
            self.callbacks = self.on_release  # (wake_after(release - now, self.advance), with itself as the event)
            heappush(self.queue, (now + (release - now), NORMAL, next(self.eid), self))
            return
        i = self.indices[pos]
        self.starts[i] = now
        comm = op.comm
        if comm is None:  # (wake_after inlined: the one event of most ops)
            scale_of = self.scale_of
            delay = op.duration * scale_of(self.rank, now) if scale_of else op.duration
            if self.ledger is None:
                self.callbacks = self.on_end
                heappush(self.queue, (now + delay, NORMAL, next(self.eid), self))
            else:
                self.ledger.start(self, delay, self._end)
        else:
            if comm.sms and self.ledger is not None:
                self.ledger.hold(comm.sms)
            self.meeting = self.arrive(comm, self.rank, i, self)

    def _ended(self, _event) -> None:
        """The current op has ended: note when and what it sent, wake whoever waits on it, go on."""
        pos = self.pos
        i = self.indices[pos]
        comm = self.ops[pos].comm
        if comm is not None:
            meeting = self.meeting
            if comm.sms and self.ledger is not None:
                self.ledger.hold(-comm.sms)
            if comm.op is SEND_RECV:
                self.starts[i] = meeting.start  # a posted recv waiting for its send is idle, not traffic
            self.sent[i] = meeting.sent.get(self.rank, 0.0)
        now = self.env._now
        self.finish[i] = now
        waiters = self.waiters
        if waiters:
            waiter = waiters.pop(i, None)
            if waiter is not None:  # (clock.trigger inlined)
                heappush(self.queue, (now, NORMAL, next(self.eid), waiter))
        self.pos = pos + 1
        self.advance()


def _gathered(values: array, at: np.ndarray) -> array:
    """``values[at]`` as an array of ``values``' type (the same items: numpy gathers them)."""
    out = array(values.typecode)
    out.frombytes(np.asarray(values)[at].tobytes())
    return out


NOT_YET = -1.0  # OpTimes.start and .end of an op that has not started, ended (times are >= 0)


class OpTimes:
    """When each op of one rank ran: start and end in seconds (:data:`NOT_YET` until it
    starts, ends), and the bytes the rank itself sent in it (0 for compute). Arrays of
    float64, 24 bytes per op where lists of float objects took ~72 (``python bench/step.py
    --only 405b-1k``: 5.1M ops' times)."""

    __slots__ = ("start", "end", "sent")

    def __init__(self, n: int):
        self.start, self.end = array("d", [NOT_YET]) * n, array("d", [NOT_YET]) * n
        self.sent = array("d", bytes(8 * n))


class Meeting:
    """One collective instance: its members as they arrive, and when it began. (A slotted
    class with its own ``__init__``: one is made per collective call.)"""

    __slots__ = ("done", "sent", "expected", "members", "start")

    def __init__(self, done: "Wake | Stream", sent: dict, expected: int):
        self.done = done  # triggered when the collective's last phase ends (sim.engine.clock.trigger)
        self.sent = sent  # bytes each member sends
        self.expected = expected  # members that will arrive (the simulated ones)
        self.members = []  # (rank, op index, arrival time), in arrival order
        self.start = 0.0  # when the last simulated member arrived and the traffic began


class Engine:
    """Executes rank programs: ``run()`` fills ``times`` (when each op of each rank ran)."""

    def __init__(self, topo: Topology, programs: list[RankProgram],
                 compute_scale: Callable[[int, float], float] | None = None,
                 folded_arrival: Callable[[Collective, list, Callable], float | None] | None = None):
        self.env = simpy.Environment()
        self.topo = topo
        self.net = Network(self.env, topo)
        self.programs = programs
        self.compute_scale = compute_scale
        self.folded_arrival = folded_arrival  # when a group's folded members arrive, if not with the simulated
        self.simulated = {p.rank for p in programs}
        self.times = {p.rank: OpTimes(len(p.ops)) for p in programs}  # rank -> when each op ran
        self._programs = {p.rank: p for p in programs}
        self._rendezvous: dict[tuple, Meeting] = {}  # collective key -> its meeting, until complete
        # every collective member that waited -> the member that arrived last, and -> when it
        # arrived, filled as meetings end (in the order their done events fire), rather than
        # kept as every meeting's member list and rebuilt per read: 0.17 GB less peak RSS at
        # ``python bench/step.py --only 405b-1k`` (see _end_meeting); as arrays, not two dicts
        # of tuples: ~310 bytes less per wait (sim/engine/waits.py)
        self.waits = WaitLog()  # (arrays: sim/engine/waits.py)
        self.held_by, self.arrived = self.waits.held_by, self.waits.arrived
        self._expected: dict[tuple, int] = {}
        self._waiters: dict[int, dict[int, Wake]] = {p.rank: {} for p in programs}  # rank -> op -> event
        self._member_bytes: dict[tuple, dict[int, float]] = {}
        self._schedules: dict[tuple, Schedule] = {}
        self._shapes: dict[tuple, tuple] = {}  # a call's fields but its key -> _shape_of's answer
        self.collectives_run = 0

    def run(self) -> None:
        """Simulate until every program has finished (``times`` then says when each op ran;
        :func:`sim.outputs.result.spans_frame` makes the spans table)."""
        streams = []
        for prog in self.programs:
            released = prog.release(keep=False)  # (kept by the streams alone: 8 bytes per op less after the run)
            ledger = SmLedger(self.env) if prog.holds_sms else None
            streams += [Stream(self, prog, indices, released, ledger) for indices in stream_indices(prog.ops)]
        with cycle_collector_paused():
            for stream in streams:  # in creation order, as SimPy would initialize processes
                stream.advance()
            run_until_empty(self.env)
        unfinished = any(s.pos < s.count for s in streams)
        for stream in streams:  # (their bound methods made each a cycle: now reference counting frees them)
            stream.advance = stream._end = stream.on_end = stream.on_release = stream.callbacks = None
            stream.meeting = None  # (a meeting of one member has the stream as its done event)
        if unfinished:
            self._report_deadlock()

    @property
    def events(self) -> int:
        """SimPy events scheduled so far (the engine's unit of work)."""
        return int(repr(self.env._eid)[6:-1])  # SimPy numbers events with itertools.count

    def _report_deadlock(self) -> None:
        stuck = [(p.rank, i, op.name) for p in self.programs
                 for i, op in enumerate(p.ops) if self.times[p.rank].end[i] < 0.0]
        rank, i, name = stuck[0]
        raise RuntimeError(f"deadlock: {len(stuck)} ops never ran; first: rank {rank} op {i} {name}")

    def arrive(self, call: Collective, rank: int, index: int, stream: Stream | None = None) -> Meeting:
        """Register one member's arrival; the last simulated member starts the collective.
        (A call with one simulated member, the usual one under folding, meets no one: it
        never enters the rendezvous, which saves hashing its key. What a call's shape gives,
        its members' bytes, how many are simulated and its schedule's phases, is looked up
        once per shape: :meth:`_shape_of`.) ``stream``: the member's, whose op then ends with
        the meeting (its ``_ended`` hung on ``done``; with one member, ``done`` is the stream
        itself); without it the caller waits on ``done``."""
        now = self.env._now
        sent, expected, phases = self._shape_of(call)
        if expected > 1:
            meeting = self._rendezvous.get(call.key)
            if meeting is None:
                meeting = self._rendezvous[call.key] = Meeting(pending(), sent, expected)
            if stream is not None:
                meeting.done.callbacks.append(stream._end)
        elif stream is not None:  # (the stream is the event of its op's end: Stream)
            stream.callbacks = stream.on_end
            meeting = Meeting(stream, sent, expected)
        else:
            meeting = Meeting(pending(), sent, expected)
        members = meeting.members
        members.append((rank, index, now))
        if len(members) == expected:
            if expected > 1:
                del self._rendezvous[call.key]
            late = self.folded_arrival(call, members, self.ready) if self.folded_arrival is not None else None
            if late is not None and late > now:  # folded members still on their way
                wake_after(self.env, late - now, lambda _ev: self._begin(call, meeting))
            else:  # (_begin inlined)
                meeting.start = now
                self.collectives_run += 1
                self._run_phases(phases, 0, meeting)
        return meeting

    def _shape_of(self, call: Collective) -> tuple:
        """(bytes each member sends, simulated members, the schedule's phases) of ``call``:
        everything but its key, cached by the fields that decide them."""
        shape = (call.op, call.algo, call.group, call.siblings, call.nbytes, call.shares)
        found = self._shapes.get(shape)
        if found is None:
            found = self._shapes[shape] = (self.member_bytes(call), self._expected_members(call.group),
                                           self.schedule_of(call).phases)
        return found

    def ready(self, rank: int, index: int) -> float:
        """When op ``index`` of ``rank`` had its dependencies done (0 without any): when it
        could have started had its stream been free."""
        deps = self._programs[rank].ops[index].deps
        end = self.times[rank].end
        return max((end[d] for d in deps), default=0.0)

    def _begin(self, call: Collective, meeting: Meeting) -> None:
        meeting.start = self.env._now
        self.collectives_run += 1
        self._run_phases(self.schedule_of(call).phases, 0, meeting)

    def _expected_members(self, group: tuple[int, ...]) -> int:
        n = self._expected.get(group)
        if n is None:
            n = self._expected[group] = sum(1 for r in group if r in self.simulated)
        return n

    def _run_phases(self, phases: tuple, i: int, meeting: Meeting) -> None:
        """Run phase i, then the next, then end the meeting (callbacks, no process)."""
        if i == len(phases):
            self._end_meeting(meeting.members)
            trigger(self.env, meeting.done)
        else:
            self.net.start(phases[i], partial(self._run_phases, phases, i + 1, meeting))

    def _end_meeting(self, members: list) -> None:
        """Record who waited in a meeting that ended (``held_by``, ``arrived``): every member
        but the last to arrive, which they waited for."""
        if len(members) > 1:
            record = self.waits.record
            last_r, last_i, _t = members[-1]
            for r, i, t in members[:-1]:
                record(r, i, last_r, last_i, t)

    def member_bytes(self, call: Collective) -> dict[int, float]:
        """Bytes each member itself sends in ``call`` (from the algorithm's schedule; cached)."""
        key = (call.op, call.algo, call.group, call.nbytes, call.shares)
        sent = self._member_bytes.get(key)
        if sent is None:
            sched = self.schedule_of(Collective(call.key, call.op, call.group, call.nbytes, call.algo,
                                                shares=call.shares))
            total = np.zeros(max(call.group) + 1)
            for ph in sched.phases:  # every hop a member starts carries its chain's bytes
                own = ph.src >= 0  # (hops leaving a switch, in-switch reduction, are nobody's)
                total += np.bincount(ph.src[own], weights=ph.nbytes[ph.chain[own]],
                                     minlength=len(total))[:len(total)]
            sent = self._member_bytes[key] = {r: float(total[r]) for r in call.group}
        return sent

    def schedule_of(self, call: Collective) -> Schedule:
        """The schedule of a call, its siblings' traffic merged phase by phase (cached)."""
        key = (call.op, call.algo, call.group, call.siblings, call.nbytes, call.shares)
        found = self._schedules.get(key)
        if found is None:
            found = self._schedules[key] = merged_schedule(
                call.op, call.algo, call.group, call.siblings, call.nbytes, self.topo, call.shares)
        return found


@contextmanager
def cycle_collector_paused():
    """Pause Python's cyclic garbage collector while a simulation runs.

    A run allocates millions of short-lived objects (events, meetings, closures) that
    reference counting frees at once; the collector would still re-traverse every op of
    every program on each full pass and find almost nothing: 1,109 objects in cycles after
    the 206k-event run of ``python bench/collectives.py`` (where the passes took a quarter
    of the run), 460 after the 1.6M events of scenarios/gpt3-175b-ptd.toml. Those few are
    collected by the next full pass once the run is over: what it left alive is moved to the
    oldest generation (``gc.freeze``, ``gc.unfreeze``), or the first young pass after the
    pause would traverse every object the run allocated to find them (about 5% of a GPT
    530B run of ``python bench/step.py``).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:  # what the run left alive goes to the oldest generation (see above)
            gc.freeze()
            gc.unfreeze()
            gc.enable()
