"""Which transfers in flight share a link: what decides whether a transfer is solved alone.

:class:`~sim.engine.network.Network` asks at every start and end of a transfer whether
another transfer in flight uses one of its links (then every transfer is re-solved jointly;
else it runs alone at its cached rates). A compiled phase's links are fixed by its key
(:class:`~sim.engine.links.CompiledPhase`), so whether two phases share a link is worked
out once per pair of keys that meet in flight and memoized, and the question costs one
dictionary lookup per distinct phase in flight, not numpy's indexing of a per-link count
(four array operations at each start and four at each end). Measured in docs/scaling.md
("Whether a transfer shares a link"). The answers are the same booleans as counting
transfers per link (``tests/test_sharing.py`` checks both on random link sets).

Run: ``python -m pytest -q tests/test_sharing.py tests/test_network_solve.py``
"""

from itertools import compress

import numpy as np

MEMO_PAIRS = 500_000  # pairs of phase keys remembered (~50 MB); past it the memo starts over (same answers)
CROWDED, UNCROWDED = 24, 12  # distinct phases in flight at which a count per link takes over, and gives up
# (timeit, this machine under load: the loop ~0.15 us per phase, the numpy ~6 us per start or end)


class Sharing:
    """The compiled phases of the transfers in flight (a count per key) and a memo of which
    pairs of keys share a link. With more than :data:`CROWDED` distinct phases in flight
    (uneven all-to-alls of whole expert groups) a loop over them costs more than numpy's
    indexing, so a count of transfers per link is kept instead (built from the phases in
    flight, dropped again below :data:`UNCROWDED`): the same answers either way."""

    __slots__ = ("count", "_links", "_pairs", "_size", "_scratch", "_users")

    def __init__(self, n_links: int):
        self.count: dict[int, int] = {}  # compiled key -> transfers of it in flight
        self._links: dict[int, np.ndarray] = {}  # compiled key -> its links (ascending, distinct)
        self._pairs: dict[int, dict[int, bool]] = {}  # key -> key -> whether they share a link
        self._size = 0  # pairs in the memo
        self._scratch = np.zeros(n_links, dtype=bool)  # left all False between calls
        self._users: np.ndarray | None = None  # transfers in flight per link, while crowded

    def add(self, compiled) -> bool:
        """Put a transfer of ``compiled`` in flight; whether one already in flight used one of
        its links."""
        key, count, users = compiled.key, self.count, self._users
        n = count.get(key, 0)
        if users is not None:
            on = users[compiled.links]
            users[compiled.links] = on + 1
            shared = bool(np.count_nonzero(on))
        else:
            shared = (n > 0 and len(compiled.links) > 0) or self._touches(compiled)
        count[key] = n + 1
        if n == 0:
            if key not in self._links:
                self._links[key] = compiled.links
            if users is None and len(count) > CROWDED:
                self._crowd()
        return shared

    def others(self, compiled) -> bool:
        """Whether a transfer in flight other than one of ``compiled`` (itself in flight)
        uses one of its links."""
        if self._users is not None:
            return bool(np.count_nonzero(self._users[compiled.links] > 1))
        return (self.count[compiled.key] > 1 and len(compiled.links) > 0) or self._touches(compiled)

    def remove(self, compiled) -> None:
        """A transfer of ``compiled`` has ended."""
        key, count = compiled.key, self.count
        n = count[key]
        if n > 1:
            count[key] = n - 1
        else:
            del count[key]
        if self._users is not None:
            self._users[compiled.links] -= 1
            if len(count) < UNCROWDED:
                self._users = None

    def _crowd(self) -> None:
        """Count the transfers in flight on each link (from here on until uncrowded)."""
        users = np.zeros(len(self._scratch), dtype=np.int64)
        for key, n in self.count.items():
            users[self._links[key]] += n
        self._users = users

    def _touches(self, compiled) -> bool:
        """Whether a phase in flight whose key is not ``compiled``'s shares one of its links."""
        key = compiled.key
        row = self._pairs.get(key)
        if row is None:
            row = self._pairs[key] = {}
        for other in self.count:
            if other == key:
                continue
            hit = row.get(other)
            if hit is None:
                hit = self._pair(compiled, other, row)
            if hit:
                return True
        return False

    def components(self, compiled: list) -> list[list[int]]:
        """Connected components of transfers of the phases ``compiled`` (in flight) over the links
        they share: lists of positions, each ascending, ordered by their first member, as
        :func:`sim.engine.maxmin.components` gives them from the link sets. From the memo of pairs
        (each position's row looked up over the earlier positions' keys by one ``map``), union-find
        over the pairs that share: no numpy call per round (label propagation took ~160 us of CPU per
        joint re-solve that missed the memo of sets in flight, docs/scaling.md)."""
        n = len(compiled)
        keys = [c.key for c in compiled]
        parent = list(range(n))
        pairs = self._pairs
        for i in range(1, n):
            key = keys[i]
            row = pairs.get(key)
            if row is None:
                row = pairs[key] = {}
            hits = list(map(row.get, keys[:i]))
            if None in hits:  # (pairs not yet worked out; the same key: the same links)
                for j in [j for j, h in enumerate(hits) if h is None]:
                    hits[j] = len(compiled[i].links) > 0 if keys[j] == key else self._pair(compiled[i], keys[j], row)
            for j in compress(range(i), hits):
                a, b = _root(parent, i), _root(parent, j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        groups: dict[int, list[int]] = {}
        for i in range(n):
            groups.setdefault(_root(parent, i), []).append(i)
        return list(groups.values())

    def _pair(self, compiled, other: int, row: dict) -> bool:
        """Work out (and remember both ways) whether ``compiled`` and key ``other`` share a link."""
        if self._size >= MEMO_PAIRS:  # (an answer forgotten is worked out again: the same boolean)
            self._pairs.clear()
            self._size = 0
            row = self._pairs[compiled.key] = {}
        mine, theirs = compiled.links, self._links[other]
        scratch = self._scratch
        scratch[mine] = True
        hit = np.count_nonzero(scratch[theirs]) > 0  # (.any(): the same answer, no Python frame)
        scratch[mine] = False
        row[other] = hit
        self._pairs.setdefault(other, {})[compiled.key] = hit
        self._size += 2
        return hit


def _root(parent: list[int], i: int) -> int:
    """The root of ``i`` in a union-find forest (halving the path on the way)."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i
