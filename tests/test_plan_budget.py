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
    c = space.enumerate_layouts(space.Space(req.gpus, req.spec.gpus_per_domain, stages.dims.layers,
                                            req.scenario.training.seq_len, stages.dims.experts))
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


def test_a_search_past_the_budget_names_the_flag_that_drives_it():
    few_gpus_huge_batch = inputs.request_of(DENSE_8B, gpus=8, batch_tokens=4096 * 2**24)
    with pytest.raises(InputError) as exc:
        budget.check(few_gpus_huge_batch)
    assert exc.value.key == "--global-batch-tokens" and "--force" in exc.value.reason
    w = budget.estimate(inputs.request_of(DENSE_8B, gpus=1024))
    assert w.seconds < work.BUDGET_S and w.driver in ("--gpus", "--global-batch-tokens")


def test_the_watchdog_stops_an_analytic_phase_past_its_limit():
    from sim.errors import SimulationError
    from sim.plan import search

    req = inputs.request_of(DENSE_8B, gpus=16)
    with pytest.raises(SimulationError, match="still simulating after 0 s of CPU"):
        search(req, budget=0, quiet=True, watchdog_s=0.05)
