"""SMs that communication kernels hold while they run, and the compute beside them.

:class:`SmLedger` is one GPU's: the engine (:mod:`.core`) gives one to each rank whose program
:attr:`~.ops.RankProgram.holds_sms`, runs that rank's compute ops through it, and tells it when
a collective holding SMs (``Collective.sms``) starts and ends on the rank.
Run ``python -m pytest -q tests/test_sm_share.py``.
"""

from functools import partial
from heapq import heappush
from typing import Callable

import simpy

from .clock import NORMAL, Wake


class SmLedger:
    """The SMs of one GPU that communication kernels hold while they run, and the compute
    kernels that run beside them on the rest.

    A kernel that moves data with SMs (DeepEP's normal dispatch and combine: ``Collective.sms``)
    holds its share of the GPU's SMs from the moment its stream reaches it until it ends, and
    a compute kernel running meanwhile on another stream of the same GPU gets only the other
    SMs: it progresses at ``1 - held`` of its rate (DeepEP's maintainers: with two streams,
    "computation and communication kernels share all the SMs (e.g. internode kernels using
    20 SMs, and GEMM on the computation uses 132 - 20 = 112 SMs)", deepseek-ai/DeepEP issue
    61); the share charged is what the compute measurably loses, which can exceed the SMs' own
    share (DeepEP's: sim/parallel/ep.py ``DEEPEP_COMPUTE_COST``). So a compute op of ``w``
    seconds overlapped for ``t`` seconds by a kernel holding a share ``s`` ends ``s * t`` later (closed form: tests/test_sm_share.py). Each running
    compute op keeps its planned end and wake; when the held share changes, the work left is
    rescaled to the new rate and a new wake replaces the old one (which then fires with no
    callback). Only ranks whose program :attr:`~.ops.RankProgram.holds_sms` get a ledger: every
    other rank's compute ops keep the one fixed wake of :meth:`.core.Stream._advance`."""

    __slots__ = ("env", "held", "running")

    def __init__(self, env: simpy.Environment):
        self.env, self.held = env, 0.0
        self.running: dict = {}  # stream -> (its compute op's wake, planned end, what to call at the end)

    def start(self, stream, work: float, on_end: Callable) -> None:
        """Run ``work`` seconds (at the full rate) of compute on ``stream`` from now; call
        ``on_end(event)`` when it ends."""
        self._plan(stream, work / (1.0 - self.held), on_end)

    def _plan(self, stream, delay: float, on_end: Callable) -> None:
        env = self.env
        due = env._now + delay
        wake = Wake([partial(self._finish, stream, on_end)])  # (partial: no Python frame of its own)
        heappush(env._queue, (due, NORMAL, next(env._eid), wake))
        self.running[stream] = (wake, due, on_end)

    def _finish(self, stream, on_end: Callable, event) -> None:
        del self.running[stream]
        on_end(event)

    def hold(self, share: float) -> None:
        """Communication kernels take (``share`` > 0) or give back SMs now: every running
        compute op's remaining work goes on at the new rate."""
        old = 1.0 - self.held
        self.held += share
        if self.held < 1e-12:  # (float sums of +s and -s: back to exactly none held)
            self.held = 0.0
        new, now = 1.0 - self.held, self.env._now
        for stream, (wake, due, on_end) in list(self.running.items()):
            if due > now:
                wake.callbacks.clear()  # (it fires later, calling nothing)
                self._plan(stream, (due - now) * old / new, on_end)
