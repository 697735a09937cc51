"""Max-min rates solved per connected component and memoized (sim/engine/maxmin.py): the
same floats as one joint progressive filling, bit for bit, on random transfer sets; the
near tie that forces the joint solve; cache hits on a recurring pattern in the network.
Run ``python -m pytest -q tests/test_maxmin.py``.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from conftest import run_transfers, spec_topology
from sim.collectives.schedule import Phase
from sim.engine import maxmin
from sim.engine.maxmin import ComponentRates, fill
from sim.engine.network import Network


def joint_of(transfers, caps):
    """``joint(positions)`` for ComponentRates: one fill over those transfers, entries in
    their order (as Network._max_min numbers them: links by their union, ascending)."""
    def joint(positions):
        union = np.unique(np.concatenate([np.array([l for c in transfers[i] for l, _ in c], dtype=np.int64)
                                          for i in positions]))
        chains, local, weight, sizes, offset = [], [], [], [], 0
        for i in positions:
            for c, hops in enumerate(transfers[i]):
                for link, w in hops:
                    chains.append(offset + c)
                    local.append(int(np.searchsorted(union, link)))
                    weight.append(w)
            sizes.append(len(transfers[i]))
            offset += len(transfers[i])
        rates = fill(np.array(chains, dtype=np.int64), np.array(local, dtype=np.int64),
                     caps[union].astype(float), offset, np.array(weight))
        return list(np.split(rates, np.cumsum(sizes)[:-1]))
    return joint


def link_sets(transfers):
    return [np.unique(np.array([l for c in t for l, _ in c], dtype=np.int64)) for t in transfers]


@st.composite
def transfer_sets(draw):
    """Transfers on links drawn from a few disjoint blocks (so several components form),
    capacities from a short list with rare relative nudges of 1e-10 (near ties)."""
    n_blocks = draw(st.integers(1, 4))
    n_links = 3 * n_blocks
    base = draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 7.5]), min_size=n_links, max_size=n_links))
    nudge = draw(st.lists(st.sampled_from([1.0, 1.0, 1.0, 1 + 1e-10, 1 - 1e-10]), min_size=n_links, max_size=n_links))
    caps = np.array(base) * np.array(nudge)
    transfers = []
    for _ in range(draw(st.integers(1, 7))):
        block = draw(st.integers(0, n_blocks - 1))
        hop = st.tuples(st.integers(3 * block, 3 * block + 2), st.sampled_from([0.5, 1.0, 2.0]))
        transfers.append(draw(st.lists(st.lists(hop, min_size=1, max_size=3), min_size=1, max_size=3)))
    return transfers, caps


@settings(max_examples=300, deadline=None)
@given(transfer_sets())
def test_component_rates_are_the_joint_fill_bit_for_bit(problem):
    transfers, caps = problem
    joint = joint_of(transfers, caps)
    expected = np.concatenate(joint(list(range(len(transfers)))))
    solver = ComponentRates(len(caps))
    keys = [repr(t) for t in transfers]
    for _ in range(2):  # the second time from the cache
        got = np.concatenate(solver.solve(link_sets(transfers), keys, joint))
        assert got.tobytes() == expected.tobytes()
    assert (solver._owner == -1).all()  # scratch left clean


def test_a_near_tie_between_components_falls_back_to_the_joint_solve():
    # alone, the second link's chain gets 1 + 1e-10; jointly it freezes at the first's level 1.0
    transfers, caps = [[[(0, 1.0)]], [[(1, 1.0)]]], np.array([1.0, 1.0 + 1e-10])
    joint = joint_of(transfers, caps)
    assert joint([1])[0].tolist() == [1.0 + 1e-10]
    solver = ComponentRates(2)
    got = solver.solve(link_sets(transfers), ["a", "b"], joint)
    assert [r.tolist() for r in got] == [[1.0], [1.0]]
    assert solver.joint_fallbacks == 1


def test_components_are_found_through_shared_links():
    owner = np.full(10, -1, dtype=np.int64)
    sets = [np.array([0, 1]), np.array([5]), np.array([1, 2]), np.array([7, 8]), np.array([2, 5])]
    assert maxmin.components(sets, owner) == [[0, 1, 2, 4], [3]]
    assert (owner == -1).all()


def test_vectorized_components_match_union_find():
    """The label propagation finds the union-find's groups, in its order, on random sets
    (long chains of transfers included: many rounds of propagation)."""
    rng = np.random.default_rng(7)
    owner = np.full(400, -1, dtype=np.int64)
    for trial in range(300):
        n = int(rng.integers(2, 40))
        width = int(rng.integers(1, 400))
        sets = [np.unique(rng.integers(0, width, size=int(rng.integers(1, 6)))) for _ in range(n)]
        if trial % 3 == 0:  # a chain: transfer i shares one link with i + 1, shuffled
            perm = rng.permutation(n)
            sets = [np.array(sorted({2 * int(perm[i]), 2 * int(perm[i]) + 1})) for i in range(n)]
            for i in range(n - 1):
                sets[i] = np.union1d(sets[i], [300 + i])
                sets[i + 1] = np.union1d(sets[i + 1], [300 + i])
        assert maxmin.components(sets, owner) == maxmin._components_by_union(sets, owner)
        assert (owner == -1).all()


def _hop(src, dst, nbytes):
    return Phase(np.array([src]), np.array([dst]), np.array([0]), np.array([float(nbytes)]), 1)




def test_a_recurring_pair_beside_other_traffic_is_solved_once(monkeypatch):
    topo = spec_topology(24)
    # GPUs 0 -> 1 twice (sharing links), each time beside a different unrelated transfer
    starts = [(0.0, _hop(8, 9, 4e9)), (0.0, _hop(0, 1, 1e9)), (1e-4, _hop(0, 1, 1e9)),
              (0.5, _hop(16, 17, 4e9)), (0.5, _hop(0, 1, 1e9)), (0.5 + 1e-4, _hop(0, 1, 1e9))]
    net, ends = run_transfers(topo, starts)
    assert net.components.hits >= 1
    monkeypatch.setattr(ComponentRates, "solve",
                        lambda self, sets, keys, joint, shape=None, groups_of=None: joint(list(range(len(sets)))))
    _, joint_ends = run_transfers(topo, starts)
    assert ends == joint_ends  # exactly the joint solve's times


def test_the_memo_drops_the_least_recently_used_past_its_bytes():
    memo = maxmin.Memo(30, lambda key, value: value)  # an entry costs its value in bytes
    memo.put("a", 10)
    memo.put("b", 10)
    assert memo.get("a") == 10  # "a" used last: "b" goes first
    memo.put("c", 15)
    assert (memo.get("b"), memo.get("a"), memo.get("c")) == (None, 10, 15)
    assert (len(memo), memo.held, memo.evicted, memo.hits, memo.misses) == (2, 25, 1, 3, 1)
    memo.put("d", 99)  # larger than the limit alone: kept, everything else dropped
    assert (len(memo), memo.held) == (1, 99)


def test_a_memo_of_one_entry_gives_the_same_times(monkeypatch):
    """Rates solved again after an eviction are the floats the memo held: the same
    transfers' ends as with the default bound, while the small memos drop entries."""
    topo = spec_topology(24)
    starts = [(0.0, _hop(8, 9, 4e9)), (0.0, _hop(0, 1, 1e9)), (1e-4, _hop(0, 1, 1e9)),
              (0.5, _hop(16, 17, 4e9)), (0.5, _hop(0, 1, 1e9)), (0.5 + 1e-4, _hop(0, 1, 1e9)),
              (0.6, _hop(8, 9, 4e9)), (0.6, _hop(0, 1, 1e9)), (0.6 + 1e-4, _hop(16, 17, 1e9))]
    _, ends = run_transfers(topo, starts)
    monkeypatch.setattr(maxmin, "MEMO_BYTES", 1)
    monkeypatch.setattr("sim.engine.network.MEMO_BYTES", 1)
    net, small_ends = run_transfers(topo, starts)
    assert net._rate_cache.evicted > 0 and len(net._rate_cache) == 1
    assert small_ends == ends
