"""The network's joint re-solve of every transfer in flight (sim/engine/network.py
``Network._solve_many``, and the components memoized by the shapes in flight in
sim/engine/maxmin.py) against the act-by-act solve it replaced, kept here verbatim as the
reference: on overlapping uneven all-to-alls (chains of different sizes ending at
different times, so live masks change mid-transfer) every rate change and every end time
is the same float. Run ``python -m pytest -q tests/test_network_solve.py``.
"""

import numpy as np

from conftest import run_transfers, spec_topology
from sim.collectives.schedule import Phase
from sim.engine.maxmin import ComponentRates
from sim.engine.network import Network, _mask_key


def _old_solve(self, acts) -> None:
    """``Network._solve`` as it was before ``_solve_many`` (main b2945af)."""
    if len(acts) > 1:
        _old_advance_many(self, acts)
    else:
        for act in acts:
            self._advance(act)
            act.mask = _mask_key(act.remaining)
    order = sorted(acts, key=lambda a: (a.phase.key, a.mask)) if len(acts) > 1 else acts
    key = tuple((a.phase.key, a.mask) for a in order)
    rates = self._rate_cache.get(key)
    if rates is None:
        if len(order) == 1:
            rates = self._max_min(order)
        else:
            rates = self.components.solve([a.phase.links for a in order], key,
                                          lambda group: self._max_min([order[i] for i in group]))
        self._rate_cache.put(key, rates)
    for act, r in zip(order, rates):
        act.rates = r
        act.generation += 1
    horizons = _old_horizons(order) if len(order) > 1 else None
    for i, act in enumerate(order):
        self._wake_in(act, self._horizon(act) if horizons is None else horizons[i])


def _old_advance_many(self, acts) -> None:
    now = self.env.now
    moving = []
    for act in acts:
        dt = now - act.updated
        act.updated = now
        if dt > 0 and act.rates is not None:
            moving.append((act, dt))
        else:
            act.mask = _mask_key(act.remaining)
    if not moving:
        return
    sizes = [len(act.remaining) for act, _ in moving]
    left = (np.concatenate([act.remaining for act, _ in moving])
            - np.concatenate([act.rates for act, _ in moving]) * np.repeat([dt for _, dt in moving], sizes))
    live = left > 0
    bounds = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    every = np.logical_and.reduceat(live, bounds[:-1]).tolist()
    bounds = bounds.tolist()
    for k, (act, _) in enumerate(moving):
        start, end = bounds[k], bounds[k + 1]
        act.remaining = left[start:end]
        act.mask = b"" if every[k] else live[start:end].tobytes()


def _old_horizons(order) -> list[float]:
    sizes = [len(act.remaining) for act in order]
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    remaining = np.concatenate([act.remaining for act in order])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = remaining / np.concatenate([act.rates for act in order])
    if all(act.mask == b"" for act in order):
        return np.minimum.reduceat(ratio, starts).tolist()
    live = remaining > 0
    out = np.minimum.reduceat(np.where(live, ratio, np.inf), starts)
    return np.where(np.logical_or.reduceat(live, starts), out, 0.0).tolist()


def _all_to_all(gpus: list[int], rng, zero_share: float = 0.1) -> Phase:
    """Every GPU of ``gpus`` to every other, one chain each, uneven bytes (some none)."""
    src, dst = zip(*[(a, b) for a in gpus for b in gpus if a != b])
    nbytes = rng.uniform(1e6, 4e7, len(src)) * (rng.random(len(src)) >= zero_share)
    return Phase(np.array(src), np.array(dst), np.arange(len(src)), nbytes, 1, overhead=1e-6)


def _traffic(seed: int) -> list[tuple[float, Phase]]:
    """Uneven all-to-alls over overlapping and disjoint groups of 32 GPUs, the same Phase
    objects recurring (as cached schedules do), started at staggered times."""
    rng = np.random.default_rng(seed)
    groups = [list(range(0, 8)), list(range(4, 12)), list(range(16, 24)), [0, 8, 16, 24], list(range(24, 32))]
    phases = [_all_to_all(g, rng) for g in groups for _ in range(2)]
    return [(float(rng.uniform(0, 4e-3)), phases[int(rng.integers(len(phases)))]) for _ in range(40)]


def _run(topo, starts, memos: bool = True) -> tuple[list, list, Network]:
    """Each transfer's end time, the network's log of rate changes (act ids renumbered by
    first appearance, rates as bytes), and the network."""

    def logged(net, env):
        net.log = []
        net._record = lambda act, rates: net.log.append((env.now, act, act.phase, rates))  # (acts kept alive)

    net, ends = run_transfers(topo, starts, logged)
    ids: dict[int, int] = {}
    log = [(t, ids.setdefault(id(a), len(ids)), None if r is None else r.tobytes()) for t, a, _, r in net.log]
    assert net.joint_solves > 50 and (net.components.hits > 0 or not memos)  # the joint path, memos found
    return ends, log, net


def test_joint_re_solves_match_the_act_by_act_solve_bit_for_bit(monkeypatch):
    topo = spec_topology(32, nic_gbps=50)
    for seed in (1, 2):
        starts = _traffic(seed)
        ends, log, _ = _run(topo, starts)
        with monkeypatch.context() as m:
            m.setattr(Network, "_solve", _old_solve)
            solve = ComponentRates.solve
            m.setattr(ComponentRates, "solve", lambda self, sets, keys, joint: solve(self, sets, keys, joint))
            old_ends, old_log, _ = _run(topo, starts)
        assert any(mask for mask in (_mask_key(p.nbytes) for _, p in starts))  # chains with no bytes
        assert ends == old_ends
        assert log == old_log


def test_the_components_memo_is_used_and_keyed_by_the_shapes_in_flight():
    _, _, net = _run(spec_topology(32, nic_gbps=50), _traffic(4))
    groups = net.components._groups
    assert groups.hits > 0 and len(groups) > 0
    assert all(isinstance(k, int) for key in groups._items for k in key)  # compiled phases' keys only
    assert groups.held <= groups.limit


def _hashed_transfers(seed: int) -> list[tuple[float, Phase]]:
    """Phases of several chains each from one scalable unit to the next on an ECMP fabric with two
    spines (sim/engine/joint.py's case: a spine uplink that three chains hash onto slows one
    chain of a phase, so its chains end at different times while other transfers are in flight),
    equal bytes per chain, staggered starts, the same Phase objects recurring."""
    rng = np.random.default_rng(seed)
    phases = []
    for _ in range(6):
        src = rng.choice(16, size=4, replace=False)  # servers 0-1 of the first unit
        dst = 32 + rng.choice(16, size=4, replace=False)  # ... to servers 0-1 of the second
        phases.append(Phase(src, dst, np.arange(4), np.full(4, 2e7), 1, overhead=1e-6))
    for base in (16, 48):  # and rings inside one server, on links of their own (other components)
        ring = np.arange(base, base + 8)
        phases.append(Phase(ring, np.roll(ring, -1), np.zeros(8, dtype=np.int64), np.array([5e6]), 1))
    return [(float(rng.uniform(0, 2e-3)), phases[int(rng.integers(len(phases)))]) for _ in range(40)]


def test_hashed_chains_ending_apart_match_the_act_by_act_solve_bit_for_bit(monkeypatch):
    """ECMP's uneven chains: most joint re-solves bring every transfer up to now by one common
    ``dt`` (joint.bring_up_to_now's scalar path), the rest by their own; every rate change and end
    time is the act-by-act solve's float."""
    topo = spec_topology(64, nodes_per_su=4, spines=2, routing="ecmp", nic_gbps=50)
    for seed in (1, 2):
        starts = _hashed_transfers(seed)
        ends, log, net = _run(topo, starts, memos=False)
        assert len({t for t, _, r in log if r is not None}) > 2 * len(starts)  # re-solves mid-transfer
        with monkeypatch.context() as m:
            m.setattr(Network, "_solve", _old_solve)
            solve = ComponentRates.solve
            m.setattr(ComponentRates, "solve", lambda self, sets, keys, joint: solve(self, sets, keys, joint))
            old_ends, old_log, _ = _run(topo, starts, memos=False)
        assert ends == old_ends
        assert log == old_log
