"""``clustersim ARGS`` in a forked child of the test process, measured.

The child inherits the imported package (no interpreter start-up per case), runs
``sim.cli.main`` with its output captured, under an address-space limit, and the parent
reads the child's own CPU time and peak RSS from ``os.wait4`` (exact per child, unlike
``RUSAGE_CHILDREN``, which is the maximum over every child this process ever waited for).
A child still running at ``timeout`` is killed: that is a hang, and the result says so.
"""

from dataclasses import dataclass
import io
import json
import os
import resource
import signal
import sys
import tempfile
import time


@dataclass
class Outcome:
    code: int | None  # exit status; None: killed at the timeout (a hang)
    stdout: str
    stderr: str
    cpu_s: float  # user + system CPU of the child
    rss_mb: float  # peak resident memory of the child
    wall_s: float


def run_cli(args: list[str], timeout: float = 60.0, memory_bytes: int = 3 << 30,
            budget_s: float | None = None, budget_bytes: float | None = None,
            file_bytes: int | None = None) -> Outcome:
    """Run ``clustersim *args`` in a fork; ``budget_*`` replace sim.work's budget there;
    ``file_bytes`` caps the size of any file the child writes (RLIMIT_FSIZE, SIGXFSZ
    ignored: a write past it fails with EFBIG, as a full disk fails with ENOSPC)."""
    import sim.cli  # noqa: F401  (imported before the fork: the child starts warm)

    fd, path = tempfile.mkstemp(prefix="clustersim-fork-")  # a file, not a pipe: no size limit
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(args, fd, memory_bytes, budget_s, budget_bytes, file_bytes)
    os.close(fd)
    status, usage, killed = _wait(pid, timeout)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    out = json.loads(data) if data else {"stdout": "", "stderr": ""}
    code = None if killed else os.waitstatus_to_exitcode(status)
    return Outcome(code, out["stdout"], out["stderr"], usage.ru_utime + usage.ru_stime,
                   usage.ru_maxrss / 1024, time.perf_counter() - t0)


def _child(args, write: int, memory_bytes: int, budget_s, budget_bytes, file_bytes=None) -> None:
    code = 70
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if file_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        import sim.cli
        import sim.work

        if budget_s is not None:
            sim.work.BUDGET_S = budget_s
        if budget_bytes is not None:
            sim.work.BUDGET_BYTES = budget_bytes
        out, err = io.StringIO(), io.StringIO()
        sys.stdout, sys.stderr = out, err
        try:
            code = sim.cli.main(args)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        with os.fdopen(write, "wb") as f:
            f.write(json.dumps({"stdout": out.getvalue(), "stderr": err.getvalue()}).encode())
    except BaseException as exc:  # noqa: BLE001 -- report anything, exit with a code the tests reject
        try:
            os.write(write, json.dumps({"stdout": "", "stderr": f"child crashed: {exc!r}"}).encode())
        except OSError:
            pass
    finally:
        os._exit(code if isinstance(code, int) else 70)


def _wait(pid: int, timeout: float):
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, usage, True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def main() -> None:
    """``python tests/forked_cli.py < jobs.json``: a fresh interpreter that imports the
    package once, then runs each job ``{"name": ..., "args": [...]}`` in a fork of itself;
    prints one JSON object: the import's CPU seconds and every job's outcome. A fresh
    process as a user's is, minus the start-up each case would repeat."""
    jobs = json.load(sys.stdin)
    import sim.cli
    import sim.step  # noqa: F401  (what `run` imports on first use)

    sim.cli.build_parser()  # imports every subcommand's module

    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {"import_cpu_s": usage.ru_utime + usage.ru_stime, "outcomes": {}}
    for job in jobs:
        got = run_cli(job["args"], timeout=job.get("timeout", 120.0), file_bytes=job.get("file_bytes"))
        out["outcomes"][job["name"]] = vars(got)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
