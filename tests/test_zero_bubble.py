"""Zero-bubble and DualPipe schedules against the papers' closed forms.

- The schedules themselves (:func:`sim.parallel.pp_zero_bubble.steps`) replayed with unit
  times F = B = W = 1 by a tiny independent replay here: ZB-H1's bubble (p-1)(F+B-W)
  (Qi et al., ICLR 2024, section 2.1, one third of 1F1B's (p-1)(F+B+W)); DualPipe's and
  DualPipeV's (PP/2-1)(F&B+B-3W) with B a whole backward (DeepSeek-V3 report Table 2;
  deepseek-ai/DualPipe README, PP the number of stages); peak activations per rank 1F1B's p
  for ZB-H1 and ZB-V (2p half-stage chunks), 2p-1 for ZB-H2, PP+1 for DualPipe(V).
- The simulator, op by op: ZB-H1's idle per rank equals (p-1)(F+B-W) with F, B, W the
  measured pass times; DualPipe's equals the replay's with the measured times.

Run: ``python -m pytest tests/test_zero_bubble.py``
"""

import numpy as np
import pytest

from conftest import assert_input_error, clustersim

from sim.input.load import scenario_from_dict
from sim.outputs.metrics import rank_times
from sim.parallel.pp_zero_bubble import EQUAL, Kind, peaks, stage_of, steps, virtual_stage
from sim.parallel.memory import stage_memory
from sim.parallel.workload import make_context
from sim.step import simulate


def replay(schedule, p, m, f=1.0, b=1.0, w=1.0, built_for=EQUAL):
    """Idle time of each rank over the makespan, every rank running its steps (the list
    schedules built for times ``built_for``) in order; a pair step costs F + B + W (no overlap)."""
    stages = 2 * p if schedule in ("zb-v", "dualpipev") else p
    cost = {Kind.F: f, Kind.B: b + w, Kind.I: b, Kind.W: w}
    orders, done = [list(steps(schedule, p, m, s, built_for)) for s in range(p)], {}
    clock, idx, busy = [0.0] * p, [0] * p, [0.0] * p

    def needs(s, kind, mb, c):
        vs = virtual_stage(schedule, p, s, c)
        if kind is Kind.F:
            return [("F", mb, vs - 1)] if vs else []
        if kind is Kind.W:
            return [("B", mb, vs)]
        return [("B", mb, vs + 1)] if vs < stages - 1 else [("F", mb, vs)]

    moved = True
    while moved:
        moved = False
        for s in range(p):
            while idx[s] < len(orders[s]):
                step = orders[s][idx[s]]
                deps = [d for item in step for d in needs(s, *item)]
                if any(d not in done for d in deps):
                    break
                end = max([clock[s]] + [done[d] for d in deps]) + sum(cost[k] for k, _, _ in step)
                busy[s] += end - max([clock[s]] + [done[d] for d in deps])
                clock[s] = end
                for kind, mb, c in step:
                    done["F" if kind is Kind.F else "W" if kind is Kind.W else "B", mb,
                         virtual_stage(schedule, p, s, c)] = end
                idx[s] += 1
                moved = True
    assert idx == [len(o) for o in orders], "the schedule deadlocks"
    return [max(clock) - x for x in busy]


@pytest.mark.parametrize("p, m", [(4, 8), (4, 12), (8, 16), (8, 24)])
def test_zb_h1_bubble_is_a_third_of_1f1b(p, m):
    assert replay("zb-h1", p, m) == pytest.approx([(p - 1) * (1 + 1 - 1)] * p)
    assert replay("zb-h1", p, m, 1.0, 1.2, 0.8) == pytest.approx([(p - 1) * (1 + 1.2 - 0.8)] * p)
    assert [peaks("zb-h1", p, m, s)[0] for s in range(p)] == [p] * p  # 1F1B's peak, on every rank


@pytest.mark.parametrize("p, m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_dualpipe_bubble_and_memory_match_deepseek_table_2(p, m):
    whole, fb = 2.0, 3.0  # B = B_input + W; F&B = F + B (no overlap in the replay)
    assert replay("dualpipe", p, m) == pytest.approx([(p / 2 - 1) * (fb + whole - 3)] * p)
    assert [peaks("dualpipe", p, m, s)[0] for s in range(p)] == [p + 1] * p
    stages = 2 * p  # DualPipeV: the same table with PP = 2p stages on p ranks
    assert replay("dualpipev", p, m) == pytest.approx([(stages / 2 - 1) * (fb + whole - 3)] * p)
    assert [peaks("dualpipev", p, m, s)[0] for s in range(p)] == [stages + 1] * p


@pytest.mark.parametrize("p, m", [(4, 8), (8, 16)])
def test_zb_h2_holds_2p_minus_1_and_zb_v_holds_1f1b_memory(p, m):
    assert max(peaks("zb-h2", p, m, s)[0] for s in range(p)) == 2 * p - 1
    assert max(peaks("zb-v", p, m, s)[0] for s in range(p)) == 2 * p  # chunks of half a stage
    assert max(replay("zb-h2", p, m)) <= max(replay("zb-h1", p, m))
    assert max(replay("zb-v", p, m)) < 2 * max(replay("zb-h1", p, m))  # in chunk units (half a stage)


def test_placement_of_v_and_dualpipe():
    p = 4
    assert [virtual_stage("zb-v", p, s, 1) for s in range(p)] == [7, 6, 5, 4]
    assert [virtual_stage("dualpipe", p, s, 1) for s in range(p)] == [3, 2, 1, 0]
    assert [stage_of("dualpipe", p, vs, 1) for vs in range(p)] == [3, 2, 1, 0]
    assert [stage_of("dualpipev", p, vs, 0) for vs in range(2 * p)] == [0, 1, 2, 3, 3, 2, 1, 0]


# --- the simulator, op by op ----------------------------------------------------------

def scenario(p, m, schedule, layers=None, **parallel):
    """GEMM-dominated layers (hidden 4096, sequence 2048) so B and W are alike."""
    return scenario_from_dict({"model": {"layers": layers or 2 * p, "hidden": 4096, "heads": 32, "vocab": 128},
                               "training": {"seq_len": 2048, "global_batch": m},
                               "cluster": {"topology": "dgx-h100", "gpus": p},
                               "parallel": {"pp": p, "schedule": schedule, **parallel}})


def pass_times(result, rank=1, mb=1):
    """(F, B, W) compute seconds of one micro-batch's passes on ``rank``."""
    sp = result.spans
    c = sp[(sp.category == "compute") & (sp["rank"] == rank) & (sp.micro_batch == mb)]
    dur = (c.end_s - c.start_s).to_numpy()
    wgrad = c.name.str.endswith("_wgrad").to_numpy()
    bwd = c.name.str.contains("_bwd").to_numpy() & ~wgrad
    return dur[~bwd & ~wgrad].sum(), dur[bwd].sum(), dur[wgrad].sum()


def idle(result):
    return rank_times(result.spans, result.summary["step_time_s"]).idle_s.to_numpy()


def test_simulated_zb_h1_bubble_is_the_papers_expression():
    p, m = 4, 8
    zb = simulate(scenario(p, m, "zb-h1"))
    f, b, w = pass_times(zb)
    assert w > 0.5 * b  # the weight gradients really are split off
    assert idle(zb) == pytest.approx(np.full(p, (p - 1) * (f + b - w)), rel=0.06)
    plain = simulate(scenario(p, m, "1f1b"))
    f1, b1, w1 = pass_times(plain)
    assert w1 == 0 and b1 == pytest.approx(b + w, rel=1e-6)  # 1F1B: one whole backward
    assert idle(plain) == pytest.approx(np.full(p, (p - 1) * (f + b + w)), rel=0.03)


def test_simulated_dualpipe_idles_as_its_schedule_replayed():
    p, m = 4, 8
    result = simulate(scenario(p, m, "dualpipe"))
    f, b, w = pass_times(simulate(scenario(p, m, "zb-h1")))
    expected = np.array(replay("dualpipe", p, m, f, b, w))
    # the replay starts a pair when both inputs are there; op by op, the pair's forward
    # pieces may start before the backward's gradient arrives: never more idle, at most 20% less
    assert (idle(result) <= expected * 1.02).all() and (idle(result) >= expected * 0.8).all()
    assert result.summary["bubble_fraction"] < simulate(scenario(p, m, "1f1b")).summary["bubble_fraction"] / 2


def test_dualpipe_holds_two_parameter_copies_and_pp_plus_1_activations():
    p, m = 4, 8
    one, two = (make_context(scenario(p, m, s), [], "h100-sxm") for s in ("1f1b", "dualpipe"))
    for stage in range(p):
        a, b = stage_memory(one, stage), stage_memory(two, stage)
        assert b.weights == pytest.approx(2 * a.weights, rel=0.02)


def test_peak_activations_per_rank_as_the_tables_give_them():
    """The fullest rank's activations relative to 1F1B's (p micro-batches on stage 0): ZB-H1
    and ZB-V 1x (Qi et al. 2024), ZB-H2 (2p-1)/p, DualPipe (PP+1)/PP with PP = p,
    DualPipeV (PP+1)/PP with PP = 2p half-size stages (DeepSeek-V3 report Table 2)."""
    p, m = 4, 8
    peak = {s: max(stage_memory(make_context(scenario(p, m, s, layers=4 * p), [], "h100-sxm"), st).activations
                   for st in range(p)) for s in ("1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe", "dualpipev")}
    ratio = {s: v / peak["1f1b"] for s, v in peak.items()}
    assert ratio == pytest.approx({"1f1b": 1, "zb-h1": 1, "zb-h2": (2 * p - 1) / p, "zb-v": 1,
                                   "dualpipe": (p + 1) / p, "dualpipev": (2 * p + 1) / (2 * p)}, rel=0.01)


@pytest.mark.parametrize("schedule, overrides, key", [
    ("zb-h1", {"pp": 1}, "parallel.pp"),
    ("dualpipe", {"pp": 3, "layers": 6}, "parallel.pp"),
    ("zb-h2", {"virtual_stages": 2}, "parallel.virtual_stages"),
    ("zb-v", {"virtual_stages": 3, "layers": 24}, "parallel.virtual_stages"),
    ("dualpipe", {"m": 6}, "training.global_batch"),
    ("dualpipe", {"m": 9}, "training.global_batch"),
    ("dualpipev", {"m": 7}, "training.global_batch"),
    ("zb-h1", {"zero": 3, "dp": 2}, "parallel.zero"),
])
def test_combinations_a_schedule_cannot_run_exit_2(schedule, overrides, key, tmp_path):
    p = overrides.get("pp", 4)
    dp = overrides.get("dp", 1)
    text = (f'[model]\nlayers = {overrides.get("layers", 8)}\nhidden = 1024\nheads = 8\nvocab = 128\n'
            f'[training]\nseq_len = 1024\nglobal_batch = {overrides.get("m", 8) * dp}\n'
            f'[cluster]\ntopology = "dgx-h100"\ngpus = {p * dp}\n'
            f'[parallel]\npp = {p}\ndp = {dp}\nschedule = "{schedule}"\n'
            f'virtual_stages = {overrides.get("virtual_stages", 1)}\nzero = {overrides.get("zero", 0)}\n')
    path = tmp_path / "s.toml"
    path.write_text(text)
    assert_input_error(clustersim("run", str(path)), key)
