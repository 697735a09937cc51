"""Sweep integrity (issue 20): fingerprinted resume, one writer per output file, workers
that die with the sweep, Ctrl-C that stops at once keeping finished rows, and a time limit
per point. The process tests run the real CLI in a subprocess; a ``sitecustomize`` module
on its PYTHONPATH makes chosen points slow, hang or kill their worker (the CLI and its
workers, forked or spawned, import it at start-up), so they test the sweep's machinery
deterministically without loading the machine.

Run: ``python -m pytest tests/test_sweep_integrity.py``
"""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from conftest import REPO, cli_env
import sim
from sim.errors import InputError
from sim.sweeps.sinks import exclusive, lock_path

FSDP = REPO / "scenarios/llama3-8b-fsdp-h100.toml"  # ~0.02 s per point
SITE = '''
import os, time
_HOOKS = {k: os.environ.get("CLUSTERSIM_TEST_" + k) for k in ("SLEEP", "HANG", "DIE")}
if any(_HOOKS.values()):
    import sim.step as _step
    _real = _step.simulate

    def _simulate(s, *args, **kwargs):
        if _HOOKS["SLEEP"]:
            time.sleep(float(_HOOKS["SLEEP"]))
        if _HOOKS["HANG"] and s.training.seq_len == int(_HOOKS["HANG"]):
            while True:
                time.sleep(1)
        if _HOOKS["DIE"] and s.training.seq_len == int(_HOOKS["DIE"]):
            os._exit(3)
        return _real(s, *args, **kwargs)

    _step.simulate = _simulate
'''


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    (folder / "sitecustomize.py").write_text(SITE)
    return folder


@pytest.fixture
def start_sweep(hooks: Path):
    """``start_sweep(out, *args, SLEEP="1")``: ``clustersim sweep`` in a subprocess with the
    test hooks, SIGINT handled as in a terminal; killed at teardown if still running."""
    started = []

    def start(out: Path, *args: str, **env: str) -> subprocess.Popen:
        environ = {**cli_env(), **{f"CLUSTERSIM_TEST_{k}": v for k, v in env.items()}}
        environ["PYTHONPATH"] = f"{hooks}{os.pathsep}{environ['PYTHONPATH']}"
        cmd = [sys.executable, "-m", "sim", "sweep", str(FSDP), "--out", str(out), *args]
        started.append(subprocess.Popen(cmd, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finished_rows(out: Path) -> int:
    return max(0, out.read_bytes().count(b"\n") - 1) if out.exists() else 0


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reap(pids) -> None:
    """A failed test leaves no process behind."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
SLOW_GRID = ["--grid", "training.seq_len=1024..16384x2", "--grid", "parallel.dp_algo=ring,hierarchical"]  # 10 points


# ---------------------------------------------------------------- fingerprints
def test_an_edited_scenario_invalidates_its_resumed_rows(tmp_path, calls):
    scenario, out = tmp_path / "s.toml", tmp_path / "s.csv"
    scenario.write_text(FSDP.read_text())
    grid = {"training.seq_len": [2048, 4096], "training.global_batch": [32, 64]}  # 2 invalid, 2 simulated
    first = sim.sweep(scenario, grid, workers=1, out=out, quiet=True)
    assert calls["n"] == 2 and first["fingerprint"].nunique() == 4 and (first["version"] == sim.__version__).all()
    stats: dict = {}
    sim.sweep(scenario, grid, workers=1, out=out, quiet=True, stats=stats)
    assert calls["n"] == 2 and stats["resumed"] == 4 and stats["recomputed"] == 0  # unchanged: all reused
    scenario.write_text(FSDP.read_text().replace("seed = 0", "seed = 5"))
    assert "seed = 5" in scenario.read_text()
    again = sim.sweep(scenario, grid, workers=1, out=out, quiet=True, stats=stats)
    assert calls["n"] == 4  # the two valid points simulated again, the invalid ones re-validated
    assert stats["recomputed"] == 4 and stats["stale"] == {"changed": 4} and stats["resumed"] == 0
    assert not set(again["fingerprint"]) & set(first["fingerprint"])
    other = tmp_path / "other.toml"  # another scenario pointed at the same file
    other.write_text(FSDP.read_text().replace('name = "llama3-8b-fsdp-h100"', 'name = "other"'))
    third = sim.sweep(other, grid, workers=1, out=out, quiet=True, stats=stats)
    assert stats["recomputed"] == 4 and calls["n"] == 6 and third["name"].dropna().tolist() == ["other", "other"]


def test_rows_without_a_fingerprint_are_stale(tmp_path, calls):
    out = tmp_path / "old.csv"
    grid = {"training.seq_len": [2048, 4096]}
    sim.sweep(FSDP, grid, workers=1, out=out, quiet=True)
    pd.read_csv(out).drop(columns=["fingerprint", "version"]).to_csv(out, index=False)  # an older sweep's file
    stats: dict = {}
    sim.sweep(FSDP, grid, workers=1, out=out, quiet=True, stats=stats)
    assert calls["n"] == 4 and stats["stale"] == {"format": 2}


def test_an_edited_topology_file_invalidates_rows(tmp_path, calls):
    topo = tmp_path / "fabric.toml"
    topo.write_text((REPO / "topologies/dgx-h100.toml").read_text())
    grid = {"training.seq_len": [2048]}
    fixed = [f"cluster.topology={json.dumps(str(topo))}"]
    sim.sweep(FSDP, grid, workers=1, out=tmp_path / "t.csv", overrides=fixed, quiet=True)
    topo.write_text(topo.read_text() + "\nnic_gbps = 25\n")
    stats: dict = {}
    sim.sweep(FSDP, grid, workers=1, out=tmp_path / "t.csv", overrides=fixed, quiet=True, stats=stats)
    assert calls["n"] == 2 and stats["stale"] == {"changed": 1}


def test_the_cli_says_how_many_rows_it_recomputed_and_why(tmp_path):
    scenario, out = tmp_path / "s.toml", tmp_path / "s.csv"
    scenario.write_text(FSDP.read_text())
    args = [sys.executable, "-m", "sim", "sweep", str(scenario), "--grid", "training.seq_len=2048,4096",
            "--out", str(out), "--workers", "1"]
    assert subprocess.run(args, env=cli_env(), capture_output=True).returncode == 0
    scenario.write_text(FSDP.read_text().replace("global_batch = 64", "global_batch = 128"))
    proc = subprocess.run(args, env=cli_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "2 simulated, 0 resumed" in proc.stderr
    assert "2 finished rows recomputed (2 scenario or clustersim version changed)" in proc.stderr


# ---------------------------------------------------------------- one writer
def test_the_lock_refuses_a_second_holder_and_is_removed(tmp_path):
    out = tmp_path / "x.csv"
    with exclusive(out):
        assert lock_path(out).exists()
        with pytest.raises(InputError, match=f"{out} is being written by another sweep"):
            with exclusive(out):
                pass
    assert not lock_path(out).exists()
    with exclusive(out):  # free again
        pass


def test_two_sweeps_on_one_file_the_second_refuses_and_the_first_keeps_every_row(tmp_path, start_sweep):
    out = tmp_path / "both.csv"
    # three points (15 s) to go: the second sweep's own start (importing clustersim) took more than
    # 6 s on a two-core machine at load 12, and the first had finished before it looked (CI, stop 51)
    first = start_sweep(out, "--grid", "training.seq_len=1024,2048,4096,8192", "--workers", "1", SLEEP="5")
    wait_for(lambda: finished_rows(out) >= 1)
    second = subprocess.run([sys.executable, "-m", "sim", "sweep", str(FSDP), "--out", str(out), "--grid",
                             "parallel.dp_algo=ring,tree", "--workers", "1"], env=cli_env(), capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1
    assert f"--out: {out} is being written by another sweep" in second.stderr
    assert first.poll() is None  # the refusal came while the first sweep was writing
    assert first.wait(timeout=60) == 0, first.stderr.read()
    df = pd.read_csv(out)
    assert df["training.seq_len"].tolist() == [1024, 2048, 4096, 8192] and df["error"].isna().all()
    assert "parallel.dp_algo" not in df.columns and not lock_path(out).exists()


# ---------------------------------------------------------------- stopping
@linux_only
def test_kill_9_of_the_sweep_leaves_no_worker(tmp_path, start_sweep):
    out = tmp_path / "k.csv"
    proc = start_sweep(out, *SLOW_GRID, "--workers", "2", SLEEP="1.0")
    wait_for(lambda: len(children(proc.pid)) == 2 and finished_rows(out) >= 1)
    workers = children(proc.pid)
    proc.kill()
    proc.wait()
    try:
        wait_for(lambda: not any(alive(w) for w in workers), timeout=5)
    finally:
        reap(workers)


@linux_only
def test_ctrl_c_stops_within_two_seconds_and_keeps_finished_rows(tmp_path, start_sweep):
    out = tmp_path / "c.csv"
    proc = start_sweep(out, *SLOW_GRID, "--workers", "2", SLEEP="1.0")
    wait_for(lambda: finished_rows(out) >= 2)
    workers, seen = children(proc.pid), finished_rows(out)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=10)
    elapsed = time.monotonic() - t0
    assert code == 130 and elapsed < 2.0, (code, elapsed)
    assert "sweep interrupted" in proc.stderr.read()
    df = pd.read_csv(out)
    assert seen <= len(df) < 10 and df["error"].isna().all()
    try:
        wait_for(lambda: not any(alive(w) for w in workers), timeout=2)
    finally:
        reap(workers)
    resumed = subprocess.run([sys.executable, "-m", "sim", "sweep", str(FSDP), "--out", str(out), *SLOW_GRID,
                              "--workers", "2"], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert f"{len(df)} resumed" in resumed.stderr and len(pd.read_csv(out)) == 10


def test_a_hanging_point_becomes_an_error_row_within_its_time_limit(tmp_path, start_sweep):
    out = tmp_path / "h.csv"
    t0 = time.monotonic()
    proc = start_sweep(out, "--grid", "training.seq_len=2048,4096,8192,1024", "--workers", "2",
                       "--point-timeout", "2", HANG="4096", DIE="8192")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert time.monotonic() - t0 < 15
    errors = pd.read_csv(out).set_index("training.seq_len")["error"]
    assert errors[4096] == "point-timeout: still running after 2 s; stopped (raise --point-timeout to give it longer)"
    assert errors[8192].startswith("worker died: the worker running this point exited (exit status 3")
    assert errors[[1024, 2048]].isna().all()
    assert "2 simulated" in stderr and "1 failed, 1 timed out" in stderr
    again = start_sweep(out, "--grid", "training.seq_len=2048,4096,8192,1024", "--workers", "2")
    _, stderr = again.communicate(timeout=60)
    assert "2 finished rows recomputed (2 timed out or lost its worker last time)" in stderr
    assert pd.read_csv(out)["error"].isna().all()


def test_point_timeout_is_checked():
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(InputError, match="--point-timeout"):
            sim.sweep(FSDP, {"training.seq_len": [2048]}, point_timeout=bad, quiet=True)
    with pytest.raises(InputError, match="dask"):
        sim.sweep(FSDP, {"training.seq_len": [2048]}, point_timeout=5, dask="tcp://127.0.0.1:1", quiet=True)
