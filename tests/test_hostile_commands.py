"""Hostile input on every command, not only ``run`` (issue 30): special files, pseudo
filesystems, unwritable outputs, garbage resume files, huge grids and work, each as a user
types it: exit 2 with one line naming the flag, key or file, no traceback, within 30 s of
CPU and 1 GiB.

Every case runs ``sim.cli.main`` in a fork of one interpreter that imported the package
once (tests/forked_cli.py), so a case's CPU time and peak RSS are its own; the import's
CPU is added. ``-m slow`` adds a generator: every hostile file under every command that
reads a scenario.

Run: ``python -m pytest tests/test_hostile_commands.py``
"""

import gzip
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO, cli_env

BASE = "scenarios/llama3-8b-fsdp-h100.toml"
RL = "scenarios/rl-llama3-8b-h100.toml"
CALIBRATION_TABLE = "examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt"
MAX_CPU_S, MAX_RSS_MB, HANG_S = 30.0, 1024, 120.0
GRID = ["--grid", "training.seq_len=2048,4096"]
PLAN = ["--gpus", "8", "--topology", "dgx-h100", "--seq-len", "4096", "--global-batch-tokens", "1048576"]


def _files(root) -> dict:
    """The hostile files, by name: a FIFO, a link to /dev/zero and to /dev/full, a folder, a
    TOML nested past any stack, a sparse 2 GB file, a garbage Parquet and sweep journal."""
    for suffix in (".toml", ".npy", ".csv", ".json", ".png", ".parquet"):
        os.mkfifo(root / f"fifo{suffix}")
    os.symlink("/dev/zero", root / "zero.toml")
    os.symlink("/dev/full", root / "full.csv")
    os.symlink("/dev/full", root / "plan.sims.csv")  # the planner's resume file
    (root / "adir.toml").mkdir()
    (root / "nested.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with open(root / "big.toml", "wb") as f:
        f.truncate(2 << 30)
    (root / "garbage.parquet").write_bytes(b"not parquet at all\n")
    (root / "journal.parquet.partial.jsonl").write_text('{"no point": 1}\n')
    (root / "old.json").write_text("old\n")
    (root / "empty.npy").write_bytes(b"")
    (root / "empty.toml").write_text("# nothing\n")
    (root / "nested.json").write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (root / "garbage.csv").write_bytes(b"point,a\r\x00\xff\xfe,\r\rb\n1,2\n")
    spaces = gzip.compress(b" " * (16 << 20))  # one gzip member, 16 KB; 70 of them unzip to 1.1 GiB
    (root / "bomb.json.gz").write_bytes(gzip.compress(b"{") + spaces * 70)
    return {p.name: str(p) for p in root.iterdir()}


def _cases(f: dict) -> list[tuple[str, list[str], str]]:
    """(case, argv, the flag/key/file its one line must name)."""
    rl_set = lambda *kv: [a for x in kv for a in ("--set", x)]  # noqa: E731
    cases = [
        ("run --trace /dev/full", ["run", BASE, "--trace", "/dev/full.json"], "--trace"),
        ("run --timeline in /proc", ["run", BASE, "--timeline", "/proc/x.png"], "--timeline"),
        ("run --spans a FIFO", ["run", BASE, "--spans", f["fifo.csv"]], "--spans"),
        ("plot -o in /sys", ["plot", BASE, "-o", "/sys/x.png"], "--out"),
        ("sweep --out in /proc", ["sweep", BASE, *GRID, "--out", "/proc/x.csv"], "--out"),
        ("sweep --out -> /dev/full", ["sweep", BASE, *GRID, "--out", f["full.csv"]], "--out"),
        ("sweep garbage parquet", ["sweep", BASE, *GRID, "--out", f["garbage.parquet"]], "--out"),
        ("sweep garbage journal", ["sweep", BASE, *GRID, "--out", f["journal.parquet.partial.jsonl"][:-14]],
         "--out"),
        ("sweep 1e10 points", ["sweep", BASE, "--grid", "training.seq_len=1..100000",
                               "--grid", "training.global_batch=1..100000", "--out", "/tmp/never.csv"], "--grid"),
        ("plan --gpus 1e18", ["plan", "llama3-8b", *PLAN, "--gpus", str(10**18)], "--gpus"),
        ("plan --seq-len 1e12", ["plan", "llama3-8b", *PLAN, "--seq-len", str(10**12)], "--seq-len"),
        ("plan --global-batch-tokens 1e27", ["plan", "llama3-8b", *PLAN, "--global-batch-tokens", str(10**27)],
         "--global-batch-tokens"),
        ("plan 8 GPUs x 2^24 sequences", ["plan", "llama3-70b", *PLAN, "--seq-len", "8192",
                                          "--global-batch-tokens", str(8192 * 2**24)], "--global-batch-tokens"),
        ("plan MoE layouts on 967,680 GPUs", ["plan", "deepseek-v3", *PLAN, "--gpus", "967680",
                                              "--global-batch-tokens", str(4096 * 967680)], "--gpus"),
        ("plan --workers 1e12", ["plan", "llama3-8b", *PLAN, "--workers", str(10**12)], "--workers"),
        ("sweep --workers 100,000", ["sweep", BASE, *GRID, "--out", "/tmp/never.csv", "--workers", "100000"],
         "--workers"),
        ("study --workers 99,999", ["study", "batch-floor", "--quick", "--workers", "99999"], "--workers"),
        ("plan --set jitter", ["plan", "llama3-8b", *PLAN, "--set", "jitter.sigma=0.1"], "--set"),
        ("plan --set stragglers", ["plan", "llama3-8b", *PLAN, "--set", "stragglers=[{ranks = [1], slowdown = 2.0}]"],
         "--set"),
        ("plan .sims.csv -> /dev/full", ["plan", "llama3-8b", *PLAN, "--out", f["plan.sims.csv"][:-9] + ".csv"],
         "--out"),
        ("plan --out in /proc", ["plan", "llama3-8b", *PLAN, "--out", "/proc/x.csv"], "--out"),
        ("rl 10,000 steps", ["rl", RL, *rl_set("rl.steps=10000")], "rl.steps"),
        ("rl a million generators", ["rl", RL, *rl_set("rl.generator_gpus=1000000", "cluster.nodes=125002")],
         "rl.generator_gpus"),
        ("rl --trace /dev/full", ["rl", RL, "--trace", "/dev/full.json"], "--trace"),
        ("campaign --plot-run in /proc", ["campaign", BASE, "--tokens", "2e9", "--step-time-s", "1.5",
                                          "--plot-run", "/proc/x.png"], "--plot-run"),
        ("campaign 100,000 trials", ["campaign", BASE, "--tokens", "2e14", "--step-time-s", "1.5",
                                     "--trials", "100000"], "--trials"),
        ("collective all_to_all 4,096", ["collective", "--op", "all_to_all", "--gpus", "4096", "--topology",
                                         "dgx-h100", "--sizes", "1G"], "--gpus"),
        ("numerics ranks x elements", ["numerics", "--ranks", "65536", "--elements", "4096"], "--elements"),
        ("numerics --plot in /proc", ["numerics", "--plot", "/proc/x.png"], "--plot"),
        ("routing --scores FIFO", ["routing", "--policy", "token_choice", "--scores", f["fifo.npy"]], "--scores"),
        ("calibrate a 2 GB log", ["calibrate", f["big.toml"], "--out", "/tmp/never.toml"], "INPUT"),
        ("calibrate a folder", ["calibrate", f["adir.toml"], "--out", "/tmp/never.toml"], "INPUT"),
        ("calibrate a FIFO", ["calibrate", f["fifo.json"], "--out", "/tmp/never.toml"], "INPUT"),
        ("calibrate a trace nested past the stack", ["calibrate", f["nested.json"], "--out", "/tmp/never.toml"],
         "INPUT"),
        ("calibrate --scenario beside tables only", ["calibrate", CALIBRATION_TABLE, "--scenario", f["zero.toml"],
                                                     "--out", "/tmp/never.toml"], "--scenario"),
        ("sweep a binary --out CSV", ["sweep", BASE, *GRID, "--out", f["garbage.csv"]], "--out"),
        ("routing --scores an empty .npy", ["routing", "--policy", "token_choice", "--scores", f["empty.npy"]],
         "--scores"),
        ("run --calibration an empty profile", ["run", BASE, "--calibration", f["empty.toml"]], "--calibration"),
        ("validate --rows nothing", ["validate", "--rows", "[[["], "--rows"),
        ("study --out-dir in /proc", ["study", "batch-floor", "--quick", "--out-dir", "/proc/x"], "--out-dir"),
    ]
    for name in ("fifo.toml", "zero.toml", "adir.toml", "nested.toml", "big.toml"):
        cases.append((f"sweep {name}", ["sweep", f[name], *GRID, "--out", "/tmp/never.csv"], "scenario"))
        cases.append((f"plan {name}", ["plan", f[name], *PLAN], "MODEL_OR_SCENARIO"))
    return cases


def _run_all(jobs: list[dict]) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "forked_cli.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=HANG_S * len(jobs))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    return {n: {**o, "cpu_s": o["cpu_s"] + got["import_cpu_s"]} for n, o in got["outcomes"].items()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-commands")
    files = _files(root)
    cases = _cases(files)
    jobs = [{"name": n, "args": a, "timeout": HANG_S} for n, a, _ in cases]
    # a write that fails after the simulation (a full disk: here a 20 kB file-size limit)
    jobs.append({"name": "run --trace past a full disk", "args": ["run", BASE, "--trace", files["old.json"]],
                 "timeout": HANG_S, "file_bytes": 20_000})
    for suffix in (".csv", ".parquet"):  # a sweep's rows appended past a full disk (the journal, for Parquet)
        jobs.append({"name": f"sweep {suffix} past a full disk", "timeout": HANG_S, "file_bytes": 200,
                     "args": ["sweep", BASE, *GRID, "--workers", "1", "--out", str(root / f"full{suffix}")]})
    keys = {n: k for n, _, k in cases}
    keys.update({"sweep .csv past a full disk": "--out", "sweep .parquet past a full disk": "--out"})
    return files, keys, _run_all(jobs)


def _assert_one_line(o: dict, key: str) -> None:
    assert o["code"] == 2, f"exit {o['code']}: {o['stderr'][-500:]}"
    lines = o["stderr"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in o["stderr"], o["stderr"][-1000:]
    assert f": {key}" in lines[0], lines[0]
    for bad in ("MemoryError", "RecursionError", "OSError", "Errno"):
        assert bad not in lines[0], lines[0]
    assert o["cpu_s"] < MAX_CPU_S, f"{o['cpu_s']:.1f} s of CPU"
    assert o["rss_mb"] < MAX_RSS_MB, f"{o['rss_mb']:.0f} MB peak RSS"


def _assert_all_one_line(keys: dict, got: dict) -> None:
    """Every named run refused in one line naming its key; all failures reported at once."""
    failures = []
    for name, key in keys.items():
        try:
            _assert_one_line(got[name], key)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


def test_every_command_refuses_hostile_input_in_one_line(world):
    _, keys, got = world
    _assert_all_one_line(keys, got)


def test_a_failed_write_exits_2_naming_the_flag_and_keeps_the_old_file(world):
    files, _, got = world
    o = got["run --trace past a full disk"]
    assert o["code"] == 2, o["stderr"]
    assert o["stderr"].strip().splitlines()[-1].startswith(f"clustersim run: --trace: cannot write {files['old.json']}")
    assert open(files["old.json"]).read() == "old\n"  # intact
    folder = os.path.dirname(files["old.json"])
    assert not [n for n in os.listdir(folder) if ".tmp" in n]  # no temporary file left behind
    assert "step time" in o["stdout"]  # the summary was printed first, then the write failed


def test_written_replaces_atomically_and_keeps_the_mode(tmp_path):
    from sim.errors import InputError
    from sim.outputs.paths import write_bytes, written

    p = tmp_path / "a.csv"
    p.write_text("old")
    os.chmod(p, 0o640)
    write_bytes(p, b"new", "--out")
    assert p.read_text() == "new" and (os.stat(p).st_mode & 0o777) == 0o640
    with pytest.raises(InputError, match="--out: cannot write"):
        with written(p, "--out") as tmp:
            raise OSError(28, "No space left on device", tmp)
    assert p.read_text() == "new" and os.listdir(tmp_path) == ["a.csv"]


def _stop_at_third(scenario):
    """A point function for the Ctrl-C test: two rows, then a Ctrl-C."""
    _stop_at_third.calls = getattr(_stop_at_third, "calls", 0) + 1
    if _stop_at_third.calls == 3:
        raise KeyboardInterrupt
    return {"step_time_s": float(scenario.training.seq_len)}, None


def test_a_ctrl_c_parquet_sweep_holds_every_row_it_counted(tmp_path):
    from sim.sweeps.grid import sweep

    out, stats = tmp_path / "v.parquet", {}
    _stop_at_third.calls = 0
    with pytest.raises(KeyboardInterrupt):
        sweep(BASE if os.path.isabs(BASE) else str(REPO / BASE), {"training.seq_len": [1024, 2048, 4096, 8192]},
              workers=1, out=out, quiet=True, stats=stats, point_fn=_stop_at_third)
    counted = stats["resumed"] + sum(stats[k] for k in ("invalid", "simulated", "failed", "timed_out"))
    assert counted == 2 and len(pd.read_parquet(out)) == 2


# ------------------------------------------------------------------ the larger generator (-m slow)
READERS = [("run", lambda p: ["run", p]), ("plot", lambda p: ["plot", p, "-o", "/tmp/never.png"]),
           ("rl", lambda p: ["rl", p]), ("campaign", lambda p: ["campaign", p, "--tokens", "2e9"]),
           ("sweep", lambda p: ["sweep", p, *GRID, "--out", "/tmp/never.csv"]), ("plan", lambda p: ["plan", p, *PLAN])]
OUTPUTS = [("run", "--trace", ".json"), ("run", "--timeline", ".png"), ("run", "--spans", ".csv"),
           ("plot", "-o", ".png"), ("rl", "--timeline", ".png"), ("rl", "--steps", ".csv"),
           ("sweep", "--out", ".parquet"), ("plan", "--out", ".csv"), ("numerics", "--plot", ".png")]


@pytest.mark.slow
def test_generated_hostile_files_and_outputs_on_every_command(tmp_path):
    files = _files(tmp_path)
    jobs, keys = [], {}
    for fname in ("fifo.toml", "zero.toml", "adir.toml", "nested.toml", "big.toml"):
        for cmd, argv in READERS:
            jobs.append({"name": f"{cmd} {fname}", "args": argv(files[fname]), "timeout": HANG_S})
            keys[f"{cmd} {fname}"] = "MODEL_OR_SCENARIO" if cmd == "plan" else "scenario"
    base = {"run": ["run", BASE], "plot": ["plot", BASE], "rl": ["rl", RL], "sweep": ["sweep", BASE, *GRID],
            "plan": ["plan", "llama3-8b", *PLAN], "numerics": ["numerics"]}
    for cmd, flag, suffix in OUTPUTS:
        for where in ("/proc/x", "/sys/x", "/dev/x", files["fifo.toml"][:-5]):
            name = f"{cmd} {flag} {where}{suffix}"
            jobs.append({"name": name, "args": [*base[cmd], flag, where + suffix], "timeout": HANG_S})
            keys[name] = "--out" if flag == "-o" else flag
    jobs.append({"name": "calibrate a gzip bomb", "args": ["calibrate", files["bomb.json.gz"], "--out",
                                                           "/tmp/never.toml"], "timeout": HANG_S})
    keys["calibrate a gzip bomb"] = "INPUT"
    got = _run_all(jobs)
    _assert_all_one_line(keys, got)
