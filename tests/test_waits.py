"""The engine's waits as arrays (sim/engine/waits.py) read as the two dicts they replace:
same keys, values and order, a later record of a member replacing its value in place.

Run: ``python -m pytest -q tests/test_waits.py``
"""

import random

import pytest

from sim.engine.waits import WaitLog


def test_the_views_equal_the_dicts_a_run_of_records_makes():
    rng = random.Random(7)
    sizes = {0: 50, 3: 40, 1000: 60}
    log, held, arrived = WaitLog(sizes), {}, {}
    for _ in range(400):  # repeats included: a dict keeps the first place and the last value
        r = rng.choice(list(sizes))
        i, last = rng.randrange(sizes[r]), (rng.choice(list(sizes)), rng.randrange(40))
        t = rng.random()
        log.record(r, i, *last, t)
        held[r, i], arrived[r, i] = last, t
    assert list(log.held_by.items()) == list(held.items()) and list(log.arrived.items()) == list(arrived.items())
    assert log.held_by == held and log.arrived == arrived and len(log.held_by) == len(held)
    assert list(log.held_by) == list(held)
    for key in [*held, (0, 49), (3, 99), (5, 0), (0, -1), "x", (1,)]:
        assert (key in log.held_by) == (key in held)
        assert log.held_by.get(key) == held.get(key) and log.arrived.get(key) == arrived.get(key)
    with pytest.raises(KeyError):
        log.held_by[5, 0]


def test_a_member_recorded_again_keeps_its_place_and_takes_the_new_value():
    log = WaitLog({0: 4, 1: 4})
    log.record(0, 1, 1, 2, 0.5)
    log.record(1, 0, 1, 3, 0.25)
    log.record(0, 1, 1, 3, 0.75)
    assert list(log.held_by.items()) == [((0, 1), (1, 3)), ((1, 0), (1, 3))]
    assert list(log.arrived.items()) == [((0, 1), 0.75), ((1, 0), 0.25)]
