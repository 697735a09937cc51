"""The planner's cheaper simulations (issue 28): a worker checks a point's work once and
reuses its cluster's topology (the same rows as a fresh build), the front leaves a layout
predicted at more than :data:`sim.plan.select.CHEAP` x the cheapest to its estimate and
takes more picks as the budget grows, and the all-to-all term of the cost predictor grows
with the pairs of ranks it puts on the network.

How a search can differ from the selection before it: with a budget of 40 s or less and no
pick past the cap, the picks are the same; otherwise the front is longer (more of the best
estimates simulated) and skips the costly ones, so the simulated set changes, rows simulated
by both searches are equal, and the best simulated of a superset is at least as fast."""

import numpy as np
import pandas as pd
import pytest

from sim.input.load import scenario_from_dict
from sim.plan import cost, explain, select
from sim.plan.layers import KINDS
from sim.plan.stages import Split

from test_plan import _plan, _request, SMALL_MOE


def _ranked(costs, estimates=None) -> pd.DataFrame:
    est = np.arange(1.0, len(costs) + 1) if estimates is None else np.asarray(estimates, float)
    return pd.DataFrame({"sim_cost_s": np.asarray(costs, float), "estimate_s": est})


def test_front_skips_what_costs_more_than_cheap_times_the_cheapest():
    costs = [9.0, 1.0, 8.0, 8.5, 2.0, 1.0]  # cheapest 1: the cap is CHEAP x 1 = 8
    picked, skipped = select.front(_ranked(costs), budget=100.0, top_n=16)
    assert picked == [1, 2, 4, 5] and skipped == [0, 3]


def test_the_cap_is_measured_among_the_near_best_not_the_whole_search():
    """A trivial layout far down the estimate order (0.01 s) must not price the near-best
    (1 s each) out of the front: the cap is CHEAP x the cheapest of the WIDEN x front_size best
    estimates (docs/plan.md: the dense H100 searches simulated from the 3,398th estimate on)."""
    size = select.front_size(20.0, 4)  # 8 picks; the near-best window: WIDEN x 8 = 24
    costs = np.r_[np.ones(select.WIDEN * size), np.full(100, 0.5), [0.01]]
    assert select.cost_floor(costs, size) == 1.0
    picked, skipped = select.front(_ranked(costs), budget=20.0, top_n=4)
    assert picked[:4] == [0, 1, 2, 3] and skipped == []
    ranked = _ranked(costs, np.r_[np.arange(1.0, len(costs)), [0.5]])
    assert select.contenders(ranked, {5: 10.0}, budget=20.0, top_n=4)[:2] == [0, 1]


def test_front_fits_the_budget_share_and_grows_with_the_budget():
    costs = np.ones(500)
    assert select.front_size(40.0, 16) == 16 and select.front_size(240.0, 16) == 96 and select.front_size(10.0, 5) == 5
    picked, _ = select.front(_ranked(costs), budget=240.0, top_n=16)
    assert picked == list(range(96))  # 96 x 1 s fits 0.7 x 240 s
    picked, _ = select.front(_ranked(costs), budget=20.0, top_n=16)
    assert picked == list(range(14))  # 0.7 x 20 s: 14 picks of 1 s


def test_contenders_skip_what_the_front_would_skip():
    ranked = _ranked([1.0, 1.0, 50.0, 1.0], [1.0, 0.9, 0.9, 0.95])  # all three beat the simulated one, scaled
    assert select.contenders(ranked, {0: 10.0}, budget=1000.0, top_n=5) == [1, 3]


def test_alltoall_term_grows_with_the_pairs_it_puts_on_the_network(tmp_path):
    """Closed form: the cross-domain all-to-all pairs of a candidate, ep 16 and 32 (tp 1, a
    stage of 2,048 ranks): all-to-alls x ranks x (ep - 1); in the domain (ep 8) none."""
    s = _request(tmp_path, SMALL_MOE, overrides=["model.moe.routing=uniform"]).scenario  # (even loads: folded)
    c = pd.DataFrame({"tp": [1, 1, 1], "cp": [2, 2, 2], "dp": [1024] * 3, "ep": [16, 32, 8], "expert_tp": [1, 1, 1],
                      "pp": [1, 1, 1], "virtual_stages": [1, 1, 1], "zero": [1, 1, 1], "micro": [4, 4, 4],
                      "schedule": ["1f1b"] * 3, "ep_comm_overlap": [False] * 3})
    layer = np.zeros((3, len(KINDS), len(cost.COUNTS)))
    layer[:, KINDS.index("moe"), cost.COUNTS.index("ep")] = 4  # four all-to-alls a MoE layer
    split = Split(*(np.array([n]) for n in (10.0, 0, 10, 1, 1, 0)))  # 10 MoE layers
    _, _, _, pairs, ranks = cost.counts(c, None, s, 8, layer, split)
    assert list(ranks) == [2048] * 3
    assert list(pairs) == [4 * 4 * 10 * 2048 * 15, 4 * 4 * 10 * 2048 * 31, 0]
    # (1.3e-8 a pair: the refit to 30 steady-mode points, sim/plan/cost.py)
    assert cost.SECONDS_PER_A2A_PAIR * (pairs[1] - pairs[0]) == pytest.approx(1.3e-8 * 4 * 4 * 10 * 2048 * 16)


def test_a_reused_topology_gives_the_same_rows(tmp_path):
    req = _request(tmp_path, SMALL_MOE)
    points = [{"parallel.dp": 8, "parallel.ep": 4}, {"parallel.tp": 2, "parallel.dp": 4, "parallel.sequence_parallel": True},
              {"parallel.pp": 2, "parallel.dp": 4}, {"parallel.dp": 8, "parallel.ep": 4}]
    drop = ["sim_wall_s", explain.CPU]  # (timings)
    fresh, reused = [], []
    for p in points:
        explain._TOPOLOGY.clear()  # a fresh build for every point
        fresh.append(explain.simulate_point(scenario_from_dict(req.data, p)))
    first = explain.topology_of(scenario_from_dict(req.data, points[0]))
    for p in points:
        reused.append(explain.simulate_point(scenario_from_dict(req.data, p)))
    assert explain.topology_of(scenario_from_dict(req.data, points[0])) is first  # one build, reused
    for (a, ea), (b, eb) in zip(fresh, reused):
        assert ea is None and eb is None
        assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


@pytest.mark.parametrize("budget", [30, 60])
def test_small_case_ranking_is_the_old_selections_or_a_superset(tmp_path, monkeypatch, budget):
    """The small MoE case planned with the old front (no cap, 16 picks: CHEAP and FRONT_PER_S
    off) and with the new one: at 30 s the same table; at 60 s the new search simulates a
    superset, equal where both simulated, and its best is at least as fast."""
    _, new = _plan(tmp_path, budget=budget)
    monkeypatch.setattr(select, "CHEAP", np.inf)
    monkeypatch.setattr(select, "FRONT_PER_S", 0.0)
    monkeypatch.setattr(select, "WIDEN", 1)
    _, old = _plan(tmp_path, budget=budget)
    cols = [k for k in new.table.columns if k not in ("sim_wall_s", "sim_cpu_s")]
    sim_new = new.table[new.table.simulated].set_index("position")
    sim_old = old.table[old.table.simulated].set_index("position")
    assert set(sim_old.index) <= set(sim_new.index)
    pd.testing.assert_series_equal(sim_new.loc[sim_old.index, "step_time_s"], sim_old["step_time_s"])
    assert sim_new["step_time_s"].min() <= sim_old["step_time_s"].min()
    if budget <= 40:
        pd.testing.assert_frame_equal(new.table[cols], old.table[cols])
    else:
        assert len(sim_new) > len(sim_old)
