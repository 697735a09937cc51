"""Golden summaries: small scenarios whose summaries are checked in and diffed.

A change to any number here is a change in what the simulator predicts: look at the diff,
and if it is intended, regenerate the files and commit them with the change:

    UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

The files (tests/golden/<case>.json) hold the summary without sim_wall_s and sim_events
(the engine's own cost, not a prediction). The cases: four bundled layouts (FSDP, 3D with
interleaving, expert parallelism, context parallelism), then one per mechanism that the
layouts do not exercise -- a straggler, compute jitter (exact and sampled), a failed NIC,
FP8 linear layers, multi-token prediction on an MoE model -- each a bundled scenario or one
with ``--set`` overrides, and the RL loop's summary as ``clustersim rl --json`` prints it.
Also here: determinism -- the same scenario gives a byte-identical summary apart from
sim_wall_s.

Run: ``python -m pytest tests/test_golden.py``
"""

import json
import math
import os
from pathlib import Path

import pytest

import sim
from conftest import clustersim
from sim.step import simulate

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
NIC_DOWN = "cluster.faults=[{gpu_nic = 0, factor = 0}]"  # GPU 0's NIC failed: its traffic rerouted
# golden file name -> (bundled scenario, overrides)
CASES = {
    "llama3-8b-fsdp-h100": ("llama3-8b-fsdp-h100", []),
    "gpt-1.7b-ptd-interleaved-a100": ("gpt-1.7b-ptd-interleaved-a100", []),
    "mixtral-small-ep-h100": ("mixtral-small-ep-h100", []),
    "llama3-8b-cp-128k-h100": ("llama3-8b-cp-128k-h100", []),
    "straggler-dp": ("straggler-dp", []),
    "jitter-dp-1k+sampled": ("jitter-dp-1k", ["jitter.mode=sampled", "jitter.sample_ranks=64"]),
    "llama3-8b-fsdp-h100+jitter": ("llama3-8b-fsdp-h100", ["jitter.sigma=0.02"]),
    "llama3-8b-fsdp-h100+nic-down": ("llama3-8b-fsdp-h100", [NIC_DOWN]),
    "llama3-8b-fsdp-h100+fp8": ("llama3-8b-fsdp-h100", ["training.precision=fp8"]),
    "mixtral-small-ep-h100+mtp": ("mixtral-small-ep-h100", ["model.mtp_layers=1"]),
}
RL = {"rl-llama3-8b-h100": "rl-llama3-8b-h100"}  # golden file name -> bundled RL scenario
UNSTABLE = ("sim_wall_s", "sim_events")


def prediction(name: str) -> dict:
    scenario, overrides = CASES[name]
    summary = simulate(sim.load_scenario(REPO / "scenarios" / f"{scenario}.toml", overrides)).summary
    return {k: v for k, v in summary.items() if k not in UNSTABLE}


def rl_prediction(name: str) -> dict:
    proc = clustersim("rl", f"scenarios/{RL[name]}.toml", "--json")
    assert proc.returncode == 0, proc.stderr
    return {k: v for k, v in json.loads(proc.stdout).items() if k not in UNSTABLE}


def differences(got, want, path="") -> list[str]:
    """Every leaf that differs (floats: 1e-9 relative, for other platforms' last bits)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return [f"{path or 'summary'}: keys {sorted(got) if isinstance(got, dict) else got} != {sorted(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}".lstrip("."))]
    if isinstance(want, float) and not isinstance(got, bool) and isinstance(got, (int, float)):
        ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    else:
        ok = got == want and type(got) is type(want)
    return [] if ok else [f"{path}: {got!r} (golden {want!r})"]


def check_golden(name: str, got: dict) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    want = json.loads(path.read_text())
    assert differences(got, want) == []


@pytest.mark.parametrize("name", CASES)
def test_summary_matches_golden(name):
    check_golden(name, prediction(name))


@pytest.mark.parametrize("name", RL)
def test_rl_summary_matches_golden(name):
    check_golden(name, rl_prediction(name))


def test_every_golden_file_has_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted([*CASES, *RL])


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


@pytest.mark.parametrize("name", [n for n, (_, over) in CASES.items() if over and n.split("+")[0] in CASES])
def test_each_variant_differs_from_its_base(name):
    """The overrides took effect: a variant's step differs from its base layout's golden; a
    perturbation (jitter, a failed NIC) reports its cost, a precision or MTP does not."""
    got, base = golden(name), golden(name.split("+")[0])
    assert got["step_time_s"] != base["step_time_s"]
    assert ("straggler_cost_s" in got) == any(k in name for k in ("jitter", "nic-down"))


def test_the_perturbed_goldens_say_what_perturbed_them():
    assert golden("straggler-dp")["straggler_cost_s"] > 0
    sampled = golden("jitter-dp-1k+sampled")
    assert sampled["jitter_mode"] == "sampled" and sampled["jitter_sampled_ranks"] == 64
    assert golden("llama3-8b-fsdp-h100+jitter")["jitter_mode"] == "exact"
    assert golden("llama3-8b-fsdp-h100+fp8")["step_time_s"] < golden("llama3-8b-fsdp-h100")["step_time_s"]
    assert golden("rl-llama3-8b-h100")["mode"] == "pipeline"


# --- determinism ----------------------------------------------------------------------

def stripped_json(result) -> str:
    return json.dumps({k: v for k, v in result.summary.items() if k != "sim_wall_s"})


@pytest.mark.parametrize("name, overrides", [
    ("gpt-1.7b-ptd-interleaved-a100", []),
    ("straggler-dp", ["jitter.sigma=0.05"]),  # seeded jitter and a straggler: same draws
])
def test_same_scenario_same_summary_bytes(name, overrides):
    path = REPO / "scenarios" / f"{name}.toml"
    first = simulate(sim.load_scenario(path, overrides))
    second = simulate(sim.load_scenario(path, overrides))
    assert stripped_json(first) == stripped_json(second)
    assert first.spans.equals(second.spans)


def test_the_seed_drives_the_jitter():
    path = REPO / "scenarios" / "straggler-dp.toml"
    a = simulate(sim.load_scenario(path, ["jitter.sigma=0.05", "seed=1"])).summary
    b = simulate(sim.load_scenario(path, ["jitter.sigma=0.05", "seed=2"])).summary
    assert a["step_time_s"] != b["step_time_s"]
