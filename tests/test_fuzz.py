"""Fuzzing the edge: mutated scenarios either simulate or fail with one InputError (exit
2 and a one-line message on the command line), never an internal error or a traceback.

Most examples run in-process on a tiny model (fast); a handful go through
``python -m sim run``. ``FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py`` digs deeper.

Issue 14 adds hostile values (non-finite, wrong-typed, extreme, at and past every bound of
sim/bounds.py) on every key of the schema: in-process through the loader and the work
estimate for every bundled scenario (tests/test_fuzz_bundled.py), and through ``sim.cli.main`` in a fork per example
(tests/forked_cli.py) with a small work budget, asserting exit 0 or 2 within a CPU limit
and the result invariants on exit 0. ``FUZZ_CLI_EXAMPLES=N`` / ``FUZZ_BUDGET_S=S`` widen it;
``python -m pytest -m slow tests/test_fuzz.py -k campaign`` runs the long campaign.

Run: ``python -m pytest tests/test_fuzz.py``
"""

import json
import math
import os
import random
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from forked_cli import run_cli
from sim import bounds
from sim.errors import InputError
from sim.hardware import specs
from sim.input.load import scenario_from_dict
from sim.input.scenario import Scenario
from sim.step import simulate

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
# the default run is the same every time (CI); FUZZ_EXAMPLES=N explores new examples
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize="FUZZ_EXAMPLES" not in os.environ, database=None)

BASE = {"name": "fuzz", "seed": 0,
        "model": {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "vocab": 512},
        "training": {"seq_len": 256, "global_batch": 8},
        "cluster": {"topology": "dgx-h100", "gpus": 8},
        "parallel": {"tp": 2, "pp": 2, "dp": 2}}

KEYS = ["parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp", "parallel.ep", "parallel.virtual_stages",
        "parallel.schedule", "parallel.zero", "parallel.sequence_parallel", "parallel.stage_layers",
        "parallel.order", "parallel.dp_algo", "parallel.fold",
        "training.seq_len", "training.global_batch", "training.micro_batch", "training.precision",
        "training.recompute", "training.flash_attention", "training.grad_bucket_mb", "training.fsdp_prefetch",
        "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn_hidden", "model.vocab",
        "model.mlp", "model.tied_embeddings", "model.moe.experts", "model.moe.top_k",
        "model.moe.capacity_factor", "model.moe.dense_layers", "model.moe.shared_experts",
        "model.moe.expert_ffn_hidden", "model.preset", "cluster.gpus", "cluster.nodes", "seed", "name"]
KEYS += ["model.moe.routing", "model.moe.skew"]

# small values only: the point is validity, and a huge batch would only make a slow run
INTS = st.sampled_from([-3, -1, 0, 1, 2, 3, 4, 5, 8, 12, 16, 32])
VALUES = st.one_of(
    INTS, INTS, INTS,
    st.sampled_from(["", "abc", "gpipe", "1f1b", "interleaved", "full", "selective", "swiglu", "uniform",
                     "expert_choice", "tp-cp-dp-pp", "pp-dp-cp-tp", "tp-tp-dp-pp", "ring", "tree", "llama3-8b",
                     "8", "-1"]),
    st.sampled_from([0.0, 0.5, 1.5, -1.0, 1e-9, float("inf"), float("nan")]),
    st.booleans(),
    st.lists(INTS, max_size=5),
    st.sampled_from([{}, {"a": 1}, [[1]]]),
)
MUTATIONS = st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=4)
# plausible values, typed per key: mostly valid scenarios, so the simulator itself gets
# exercised on odd but legal combinations
_SMALL = st.sampled_from([1, 2, 4, 8])
_TYPED = {
    "parallel.schedule": st.sampled_from(["gpipe", "1f1b", "interleaved"]),
    "parallel.zero": st.sampled_from([0, 1, 2, 3]),
    "parallel.stage_layers": st.lists(st.integers(1, 4), min_size=1, max_size=4),
    "parallel.order": st.permutations(["tp", "cp", "dp", "pp"]).map("-".join),
    "parallel.dp_algo": st.sampled_from(["auto", "ring", "tree", "hierarchical"]),
    "training.precision": st.sampled_from(["bf16", "fp16", "fp8"]),
    "training.recompute": st.sampled_from(["none", "selective", "full"]),
    "training.grad_bucket_mb": st.sampled_from([0.5, 1.0, 25.0]),
    "model.mlp": st.sampled_from(["gelu", "swiglu"]),
    "model.moe.capacity_factor": st.sampled_from([1.0, 1.25, 2.0]),
    "model.moe.routing": st.sampled_from(["uniform", "token_choice", "expert_choice", "token_drop"]),
    "model.moe.skew": st.sampled_from([0.0, 0.5, 1.2]),
    "model.moe.dense_layers": st.sampled_from([0, 1, 2]),
    "model.moe.shared_experts": st.sampled_from([0, 1]),
    "cluster.gpus": st.sampled_from([1, 2, 4, 8, 16]),
}
_BOOLS = {"parallel.sequence_parallel", "parallel.fold", "training.flash_attention", "training.fsdp_prefetch",
          "model.tied_embeddings"}
_PLAUSIBLE_KEYS = [k for k in KEYS if k not in ("model.preset", "seed", "name", "cluster.nodes")]


def _plausible(key):
    value = _TYPED.get(key, st.booleans() if key in _BOOLS else _SMALL)
    return value.map(lambda v: (key, v))


@st.composite
def _consistent_parallel(draw):
    """tp, pp, dp, cp in {1, 2, 4} with the GPU count to match."""
    dims = {a: draw(st.sampled_from([1, 2, 4])) for a in ("tp", "pp", "dp", "cp")}
    gpus = dims["tp"] * dims["pp"] * dims["dp"] * dims["cp"]
    return [(f"parallel.{a}", n) for a, n in dims.items()] + [("cluster.gpus", gpus)]


PLAUSIBLE_MUTATIONS = st.builds(
    lambda par, rest: par + rest, _consistent_parallel(),
    st.lists(st.sampled_from(_PLAUSIBLE_KEYS).flatmap(_plausible), min_size=0, max_size=4))


def outcome(overrides: list[tuple[str, object]]) -> str:
    """'ok' or 'input error'; anything else raises (and fails the test)."""
    try:
        summary = simulate(scenario_from_dict(BASE, dict(overrides))).summary
    except InputError as exc:
        assert exc.key and exc.reason and "\n" not in str(exc)
        return "input error"
    assert math.isfinite(summary["step_time_s"]) and summary["step_time_s"] > 0
    assert 0 <= summary["bubble_fraction"] < 1 and summary["mfu"] > 0
    assert_possible(summary)
    return "ok"


def assert_possible(summary: dict) -> None:
    """The result invariants of issue 14, restated here so the test does not trust the
    code it tests (sim/outputs/invariants.py)."""
    assert math.isfinite(summary["step_time_s"]) and summary["step_time_s"] > 0
    assert 0 < summary["mfu"] <= 1, summary["mfu"]
    assert 0 <= summary["bubble_fraction"] <= 1
    assert 0 <= summary["exposed_comm_s"] <= summary["step_time_s"] * (1 + 1e-9)
    assert all(math.isfinite(v) and v >= 0 for v in summary["comm_bytes_per_gpu"].values())
    assert math.isfinite(summary["memory_per_gpu_bytes"]) and summary["memory_per_gpu_bytes"] > 0
    assert math.isfinite(summary.get("straggler_cost_s", 0.0))


@FUZZ
@given(MUTATIONS)
def test_mutated_scenarios_simulate_or_raise_input_error(overrides):
    outcome(overrides)


@FUZZ
@given(PLAUSIBLE_MUTATIONS)
def test_plausible_mutations_simulate_or_raise_input_error(overrides):
    outcome(overrides)


def test_the_base_scenario_simulates():
    assert outcome([]) == "ok"


CLI_CASES = 5


def cli_mutations(seed: int) -> list[str]:
    """Seeded mutations for the command line, as --set key=value texts."""
    rng = random.Random(seed)
    values = ["-1", "0", "3", "16", "abc", "1.5", "true", "[1, 2]", "gpipe"]
    return [f"{rng.choice(KEYS)}={rng.choice(values)}" for _ in range(rng.randint(1, 3))]


@pytest.mark.parametrize("seed", range(CLI_CASES))
def test_cli_exits_0_or_2_with_one_line(seed, tmp_path):
    path = tmp_path / "fuzz.toml"
    path.write_text(_toml(BASE))
    args = [a for kv in cli_mutations(seed) for a in ("--set", kv)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "--json", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr
    if proc.returncode == 2:
        assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stderr.startswith("clustersim run: ")


def _toml(d: dict, prefix: str = "") -> str:
    """Just enough TOML for BASE (scalars and tables)."""
    scalars = [f"{k} = {_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    tables = [f"\n[{prefix}{k}]\n" + _toml(v, f"{prefix}{k}.") for k, v in d.items() if isinstance(v, dict)]
    return "\n".join(scalars) + "\n" + "".join(tables)


def _value(v) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


# --- regressions the fuzzer found -----------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    ({"seed": -3, "model.moe.experts": 2}, "seed"),  # numpy refuses negative seeds
    ({"parallel.order": ""}, "parallel.order"),  # was only caught inside simulate()
    ({"parallel.dp_algo": "tree", "parallel.zero": 3}, "parallel.dp_algo"),  # tree has no all-gather
    ({"parallel.dp_algo": "tree", "parallel.zero": 1}, "parallel.dp_algo"),
    ({"model.preset": [1, 2]}, "model.preset"),  # was TypeError: unhashable list
    ({"model.hf_config": 5}, "model.hf_config"),
])
def test_fuzz_regressions_are_input_errors_at_load(overrides, key):
    with pytest.raises(InputError) as info:
        scenario_from_dict(BASE, overrides)
    assert info.value.key == key


def test_tree_all_reduce_still_allowed_for_ddp():
    assert outcome([("parallel.dp_algo", "tree"), ("parallel.zero", 0)]) == "ok"


def test_two_copies_of_one_phase_with_different_live_chains():
    assert outcome([("parallel.tp", 2), ("parallel.pp", 1), ("parallel.dp", 1), ("parallel.cp", 2),
                    ("cluster.gpus", 4), ("parallel.zero", 3), ("parallel.fold", False)]) == "ok"


def test_input_error_survives_reconstruction_and_pickling():
    import pickle

    err = InputError("parallel.dp_algo", "no such algorithm")
    assert str(type(err)(*err.args)) == str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


# --- hostile values on every key (issue 14) --------------------------------------------

def schema_keys(model=Scenario, prefix: str = "") -> dict[str, type]:
    """Every leaf key of the schema -> its Python type (int, float, bool, str, list...);
    lists of sections (stragglers, cluster.faults) are mutated as one-entry lists."""
    out = {}
    for name, field in model.model_fields.items():
        key, sub = prefix + name, _section(field.annotation)
        if sub is not None:
            out |= schema_keys(sub, key + ".")
        else:
            out[key] = typing.get_origin(field.annotation) or field.annotation
    return out


def _section(annotation):
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


LIST_SECTIONS = {"stragglers": {"ranks": [0], "slowdown": 1.5}, "cluster.faults": {"gpu_nic": 0, "factor": 0.5}}
TOPOLOGY_KEYS = [f"cluster.topology_overrides.{k}" for k in specs.FatTreeSpec.__dataclass_fields__ if k != "name"]
KEY_TYPES = schema_keys() | {k: object for k in TOPOLOGY_KEYS}
ALL_KEYS = sorted(KEY_TYPES)
NON_FINITE = [math.nan, math.inf, -math.inf]
WRONG_TYPES = [True, False, "abc", "8", [1, 2], {"a": 1}, [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]
EXTREMES = [0, -1, 1, 2, 7, 2**31, 2**53, 2**53 + 1, 2**63, 10**6, 10**7, 10**9, -2**63,
            0.0, -0.0, 0.5, 1.5, 5e-324, 1e-300, 1e-9, 1e300, -1e300]
BOUNDARIES = sorted({v for b in vars(bounds).values() if isinstance(b, bounds.Bound)
                     for v in (b.lo, b.hi, b.hi + 1, b.lo - 1, b.hi * 1.0001)}, key=repr)
HOSTILE = NON_FINITE + WRONG_TYPES + EXTREMES + BOUNDARIES
# odd but often legal values, so that mutated scenarios also run, not only get refused
LEGALISH = [1, 2, 3, 4, 8, 16, 32, 64, 1024, 4096, 0.0, 0.25, 0.5, 1.0, 1.25, 2.0, 16.0, True, False,
            "ring", "tree", "hierarchical", "token_choice", "token_drop", "expert_choice", "interleaved",
            "gpipe", "full", "selective", "swiglu", "normal", "ecmp", "generic", "gb200-nvl72", "b200"]


# sections with required keys: a mutated key is set inside an otherwise complete section
RL_TEMPLATE = {"generator_gpus": 8, "trainer_gpus": 8, "steps": 2, "lengths": {"mean": 100, "max": 200}}


def mutate(key: str, value):
    """(key, value) for --set: a key inside a list of sections sets a one-entry list; a key
    of [rl] sets a whole [rl] section (its other keys are required)."""
    for section, template in LIST_SECTIONS.items():
        if key.startswith(section + "."):
            return section, [{**template, key[len(section) + 1:]: value}]
    if key.startswith("rl."):
        rl = {**RL_TEMPLATE, "lengths": dict(RL_TEMPLATE["lengths"])}
        *path, last = key.split(".")[1:]
        (rl[path[0]] if path else rl)[last] = value
        return "rl", rl
    return key, value


def _normal(key: str) -> str:
    """``stragglers[0].ranks.1`` -> ``stragglers.ranks``: the key without list positions."""
    return ".".join(p for p in key.replace("[", ".").replace("]", "").split(".") if not p.isdigit())


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_refuses_non_finite_and_wrong_typed_values(key):
    """nan, inf and a wrong type are never legal: an InputError naming that very key."""
    numeric = KEY_TYPES[key] in (int, float)
    values = NON_FINITE + ([True, "abc", [1]] if numeric else []) + ([1.5] if KEY_TYPES[key] is int else [])
    for value in values:
        with pytest.raises(InputError) as info:
            scenario_from_dict(BASE, dict([mutate(key, value)]))
        assert _normal(info.value.key).startswith(_normal(key)), (key, value, str(info.value))


def toml_value(v) -> str:
    """A Python value as TOML text for --set (nan, inf, inline tables included)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return {math.inf: "inf", -math.inf: "-inf"}.get(v, "nan" if v != v else repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


SCENARIOS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scenarios").rglob("*.toml"))
CLI_BUDGET_S = float(os.environ.get("FUZZ_BUDGET_S", "2"))  # the work budget of each fuzzed run
CLI_MUTATIONS = st.lists(st.tuples(st.sampled_from(ALL_KEYS), st.sampled_from(HOSTILE) | st.sampled_from(LEGALISH)),
                         min_size=1, max_size=3)
CLI_FUZZ = settings(max_examples=int(os.environ.get("FUZZ_CLI_EXAMPLES", "150")), deadline=None, database=None,
                    derandomize="FUZZ_CLI_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_cli_run(scenario: str, mutations, budget_s: float) -> None:
    """``clustersim run`` through sim.cli.main in a fork: exit 0 or 2, never 1 or a hang;
    within a CPU limit the work budget implies; on exit 0 an invariant-abiding JSON."""
    args = ["run", str(REPO / scenario), "--json"]
    for key, value in mutations:
        key, value = mutate(key, value)
        args += ["--set", f"{key}={toml_value(value)}"]
    got = run_cli(args, timeout=120 + 10 * budget_s, budget_s=budget_s, budget_bytes=1 << 30)
    assert got.code in (0, 2), f"exit {got.code} after {got.wall_s:.0f} s: {got.stderr[-800:]}"
    assert got.cpu_s < 4 * budget_s + 5, f"{got.cpu_s:.1f} s of CPU with a budget of {budget_s} s"
    if got.code == 2:
        assert got.stdout == "" and len(got.stderr.strip().splitlines()) == 1
        assert got.stderr.startswith("clustersim run: ") and "Traceback" not in got.stderr
    else:
        assert_possible(json.loads(got.stdout))


@CLI_FUZZ
@given(st.sampled_from(SCENARIOS), CLI_MUTATIONS)
def test_cli_on_hostile_mutations_of_bundled_scenarios(scenario, mutations):
    check_cli_run(scenario, mutations, CLI_BUDGET_S)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("FUZZ_SLOW_EXAMPLES", "1500")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(SCENARIOS), CLI_MUTATIONS)
def test_cli_hostile_campaign(scenario, mutations):
    """The longer campaign: ``python -m pytest -m slow tests/test_fuzz.py -k campaign``."""
    check_cli_run(scenario, mutations, 20.0)
