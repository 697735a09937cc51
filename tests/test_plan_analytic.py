"""The planner's analytic phase made cheaper (issues 28, 29) without moving a result: each
shortcut against the walk it replaces, bit for bit.

- ``pp_zero_bubble.held_peak`` reads cumulative counts kept per schedule (one walk, whatever
  ``w_share``): equal to the item-by-item walk on every zero-bubble and DualPipe schedule;
- ``layers.stage_waits`` walks each distinct row of its inputs once: equal to walking every
  row alone, and the whole estimate of a small MoE search (with zero-bubble and DualPipe
  shapes) equal with the shortcut switched off."""

import numpy as np
import pytest

from sim.input.choices import Schedule
from sim.parallel import pp_zero_bubble as zb
from sim.plan import driver, fit, layers
from sim.plan.estimate import Estimator
from sim.plan.stages import Stages

from test_plan import _request, SMALL_MOE


def _walked_peak(schedule, p, m, stage, w_share):
    """held_peak as the item-by-item walk it was."""
    full = pending = top = 0.0
    for kind in zb._kinds(schedule, p, m, stage, zb.EQUAL):
        full += {zb.Kind.F: 1, zb.Kind.B: -1, zb.Kind.I: -1}.get(kind, 0)
        pending += {zb.Kind.I: 1, zb.Kind.W: -1}.get(kind, 0)
        top = max(top, full + w_share * pending)
    return top


@pytest.mark.parametrize("schedule", [Schedule.ZB_H1, Schedule.ZB_H2, Schedule.ZB_V, Schedule.DUALPIPE,
                                      Schedule.DUALPIPEV])
def test_held_peak_is_the_walk_of_its_items(schedule):
    for p, m in ((2, 4), (4, 8), (4, 12), (8, 16), (8, 40)):
        for stage in range(p):
            for w_share in (0.0, 0.1, 1 / 3, 0.4637, 1.0):
                got = zb.held_peak(schedule, p, m, stage, zb.EQUAL, w_share)
                assert type(got) is float and got == _walked_peak(schedule, p, m, stage, w_share)


def test_stage_waits_of_distinct_rows_is_every_rows_own():
    rng = np.random.default_rng(0)
    n, kinds, stages = 60, len(layers.KINDS), 3
    pick = rng.integers(0, 4, n)  # 4 distinct rows, repeated
    base = {name: rng.normal(0, 1e-3, (4, kinds)) for name in layers.PASS_FIELDS}
    for name in ("fwd_sync", "bwd_sync"):
        base[name] = (rng.random((4, kinds)) > 0.5).astype(float)
    base["fwd_m_pre"][1, 0] = -0.0  # 0.0 and -0.0 stay apart
    base["fwd_m_pre"][2, 0] = 0.0
    for v in base.values():  # rows 0 and 3 a hair apart: the GPU time of a pass, 1e-9 s
        v[3] = v[0]
    base["fwd_m_post"][3] += 1e-9
    parts = {k: v[pick] for k, v in base.items()}
    beside = rng.random((4, stages))
    beside[3] = beside[0]
    zero3, beside = (pick == 1).astype(float), beside[pick] * 1e-3
    counts = rng.integers(1, 3, (stages, kinds)).astype(float)
    together = layers.stage_waits(counts, parts, zero3, beside)
    alone = np.vstack([layers.stage_waits(counts, {k: v[i:i + 1] for k, v in parts.items()}, zero3[i:i + 1],
                                          beside[i:i + 1]) for i in range(n)])
    assert layers.distinct_rows([*parts.values(), zero3[:, None], beside]) is not None
    assert np.array_equal(together.view(np.uint64), alone.view(np.uint64))


def test_the_estimate_of_a_small_moe_search_is_the_row_by_row_one(tmp_path, monkeypatch):
    req = _request(tmp_path, SMALL_MOE, overrides=["training.global_batch=64"])
    stages = Stages(req.scenario)
    _, _, valid = driver._valid(req, stages, fit.HEADROOM)
    assert set(valid["schedule"]) >= {Schedule.ZB_H1, Schedule.DUALPIPE}
    real, used = layers.distinct_rows, []
    monkeypatch.setattr(layers, "distinct_rows", lambda columns: used.append(real(columns)) or used[-1])
    fast = Estimator(req.scenario, stages, req.spec, req.gpu).frame(valid)
    assert any(u is not None for u in used)  # the shortcut ran
    monkeypatch.setattr(layers, "distinct_rows", lambda columns: None)
    slow = Estimator(req.scenario, Stages(req.scenario), req.spec, req.gpu).frame(valid)
    assert fast.columns.equals(slow.columns)
    assert np.array_equal(fast.to_numpy().view(np.uint64), slow.to_numpy().view(np.uint64))
