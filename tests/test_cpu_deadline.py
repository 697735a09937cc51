"""The CPU deadline (sim/work.py ``cpu_deadline``): one nestable timer under the simulation's
watchdog and the planner point's CPU limit.

Run: ``python -m pytest tests/test_cpu_deadline.py``
"""

import os
import signal
import threading
import time

import pytest

from sim import work
from sim.errors import SimulationError
from sim.plan import explain

SLACK = 0.08  # s of CPU: the kernel checks CPU timers at its tick (1-10 ms), Python runs the handler after
TICK = 0.021  # s: getitimer(2) reads a CPU timer rounded up to the tick (twice: when saved and when read back)


class Outer(Exception):
    pass


class Inner(Exception):
    pass


def spin(seconds):
    """Spend ``seconds`` of CPU (then fail: a deadline should have stopped it first)."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    raise AssertionError(f"not stopped within {seconds} s of CPU")


def timer():
    return signal.getitimer(signal.ITIMER_PROF)


def test_an_inner_deadline_fires_and_the_outer_survives_it_unextended():
    """Outer 0.3 s, inner 0.15 s: the inner fires at 0.15 s, the outer at 0.3 s of the CPU counted
    from its own start (not 0.3 s after the inner was left, nor never)."""
    start = time.process_time()
    with pytest.raises(Outer):
        with work.cpu_deadline(0.3, Outer):
            with pytest.raises(Inner):
                with work.cpu_deadline(0.15, Inner):
                    spin(5)
            inner_at = time.process_time() - start
            spin(5)
    outer_at = time.process_time() - start
    assert 0.15 <= inner_at < 0.15 + SLACK
    assert 0.3 <= outer_at < 0.3 + SLACK
    assert timer() == (0.0, 0.0) and not work._DEADLINES


def test_an_outer_deadline_earlier_than_the_inner_fires_first():
    start = time.process_time()
    with pytest.raises(Outer):
        with work.cpu_deadline(0.1, Outer):
            with work.cpu_deadline(1.0, Inner):
                spin(5)
    assert 0.1 <= time.process_time() - start < 0.1 + SLACK
    assert timer() == (0.0, 0.0) and not work._DEADLINES


def test_leaving_an_inner_deadline_rearms_the_outer_with_the_cpu_spent_counted():
    with work.cpu_deadline(100.0, Outer):
        entered = time.process_time()
        with work.cpu_deadline(50.0, Inner):
            assert 49.9 < timer()[0] <= 50.0 + TICK  # the earlier one is armed
            busy = time.process_time()
            while time.process_time() - busy < 0.2:
                pass
        spent = time.process_time() - entered
        assert 100.0 - spent - SLACK < timer()[0] <= 100.0 - spent + TICK
    assert timer() == (0.0, 0.0)


def test_the_handler_and_timer_found_are_put_back():
    """A SIGPROF handler and an armed ITIMER_PROF (a profiler's) come back after the deadline:
    the timer less the CPU spent in the block, its interval unchanged."""
    fired = []
    previous = signal.signal(signal.SIGPROF, lambda *_: fired.append(1))
    signal.setitimer(signal.ITIMER_PROF, 100.0, 7.0)
    try:
        start = time.process_time()
        with pytest.raises(Inner):
            with work.cpu_deadline(0.05, Inner):
                spin(5)
        spent = time.process_time() - start
        value, interval = timer()
        assert 100.0 - spent - SLACK < value <= 100.0 - spent + TICK and interval == 7.0
        assert signal.getsignal(signal.SIGPROF) is not work._on_timer and not fired
        signal.setitimer(signal.ITIMER_PROF, 0.01)
        busy = time.process_time()
        while not fired and time.process_time() - busy < 2:
            pass
        assert fired  # the caller's handler is the one installed again
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def test_a_callable_is_called_not_raised_and_the_body_goes_on():
    calls = []
    with work.cpu_deadline(0.0, lambda: calls.append(time.process_time())):
        busy = time.process_time()
        while not calls and time.process_time() - busy < 2:
            pass
        after = time.process_time()
    assert len(calls) == 1 and calls[0] - busy < SLACK and after >= calls[0]
    assert timer() == (0.0, 0.0)


def test_it_is_off_off_the_main_thread_and_without_seconds():
    """A Dask worker runs points in threads: no deadline there (signals reach the main thread only)."""
    seen = {}

    def body():
        with work.cpu_deadline(0.0, Inner):
            busy = time.process_time()
            while time.process_time() - busy < 0.2:
                pass
            seen["timer"], seen["handler"] = timer(), signal.getsignal(signal.SIGPROF)

    before = signal.getsignal(signal.SIGPROF)
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"timer": (0.0, 0.0), "handler": before}
    with work.cpu_deadline(None, Inner):
        assert timer() == (0.0, 0.0) and signal.getsignal(signal.SIGPROF) is before


def test_a_forked_child_inherits_no_deadline():
    """fork(2) does not carry the timer to the child: nor does it carry the deadlines."""
    read, write = os.pipe()
    with work.cpu_deadline(100.0, Outer):
        pid = os.fork()
        if pid == 0:
            os.write(write, f"{len(work._DEADLINES)} {timer()[0]}".encode())
            os._exit(0)
        os.waitpid(pid, 0)
    os.close(write)
    assert os.read(read, 100).decode() == "0 0.0"
    os.close(read)


def test_the_watchdog_and_the_point_limit_are_cpu_deadlines():
    """The watchdog's SimulationError past its CPU; the planner point's CpuLimit around it fires
    first when earlier (the point's 60 s wrap a simulation whose watchdog is 120 s or more)."""
    before = signal.getsignal(signal.SIGPROF)
    with pytest.raises(SimulationError, match="still simulating after 0 s of CPU"):
        with work.watchdog("x", 0.05):
            spin(5)
    start = time.process_time()
    with pytest.raises(explain.CpuLimit):
        with explain.cpu_limit(0.1):
            with work.watchdog("x", 1.0):
                spin(5)
    assert time.process_time() - start < 0.1 + SLACK
    assert timer() == (0.0, 0.0) and signal.getsignal(signal.SIGPROF) is before
