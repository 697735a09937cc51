"""The engine's clock: SimPy's event queue, driven without SimPy's per-event machinery.

A compute op, a phase's latency and a transfer's planned end each need a timed wake-up
that only calls callbacks; an op's end that other streams wait for and a collective's
end need an event triggered when they happen (:func:`pending`, :func:`trigger`: SimPy's
``env.event()`` and ``succeed()`` without their checks, in the same place of the order). :func:`wake_after` puts one on SimPy's own queue exactly as
``env.timeout(delay)`` would (the same ``(now + delay, NORMAL, next eid)`` key, so every
event fires in the same order and ``Engine.events`` counts the same), as a slotted
:class:`Wake` instead of a :class:`simpy.Timeout` (whose constructor checks, stores and
schedules through two more calls). :func:`run_until_empty` is ``env.run()`` without an
``until``: SimPy's ``Environment.step`` loop inlined (same pop, same callback order, the
same crash on a failed event nobody defused), a method call fewer per event. Both work
beside ordinary SimPy events and processes, and a Wake also fires under ``env.run()``.
A superseded wake-up (the network re-plans a transfer) is voided, its callbacks
:data:`VOID`, and :class:`Superseded` drops such entries from the queue in bulk
(:func:`compact`: the same order for every other event).
``python bench/collectives.py`` measures the engine's events per second.
"""

from heapq import heapify, heappop, heappush
import time

import simpy

NORMAL = 1  # SimPy's priority of timeouts and succeeded events (simpy.events.NORMAL)
VOID = ()  # the callbacks of a superseded wake-up: it calls nothing (and :func:`compact` drops it)


class Wake:
    """A timed event that only calls its callbacks (what SimPy's step reads of an event)."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self, callbacks: list):
        self.callbacks = callbacks


def wake_after(env: simpy.Environment, delay: float, callback) -> Wake:
    """Call ``callback(wake)`` ``delay`` seconds from now (``delay`` >= 0), in the place
    ``env.timeout(delay)`` made now would take in the event order."""
    wake = Wake([callback])
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), wake))
    return wake


def pending() -> Wake:
    """An event nobody has triggered yet (callbacks hang on it): SimPy's ``env.event()``
    for waiting only, without its checks and value; :func:`trigger` fires it."""
    return Wake([])


def trigger(env: simpy.Environment, wake: Wake) -> None:
    """Fire ``wake`` now, in the place ``event.succeed()`` would give it in the event order
    (the same ``(now, NORMAL, next eid)`` key; ``Engine.events`` counts the same)."""
    heappush(env._queue, (env._now, NORMAL, next(env._eid), wake))


def compact(queue: list) -> None:
    """Drop superseded wake-ups (callbacks :data:`VOID`) from SimPy's event queue, in place.
    The rest pop in the same order: the keys ``(time, priority, eid)`` are distinct (eids
    are), so every heap of them pops them in one order; ``Engine.events`` counts eids
    handed out, not popped, so it stays too. A joint re-solve of the network re-plans every
    transfer in flight and leaves each one's old wake-up in the queue until its time: in the
    GPT 530B row of ``clustersim validate`` half the events popped were such (docs/scaling.md)."""
    queue[:] = [entry for entry in queue if entry[3].callbacks is not VOID]
    heapify(queue)


COMPACT_MIN = 4096  # superseded wake-ups in the queue, at least, before :class:`Superseded` drops them


class Superseded:
    """Counts the wake-ups superseded in ``queue`` (their callbacks set to :data:`VOID`) and
    drops them (:func:`compact`) once there are more than :data:`COMPACT_MIN` and than half
    the queue: each entry is then looked at O(1) times per wake-up superseded."""

    __slots__ = ("queue", "count")

    def __init__(self, queue: list):
        self.queue, self.count = queue, 0

    def add(self, n: int) -> None:
        """``n`` more wake-ups superseded."""
        self.count += n
        if self.count > COMPACT_MIN and 2 * self.count > len(self.queue):
            compact(self.queue)
            self.count = 0


def run_until_empty(env: simpy.Environment) -> None:
    """``env.run()``: process events in order until none is left."""
    queue = env._queue
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):  # (as Environment.step: a failure crashes the run)
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


def bare_simpy_rate(n: int = 200_000) -> float:
    """Events per second of a bare SimPy timeout loop: the yardstick for the engine."""
    env = simpy.Environment()

    def loop():
        for _ in range(n):
            yield env.timeout(1e-6)

    env.process(loop())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)
