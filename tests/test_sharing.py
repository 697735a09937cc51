"""sim.engine.sharing: whether a transfer shares a link with another in flight, answered from
a memo of pairs of phases (or, crowded, a count per link) exactly as counting the transfers
on every link answers it (what the network did before: its answers decide every joint
solve, so any difference changes results)."""

import random
from types import SimpleNamespace

import numpy as np
import pytest

from sim.engine import sharing
from sim.engine.sharing import Sharing

N_LINKS = 60


def _phases(rng: random.Random, n: int) -> list:
    """Compiled phases (a key and ascending distinct links): small random link sets over few
    links, so pairs both share and do not; one phase with no links."""
    out = [SimpleNamespace(key=0, links=np.zeros(0, dtype=np.int64))]
    for key in range(1, n):
        k = rng.randint(1, 6)
        out.append(SimpleNamespace(key=key, links=np.array(sorted(rng.sample(range(N_LINKS), k)), dtype=np.int64)))
    return out


def _walk(seed: int, n_phases: int, steps: int, spread: int) -> int:
    """Random starts and ends (in turns of up to ``spread`` in flight and of draining);
    every answer compared with a count per link. Returns how
    many answers were True (so the walk is known to exercise both)."""
    rng = random.Random(seed)
    phases = _phases(rng, n_phases)
    users = np.zeros(N_LINKS, dtype=np.int64)  # the reference: transfers in flight per link
    flight: list = []
    s, shared = Sharing(N_LINKS), 0
    for i in range(steps):
        limit = spread if (i // 400) % 2 == 0 else 1  # in flight: up to ``spread``, then drained, in turns
        if flight and (rng.random() < 0.5 or len(flight) > limit):
            ph = flight[rng.randrange(len(flight))]
            expect = bool(np.count_nonzero(users[ph.links] - 1))
            assert s.others(ph) == expect
            if rng.random() < 0.7:  # it ends (else it was re-planned and goes on)
                flight.remove(ph)
                users[ph.links] -= 1
                s.remove(ph)
        else:
            ph = phases[rng.randrange(len(phases))]
            expect = bool(np.count_nonzero(users[ph.links]))
            assert s.add(ph) == expect
            users[ph.links] += 1
            flight.append(ph)
        shared += expect
    assert sorted(s.count.items()) == sorted((k, n) for k, n in
                                             __import__("collections").Counter(p.key for p in flight).items())
    return shared


@pytest.mark.parametrize("seed", range(6))
def test_same_answers_as_a_count_per_link(seed):
    assert 0 < _walk(seed, n_phases=40, steps=3000, spread=10) < 3000 * 0.95


@pytest.mark.parametrize("seed", range(3))
def test_crowded_and_back(seed, monkeypatch):
    """Past CROWDED distinct phases in flight the count per link takes over, and leaves
    again below UNCROWDED: the answers stay the same across the switches."""
    monkeypatch.setattr(sharing, "CROWDED", 6)
    monkeypatch.setattr(sharing, "UNCROWDED", 3)
    crowded = []
    original = Sharing._crowd

    def spy(self):
        crowded.append(len(self.count))
        original(self)

    monkeypatch.setattr(Sharing, "_crowd", spy)
    _walk(100 + seed, n_phases=60, steps=4000, spread=25)
    assert len(crowded) > 3  # it switched, and switched back (to switch again)


def test_memo_starting_over(monkeypatch):
    """A memo that fills starts over: answers worked out again are the same."""
    monkeypatch.setattr(sharing, "MEMO_PAIRS", 8)
    _walk(7, n_phases=50, steps=3000, spread=12)


def test_a_transfer_alone_since_its_start_shares_no_link():
    """The network skips the question at a transfer's end when it started alone and was never
    re-solved (``network._solo_since_start``): on staggered transfers over overlapping and
    disjoint groups, every time the shortcut applies the full answer is no, and it applies
    often (it fails with the generation test left out)."""
    from conftest import run_transfers, spec_topology
    from sim.collectives.schedule import Phase
    from sim.engine import network

    rng = np.random.default_rng(3)
    groups = [list(range(0, 8)), list(range(4, 12)), list(range(16, 24)), list(range(24, 32)), [0, 8, 16, 24]]

    def ring(gpus):
        src = np.array(gpus)
        return Phase(src, np.roll(src, -1), np.arange(len(gpus)), rng.uniform(1e6, 4e7, len(gpus)), 1, overhead=1e-6)

    phases = [ring(g) for g in groups for _ in range(2)]
    starts = [(float(rng.uniform(0, 0.1)), phases[int(rng.integers(len(phases)))]) for _ in range(60)]
    answers = []
    original = network.Network._on_wake

    def checked(self, act, event=None):
        if network._solo_since_start(act, act.generation):
            answers.append(self._sharing.others(act.phase))
        return original(self, act, event)

    network.Network._on_wake = checked
    try:
        net, _ = run_transfers(spec_topology(32, nic_gbps=50), starts)
    finally:
        network.Network._on_wake = original
    assert net.joint_solves > 5 and len(answers) > 10
    assert not any(answers)


@pytest.mark.parametrize("seed", range(8))
def test_components_from_the_memo_of_pairs_are_the_link_sets_ones(seed, monkeypatch):
    """``Sharing.components`` (union-find over the memo of pairs, what a joint re-solve that misses
    the memo of sets in flight asks) lists the same groups in the same order as
    ``maxmin.components`` finds from the link sets themselves: phases repeated (the same key,
    in flight twice), one with no links, the memo starting over midway."""
    from sim.engine.maxmin import components

    monkeypatch.setattr(sharing, "MEMO_PAIRS", 40)
    rng = random.Random(seed)
    phases = _phases(rng, 30)
    s = Sharing(N_LINKS)
    owner = np.full(N_LINKS, -1, dtype=np.int64)
    merged = 0
    for _ in range(200):
        flight = [phases[rng.randrange(len(phases))] for _ in range(rng.randint(1, 16))]
        for ph in flight:
            s.add(ph)
        groups = s.components(flight)
        assert groups == components([ph.links for ph in flight], owner)
        merged += len(groups) < len(flight)
        for ph in flight:
            s.remove(ph)
    assert 20 < merged < 200  # (both separate and merged transfers were met)
