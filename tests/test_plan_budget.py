"""The planner's work estimate (sim/plan/budget.py) counts what the search will do without
enumerating it: exactly the layouts the space enumerates, and every schedule replay the
memory rule makes; and a search past the budget is refused naming the flag that drives it
(the CLI refusals, in one line within seconds, are in tests/test_hostile_commands.py)."""

import pytest

from sim.errors import InputError
from sim.parallel import pp as pipeline
from sim.plan import budget, fit, inputs, rules, space
from sim.plan.stages import Stages
from sim import work

from test_plan import SMALL_MOE, TINY

DENSE_8B = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch": 512},
            "cluster": {"topology": "dgx-h100"}}


def _replays(req) -> tuple[int, set]:
    """(layouts enumerated, the (schedule, pp, micro-batches, w_share) replays the memory rule made)."""
    stages = Stages(req.scenario)
    c = space.enumerate_layouts(space.Space.of(req, stages.dims))
    made = set()
    real = pipeline.held_peak

    def recording(schedule, p, m, stage, costs, w_share):
        made.add((schedule, p, m, w_share))
        return real(schedule, p, m, stage, costs, w_share)

    pipeline.held_peak = recording
    try:
        fit.peak(c[rules.codes(c, rules.fixed_of(req.scenario)) == 0], stages, req.scenario)
    finally:
        pipeline.held_peak = real
    return len(c), made


@pytest.mark.parametrize("text,gpus", [(TINY, 8), (TINY, 16), (SMALL_MOE, 8), (SMALL_MOE, 32)])
def test_layouts_and_replays_are_counted_without_enumerating(tmp_path, text, gpus):
    path = tmp_path / "base.toml"
    path.write_text(text)
    req = inputs.request(str(path), gpus, None, None, None, None)
    layouts, made = _replays(req)
    counted, keys = budget.count(req)
    assert counted == layouts
    assert made <= set(keys)  # every replay the rule makes is priced (those of rejected layouts may be too)
    if "moe" not in text:
        assert set(keys) == made


def test_a_dense_model_on_a_node_replays_what_it_counts():
    req = inputs.request_of(DENSE_8B, gpus=16)
    layouts, made = _replays(req)
    counted, keys = budget.count(req)
    assert (counted, set(keys)) == (layouts, made) and made


MLA_8 = {"model": {"layers": 4, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000, "attention": "mla",
                   "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                   "v_head_dim": 64},
          "training": {"seq_len": 1024, "global_batch": 16}, "cluster": {"topology": "dgx-h100"}}


def test_mla_models_also_search_mla_up_proj_and_the_budget_counts_it():
    """An MLA model's space has recompute = "mla_up_proj" (NeMo's DeepSeek-V3 recipe) beside
    none / selective / full, a quarter of its layouts, counted by the budget; a model
    without MLA has none; and the loader takes every such layout the rules pass."""
    from sim.input.choices import Recompute
    from sim.input.load import scenario_from_dict

    req = inputs.request_of(MLA_8, gpus=8)
    stages = Stages(req.scenario)
    c = space.enumerate_layouts(space.Space.of(req, stages.dims))
    assert budget.count(req)[0] == len(c) and (c.recompute == Recompute.MLA_UP_PROJ).mean() == 0.25
    valid = c[(rules.codes(c, rules.fixed_of(req.scenario)) == 0) & (c.recompute == Recompute.MLA_UP_PROJ)]
    for row in valid.iloc[::max(1, len(valid) // 8)].to_dict("records"):
        assert scenario_from_dict(req.data, space.overrides(row)).training.recompute is Recompute.MLA_UP_PROJ
    dense = inputs.request_of(DENSE_8B, gpus=16)
    assert Recompute.MLA_UP_PROJ not in set(space.enumerate_layouts(
        space.Space.of(dense, Stages(dense.scenario).dims)).recompute)


def test_a_search_past_the_budget_names_the_flag_that_drives_it():
    few_gpus_huge_batch = inputs.request_of(DENSE_8B, gpus=8, batch_tokens=4096 * 2**24)
    with pytest.raises(InputError) as exc:
        budget.check(few_gpus_huge_batch)
    assert exc.value.key == "--global-batch-tokens" and "--force" in exc.value.reason
    w = budget.estimate(inputs.request_of(DENSE_8B, gpus=1024))
    assert w.seconds < work.BUDGET_S and w.driver in ("--gpus", "--global-batch-tokens")


def test_the_watchdog_stops_an_analytic_phase_past_its_limit(monkeypatch):
    """The enumeration made to take 0.3 s of CPU first: with the phase's caches warm (earlier
    tests in the same process) the real phase of this small case can finish inside 0.05 s, and
    the watchdog, rightly, never fires (the order-dependent failure of stop 50's last CI)."""
    import time

    from sim.errors import SimulationError
    from sim.plan import driver, search

    real = driver.enumerate_layouts

    def slow(*args, **kwargs):
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "enumerate_layouts", slow)
    req = inputs.request_of(DENSE_8B, gpus=16)
    with pytest.raises(SimulationError, match="still simulating after 0 s of CPU"):
        search(req, budget=0, quiet=True, watchdog_s=0.05)


def test_deepseek_v3s_published_scale_search_is_not_refused():
    """bench/plan.py's DeepSeek-V3 case (2,048 GPUs, mla_up_proj in the space: 1.5 M layouts)
    peaked at 1.5 GB measured (docs/plan.md); the estimate must let it run without --force."""
    req = inputs.request("deepseek-v3", 2048, "dgx-h100", None, 4096, 16777216)
    w = budget.check(req)
    assert w.layouts > 1_400_000 and w.bytes < work.BUDGET_BYTES


def test_each_schedule_is_walked_once_whatever_its_shares_and_priced_so():
    """The memory rule walks a zero-bubble or DualPipe schedule once per (schedule, pp,
    micro-batches, stage) and weighs each ``w_share`` from the cached counts: the budget prices
    the walks the rule makes (each stage once) at STEP_S, not one walk per share."""
    from sim.parallel import pp_zero_bubble as zb

    req = inputs.request_of(MLA_8, gpus=8)  # 26 (schedule, pp, micro-batches, share) replays of 17 schedules
    walks, real = [], zb._kinds
    zb._held_counts.cache_clear()
    zb._kinds = lambda schedule, p, m, stage, costs: walks.append((schedule, p, m, stage)) or real(
        schedule, p, m, stage, costs)
    try:
        _, made = _replays(req)
    finally:
        zb._kinds = real
        zb._held_counts.cache_clear()
    _, keys = budget.count(req)
    schedules = {key[:3] for key in keys}
    assert len(walks) == len(set(walks)) and {w[:3] for w in walks} == schedules
    assert len(made) > len(schedules)  # several shares per schedule: weighed, not walked again
    assert budget.estimate(req).replay_steps == sum(budget._steps(*k) for k in schedules)
