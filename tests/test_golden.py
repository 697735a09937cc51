"""Golden summaries: small bundled scenarios whose summaries are checked in and diffed.

A change to any number here is a change in what the simulator predicts: look at the diff,
and if it is intended, regenerate the files and commit them with the change:

    UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

The files (tests/golden/<scenario>.json) hold the summary without sim_wall_s and
sim_events (the engine's own cost, not a prediction). Also here: determinism -- the same
scenario gives a byte-identical summary apart from sim_wall_s.

Run: ``python -m pytest tests/test_golden.py``
"""

import json
import math
import os
from pathlib import Path

import pytest

import sim
from sim.step import simulate

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = ["llama3-8b-fsdp-h100", "gpt-1.7b-ptd-interleaved-a100", "mixtral-small-ep-h100",
             "llama3-8b-cp-128k-h100"]
UNSTABLE = ("sim_wall_s", "sim_events")


def prediction(name: str) -> dict:
    summary = simulate(sim.load_scenario(REPO / "scenarios" / f"{name}.toml")).summary
    return {k: v for k, v in summary.items() if k not in UNSTABLE}


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


@pytest.mark.parametrize("name", SCENARIOS)
def test_summary_matches_golden(name):
    got = prediction(name)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert path.exists(), f"no golden file {path}; create it with UPDATE_GOLDEN=1"
    want = json.loads(path.read_text())
    assert differences(got, want) == []


def test_every_golden_file_has_a_scenario():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(SCENARIOS)


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
