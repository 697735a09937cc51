"""Fuzzing the edge: mutated scenarios either simulate or fail with one InputError (exit
2 and a one-line message on the command line), never an internal error or a traceback.

Most examples run in-process on a tiny model (fast); a handful go through
``python -m sim run``. ``FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py`` digs deeper.

Run: ``python -m pytest tests/test_fuzz.py``
"""

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.errors import InputError
from sim.input.load import scenario_from_dict
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
    return "ok"


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
