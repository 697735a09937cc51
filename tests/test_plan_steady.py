"""The planner simulates its picks in steady-state mode where they qualify (issue 28,
sim/plan/inputs.py): the extrapolated step time is the exact step's (sim/steady.py's own
linearity check; within 1e-9 here), the table says which rows were extrapolated, the
predictor prices the few runs, and ``--set simulation.micro_batches=all`` simulates every
micro-batch as before."""

import pytest

from sim.input.choices import MicroBatches
from sim.input.load import scenario_from_dict
from sim.parallel import steady
from sim.plan import cost, driver, explain
from sim.plan.space import overrides
from sim import step

from conftest import clustersim
from test_plan import SMALL_MOE, _request

MANY = SMALL_MOE.replace("global_batch = 8", "global_batch = 256")  # 32-256 micro-batches a pipeline


def test_the_planner_defaults_to_steady_and_all_is_exact(tmp_path):
    req = _request(tmp_path, MANY)
    plan = driver.search(req, top=5, budget=10, workers=1, quiet=True)
    assert req.scenario.simulation.micro_batches is MicroBatches.STEADY
    sims = plan.table[plan.table["simulated"]]
    assert not plan.table.loc[~plan.table["simulated"], "extrapolated"].any()
    extrapolated = sims[sims["extrapolated"]]
    assert len(extrapolated) >= 3  # (256 sequences: every pick's three runs are at most half its micro-batches)
    # the extrapolated step is the exact step
    for _, row in extrapolated.head(3).iterrows():
        s = steady.exact_copy(scenario_from_dict(req.data, overrides(row)))
        assert step.simulate(s).summary["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)
    # ``--set simulation.micro_batches=all``: every micro-batch, priced so
    exact = _request(tmp_path, MANY, overrides=["simulation.micro_batches=all"])
    assert exact.scenario.simulation.micro_batches is MicroBatches.ALL
    c = sims.assign(micro=256 // (sims["dp"] * sims["micro_batch"]))
    micro, runs = cost.simulated_micro_batches(c, exact.scenario)
    assert (micro == c["micro"]).all() and (runs == 1).all()
    micro, runs = cost.simulated_micro_batches(c, req.scenario)  # the steady runs where they were extrapolated
    ext = sims["extrapolated"].to_numpy()
    assert (micro[ext] < c["micro"].to_numpy()[ext]).all() and (runs[ext] == steady.COUNTS).all()


def test_an_extrapolated_rows_breakdown_adds_up_to_its_step(tmp_path):
    req = _request(tmp_path, MANY)
    point = {**overrides({"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 2, "expert_tp": 1, "virtual_stages": 1,
                          "schedule": "1f1b", "zero": 1, "recompute": "none", "micro_batch": 1,
                          "tp_comm_overlap": False, "ep_comm_overlap": False})}
    s = scenario_from_dict(req.data, point)
    assert steady.counts(s).eligible
    result = step.simulate(s)
    assert result.summary["extrapolated"] and result.shown is not None
    crit = explain.step_breakdown(result)
    total = crit["compute"] + crit["exposed_comm"] + crit["idle"]
    assert total == pytest.approx(result.summary["step_time_s"], rel=1e-9)
    # the shown run's own breakdown would not add up to the extrapolated step
    shown = explain.breakdown(result.shown.spans, result.shown.summary["step_time_s"])
    assert shown["compute"] + shown["exposed_comm"] + shown["idle"] < 0.9 * result.summary["step_time_s"]


def test_cli_table_and_out_say_which_steps_were_extrapolated(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(SMALL_MOE.replace("global_batch = 8", "global_batch = 1024"))  # (>= 32 micro-batches: all qualify)
    out = tmp_path / "plan.csv"  # (one search: the table on stdout, every layout in --out)
    proc = clustersim("plan", str(base), "--budget", "4", "--workers", "1", "--top", "5", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert " steady" in proc.stdout
    import pandas as pd
    table = pd.read_csv(out)
    assert table["extrapolated"].dtype == bool
    assert table["extrapolated"].any() and not table.loc[~table["simulated"], "extrapolated"].any()
