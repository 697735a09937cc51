"""MoE routing lab: router properties, the causality checker, loads for the simulator, CLI."""

import json

import numpy as np
import pytest

from conftest import assert_input_error, clustersim
from sim.model.routing import capacity, drop_overflow, expert_choice, expert_loads, random_scores, route, token_choice
from sim.labs.routing import check_causality


def check(policy, tokens=1024, experts=16, top_k=2, cf=1.0, seed=0, skew=0.0, **kw):
    return check_causality(random_scores(tokens, experts, seed, skew), policy, top_k, cf, seed, skew, **kw)


@pytest.mark.parametrize("skew", [0.0, 1.0])
def test_token_choice_without_capacity_never_looks_ahead(skew):
    out = check("token_choice", skew=skew, checked=200)
    assert out["checked"] == 200 and out["causality_violations"] == 0 and out["dropped_fraction"] == 0


@pytest.mark.parametrize("policy", ["expert_choice", "token_drop"])
def test_expert_choice_and_token_dropping_break_causality(policy):
    out = check(policy, checked=200)
    assert out["causality_violations"] > 0 and out["violation_rate"] == out["causality_violations"] / 200


def test_expert_choice_balances_exactly():
    for tokens, experts, k, cf in ((1024, 16, 2, 1.0), (999, 7, 1, 1.3), (4096, 64, 8, 0.5)):
        out = check("expert_choice", tokens, experts, k, cf, checked=4)
        assert out["max_load_ratio"] == 1.0
        assert set(out["loads"]) == {capacity(tokens, experts, k, cf)}


def test_token_dropping_by_position_is_causal_and_by_score_is_not():
    assert check("token_drop", skew=0.5, drop_order="position", checked=200)["causality_violations"] == 0
    assert check("token_drop", skew=0.5, drop_order="score", checked=200)["causality_violations"] > 0


def test_the_checker_finds_a_planted_look_ahead():
    scores = np.zeros((4, 2), dtype=np.float32)
    scores[:, 0] = [1.0, 0.5, 2.0, 3.0]  # expert 0 takes the top 2 tokens: 3 and 2
    kept = expert_choice(scores, 2)
    assert kept[:, 0].tolist() == [False, False, True, True]
    # token 0 would have been taken if the later tokens had scored lower
    lower = scores.copy()
    lower[1:, 0] = -5
    assert expert_choice(lower, 2)[0, 0]


@pytest.mark.parametrize("values", ["normal", "ties", "signed_zeros"])
def test_token_choice_is_the_first_k_of_a_stable_sort(values):
    """token_choice (np.partition, then ties to the lower expert) picks exactly what a stable
    argsort of the negated scores puts first, ties and -0.0 included, for every k."""
    rng = np.random.default_rng(7)
    scores = {"normal": rng.standard_normal((64, 12)).astype(np.float32),
              "ties": rng.integers(-2, 3, (64, 12)).astype(np.float32),
              "signed_zeros": np.where(rng.random((64, 12)) < 0.5, -0.0, 0.0).astype(np.float32)}[values]
    for k in range(0, 13):
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        want = np.zeros(scores.shape, dtype=bool)
        np.put_along_axis(want, top, True, axis=1)
        assert (token_choice(scores, k) == want).all(), k


def test_routers_respect_top_k_and_capacity():
    s = random_scores(512, 8, 3, 1.0)
    wanted = token_choice(s, 3)
    assert (wanted.sum(axis=1) == 3).all()
    kept = drop_overflow(s, wanted, 40)
    assert (kept.sum(axis=0) <= 40).all() and (kept <= wanted).all()
    # the kept tokens of a full expert are its best-scoring requests
    e = int(np.argmax(wanted.sum(axis=0)))
    assert s[kept[:, e], e].min() >= s[wanted[:, e] & ~kept[:, e], e].max()


def test_skew_unbalances_token_choice_and_the_aux_loss_bias_repairs_it():
    from sim.model.routing import learn_bias

    plain = check("token_choice", 2048, 32, skew=1.0, checked=64)
    bias = learn_bias(np.random.default_rng(5), 2048, 32, 2, 1.0)
    balanced = check("token_choice", 2048, 32, skew=1.0, checked=64, bias=bias)
    assert plain["max_load_ratio"] > 5 and balanced["max_load_ratio"] < 1.6
    assert balanced["aux_loss"] < plain["aux_loss"]
    assert balanced["causality_violations"] == 0  # a learned bias is a parameter: still causal


def test_expert_loads_for_the_simulator():
    for policy in ("token_choice", "expert_choice", "token_drop"):
        a = expert_loads(policy, 4096, 8, 2, 1.25, 7, 0.8)
        assert np.array_equal(a, expert_loads(policy, 4096, 8, 2, 1.25, 7, 0.8))  # seeded
        s = random_scores(4096, 8, 7, 0.8)
        assert np.array_equal(a, route(s, policy, 2, 1.25)[0].sum(axis=0))
    tc = expert_loads("token_choice", 4096, 8, 2, 1.25, 7, 0.8)
    assert tc.sum() == 4096 * 2 and tc.max() > 2 * tc.min()
    assert expert_loads("token_drop", 4096, 8, 2, 1.25, 7, 0.8).max() == capacity(4096, 8, 2, 1.25)


def test_cli_json_has_the_contract_keys():
    p = clustersim("routing", "--policy", "expert_choice", "--tokens", "512", "--experts", "8", "--top-k", "2", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"policy", "checked", "causality_violations", "violation_rate", "max_load_ratio",
            "dropped_fraction"} <= set(out)
    assert out["max_load_ratio"] == 1.0 and out["causality_violations"] > 0


def test_cli_reads_scores_from_npy(tmp_path):
    f = tmp_path / "s.npy"
    np.save(f, random_scores(300, 6, 1))
    p = clustersim("routing", "--policy", "token_choice", "--scores", str(f), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["tokens"], out["experts"], out["causality_violations"]) == (300, 6, 0)


@pytest.mark.parametrize("array", [
    np.zeros(4, dtype=[("a", "f4"), ("b", "i4")]).reshape(2, 2),  # structured
    np.array([["a", "b"], ["c", "d"]]),  # strings
    np.full((8, 4), 1e308),  # float64 past float32: printed "aux_loss": NaN, not JSON
], ids=["structured", "strings", "huge"])
def test_cli_refuses_score_files_that_are_not_router_logits(tmp_path, array):
    """issue 30: a structured or string .npy was a TypeError; 1e308 scores printed NaN."""
    f = tmp_path / "s.npy"
    np.save(f, array)
    assert_input_error(clustersim("routing", "--policy", "token_choice", "--scores", str(f), "--aux-loss", "--json"),
                       "--scores")


@pytest.mark.parametrize("args, key", [
    (["--policy", "random"], "--policy"),
    (["--policy", "token_choice", "--top-k", "0"], "--top-k"),
    (["--policy", "token_choice", "--experts", "4", "--top-k", "5"], "--top-k"),
    (["--policy", "token_drop", "--capacity-factor", "0"], "--capacity-factor"),
    (["--policy", "token_choice", "--tokens", "-5"], "--tokens"),
    (["--policy", "expert_choice", "--aux-loss"], "--aux-loss"),
    (["--policy", "token_choice", "--scores", "/nonexistent.npy"], "--scores")])
def test_cli_bad_input_exits_2_with_one_line(args, key):
    p = clustersim("routing", *args)
    assert_input_error(p, key)
