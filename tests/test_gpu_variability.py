"""GPU speed variability (``variability.sigma``, sim/hardware/variability.py): the step runs
at the slowest of its N GPUs, F = 1 + sigma * E[max of N standard normals], on every FLOP.

Run: ``python -m pytest tests/test_gpu_variability.py``.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, assert_refusals, cli_env
from sim.hardware.gpus import gpu_preset
from sim.hardware.variability import expected_max, slowest_of
from sim.input.load import scenario_from_dict
from sim.model.compute import GEMM_EFFICIENCY, ComputeModel, elementwise, gemm
from sim.step import simulate

MODEL = {"layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000, "mlp": "swiglu", "ffn_hidden": 14336}


def scenario(gpus: int = 16, sigma: float = 0.0, tp: int = 2):
    return scenario_from_dict({"model": MODEL, "training": {"seq_len": 4096, "global_batch": 4 * gpus // tp},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": {"tp": tp, "dp": gpus // tp, "zero": 1, "sequence_parallel": tp > 1},
                               "variability": {"sigma": sigma}})


def test_expected_max_closed_forms_and_monte_carlo():
    """E[max] of 1, 2, 3 normals in closed form (0, 1/sqrt(pi), 3/(2 sqrt(pi))); larger N
    against the mean of 4,000 Monte Carlo maxima (its standard error is 0.15-0.5% of it)."""
    assert expected_max(1) == pytest.approx(0, abs=1e-9)
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-6)
    rng = np.random.default_rng(27)
    for n in (16, 256, 2048):
        drawn = np.mean([rng.standard_normal(n).max() for _ in range(4000)])
        assert expected_max(n) == pytest.approx(drawn, rel=0.01), n


def test_slowest_of_is_one_when_off_and_grows_with_gpus_and_sigma():
    assert slowest_of(1, 0.05) == 1.0 and slowest_of(16384, 0.0) == 1.0
    gpus = [2, 8, 64, 256, 1024, 4096, 16384, 65536]
    factors = [slowest_of(n, 0.015) for n in gpus]
    assert all(a < b for a, b in zip(factors, factors[1:]))  # monotone in N
    assert slowest_of(1024, 0.01) < slowest_of(1024, 0.02)  # and in sigma
    # the slowest of N normals grows as sqrt(2 ln N) (to within 10% here): slowly, not linearly in log N
    assert expected_max(16384) / math.sqrt(2 * math.log(16384)) == pytest.approx(0.9, abs=0.1)
    assert slowest_of(16384, 0.015) == pytest.approx(1 + 0.015 * expected_max(16384), rel=1e-12)


def test_compute_model_scales_flop_time_only():
    """Every FLOP-bound kernel takes exactly F times as long; a memory-bound one does not move."""
    base, slow = ComputeModel(gpu_preset("h100-sxm")), ComputeModel(gpu_preset("h100-sxm"), slowdown=1.05)
    k = gemm(8192, 8192, 8192)
    assert slow.flop_time(k) == pytest.approx(1.05 * base.flop_time(k), rel=1e-12)
    assert slow.time([elementwise(1e9)]) == base.time([elementwise(1e9)])


def test_step_equals_the_same_step_on_gpus_slower_by_the_factor():
    """The mechanism is exactly a sustained factor divided by F (so turning it on for every
    row is, per GPU type, a level the global refit absorbs, plus F's growth with N)."""
    s = scenario(16, 0.02)
    f = slowest_of(16, 0.02)
    on = simulate(s)
    assert on.summary["gpu_variability_slowdown"] == pytest.approx(f, rel=1e-12)
    slower = simulate(scenario(16), e_max=GEMM_EFFICIENCY["h100-sxm"] / f)
    assert on.summary["step_time_s"] == pytest.approx(slower.summary["step_time_s"], rel=1e-9)
    clean = simulate(scenario(16))
    assert "gpu_variability_slowdown" not in clean.summary and "straggler_cost_s" not in on.summary
    assert clean.summary["step_time_s"] < on.summary["step_time_s"] < f * clean.summary["step_time_s"]


def test_folding_survives():
    """One factor for every rank: the same few ranks simulated as without it, and about the
    same events (a few more or fewer where longer kernels change what coincides)."""
    on, off = simulate(scenario(256, 0.015)), simulate(scenario(256))
    assert on.facts.simulated_ranks == off.facts.simulated_ranks and len(on.facts.simulated_ranks) < 256
    assert on.summary["sim_events"] == pytest.approx(off.summary["sim_events"], rel=0.01)


def test_bad_values_exit_2_naming_the_key():
    assert_refusals(REPO / "scenarios" / "gpt-1.7b-ptd-interleaved-a100.toml",
                    [(["variability.sigma=0.5"], "variability.sigma"), (["variability.sigma=-0.01"], "variability.sigma"),
                     (["variability.sigma=nan"], "variability.sigma"), (["variability.spread=1"], "variability.spread")])


def test_cli_reports_the_factor_and_the_planner_refuses_it():
    run = subprocess.run([sys.executable, "-m", "sim", "run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml", "--set",
                          "variability.sigma=0.015", "--json"], capture_output=True, text=True, cwd=REPO,
                         env=cli_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["gpu_variability_slowdown"] == pytest.approx(slowest_of(16, 0.015), rel=1e-12)
    plan = subprocess.run([sys.executable, "-m", "sim", "plan", "llama3.1-8b", "--gpus", "8", "--topology", "dgx-h100",
                           "--seq-len", "8192", "--global-batch-tokens", "131072", "--set", "variability.sigma=0.01"], capture_output=True, text=True, cwd=REPO,
                          env=cli_env(), timeout=300)
    assert plan.returncode == 2 and "variability" in plan.stderr and "Traceback" not in plan.stderr
