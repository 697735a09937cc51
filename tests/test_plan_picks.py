"""Why the planner simulated each layout (issue 28): every simulated row says why it was picked
(sim/plan/select.py ``WHY``), the counts add up (simulated + estimated only = evaluated; the
reasons cover every pick), ``--json`` carries them, and a point past its CPU seconds is
stopped, kept as an estimate and counted as stopped (sim/plan/explain.py ``POINT_CPU_S``)."""

import json
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from sim.plan import explain, select

from conftest import REPO, cli_env, small_plan_json
from test_plan import _plan


def _ranked(costs) -> pd.DataFrame:
    return pd.DataFrame({"sim_cost_s": np.asarray(costs, float), "estimate_s": np.arange(1.0, len(costs) + 1)})


def test_front_parts_are_the_front_split_by_why():
    costs = [4.0, 3.0, 4.0, 1.0, 2.0, 1.0, 1.0, 3.0]  # (tests/test_plan_cost.py's case)
    best, cheap = select.front_parts(_ranked(costs), budget=20.0, top_n=2)
    assert best == [0, 1] and cheap == [3, 5, 6, 4]  # the two best estimates, then the cheapest, cheapest first
    assert sorted(best + cheap) == select.front(_ranked(costs), budget=20.0, top_n=2)[0]


def test_every_pick_says_why_and_the_counts_add_up(tmp_path):
    _, plan = _plan(tmp_path, budget=60)
    t = plan.table
    assert set(t.loc[t.simulated, "picked"]) <= set(select.WHY) and (t.loc[t.simulated, "picked"] != "").all()
    assert set(t.loc[t.picked != "", "position"]) == set(plan.picked)  # picks that failed keep their reason too
    assert plan.simulated + (len(t) - plan.simulated) == plan.evaluated
    assert set(plan.picked.values()) >= {"best", "spread"}
    assert len(plan.picked) == plan.simulated + len(plan.failures)  # (no refusals at this size)


def test_json_says_how_many_were_simulated_estimated_and_why():
    out = small_plan_json()
    assert out["estimated_only"] == out["evaluated"] - out["simulated"] and out["stopped"] == 0
    assert set(out["picked"]) == set(select.WHY) and sum(out["picked"].values()) >= out["simulated"] >= 1
    for layout in out["layouts"]:
        assert (layout["picked"] in select.WHY) if layout["simulated"] else layout["picked"] in (None, *select.WHY)


def test_a_point_past_its_cpu_seconds_is_stopped(tmp_path):
    """Every simulation made to spin 5 s of CPU, a limit of 0 s stops each pick at once
    (sim/work.py ``cpu_deadline``, ITIMER_PROF): each keeps its estimate, is counted as stopped, and the search
    still ranks every layout. Run in a fresh process: the sweep pool forks its workers (and so
    carries the patches) only from a single-threaded process, and a pytest-xdist worker has
    execnet's threads alive (sim/sweeps/pool.py ``_Worker``: it spawns there)."""
    script = tmp_path / "stop.py"
    script.write_text(STOP_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, env=cli_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["simulated"] == 0 and out["stopped"] == out["picked"] > 0
    assert out["failures_timed_out"] and not out["table_simulated"] and out["rows"] == out["evaluated"]


STOP_SCRIPT = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, "tests")
from sim import step
from sim.plan import explain
from sim.sweeps.pool import TIMEOUT_PREFIX


def spin(*args, **kwargs):
    start = time.process_time()
    while time.process_time() - start < 5:
        pass
    raise AssertionError("not stopped")


explain.POINT_CPU_S = 0.0
step.simulate = spin
from test_plan import _plan

_, plan = _plan(Path(sys.argv[1]), budget=3)
print(json.dumps({"simulated": plan.simulated, "stopped": plan.stopped, "picked": len(plan.picked),
                  "failures_timed_out": all(e.startswith(TIMEOUT_PREFIX) for e in plan.failures.values()),
                  "table_simulated": bool(plan.table.simulated.any()), "rows": len(plan.table),
                  "evaluated": plan.evaluated}))
"""


def test_cpu_limit_raises_in_the_block_and_clears_its_timer():
    import signal

    start = time.process_time()
    with pytest.raises(explain.CpuLimit):
        with explain.cpu_limit(0.0):
            while time.process_time() - start < 5:
                pass
    assert time.process_time() - start < 0.5  # stopped at once (ITIMER_PROF), not run to the end
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)  # sim/work.py cpu_deadline's timer cleared
