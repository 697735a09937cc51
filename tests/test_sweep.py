"""Sweeps (issue 7): grid syntax, rows, error rows, resume after a kill, process pool and
Dask giving the same rows as one process, the CLI's exit statuses.

Run: ``python -m pytest tests/test_sweep.py``
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings, strategies as st
import pandas as pd
import pytest

from conftest import cli_env, clustersim
import sim
from sim import step
from sim.commands.sweep import parse_grid, parse_values
from sim.errors import InputError
from sim.sweeps.sinks import JOURNAL_SUFFIX
from sim.sweeps.grid import SUMMARY_COLUMNS, TRAILING_COLUMNS, expand, point_key

REPO = Path(__file__).resolve().parent.parent
FSDP = REPO / "scenarios/llama3-8b-fsdp-h100.toml"  # 64 GPUs, ~0.02 s per point
BUBBLES = REPO / "sim/studies/scenarios/pipeline-bubbles.toml"  # 0.2-1 s per point at m = 8..40
GRID = {"training.seq_len": [2048, 4096], "parallel.dp_algo": ["ring", "hierarchical"]}


def without_wall(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["sim_wall_s"]).reset_index(drop=True)


# ---------------------------------------------------------------- grid syntax
def test_values_lists_ranges_and_toml_types():
    assert parse_values("8..64x2") == [8, 16, 32, 64]
    assert parse_values("8..100x2") == [8, 16, 32, 64]  # stops at the last value <= B
    assert parse_values("1..10+3") == [1, 4, 7, 10]
    assert parse_values("0..1+0.25") == [0, 0.25, 0.5, 0.75, 1.0]
    assert parse_values("1..4") == [1, 2, 3, 4]
    assert parse_values("ring, hierarchical") == ["ring", "hierarchical"]
    assert parse_values('1.5,true,"a,b",[1, 2]') == [1.5, True, "a,b", [1, 2]]
    assert parse_grid(["cluster.gpus=8..16384x2"])["cluster.gpus"][-1] == 16384


@pytest.mark.parametrize("spec", ["training.seq_len", "training.seq_len=", "=1,2", "training.seq_len=1,,2",
                                  "training.seq_len=8..4x2", "training.seq_len=8..64x1", "training.seq_len=1..5+0",
                                  "nosuch.key=1,2", "training.seq_len.x=1", "training.seq_len=1..100000000"])
def test_malformed_grid_is_an_input_error(spec):
    with pytest.raises(InputError) as err:
        parse_grid([spec])
    assert str(err.value).startswith("--grid")


def test_a_key_twice_is_an_input_error():
    with pytest.raises(InputError, match="twice"):
        parse_grid(["training.seq_len=1,2", "training.seq_len=3"])


@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 1000), span=st.integers(0, 1000), s=st.integers(1, 50))
def test_arithmetic_range_is_python_range(a, span, s):
    assert parse_values(f"{a}..{a + span}+{s}") == list(range(a, a + span + 1, s))


@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 64), f=st.integers(2, 5), b=st.integers(1, 10**6))
def test_geometric_range_is_every_power_up_to_b(a, f, b):
    values = parse_values(f"{a}..{max(a, b)}x{f}")
    assert values[0] == a and all(y == x * f for x, y in zip(values, values[1:]))
    assert values[-1] <= max(a, b) < values[-1] * f


def test_points_are_the_cartesian_product_and_keys_are_canonical():
    points = expand(GRID)
    assert points == [{"training.seq_len": 2048, "parallel.dp_algo": "ring"},
                      {"training.seq_len": 2048, "parallel.dp_algo": "hierarchical"},
                      {"training.seq_len": 4096, "parallel.dp_algo": "ring"},
                      {"training.seq_len": 4096, "parallel.dp_algo": "hierarchical"}]
    assert point_key({"a.b": 1, "c": "x"}) == point_key({"c": "x", "a.b": 1})
    assert point_key({"a": 1}) != point_key({"a": 1.0})


# ---------------------------------------------------------------- rows
def test_rows_hold_the_overrides_then_every_summary_key(tmp_path, calls):
    out = tmp_path / "s.csv"
    df = sim.sweep(FSDP, {**GRID, "training.global_batch": [64, 32]}, workers=1, out=out, quiet=True)
    assert calls["n"] == 4  # 8 points, 4 invalid (global_batch 32 < dp 64): validated, never simulated
    header = out.read_text().splitlines()[0].split(",")
    assert header == list(GRID) + ["training.global_batch"] + list(SUMMARY_COLUMNS) + list(TRAILING_COLUMNS)
    assert list(df.columns) == header and len(df) == 8
    ok, bad = df[df["error"].isna()], df[df["error"].notna()]
    assert len(ok) == 4 and (ok["num_gpus"] == 64).all() and (ok["comm_bytes_per_gpu.dp"] > 0).all()
    assert (ok["comm_bytes_per_gpu.tp"] == 0).all() and ok["mfu"].between(0.3, 0.7).all()
    assert bad["error"].str.startswith("training.global_batch: batch-size floor").all()
    assert bad["mfu"].isna().all()
    # grid order in the file and the frame; `point` identifies each row
    assert [json.loads(p) for p in df["point"]] == expand({**GRID, "training.global_batch": [64, 32]})


def test_rows_are_deterministic_except_wall_time(tmp_path):
    a = sim.sweep(FSDP, GRID, workers=1, out=tmp_path / "a.csv", quiet=True)
    b = sim.sweep(FSDP, GRID, workers=1, out=tmp_path / "b.csv", quiet=True)
    pd.testing.assert_frame_equal(without_wall(a), without_wall(b))


def test_a_failed_point_carries_its_error_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = step.simulate

    def flaky(scenario, *args, **kwargs):
        if scenario.training.seq_len == 4096 and scenario.parallel.dp_algo == "ring":
            raise ZeroDivisionError("boom")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(step, "simulate", flaky)
    df = sim.sweep(FSDP, GRID, workers=1, out=tmp_path / "f.csv", quiet=True)
    errors = df["error"].tolist()
    assert errors[2] == "internal error: ZeroDivisionError: boom"
    assert pd.isna(errors[0]) and pd.isna(errors[1]) and pd.isna(errors[3])
    assert df["mfu"].notna().sum() == 3


def test_set_overrides_apply_to_every_point_and_belong_to_its_identity():
    df = sim.sweep(FSDP, {"training.seq_len": [2048]}, workers=1, overrides=["parallel.dp_algo=ring"], quiet=True)
    assert df["parallel.dp_algo"].tolist() == ["ring"]
    assert json.loads(df["point"][0]) == {"parallel.dp_algo": "ring", "training.seq_len": 2048}


def test_a_list_of_points_and_a_scenario_dict(calls):
    data = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 2048, "global_batch": 16},
            "cluster": {"topology": "dgx-h100", "gpus": 16}, "parallel": {"dp": 16, "zero": 3}}
    df = sim.sweep(data, [{"cluster.gpus": 8, "parallel.dp": 8}, {"cluster.gpus": 16, "parallel.dp": 16}],
                   workers=1, quiet=True)
    assert df["num_gpus"].tolist() == [8, 16] and calls["n"] == 2


# ---------------------------------------------------------------- resume
def test_resume_after_a_torn_last_line_recomputes_only_that_row(tmp_path, calls):
    out = tmp_path / "r.csv"
    sim.sweep(FSDP, GRID, workers=1, out=out, quiet=True)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    calls["n"] = 0
    df = sim.sweep(FSDP, GRID, workers=1, out=out, quiet=True)
    assert calls["n"] == 1
    after = out.read_text().splitlines(keepends=True)
    assert after[:-1] == lines[:-1]  # byte for byte: nothing rewritten, sim_wall_s unchanged
    assert after[-1].split(",")[:3] == lines[-1].split(",")[:3] and len(df) == 4
    calls["n"] = 0
    sim.sweep(FSDP, GRID, workers=1, out=out, quiet=True)
    assert calls["n"] == 0 and out.read_text().splitlines(keepends=True) == after


def test_error_rows_are_finished_points(tmp_path, calls):
    out = tmp_path / "e.csv"
    grid = {"training.global_batch": [32, 64]}
    sim.sweep(FSDP, grid, workers=1, out=out, quiet=True)
    calls["n"] = 0
    df = sim.sweep(FSDP, grid, workers=1, out=out, quiet=True)
    assert calls["n"] == 0 and df["error"].notna().tolist() == [True, False]


def test_resume_after_killing_the_cli_loses_nothing_and_recomputes_nothing(tmp_path, calls):
    out = tmp_path / "k.csv"
    args = [sys.executable, "-m", "sim", "sweep", str(BUBBLES), "--grid", "training.global_batch=8..40+8",
            "--out", str(out), "--workers", "1", "--quiet"]
    proc = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 3:  # header + 2 rows
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    raw = out.read_bytes()
    done = raw[: raw.rfind(b"\n") + 1].decode().splitlines(keepends=True)  # complete lines only
    finished = len(done) - 1
    assert 2 <= finished < 5, "the sweep should be killed part-way"
    df = sim.sweep(BUBBLES, {"training.global_batch": [8, 16, 24, 32, 40]}, workers=1, out=out, quiet=True)
    assert calls["n"] == 5 - finished
    after = out.read_text().splitlines(keepends=True)
    assert after[: len(done)] == done and len(after) == 6
    assert df["error"].isna().all() and df["training.global_batch"].tolist() == [8, 16, 24, 32, 40]


def test_parquet_resume_from_its_journal(tmp_path, calls):
    out = tmp_path / "p.parquet"
    grid = {"training.seq_len": [2048, 4096, 8192]}
    full = sim.sweep(FSDP, grid, workers=1, out=out, quiet=True)
    assert not out.with_name(out.name + JOURNAL_SUFFIX).exists()  # removed once complete
    records = full.to_dict("records")
    full.iloc[:1].to_parquet(out, index=False)  # the last atomic rewrite before the kill held row 1
    journal = out.with_name(out.name + JOURNAL_SUFFIX)
    journal.write_text(json.dumps(records[1]) + "\n" + json.dumps(records[2])[:40])  # row 3 torn
    calls["n"] = 0
    again = sim.sweep(FSDP, grid, workers=1, out=out, quiet=True)
    assert calls["n"] == 1
    assert again["sim_wall_s"].tolist()[:2] == full["sim_wall_s"].tolist()[:2]  # not recomputed
    pd.testing.assert_frame_equal(without_wall(again), without_wall(full), check_dtype=False)
    pd.testing.assert_frame_equal(without_wall(pd.read_parquet(out)), without_wall(full), check_dtype=False)


# ---------------------------------------------------------------- executors
def test_a_process_pool_gives_the_rows_of_one_process():
    one = sim.sweep(FSDP, GRID, workers=1, quiet=True)
    two = sim.sweep(FSDP, GRID, workers=2, quiet=True)
    pd.testing.assert_frame_equal(without_wall(one), without_wall(two))


def test_dask_gives_the_rows_of_the_local_path(tmp_path):
    from distributed import LocalCluster

    grid = {**GRID, "training.global_batch": [64, 32]}
    local = sim.sweep(FSDP, grid, workers=1, out=tmp_path / "local.csv", quiet=True)
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        remote = sim.sweep(FSDP, grid, dask=cluster.scheduler_address, out=tmp_path / "dask.csv", quiet=True)
    pd.testing.assert_frame_equal(without_wall(local), without_wall(remote))


# ---------------------------------------------------------------- CLI
@pytest.mark.parametrize("grid", ["training.seq_len", "training.seq_len=8..4x2", "nosuch.key=1,2",
                                  "training.seq_len=1,,2"])
def test_cli_bad_grid_exits_2_with_one_line(tmp_path, grid):
    proc = clustersim("sweep", str(FSDP), "--grid", grid, "--out", str(tmp_path / "x.csv"))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("clustersim sweep: --grid") and proc.stdout == ""
    assert not (tmp_path / "x.csv").exists()


def test_cli_bad_out_and_workers_exit_2(tmp_path):
    for extra in (["--out", str(tmp_path / "x.txt")], ["--out", str(tmp_path / "x.csv"), "--workers", "0"]):
        proc = clustersim("sweep", str(FSDP), "--grid", "training.seq_len=2048", *extra)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_cli_sweep_writes_every_row_and_resumes(tmp_path):
    out = tmp_path / "cli.csv"
    args = ("sweep", str(FSDP), "--grid", "training.seq_len=2048,4096", "--grid", "training.global_batch=32,64",
            "--set", "parallel.dp_algo=ring", "--out", str(out), "--workers", "2")
    first = clustersim(*args)
    assert first.returncode == 0, first.stderr
    assert "4 points" in first.stderr and "2 invalid" in first.stderr
    df = pd.read_csv(out)
    assert len(df) == 4 and list(df.columns[:3]) == ["training.seq_len", "training.global_batch", "parallel.dp_algo"]
    second = clustersim(*args)
    assert second.returncode == 0 and "0 simulated, 4 resumed" in second.stderr
