"""``clustersim run`` as a user runs it: a subprocess, its stdout, stderr and exit status
(CONTRACT.md).

Run: ``python -m pytest tests/test_cli_run.py``
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_input_error, cli_env, clustersim as cli

REPO = Path(__file__).resolve().parent.parent
FSDP = "scenarios/llama3-8b-fsdp-h100.toml"
CONTRACT_KEYS = {"name", "num_gpus", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction",
                 "exposed_comm_s", "comm_bytes_per_gpu", "memory_per_gpu_bytes", "fits_in_memory", "sim_events",
                 "sim_wall_s"}
AXES = {"dp", "tp", "pp", "ep", "cp"}
H100_PEAK = 989e12  # dense bf16 FLOP/s, NVIDIA H100 SXM datasheet


def clustersim(*args: str) -> subprocess.CompletedProcess:
    return cli("run", *args)


def one_json_object(stdout: str) -> dict:
    """stdout must hold exactly one JSON object (json.loads rejects trailing data)."""
    obj = json.loads(stdout)
    assert isinstance(obj, dict)
    return obj


@pytest.fixture(scope="module")
def fsdp_json():
    return [clustersim(FSDP, "--json") for _ in range(2)]


def test_json_has_exactly_the_contract_keys(fsdp_json):
    proc = fsdp_json[0]
    assert proc.returncode == 0  # stderr holds at most the heartbeat of a slow machine (outputs/progress.py)
    assert all(line.startswith("simulating ") for line in proc.stderr.splitlines()), proc.stderr
    s = one_json_object(proc.stdout)
    assert set(s) == CONTRACT_KEYS  # no straggler_cost_s without stragglers/jitter/faults
    assert set(s["comm_bytes_per_gpu"]) == AXES
    assert s["name"] == "llama3-8b-fsdp-h100" and s["num_gpus"] == 64 and s["fits_in_memory"] is True
    # the contract's definitions, recomputed from the other fields
    assert s["tokens_per_s"] == pytest.approx(64 * 8192 / s["step_time_s"], rel=1e-12)
    assert s["mfu"] == pytest.approx(s["tflops_per_gpu"] * 1e12 / H100_PEAK, rel=1e-12)
    assert s["bubble_fraction"] == 0.0  # no pipeline
    assert 0 <= s["exposed_comm_s"] < s["step_time_s"]
    assert isinstance(s["sim_events"], int) and s["sim_events"] > 0


def test_two_processes_print_the_same_summary(fsdp_json):
    a, b = (one_json_object(p.stdout) for p in fsdp_json)
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize("extra", [
    ["scenarios/straggler-dp.toml"],
    [FSDP, "--set", "jitter.sigma=0.02"],
    [FSDP, "--set", "cluster.faults=[{gpu_nic = 0, factor = 0.5}]"],
])
def test_straggler_cost_only_when_something_is_perturbed(extra):
    proc = clustersim(*extra, "--json")
    assert proc.returncode == 0, proc.stderr
    s = one_json_object(proc.stdout)
    jitter = {"jitter_mode"} if any("jitter" in a for a in extra) else set()  # (exact at 8 GPUs: no sample keys)
    assert set(s) == CONTRACT_KEYS | {"straggler_cost_s"} | jitter
    assert s["straggler_cost_s"] > 0
    assert s.get("jitter_mode", "exact") == "exact"


def test_human_table_without_json():
    proc = clustersim(FSDP)
    assert proc.returncode == 0
    assert "step time" in proc.stdout and "MFU" in proc.stdout and "llama3-8b-fsdp-h100" in proc.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout)


@pytest.mark.parametrize("args, key", [
    (["scenarios/no-such-file.toml"], "scenario"),
    ([FSDP, "--set", "parallel.dp=7"], "parallel"),
    ([FSDP, "--set", "parallel.tensor=2"], "parallel.tensor"),
    ([FSDP, "--set", "dp"], "--set"),
    ([FSDP, "--set", "cluster.gpu=h900"], "cluster.gpu"),
    ([FSDP, "--set", "training.global_batch=32"], "training.global_batch"),
])
def test_invalid_input_exits_2_with_one_line(args, key):
    proc = clustersim(*args, "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"clustersim run: {key}: ")


def test_gpt3_on_8_gpus_does_not_fit_and_warns():
    proc = clustersim("scenarios/gpt3-175b-ptd.toml", "--json", "--set", "cluster.nodes=1",
                      "--set", "parallel.tp=1", "--set", "parallel.pp=1", "--set", "parallel.dp=8",
                      "--set", "parallel.zero=0", "--set", "training.global_batch=8")
    assert proc.returncode == 0
    s = one_json_object(proc.stdout)
    assert s["fits_in_memory"] is False and s["num_gpus"] == 8
    # memory in the unit the A100's capacity is quoted in (80 GiB), the capacity beside it
    assert f"warning: gpt3-175b-ptd needs {s['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU" in proc.stderr
    assert "a100-80gb's 80.0 GiB" in proc.stderr


def test_a_topology_by_its_path_in_topologies_is_the_preset_by_name(fsdp_json, tmp_path):
    """``cluster.topology = "topologies/dgx-h100.toml"``: the repository's file from the
    checkout, the preset the package ships from anywhere else (the folder is the package's
    sim/hardware/topologies); a file that is neither is an input error."""
    by_name = one_json_object(fsdp_json[0].stdout)
    by_path = one_json_object(clustersim(FSDP, "--json", "--set", "cluster.topology=topologies/dgx-h100.toml").stdout)
    elsewhere = subprocess.run([sys.executable, "-m", "sim", "run", str(REPO / FSDP), "--json", "--set",
                                "cluster.topology=topologies/dgx-h100.toml"], capture_output=True, text=True,
                               cwd=tmp_path, env=cli_env(), timeout=300)
    assert elsewhere.returncode == 0, elsewhere.stderr
    for got in (by_path, one_json_object(elsewhere.stdout)):
        assert {**got, "sim_wall_s": 0} == {**by_name, "sim_wall_s": 0}
    shipped = REPO / "sim/hardware/topologies/dgx-h100.toml"  # what a wheel ships: the same file
    assert (REPO / "topologies/dgx-h100.toml").read_bytes() == shipped.read_bytes()
    assert_input_error(clustersim(FSDP, "--set", "cluster.topology=topologies/nope.toml"), "cluster.topology")
