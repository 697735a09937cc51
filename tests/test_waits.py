"""The engine's waits as arrays (sim/engine/waits.py) read as the two dicts they replace:
same keys, values and order; keys that never waited are not in them.

Run: ``python -m pytest -q tests/test_waits.py``
"""

import random

import pytest

from sim.engine.waits import WaitLog


def test_the_views_equal_the_dicts_a_run_of_records_makes():
    rng = random.Random(7)
    keys = rng.sample([(r, i) for r in (0, 3, 1000, 131071) for i in range(60)], 150)  # (each op waits once)
    log, held, arrived = WaitLog(), {}, {}
    for r, i in keys:
        last, t = (rng.choice((0, 3, 1000)), rng.randrange(40)), rng.random()
        log.record(r, i, *last, t)
        held[r, i], arrived[r, i] = last, t
        if rng.random() < 0.1:  # (read while recording: the index is made again)
            assert log.held_by[r, i] == last
    assert list(log.held_by.items()) == list(held.items()) and list(log.arrived.items()) == list(arrived.items())
    assert log.held_by == held and log.arrived == arrived and len(log.held_by) == len(held)
    assert list(log.held_by) == list(held)
    for key in [*held, (0, 60), (3, 99), (5, 0), (0, -1), (1, -1), "x", (1,), None]:
        assert (key in log.held_by) == (key in held)
        assert log.held_by.get(key) == held.get(key) and log.arrived.get(key) == arrived.get(key)
    with pytest.raises(KeyError):
        log.held_by[5, 0]


def test_an_empty_log_holds_nothing():
    log = WaitLog()
    assert dict(log.held_by) == {} and (0, 0) not in log.arrived and log.held_by.get((0, 0)) is None
