"""The engine's clock (sim/engine/clock.py): superseded wake-ups dropped from SimPy's event
queue (``compact``) leave every other event in its place of the order, and the network,
which drops them once they pile up (``sim.engine.network.COMPACT_MIN``), ends every transfer
at the same float and hands out the same events either way.

Run: ``python -m pytest -q tests/test_clock.py``
"""

from heapq import heappop, heappush
import random

import simpy

from conftest import run_transfers, spec_topology
from sim.engine import clock, network
from test_network_solve import _traffic

COMPACT = clock.compact  # (the test below counts its calls by patching it)


def test_compact_keeps_the_order_of_every_live_event_and_drops_the_void():
    rng = random.Random(7)
    queue, kept = [], []
    for eid in range(2000):
        wake = clock.Wake([eid])
        entry = (float(rng.randrange(50)), rng.choice((0, 1)), eid, wake)  # (many equal times)
        heappush(queue, entry)
        if rng.random() < 0.6:
            wake.callbacks = clock.VOID
        else:
            kept.append(entry)
    for _ in range(300):  # a queue part-way through a run
        entry = heappop(queue)
        if entry[3].callbacks is not clock.VOID:
            kept.remove(entry)
    alias = queue
    clock.compact(queue)
    assert alias is queue  # in place: the engine's streams hold the queue itself
    assert all(e[3].callbacks is not clock.VOID for e in queue)
    assert [heappop(queue) for _ in range(len(queue))] == sorted(kept)


def _events(env: simpy.Environment) -> int:
    return int(repr(env._eid)[6:-1])


def test_network_ends_every_transfer_at_the_same_float_with_and_without_compaction(monkeypatch):
    topo = spec_topology(32, nic_gbps=50)
    for seed in (1, 3):
        starts = _traffic(seed)
        runs = []
        for least in (10**12, 0):  # never, and at every superseded wake-up past half the queue
            monkeypatch.setattr(clock, "COMPACT_MIN", least)
            sizes = []

            def counted(queue):
                before = len(queue)
                COMPACT(queue)
                sizes.append((before, len(queue)))

            monkeypatch.setattr(clock, "compact", counted)
            seen = {}
            net, ends = run_transfers(topo, starts, lambda net, env: seen.setdefault("env", env))
            runs.append((ends, _events(seen["env"]), net.joint_solves, sizes))
        (ends, events, solves, never), (ends_c, events_c, solves_c, sizes) = runs
        assert not never and solves > 50
        assert any(after < before for before, after in sizes)  # wake-ups were dropped
        assert ends_c == ends and events_c == events and solves_c == solves
