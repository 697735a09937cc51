"""The RL loop (sim/rl): closed forms, staleness bounds, the decode model against published
runs, the trainer's step line, time accounting, and the command line.

Run ``python -m pytest tests/test_rl.py``.
"""

import json
import math

from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np
import pytest

from sim.errors import InputError
from sim.input.load import scenario_from_dict
from sim.rl import lengths as length_model
from sim.rl import validation
from sim.rl.inference import DECODE_HBM_EFFICIENCY, EngineCost
from sim.rl.run import simulate_rl
from sim.rl.summary import engine_times
from sim.rl.trainer import pool_scenario
from tests.conftest import assert_input_error, clustersim

RL_SCENARIO = "scenarios/rl-llama3-8b-h100.toml"
TINY_MODEL = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 1024, "vocab": 1024,
              "mlp": "swiglu"}


def tiny(engines: int = 2, batch: int = 16, **rl):
    """A small model on 2 trainer GPUs and ``engines`` one-GPU engines: runs in milliseconds."""
    lengths = rl.pop("lengths", {})
    return scenario_from_dict({
        "name": "rl-tiny", "seed": rl.pop("seed", 0), "model": TINY_MODEL,
        "training": {"seq_len": 4096, "global_batch": batch},
        "cluster": {"topology": "dgx-h100", "gpus": 2 + engines}, "parallel": {"dp": 2},
        "rl": {"trainer_gpus": 2, "generator_gpus": engines, "steps": 8, "prompt_tokens": 64, **rl,
               "lengths": {"mean": 200, "sigma": 100, "max": 1024, **lengths}}})


def decode_bound_limit(slots: int) -> EngineCost:
    """An engine whose every step (prefill or decode) takes 1 ms whatever it holds: weights
    dominate, KV reads and compute vanish (the decode-bound limit)."""
    return EngineCost(tp=1, layers=1, hidden=1, weight_bytes=1e9, kv_bytes=0.0, flops_token=0.0, attn_flops=0.0,
                      hbm_bw=1e12, peak=1e15, e_max=0.7, slots=slots, eta=1.0, h2d_bw=1e12)


# --- response lengths -----------------------------------------------------------------------

def test_lengths_follow_their_distribution_and_grow():
    lengths = tiny().rl.lengths.model_copy(update={"growth": 0.05})
    for step in (0, 10):
        draws = np.concatenate([length_model.draw(lengths, 0, b, 1000, step=step) for b in range(40)])
        assert draws.min() >= 1 and draws.max() <= lengths.max
        assert draws.mean() == pytest.approx(length_model.expected(lengths, step), rel=0.01)
        assert (draws == lengths.max).mean() == pytest.approx(1 - length_model.cdf(lengths, step, lengths.max - 1),
                                                              abs=0.003)
    assert length_model.expected(lengths, 10) > 1.5 * length_model.expected(lengths, 0)  # 1.05^10 = 1.63, capped


def test_every_mode_sees_the_same_responses():
    a = simulate_rl(tiny(mode="sync")).loop.prompts.lengths
    b = simulate_rl(tiny(mode="pipeline")).loop.prompts.lengths
    assert all(np.array_equal(a[j], b[j]) for j in a if j in b)


# --- the synchronous closed form ----------------------------------------------------------------

def test_sync_utilization_is_the_closed_form_in_the_decode_bound_limit():
    """n sequences per engine start together; the engine works until the longest ends:
    batches are E[sum L] / (n E[max L]) full (Monte Carlo within 1%)."""
    n, engines = 8, 4
    s = tiny(engines=engines, batch=n * engines, mode="sync", steps=1200, max_seqs=n,
             lengths={"mean": 20, "sigma": 12, "max": 80})
    result = simulate_rl(s, costs=[decode_bound_limit(n)] * engines)
    closed = length_model.expected(s.rl.lengths, 0) / length_model.expected_max(s.rl.lengths, 0, n)
    assert result.summary["generating_utilization"] == pytest.approx(closed, rel=0.01)
    assert closed < 0.6  # the stragglers cost: not a trivially full batch


# --- staleness bounds ------------------------------------------------------------------------------

def trained(result) -> list:
    return [q for q in result.loop.prompts.all if q.trained_at >= 0]


def test_sync_trains_on_its_own_weights():
    r = simulate_rl(tiny(mode="sync"))
    assert r.summary["max_staleness_steps"] == 0
    assert all(set(q.versions) == {q.trained_at} for q in trained(r))


RUNS = dict(k=st.integers(0, 3), engines=st.integers(1, 3), per_engine=st.integers(1, 6),
            sigma=st.floats(0, 400), seed=st.integers(0, 1000))
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(**RUNS)
def test_async_staleness_never_exceeds_k(k, engines, per_engine, sigma, seed):
    r = simulate_rl(tiny(engines, engines * per_engine, mode="async", max_staleness=k, seed=seed,
                         lengths={"sigma": sigma}))
    for q in trained(r):
        (version,) = q.versions  # no swap inside a sequence
        assert 0 <= q.trained_at - version <= k
    assert r.summary["max_staleness_steps"] <= k


@FAST
@given(**RUNS)
def test_pipeline_lag_is_bounded_by_k_plus_the_updates_a_sequence_lived_through(k, engines, per_engine, sigma,
                                                                                    seed):
    """docs/rl.md: a sequence finished on weights v_end is trained at step n <= v_end + k
    (the gate admits fewer than B(v_end + k + 1) sequences by then), so a token made with
    weights v lags n - v <= k + (v_end - v); the last token lags at most k."""
    r = simulate_rl(tiny(engines, engines * per_engine, mode="pipeline", max_staleness=k, seed=seed,
                         lengths={"sigma": sigma}))
    for q in trained(r):
        v_end = max(q.versions)
        assert 0 <= q.trained_at - v_end <= k
        assert all(q.trained_at - v <= k + (v_end - v) for v in q.versions)


def test_the_toy_trainer_is_host_bound():
    """Why the toy's step is ~4x its free-host step (0.86 -> 3.35 ms): every op of rank 0
    starts the moment its host has issued it (sim/model/host.py's costs, summed in program
    order: RankProgram.release), so the step is the host's issue time plus the last op."""
    from sim.step import build, build_topology, simulate

    s = pool_scenario(tiny(), 1, 8)
    _ctx, programs = build(s, build_topology(s))
    released = np.asarray(programs[0].release())
    spans = simulate(s).spans
    rank0 = spans[spans["rank"] == 0]
    assert len(rank0) == len(released)
    np.testing.assert_allclose(rank0["start_s"], released, rtol=1e-9, atol=1e-12)
    assert rank0["end_s"].max() == pytest.approx(released[-1] + rank0["end_s"].iloc[-1] - rank0["start_s"].iloc[-1])


def test_pipeline_swaps_weights_inside_sequences():
    """Weights arrive inside a sequence only if a training step ends while it runs: the toy
    trainer is host-bound (3.35 ms a step: test_the_toy_trainer_is_host_bound), the toy engine
    decodes a token in ~3 us, so responses run up to 4,000 tokens (at most 1,024 were all
    done within a step, and no weights arrived inside one)."""
    r = simulate_rl(tiny(mode="pipeline", max_staleness=1, lengths={"mean": 1000, "sigma": 1500, "max": 4000}))
    cost, longest = r.loop.generators[0].cost, max(q.length for q in trained(r))
    # (the premise: the longest response, even decoded alone, outlasts the shortest step)
    assert cost.decode_span(1, r.scenario.rl.prompt_tokens, longest) > min(st.end - st.start for st in r.loop.steps)
    assert any(len(q.versions) > 1 for q in trained(r))
    assert r.summary["max_staleness_steps"] > 1  # k = 1, plus the updates a long sequence lived through


# --- accounting, the trainer, the decode model ---------------------------------------------------

@pytest.mark.parametrize("mode", ["sync", "async", "pipeline"])
def test_engine_time_is_useful_plus_tail_plus_idle_plus_weights(mode):
    r = simulate_rl(tiny(mode=mode, **({} if mode == "sync" else {"max_staleness": 1})))
    wall = r.summary["wall_s"]
    for g in r.loop.generators:
        assert sum(engine_times(g, wall).values()) == pytest.approx(wall, rel=1e-9)
    s = r.summary
    parts = s["generator_utilization"] + s["long_tail_fraction"] + s["generator_idle_fraction"]
    assert parts + s["generator_weights_fraction"] == pytest.approx(1.0, rel=1e-9)


def test_trainer_step_time_off_its_line_matches_its_own_simulation():
    from sim.step import simulate

    r = simulate_rl(tiny(mode="sync", lengths={"growth": 0.1}))
    trainer = r.loop.trainer
    anchors = sorted(trainer.anchors)
    other = anchors[-1] + 3
    direct = simulate(pool_scenario(r.scenario, other, 8)).summary["step_time_s"]
    assert trainer.step_time(other) == pytest.approx(direct, rel=1e-9)
    assert trainer.micro_batches(4096 * 2 * 5) == 5  # 10 rows of 4,096 tokens over dp = 2


def test_decode_span_is_the_sum_of_its_steps():
    cost = validation.row_cost(validation.rows()[1])
    for b, ctx, k in ((1, 100, 50), (64, 30_000, 300), (256, 10, 7)):
        steps = sum(cost.decode_step(b, ctx + i * b) for i in range(k))
        assert cost.decode_span(b, ctx, k) == pytest.approx(steps, rel=1e-12)
        assert cost.steps_within(b, ctx, cost.decode_span(b, ctx, k // 2) + 1e-9, k) == k // 2


def test_decode_steps_match_published_vllm_runs_within_15_percent():
    """Llama 3 8B (1 H100) and 70B (TP 8): every run's mean decode-step error, one constant."""
    runs = validation.compare()
    assert {r["id"] for r in runs} == {"vllm-l8-h100-10", "vllm-l8-h100-80", "vllm-l70-h100x8-10",
                                      "vllm-l70-h100x8-80"}
    for r in runs:
        assert r["rounds"] >= 70 and abs(r["step_error_mean"]) < 0.15, r
    assert validation.fit() == pytest.approx(DECODE_HBM_EFFICIENCY, abs=0.003)


def test_weights_move_on_the_route_asked():
    from sim.model.transformer import dims, total_params
    from sim.rl import transfer

    r = simulate_rl(tiny(engines=4, mode="sync"))
    s, topo = r.scenario, r.topology
    assert r.summary["weight_bytes"] == 2 * total_params(dims(s.model))
    gens = (2, 3, 4, 5)
    (bcast,) = transfer.phases(s, topo, 2, gens, 1e9)
    assert set(bcast.dst) == set(gens) and 0 in set(bcast.src)
    p2p = s.model_copy(update={"rl": s.rl.model_copy(update={"weight_route": "p2p"})})
    (pairs,) = transfer.phases(p2p, topo, 2, gens, 1e9)
    # ZeRO-0: dp rank 0 holds every parameter; each one-GPU engine receives all of them
    assert len(pairs.nbytes) == 1 * 4 and pairs.nbytes.sum() == pytest.approx(4 * 1e9)


def test_an_overlapped_transfer_shares_links_with_the_training_step():
    """The broadcast leaves rank 0 through its NVLink port, which the trainer's FSDP
    all-gathers use too: run together, the step takes longer than alone (24.7 ms of 32.6 s:
    the step's first gathers, before any compute hides them). Rank 0's host issues the
    broadcast first (sim/rl/trainer.py ``issued_first``); appended last, it left only once the
    host had issued the whole step (0.73 s in), when the gathers it slows were hidden, and
    the step came out the same with and without it."""
    from sim.rl.run import build

    s = scenario_from_dict(_bundled(), ["rl.trainer_gpus=8", "parallel.dp=8", "rl.generator_gpus=24",
                                        "rl.weight_sync=overlapped"])
    _, loop, topo, facts = build(s)
    trainer, m = loop.trainer, loop.trainer.expected_micro_batches(0)
    step, sent = trainer.with_transfer(m, topo, loop.group, facts["weight_bytes"])
    assert step > trainer.step_time(m) * 1.0005 and sent > 0
    with pytest.raises(InputError) as err:
        scenario_from_dict(_bundled(), ["rl.weight_sync=overlapped", "rl.weight_route=p2p"])
    assert err.value.key == "rl.weight_sync"


def _bundled() -> dict:
    import tomllib

    from tests.conftest import REPO

    return tomllib.loads((REPO / RL_SCENARIO).read_text())


# --- the command line -------------------------------------------------------------------------------

def test_cli_json_has_the_contract_keys_and_is_deterministic():
    runs = [clustersim("rl", RL_SCENARIO, "--json", "--set", "rl.steps=4") for _ in range(2)]
    assert all(p.returncode == 0 for p in runs), runs[0].stderr
    a, b = (json.loads(p.stdout) for p in runs)
    for key in ("mode", "generator_utilization", "trainer_utilization", "tokens_per_s", "mean_staleness_steps",
                "max_staleness_steps"):
        assert key in a
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b and a["mode"] == "pipeline" and 0 < a["generator_utilization"] <= 1


def test_cli_writes_both_pools_timelines(tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    proc = clustersim("rl", RL_SCENARIO, "--set", "rl.steps=3", "--trace", str(trace), "--timeline", str(png))
    assert proc.returncode == 0, proc.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"generate_fwd", "underfull", "send_weights", "receive_weights", "train_fwd"} <= names
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("overrides, key", [
    (["rl.generator_gpus=64"], "rl.generator_gpus"),  # pools bigger than the cluster
    (["rl.max_staleness=-1"], "rl.max_staleness"),
    (["rl.lengths.max=600000", "training.seq_len=700000"], "rl.lengths.max"),  # one sequence's KV does not fit
    (["rl.mode=sync", "rl.max_staleness=1"], "rl.max_staleness"),  # sync has no run-ahead to bound
    (["rl.generator_tp=3"], "rl.generator_tp"),
    (["rl.lengths.max=16000"], "rl.lengths.max"),  # prompt + max > training.seq_len
    (["parallel.dp=8"], "parallel"),  # the layout must fill the trainer pool
])
def test_bad_rl_input_exits_2_naming_the_key(overrides, key):
    args = [a for o in overrides for a in ("--set", o)]
    assert_input_error(clustersim("rl", RL_SCENARIO, *args), key)


@pytest.mark.parametrize("overrides", [["rl.mode=sync"], ["rl.mode=sync", "rl.max_staleness=0"], ["rl.mode=async"],
                                       ["rl.mode=pipeline"]])
def test_readme_rl_modes_run(overrides):
    """README: clustersim rl scenarios/rl-llama3-8b-h100.toml --set rl.mode=sync | async | pipeline."""
    args = [a for o in overrides + ["rl.steps=2"] for a in ("--set", o)]
    proc = clustersim("rl", RL_SCENARIO, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mode"] == overrides[0].split("=")[1]


def test_an_rl_scenario_is_not_a_training_step():
    assert_input_error(clustersim("run", RL_SCENARIO), "rl")
    assert_input_error(clustersim("rl", "scenarios/llama3-8b-fsdp-h100.toml"), "rl")


def test_kv_capacity_is_checked_before_simulating():
    with pytest.raises(InputError) as err:
        simulate_rl(tiny(lengths={"max": 4000}, max_seqs=4).model_copy(
            update={"model": tiny().model.model_copy(update={"layers": 100_000})}))
    assert err.value.key in ("rl.lengths.max", "rl.generator_tp")
    assert math.isfinite(DECODE_HBM_EFFICIENCY)
