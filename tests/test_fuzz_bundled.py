"""Hostile values (issue 14) on every key of every bundled scenario, in-process: the loader
and the work estimate either accept (with a finite estimate) or raise one InputError.

Every key x every value x every scenario is ~70,000 loads and ~6,000 work estimates (minutes
of CPU), so CI splits the values into ``SHARES`` interleaved shares and gives each scenario
one share, a different one to consecutive scenarios: every key still meets every value, on
a third of the scenarios. ``python -m pytest -m slow tests/test_fuzz_bundled.py`` runs every
value on every scenario. The values, keys and mutation rules are tests/test_fuzz.py's.

Run: ``python -m pytest tests/test_fuzz_bundled.py``
"""

import math
import tomllib

import pytest

from sim import work
from sim.errors import InputError
from sim.input.load import scenario_from_dict

from test_fuzz import ALL_KEYS, BOUNDARIES, HOSTILE, REPO, SCENARIOS, mutate

VALUES = HOSTILE[::3] + BOUNDARIES[1::7]
SHARES = 3  # CI: scenario i tries VALUES[i % SHARES::SHARES] on every key


def check_loads_or_refuses(scenario: str, values: list) -> None:
    """Every key x ``values`` on ``scenario``: a finite work estimate or one InputError."""
    data = tomllib.loads((REPO / scenario).read_text())
    for key in ALL_KEYS:
        for value in values:
            try:
                s = scenario_from_dict(data, dict([mutate(key, value)]), base=(REPO / scenario).parent)
                w = work.estimate(s)
            except InputError as exc:
                assert exc.key and "\n" not in str(exc)
                continue
            assert math.isfinite(w.seconds) and math.isfinite(w.bytes)


def test_the_shares_cover_every_value_each_on_several_scenarios():
    shares = [VALUES[i % SHARES::SHARES] for i in range(len(SCENARIOS))]
    assert len(SCENARIOS) >= 2 * SHARES and sorted(map(repr, sum(shares[:SHARES], []))) == sorted(map(repr, VALUES))


@pytest.mark.parametrize("i, scenario", list(enumerate(SCENARIOS)), ids=SCENARIOS)
def test_every_key_of_every_bundled_scenario_loads_or_refuses(i, scenario):
    """Every key x a share of the hostile values on each bundled scenario."""
    check_loads_or_refuses(scenario, VALUES[i % SHARES::SHARES])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_key_of_every_bundled_scenario_loads_or_refuses_every_value(scenario):
    """Every key x every hostile value on every bundled scenario (the pre-split CI test)."""
    check_loads_or_refuses(scenario, VALUES)
