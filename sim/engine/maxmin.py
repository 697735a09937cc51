"""Max-min fair rates of chains over links, by progressive filling, and the joint solve of
many transfers split into the connected components of the links they share.

:func:`fill` is the one solver: every round it finds the lowest fair share ``level`` of
any link, freezes every chain on a link whose share is within a relative ``_EPS`` of it
at that level and takes their rates off the links (Bertsekas and Gallager, *Data
Networks*, 2nd ed., section 6.5.2, "max-min flow control": progressive filling).

Transfers that share no link, directly or through others, do not constrain each other,
so :class:`ComponentRates` solves each connected component on its own and memoizes it by
its transfers' link structures (the same all-to-alls recur micro-batch after micro-batch,
each beside a different mix of unrelated traffic). Its rates are *the same floats* as
one :func:`fill` over everything, not merely close: a link's share depends only on its
own chains, summed by ``np.bincount`` in the same entry order either way, so a component
goes through exactly the rounds it goes through alone, provided no round of the joint
solve freezes it at another component's level. That happens only when two components'
levels differ by at most ``_EPS`` relatively without being equal; every level is a rate
some chain got, so :func:`separated` checks this on the results, and where it fails the
joint solve is done instead (``joint_fallbacks`` counts it). Tested by
``python -m pytest tests/test_maxmin.py``.

Both memos of rates (this module's per component, the network's per set of transfers in
flight) are :class:`Memo`: least recently used first out past :data:`MEMO_BYTES` each, so a
long MoE step (tens of thousands of distinct sets in flight) holds a bounded amount; an
evicted entry is solved again, to the same floats (the solve is a function of its key).
"""

from collections import OrderedDict

import numpy as np

from ..arrays import run_bounds

_EPS = 1e-9  # relative: links whose shares are this close to the lowest freeze together
# Bytes each rate memo may hold (its arrays and keys, as :func:`rates_bytes` counts them):
# `qwen` of bench/step.py at 128 sequences kept 84,662 sets in flight (docs/scaling.md).
MEMO_BYTES = 64 * 2**20
ARRAY_OVERHEAD, KEY_ITEM_BYTES = 112, 72  # a numpy array's header; one (phase key, mask) pair of a key
GROUP_BYTES, POSITION_BYTES = 56, 36  # a list's header; one small int in it (its slot and object)


class Memo:
    """A memo of at most ``limit`` bytes (``cost(key, value)`` says an entry's), the least
    recently used entry dropped first; ``hits``, ``misses`` and ``evicted`` count."""

    __slots__ = ("limit", "cost", "held", "hits", "misses", "evicted", "_items")

    def __init__(self, limit: float, cost):
        self.limit, self.cost, self.held = limit, cost, 0
        self.hits = self.misses = self.evicted = 0
        self._items: OrderedDict = OrderedDict()  # key -> (value, its cost)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key):
        """The value kept for ``key`` (now the most recently used), or None."""
        found = self._items.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return found[0]

    def put(self, key, value) -> None:
        """Keep ``value`` for ``key``, dropping the least recently used past the limit."""
        n = self.cost(key, value)
        self._items[key] = (value, n)
        self.held += n
        while self.held > self.limit and len(self._items) > 1:
            _, (_, dropped) = self._items.popitem(last=False)
            self.held -= dropped
            self.evicted += 1


def rates_bytes(key: tuple, rates: list[np.ndarray]) -> int:
    """What one memo entry of rates holds: its arrays and its key's items."""
    return sum(r.nbytes + ARRAY_OVERHEAD for r in rates) + KEY_ITEM_BYTES * len(key)


def groups_bytes(key: tuple, groups: list[list[int]]) -> int:
    """What one memo entry of components holds: its key's items and the groups' positions."""
    return KEY_ITEM_BYTES * len(key) + sum(GROUP_BYTES + POSITION_BYTES * len(g) for g in groups)


def max_min_rates(entry_chain: np.ndarray, entry_link: np.ndarray, n_chains: int,
                  caps: np.ndarray, entry_weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of each chain (bytes/s) by progressive filling.

    ``entry_chain[i]`` puts ``entry_weight[i]`` (default 1) times its rate on link
    ``entry_link[i]``: a chain with k hops on one link consumes k times its rate there,
    a flow sprayed over p paths 1/p on each.

    >>> max_min_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), 2, np.array([10., 3.]))
    array([7., 3.])
    """
    weight = np.ones(len(entry_chain)) if entry_weight is None else entry_weight
    links, local = np.unique(entry_link, return_inverse=True)
    return fill(entry_chain, local, caps[links].astype(float), n_chains, weight)


def fill(entry_chain: np.ndarray, local: np.ndarray, remaining: np.ndarray, n_chains: int,
         weight: np.ndarray) -> np.ndarray:
    """Progressive filling of :func:`max_min_rates` with links numbered 0..len(remaining)-1
    (``local``) and their capacities ``remaining`` (consumed)."""
    n_links = len(remaining)
    rates = np.zeros(n_chains)
    while len(entry_chain):  # the entries of chains not yet frozen, in their original order
        load = np.bincount(local, weights=weight, minlength=n_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, np.maximum(remaining, 0) / load, np.inf)
        level = share.min()
        tight = share <= level * (1 + _EPS)
        hit = np.zeros(n_chains, dtype=bool)
        hit[entry_chain[tight[local]]] = True
        rates[hit] = level
        newly = hit[entry_chain]
        remaining -= np.bincount(local[newly], weights=weight[newly], minlength=n_links) * level
        keep = ~newly
        entry_chain, local, weight = entry_chain[keep], local[keep], weight[keep]
    return rates


def components(link_sets: list[np.ndarray], owner: np.ndarray) -> list[list[int]]:
    """Connected components of transfers that share links: lists of positions in
    ``link_sets`` (each ascending, ordered by their first member). ``owner`` is scratch,
    one entry per link of the topology, all -1 (and left so).

    Vectorized label propagation: every transfer starts labelled by its own position; each
    round a link takes the lowest label of its transfers and a transfer the lowest of its
    links' (then of its label's label: pointer jumping), until nothing changes. Each label
    is then its component's lowest position, the order the groups are listed in. A few
    whole-array rounds, not a union-find step per transfer in Python (which took 15% of the
    engine in the GPT 530B case of ``python bench/step.py``)."""
    n = len(link_sets)
    sizes = np.fromiter(map(len, link_sets), dtype=np.int64, count=n)
    if n == 1 or not sizes.all():
        return _components_by_union(link_sets, owner)
    links = np.concatenate(link_sets)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    who = np.repeat(np.arange(n, dtype=np.int64), sizes)
    label = np.arange(n, dtype=np.int64)
    while True:
        owner[links] = n
        np.minimum.at(owner, links, label[who])
        lowest = np.minimum.reduceat(owner[links], starts)
        lowest = lowest[lowest]  # (labels only fall, each to a position of the same component)
        if np.array_equal(lowest, label):
            break
        label = lowest
    owner[links] = -1
    order = np.argsort(label, kind="stable")
    bounds = run_bounds(label[order])
    order = order.tolist()
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _components_by_union(link_sets: list[np.ndarray], owner: np.ndarray) -> list[list[int]]:
    """:func:`components` by union-find, one transfer at a time (a transfer on no link)."""
    parent = list(range(len(link_sets)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, links in enumerate(link_sets):
        seen = owner[links]
        owner[links] = i
        for j in np.unique(seen[seen >= 0]).tolist():
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    for links in link_sets:
        owner[links] = -1
    groups: dict[int, list[int]] = {}
    for i in range(len(link_sets)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def separated(levels: list[np.ndarray]) -> bool:
    """Whether no two levels (each component's distinct rates) differ by at most ``_EPS``
    relatively without being equal: then no round of a joint :func:`fill` freezes a
    component at another's level, and the components' own solves are the joint one's.
    (Conservative: a near tie inside one component also says no.)"""
    values = np.sort(np.concatenate(levels))
    low, high = values[:-1], values[1:]
    return not np.count_nonzero((high > low) & (high <= low * (1 + _EPS)))  # (.any(): the same answer)


class ComponentRates:
    """Joint max-min rates of many transfers, one connected component at a time, each
    component memoized by its key (see the module's docstring).

    ``solve(link_sets, keys, joint)``: ``link_sets[i]`` the distinct links transfer i
    uses, ``keys[i]`` what fixes its rates given its links (its link structure and which
    chains are live), ``joint(positions)`` the :func:`fill` of those transfers together
    (a list of rate arrays, one per transfer, in the order given)."""

    def __init__(self, n_links: int):
        self._owner = np.full(n_links, -1, dtype=np.int64)
        self._cache = Memo(MEMO_BYTES, lambda key, found: rates_bytes(key, found[0]) + found[1].nbytes)
        self._groups = Memo(MEMO_BYTES, groups_bytes)  # shape of the transfers in flight -> components
        self.joint_fallbacks = 0  # joint solves done because components' levels nearly tied

    @property
    def hits(self) -> int:
        """Components found in the memo."""
        return self._cache.hits

    @property
    def solves(self) -> int:
        """Components solved (not found in the memo)."""
        return self._cache.misses

    def solve(self, link_sets: list[np.ndarray], keys: list, joint, shape: tuple | None = None,
              groups_of=None) -> list[np.ndarray]:
        """``shape``, when given, names ``link_sets`` (the same shape, the same sets in the
        same order): their components are then memoized by it, found again whenever the
        same transfers are in flight whatever their live chains. ``groups_of()``, when given,
        gives what :func:`components` would (the network's memo of pairs that share a link:
        :meth:`sim.engine.sharing.Sharing.components`)."""
        groups = None if shape is None else self._groups.get(shape)
        if groups is None:
            groups = components(link_sets, self._owner) if groups_of is None else groups_of()
            if shape is not None:
                self._groups.put(shape, groups)
        if len(groups) == 1:
            return joint(groups[0])
        out: list = [None] * len(link_sets)
        levels = []
        cache = self._cache
        items = cache._items  # (Memo.get inlined, the same counts and order: ~20 components per solve)
        for group in groups:
            key = tuple([keys[i] for i in group])
            entry = items.get(key)
            if entry is None:
                cache.misses += 1
                rates = joint(group)
                found = (rates, np.unique(np.concatenate(rates)))
                cache.put(key, found)
            else:
                cache.hits += 1
                items.move_to_end(key)
                found = entry[0]
            for i, r in zip(group, found[0]):
                out[i] = r
            levels.append(found[1])
        if separated(levels):
            return out
        self.joint_fallbacks += 1
        return joint(list(range(len(link_sets))))
