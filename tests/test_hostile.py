"""The hostile inputs of issue 14, each as a user types it: exit 2 with one line naming
the key (or, where the value is legal, a correct result), in under 5 s of CPU and 1 GB.

Every case runs ``sim.cli.main`` in its own fork of one fresh interpreter that imported
the package once (tests/forked_cli.py): its CPU time (plus the import's) and peak RSS are
that child's own (``os.wait4``), as a fresh ``clustersim`` process's would be. CPU, not
wall, time is asserted: this machine is shared, and wall time measures the neighbours.

Run: ``python -m pytest tests/test_hostile.py``
"""

import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, cli_env

BASE = "scenarios/llama3-8b-fsdp-h100.toml"  # Llama 3 8B, FSDP on 64 H100s
MAX_CPU_S, MAX_RSS_MB, HANG_S = 5.0, 1024, 120.0


def _set(*pairs):
    return [a for kv in pairs for a in ("--set", kv)]


# (case, arguments after `run BASE --json` or a whole command line, the key its one line must name)
REFUSED = [
    ("hidden 1e6", _set("model.hidden=1000000"), "model.hidden"),
    ("hidden 1e7", _set("model.hidden=10000000"), "model.hidden"),
    ("seq_len 1e9 (was a livelock)", _set("training.seq_len=1000000000"), "training.seq_len"),
    ("vocab 1e7", _set("model.vocab=10000000"), "model.vocab"),
    ("layers 1e6", _set("model.layers=1000000"), "model.layers"),
    ("gpus 1e6", _set("cluster.nodes=125000", "parallel.dp=1000000", "training.global_batch=1000000"),
     "cluster.nodes"),
    ("gpus 1e7", _set("cluster.gpus=10000000", "cluster.nodes=1250000", "parallel.dp=10000000"), "cluster."),
    ("global_batch 1e7", _set("training.global_batch=10000000"), "training.global_batch"),
    ("slowdown inf", _set("stragglers=[{ranks = [1], slowdown = inf}]"), "stragglers.0.slowdown"),
    ("jitter sigma inf", _set("jitter.sigma=inf"), "jitter.sigma"),
    ("NaN NIC bandwidth", _set("cluster.topology_overrides.nic_gbps=nan"), "cluster.topology_overrides.nic_gbps"),
    ("1e9 experts", _set("model.moe={experts = 1000000000, top_k = 2}"), "model.moe.experts"),
    ("huge spines", _set("cluster.topology_overrides.spines=1000000000"), "cluster.topology_overrides.spines"),
    ("legal spines, huge fabric", _set("cluster.topology='generic'", "cluster.topology_overrides.spines=2048",
                                       "cluster.topology_overrides.nodes_per_su=1", "cluster.nodes=1024",
                                       "parallel.dp=8192", "training.global_batch=8192"),
     "cluster.topology_overrides.spines"),
    ("capacity_factor inf", _set("model.moe={experts = 8, top_k = 2, capacity_factor = inf}"),
     "model.moe.capacity_factor"),
    ("jitter sigma 5 (was MFU 228%)", _set("jitter.sigma=5"), "jitter.sigma"),
    ("fault factor 1e-300 (was a 1.7e100 s step)", _set("cluster.faults=[{gpu_nic = 0, factor = 1e-300}]"),
     "cluster.faults[0].factor"),
    ("NIC 1e-300 GB/s", _set("cluster.topology_overrides.nic_gbps=1e-300"), "cluster.topology_overrides.nic_gbps"),
    ("negative straggler rank", _set("stragglers=[{ranks = [-1], slowdown = 2.0}]"), "stragglers.0.ranks.0"),
    ("negative straggler node", _set("stragglers=[{nodes = [-1], slowdown = 2.0}]"), "stragglers.0.nodes.0"),
    ("dense_layers > layers", _set("model.moe={experts = 8, top_k = 2, dense_layers = 100}"),
     "model.moe.dense_layers"),
    ("seq_len = true", _set("training.seq_len=true"), "training.seq_len"),
    ("a straggler naming nobody (did nothing)", _set("stragglers=[{slowdown = 2.0}]"), "stragglers[0]"),
    ("JSON in --set (was: Input should be a valid list)", _set('stragglers=[{"ranks":[3],"slowdown":1.5}]'),
     "stragglers: --set value"),
    ("jitter floor under lognormal (did nothing)", _set("jitter={sigma = 0.1, floor = 5.0}"), "jitter.floor"),
    ("micro_batch = 1.5", _set("training.micro_batch=1.5"), "training.micro_batch"),
    ("expert choice over 1M tokens x 16k experts",
     _set("model.moe={experts = 16384, top_k = 2, routing = 'expert_choice'}", "training.seq_len=1000000"),
     "training.seq_len"),
    ("every rank of 100k simulated", _set("cluster.nodes=12500", "parallel.dp=100000",
                                          "training.global_batch=100000", "parallel.fold=false"), "cluster.nodes"),
    ("--set nested 60k deep", _set("name=" + "[" * 60_000 + "]" * 60_000), "--set"),  # (an argument: < 128 KiB)
]
FILES = [  # (case, how to make the file in a directory, option, key)
    ("scenario nested 100k deep", "nested.toml", "scenario", "scenario"),
    ("hf_config /dev/zero (endless)", "/dev/zero", "hf_config", "model.hf_config"),
    ("hf_config a FIFO (blocks)", "fifo.json", "hf_config", "model.hf_config"),
    ("hf_config a JSON array", "array.json", "hf_config", "model.hf_config"),
    ("hf_config 2 GB", "big.json", "hf_config", "model.hf_config"),
    ("hf_config nested 100k deep", "deep.json", "hf_config", "model.hf_config"),
    ("scenario is a directory", "adir", "scenario", "scenario"),
    ("topology file 2 GB", "big.toml", "topology", "cluster.topology"),
]
COMMANDS = [  # (case, whole command line, key)
    ("collective --gpus 1e8", ["collective", "--op", "all_reduce", "--gpus", "100000000", "--topology", "generic"],
     "--gpus"),
    ("collective --gpus 1e6", ["collective", "--op", "all_reduce", "--gpus", "1000000", "--topology", "generic",
                               "--sizes", "1M"], "--gpus"),
    ("collective 1e35-byte sizes", ["collective", "--op", "all_reduce", "--gpus", "8", "--topology", "dgx-h100",
                                    "--sizes", "99999999999999999999T"], "--sizes"),
    ("routing --seed -1", ["routing", "--policy", "token_choice", "--seed", "-1"], "--seed"),
    ("routing 1M tokens x 4k experts", ["routing", "--policy", "expert_choice", "--tokens", "1048576",
                                        "--experts", "4096"], "--tokens"),
    ("routing --skew 1e300", ["routing", "--policy", "token_choice", "--skew", "1e300"], "--skew"),
    ("numerics --seed -1", ["numerics", "--seed", "-1"], "--seed"),
]
LEGAL = [  # values past any real run but inside the bounds: they run, and correctly
    ("seq_len 1e7 (was a livelock)", _set("training.seq_len=10000000")),
    ("vocab 1e6", _set("model.vocab=1000000")),
    ("seq_len 1e6", _set("training.seq_len=1000000")),
]


def _files(root) -> dict:
    (root / "nested.toml").write_text("name = 'x'\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    os.mkfifo(root / "fifo.json")
    (root / "array.json").write_text("[1, 2, 3]")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "adir").mkdir()
    for name in ("big.json", "big.toml"):
        with open(root / name, "wb") as f:
            f.truncate(2 << 30)  # sparse: 2 GB long, no disk used
    return {name: str(root / name) if not name.startswith("/") else name for _, name, _, _ in FILES}


def _argv(option: str, path: str) -> list[str]:
    if option == "scenario":
        return ["run", path]
    if option == "hf_config":
        return ["run", BASE, *_set("model.preset=''", f"model.hf_config='{path}'")]
    return ["run", BASE, *_set(f"cluster.topology='{path}'")]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case: name -> (exit code, stdout, stderr, CPU s, RSS MB)."""
    files = _files(tmp_path_factory.mktemp("hostile"))
    jobs = {name: ["run", BASE, "--json", *args] for name, args, _ in REFUSED}
    jobs |= {name: _argv(option, files[f]) for name, f, option, _ in FILES}
    jobs |= {name: args for name, args, _ in COMMANDS}
    jobs |= {name: ["run", BASE, "--json", *args] for name, args in LEGAL}
    return _run_all(jobs)


def _run_all(jobs: dict) -> dict:
    """One fresh interpreter imports the package, then forks a child per case
    (tests/forked_cli.py): each case's CPU is the child's plus the import's, its RSS the
    child's peak, which includes the imported package as a fresh process's does."""
    batch = [{"name": name, "args": args, "timeout": HANG_S} for name, args in jobs.items()]
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "forked_cli.py")], input=json.dumps(batch),
                          capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=HANG_S * len(batch))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    return {name: (o["code"], o["stdout"], o["stderr"], o["cpu_s"] + got["import_cpu_s"], o["rss_mb"])
            for name, o in got["outcomes"].items()}


def _assert_quick(outcome) -> None:
    code, out, err, cpu, rss = outcome
    assert cpu < MAX_CPU_S, f"{cpu:.1f} s of CPU"
    assert rss < MAX_RSS_MB, f"{rss:.0f} MB peak RSS"


@pytest.mark.parametrize("name, key", [(n, k) for n, _, k in REFUSED] + [(n, k) for n, _, _, k in FILES]
                         + [(n, k) for n, _, k in COMMANDS])
def test_hostile_input_exits_2_naming_the_key(outcomes, name, key):
    code, out, err, cpu, rss = outcomes[name]
    assert code == 2, f"exit {code}: {err[-500:]}"
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f": {key}" in err, err
    _assert_quick(outcomes[name])


@pytest.mark.parametrize("name", [n for n, _ in LEGAL])
def test_extreme_but_legal_values_run_correctly(outcomes, name):
    code, out, err, cpu, rss = outcomes[name]
    assert code == 0, err
    s = json.loads(out)
    assert math.isfinite(s["step_time_s"]) and s["step_time_s"] > 0
    assert 0 < s["mfu"] <= 1 and 0 <= s["bubble_fraction"] <= 1
    assert all(v >= 0 for v in s["comm_bytes_per_gpu"].values())
    _assert_quick(outcomes[name])


def test_a_sweep_point_with_a_hostile_value_is_an_error_row_not_a_hang():
    """The work estimate runs inside simulate(), so a sweep's points get it too."""
    import sim

    t0 = time.process_time()
    rows = sim.sweep(str(REPO / BASE), {"training.global_batch": [64, 10_000_000], "jitter.sigma": [0.0]},
                     workers=1, quiet=True)
    assert time.process_time() - t0 < 30
    assert rows.error.iloc[0] == "" or rows.error.isna().iloc[0]
    assert "training.global_batch" in rows.error.iloc[1] and "--force" in rows.error.iloc[1]
