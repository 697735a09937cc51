"""Two compute ops of a stream run back to back as one event, where no one can tell (issue 28).

When a compute op A starts at ``t0`` and the stream's next op B is compute, could start the
moment A ends (its other deps done, the host has issued it) and no one waits for A yet, the
stream computes ``t1 = t0 + dA`` and ``t2 = t1 + dB`` exactly as the two events would (the same
floats, the straggler factor taken at ``t1``) and queues one event, B's end at ``t2``
(:meth:`sim.engine.core.Stream._merge`); A's end and B's start are written when it fires.

The order of events is SimPy's ``(time, priority, eid)``, eids handed out as events are
queued. B's end would have been queued when A's event ran, at its key ``(t1, NORMAL, eA)``
(call that moment ``s1``); the merged event takes A's eid ``eA``, handed out at ``t0``. Every
other event keeps its relative order (eids are compared, never read), so the runs can differ
only where someone looks at A's end, or where another event at the same time ``t2`` is queued
after ``t0`` but before ``s1`` (the unmerged run pops it first, the merged event would pop
first). So:

- a stream that finds A's end not yet written asks :meth:`Chains.first_ended`: after ``s1``
  (a later time, or ``t1`` and a later eid than the event running now) it is written and
  read, as it would have been; before, the merge is split (:meth:`Chains.split`): A's own
  event goes back on the queue at ``(t1, NORMAL, eA)``, exactly what the unmerged run holds
  at that moment, and wakes the asker;
- an event queued at a time ``t2`` of a pending merge before that merge's ``s1`` splits it
  (:meth:`Chains.clash`; every place that queues a timed event asks);
- a merge is not made where its ``t2`` is another pending merge's with a later ``t1`` (the
  two would pop in the other order), nor where its ``t1`` is a pending merge's ``t2`` (A's
  event, put back by a split, would pop on the wrong side of it); the ops then run as before;
- an event queued at the current time never splits a merge (``t2 > t1`` is required), so
  triggers need no check.

``Engine.events`` adds the merges that fired (each saved one eid), so it counts the same.
``tests/test_chains.py`` runs random programs with many equal times with and without merging
and as SimPy processes and demands the same spans, ``held_by``, ``arrived`` and event count;
it builds the splits by hand. Run ``python -m pytest -q tests/test_chains.py``.
"""

from heapq import heapify
from .clock import NORMAL


class Chains:
    """The merges pending on one engine's queue: ``pending`` maps the time a merged event fires
    to the stream whose event it is (others at that time linked by ``Stream.merge_next``); a
    stream with a merge pending sits in the queue once, at ``(t2, NORMAL, eid)``, with its
    first op's end ``first_end`` and that eid ``merge_eid`` (:meth:`sim.engine.core.Stream._merge`)."""

    __slots__ = ("env", "pending", "current", "fired", "splits")

    def __init__(self, env):
        self.env = env
        self.pending: dict = {}  # t2 -> a stream whose merge fires then
        self.current = -1  # eid of the event whose callbacks run now (the loop sets it; -1: none yet)
        self.fired = 0  # merges that fired (each saved one eid: Engine.events adds them; set after a run)
        self.splits = 0  # merges split by a clash

    @staticmethod
    def queued_before(stream, first_end: float) -> bool:
        """Whether every merge pending in the list from ``stream`` would have queued its event
        before one whose first op ends at ``first_end`` (and was handed an eid after theirs)."""
        while stream is not None:
            if stream.first_end > first_end:
                return False
            stream = stream.merge_next
        return True

    def clash(self, time: float) -> None:
        """An event is being queued at ``time``, when merges fire: split each whose first op's end
        is still ahead of this moment (see the module's doc)."""
        stream = self.pending[time]
        while stream is not None:
            after = stream.merge_next
            if not self._passed(stream):
                self.split(stream)
            stream = after

    def first_ended(self, stream, index: int) -> bool:
        """Whether op ``index``, the first of ``stream``'s pending merge, has ended by now, as a
        stream that depends on it asks: if so its end is written now (as its event would have),
        else the merge is split so that its event wakes the asker (see the module's doc)."""
        if self._passed(stream):
            stream.finish[index] = stream.first_end
            return True
        self.split(stream)
        return False

    def _passed(self, stream) -> bool:
        """Whether this moment comes after the event of ``stream``'s first merged op would have
        run: a later time, or its time and a later eid than the event running now."""
        now = self.env._now
        return now > stream.first_end or (now == stream.first_end and self.current > stream.merge_eid)

    def split(self, stream) -> None:
        """Undo ``stream``'s pending merge: its first op's end goes back on the queue at
        ``(first_end, NORMAL, eid)``, where the unmerged run holds it now. (Rare: the stream's
        one entry is found by a scan of the queue.)"""
        self.unlink(stream, stream.merge_end)
        queue = self.env._queue
        at = next(k for k, entry in enumerate(queue) if entry[3] is stream)
        queue[at] = (stream.first_end, NORMAL, stream.merge_eid, stream)  # (an earlier time: the heap is redone)
        heapify(queue)
        stream.callbacks = stream.on_end
        del stream.firsts[stream.indices[stream.pos]]
        self.splits += 1

    def unlink(self, stream, time: float) -> None:
        """``stream``'s merge, pending at ``time``, is pending no more."""
        head = self.pending[time]
        if head is stream:
            if stream.merge_next is None:
                del self.pending[time]
            else:
                self.pending[time] = stream.merge_next
        else:
            while head.merge_next is not stream:
                head = head.merge_next
            head.merge_next = stream.merge_next
        stream.merge_next = None
