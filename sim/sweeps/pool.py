"""Where sweep points run: worker processes of the sweep's own, or a dask.distributed cluster.

Run by :func:`sim.sweeps.grid.sweep` (``clustersim sweep ... --workers N
[--point-timeout S]``). Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop
one running task, so a point that hangs holds its worker and the sweep forever; its
shutdown waits for the queued work before discarding it (Ctrl-C took 14-16 s); and its
workers outlive a SIGKILLed parent, idle. Here each worker has a pipe of its own and takes
one point at a time, so the sweep can

- kill the one worker whose point ran past ``point_timeout`` (the point becomes an error
  row ``point-timeout: ...``) and start a fresh worker in its place;
- notice a worker that died (out of memory, killed): its point becomes ``worker died: ...``;
- stop every worker at once on Ctrl-C or any exit (``close``), keeping the finished rows;
- make workers die with it: on Linux the kernel SIGKILLs them when the sweep's process
  dies (``prctl(PR_SET_PDEATHSIG)``, as torch.distributed's elastic agent and Ray's
  workers do), and a thread in each worker polls the parent's pid as a backstop.
"""

from collections import deque
import ctypes
import multiprocessing
from multiprocessing.connection import wait
import os
import signal
import sys
import threading
import time

from .. import step
from ..errors import InputError

TIMEOUT_PREFIX = "point-timeout:"
DIED_PREFIX = "worker died:"
RETRIED_ERRORS = (TIMEOUT_PREFIX, DIED_PREFIX)  # errors of the run, not of the point: recomputed on resume
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_S = 1.0  # the backstop's period
# --workers: at most OVERSUBSCRIBE x the CPUs (a point is CPU-bound, one core each: more workers
# only share the cores and add memory) and no more than the memory holds at WORKER_BYTES each (a
# forked interpreter with the package loaded, sim.work.BASE_BYTES, 124 MiB measured, plus a point).
OVERSUBSCRIBE = 4
WORKER_BYTES = 256 * 2**20


def max_workers() -> int:
    """The most worker processes :func:`check_workers` accepts on this machine."""
    cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf: the CPU bound alone
        memory = None
    return max(1, min(OVERSUBSCRIBE * cpus, memory // WORKER_BYTES if memory else OVERSUBSCRIBE * cpus))


def check_workers(workers, key: str = "--workers") -> None:
    """InputError unless ``workers`` is None (the default) or 1 .. :func:`max_workers`."""
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(key, f"expected a positive integer, got {workers!r}")
    if workers > max_workers():
        raise InputError(key, f"{workers:,} worker processes asked, at most {max_workers():,} here: "
                              f"{OVERSUBSCRIBE}x the {os.cpu_count() or 1} CPUs (a point is CPU-bound; more only "
                              f"share the cores), each a forked interpreter of ~{WORKER_BYTES / 2**20:.0f} MiB")


# ---------------------------------------------------------------- one point
def run_point(scenario) -> tuple[dict | None, str | None]:
    """Simulate one validated scenario: (flattened summary, None) or (None, error text).
    Runs in worker processes; never raises for a failed simulation."""
    try:
        return flatten(step.simulate(scenario).summary), None
    except InputError as exc:
        return None, one_line(str(exc))
    except Exception as exc:  # a failed point is a row, not the end of the sweep
        return None, one_line(f"internal error: {type(exc).__name__}: {exc}")


def flatten(summary: dict) -> dict:
    """Nested dicts become dotted columns: comm_bytes_per_gpu.dp, ..."""
    out = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- a worker
def _die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` does (see the module docstring)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _worker(conn, parent_pid: int, point_fn=None) -> None:
    """A worker's life: take a (key, scenario), send back (key, run_point(scenario)) (or
    ``point_fn``'s result), until the pipe closes or says None."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the sweep handles it
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        key, scenario = task
        conn.send((key, (point_fn or run_point)(scenario)))


class _Worker:
    def __init__(self, point_fn=None):
        # Fork while this process has a single thread (fast, and scripts without a __main__
        # guard work); with other threads alive (a progress bar, an in-process dask cluster)
        # forking is unsafe, so spawn.
        method = "fork" if threading.active_count() == 1 and os.name == "posix" else "spawn"
        ctx = multiprocessing.get_context(method)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, os.getpid(), point_fn), daemon=True)
        self.proc.start()
        child.close()
        self.key, self.started = None, 0.0

    def give(self, key, scenario) -> None:
        self.key, self.started = key, time.monotonic()
        self.conn.send((key, scenario))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


# ---------------------------------------------------------------- the pool
class LocalPool:
    """``with LocalPool(4, point_timeout=60) as pool: for key, result in pool.run(tasks)``:
    ``tasks`` are (key, scenario) pairs; results come as points finish. Leaving the block,
    normally or not (Ctrl-C), kills every worker at once. ``point_fn`` (a module-level
    function scenario -> (row, error), like :func:`run_point`) replaces run_point."""

    def __init__(self, workers: int, point_timeout: float | None = None, point_fn=None):
        self.size, self.timeout, self.point_fn = workers, point_timeout, point_fn
        self.idle: list[_Worker] = []
        self.busy: dict = {}  # conn -> _Worker
        self.pending: deque = deque()  # (key, scenario) not yet given to a worker

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self, n: int) -> None:
        """Start ``n`` workers now (before a progress bar's thread makes forking unsafe)."""
        self.idle += [_Worker(self.point_fn) for _ in range(min(n, self.size))]

    def run(self, tasks):
        self.pending = deque(tasks)
        self._fill()
        while self.busy:
            yield from self._collect()

    def _fill(self) -> None:
        while self.pending and len(self.busy) < self.size:
            worker = self._idle_worker()
            worker.give(*self.pending.popleft())
            self.busy[worker.conn] = worker

    def _collect(self) -> list:
        """Wait for a result, a dead worker or a deadline; hand the freed workers their next
        points before returning what finished (so no worker waits while the caller writes)."""
        sentinels = {w.proc.sentinel: w for w in self.busy.values()}
        ready = set(wait([*self.busy, *sentinels], timeout=self._wait_s()))
        finished = []
        for worker in list(self.busy.values()):
            outcome = None
            if worker.conn in ready:
                try:
                    outcome = worker.conn.recv()[1]
                except (EOFError, OSError):
                    pass
            if outcome is not None:
                self.busy.pop(worker.conn)
                self.idle.append(worker)
            elif worker.proc.sentinel in ready or not worker.proc.is_alive():
                self._drop(worker)  # reaped: its exit code is known
                outcome = (None, f"{DIED_PREFIX} the worker running this point exited "
                                 f"({_exit_text(worker.proc.exitcode)}; out of memory?)")
            elif self.timeout is not None and time.monotonic() - worker.started > self.timeout:
                outcome = (None, f"{TIMEOUT_PREFIX} still running after {self.timeout:g} s; stopped "
                                 "(raise --point-timeout to give it longer)")
                self._drop(worker)
            if outcome is not None:
                finished.append((worker.key, outcome))
        self._fill()
        return finished

    def _idle_worker(self) -> _Worker:
        while self.idle:
            worker = self.idle.pop()
            if worker.proc.is_alive():
                return worker
            worker.kill()  # it sent its last result and died: reap it
        return _Worker(self.point_fn)

    def _wait_s(self) -> float | None:
        if self.timeout is None:
            return None
        oldest = min(w.started for w in self.busy.values())
        return max(0.0, oldest + self.timeout - time.monotonic()) + 0.01

    def _drop(self, worker: _Worker) -> None:
        self.busy.pop(worker.conn)
        worker.kill()

    def close(self) -> None:
        """Kill every worker now; nothing queued is waited for."""
        for worker in [*self.idle, *self.busy.values()]:
            worker.kill()
        self.idle, self.busy = [], {}


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {-code}, {signal.Signals(-code).name}"
    return f"exit status {code}"


def run_in_process(tasks, point_fn=None):
    """The points one after another in this process (``workers=1`` without a time limit)."""
    for key, scenario in tasks:
        yield key, (point_fn or run_point)(scenario)


# ---------------------------------------------------------------- dask
def run_dask(tasks, dask, point_fn=None):
    """Yield (key, result) as points finish on a dask.distributed cluster: ``dask`` is a
    scheduler address, a Client, or a cluster object (e.g. LocalCluster). Points not yet
    finished are cancelled when the caller stops early (Ctrl-C)."""
    from distributed import Client, as_completed as dask_completed

    own = not hasattr(dask, "submit")
    try:
        client = Client(dask, set_as_default=False) if own else dask
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise InputError("--dask", f"cannot connect to {dask!r}: {exc}") from None
    futures = {}
    try:
        futures = {client.submit(point_fn or run_point, s, pure=False): key for key, s in tasks}
        for future in dask_completed(list(futures), loop=client.loop):
            yield futures[future], future.result()
    finally:
        unfinished = [f for f in futures if not f.done()]
        if unfinished:
            client.cancel(unfinished)
        if own:
            client.close()
