"""Ring collectives with NCCL-style channels.

A ring spanning several NVLink domains with k members in each runs k channels (k rings
carrying 1/k of the data each), rotated inside every domain so that each channel leaves
a domain through a different GPU and so a different NIC: a ring across DGX nodes uses
every NIC of the node, as NCCL does (NCCL docs, "rings ... one per NIC"). Each hop of a
channel carries (N-1)/N of its chunk for all-gather and reduce-scatter, twice that for
all-reduce (Patarasuk & Yuan 2009; nccl-tests doc/PERFORMANCE.md).

On a switchless xGMI mesh (``mesh``: AMD Instinct nodes, :mod:`sim.hardware.mesh`) a ring
hop is one peer link, so one ring would use 1 of a GPU's 7 links. RCCL's topology search
builds many channels whose rings take different xGMI links (ROCm/rccl src/graph/search.cc,
rome_models.cc: predefined ring sets for fully connected 8-GPU gfx942 nodes) so that all
links carry traffic; here the channels are arc-disjoint directed Hamiltonian cycles of the
node (:func:`mesh_rings`: 7 rings on 8 GPUs use every directed link exactly once, Tillson
1980), so T = 2B(N-1)/(N * (N-1) * w_link) for all-reduce on one 8-GPU node. Across nodes
channel c enters a node at member c and crosses it on its own Hamiltonian path
(:func:`mesh_paths`: 8 paths on 8 GPUs again use every link once), leaving through the
GPU whose NIC it takes. Sizes without such a decomposition (3, 5 members: none exists
with one path per start) fall back to the rotated order.
"""

from functools import lru_cache

import numpy as np

from .schedule import Phase, chains_phase


def domain_members(group: tuple[int, ...], domains: tuple[int, ...]) -> list[list[int]]:
    """Members of ``group`` per NVLink domain, domains in order of first appearance."""
    by_domain: dict[int, list[int]] = {}
    for rank, dom in zip(group, domains):
        by_domain.setdefault(dom, []).append(rank)
    return list(by_domain.values())


def rotated(members: list[int], c: int) -> list[int]:
    """``members`` started at position c (mod its length): channel c's entry into a domain."""
    c %= len(members)
    return members[c:] + members[:c]


# Found by :func:`_search` (exhaustive, lexicographic) and kept: the 8-GPU search takes
# seconds. tests/test_mesh.py checks both are decompositions and that the search finds them.
_MESH_RINGS = {8: ((0, 1, 2, 3, 4, 5, 6, 7), (0, 2, 1, 3, 5, 4, 7, 6), (0, 3, 1, 4, 6, 2, 7, 5),
                   (0, 4, 1, 5, 7, 2, 6, 3), (0, 5, 3, 6, 1, 7, 4, 2), (0, 6, 5, 2, 4, 3, 7, 1),
                   (0, 7, 3, 2, 5, 1, 6, 4))}
_MESH_PATHS = {8: ((0, 1, 2, 3, 4, 5, 6, 7), (1, 0, 2, 4, 3, 5, 7, 6), (2, 0, 3, 1, 6, 4, 7, 5),
                   (3, 0, 4, 6, 5, 1, 7, 2), (4, 0, 5, 2, 6, 3, 7, 1), (5, 4, 1, 3, 6, 2, 7, 0),
                   (6, 0, 7, 4, 2, 1, 5, 3), (7, 3, 2, 5, 0, 6, 1, 4))}


def _search(n: int, cycles: bool, count: int | None = None, budget: int = 200_000
            ) -> tuple[tuple[int, ...], ...] | None:
    """``count`` arc-disjoint directed Hamiltonian cycles through 0 (default n - 1: every
    arc of the complete digraph on n vertices), or n paths, path c starting at c; None when
    none exists or ``budget`` search steps do not find them."""
    count = count or (n - 1 if cycles else n)
    used: set[tuple[int, int]] = set()
    out: list[tuple[int, ...]] = []
    steps = [0]

    def walks(path, seen):
        steps[0] += 1
        if steps[0] > budget:
            raise TimeoutError
        if len(path) == n:
            if not cycles or (path[-1], path[0]) not in used:
                yield tuple(path)
            return
        for v in range(n):
            if v not in seen and (path[-1], v) not in used:
                yield from walks(path + [v], seen | {v})

    def place(k: int) -> bool:
        if k == count:
            return True
        for walk in walks([0 if cycles else k], {0 if cycles else k}):
            arcs = list(zip(walk, walk[1:] + ((walk[0],) if cycles else ())))
            used.update(arcs)
            out.append(walk)
            if place(k + 1):
                return True
            used.difference_update(arcs)
            out.pop()
        return False

    try:
        return tuple(out) if place(0) else None
    except TimeoutError:
        return None


@lru_cache(maxsize=None)
def mesh_rings(n: int) -> tuple[tuple[int, ...], ...]:
    """Ring orders (member indices) of the channels of a ring on n meshed GPUs of one node:
    as many arc-disjoint ones as exist (n - 1; 2 on 4 GPUs and 4 on 6, where no full
    decomposition exists)."""
    if n in _MESH_RINGS:
        return _MESH_RINGS[n]
    for count in range(n - 1, 1, -1):
        found = _search(n, True, count) if n > 2 else None
        if found:
            return found
    return (tuple(range(n)),)


@lru_cache(maxsize=None)
def mesh_paths(n: int) -> tuple[tuple[int, ...], ...] | None:
    """Per channel c, the order in which it crosses a node of n meshed GPUs, entering at c."""
    return _MESH_PATHS.get(n) or _search(n, False)


def channel_orders(group: tuple[int, ...], domains: tuple[int, ...], mesh: bool = False) -> list[list[int]]:
    """The ring order of every channel (``mesh``: the node's GPUs are meshed, not switched)."""
    per_domain = domain_members(group, domains)
    if len(per_domain) == 1:
        return [[group[i] for i in ring] for ring in mesh_rings(len(group))] if mesh else [list(group)]
    # one channel per member of the largest domain; a smaller (partial) domain's GPUs
    # serve several channels, sharing their links
    channels = max(len(members) for members in per_domain)
    if mesh:
        return [[r for members in per_domain for r in crossing(members, c, channels)] for c in range(channels)]
    return [[r for members in per_domain for r in rotated(members, c)] for c in range(channels)]


def crossing(members: list[int], c: int, channels: int) -> list[int]:
    """Channel c's order through one meshed node: its Hamiltonian path when the node holds
    a member per channel, else the rotated order (the tree's in-node chains too, :mod:`.tree`)."""
    paths = mesh_paths(len(members)) if len(members) == channels else None
    return [members[i] for i in paths[c]] if paths else rotated(members, c)


def ring_phase(group, domains, nbytes: float, passes: int, label: str, mesh: bool = False) -> Phase:
    """One phase: every channel moves passes*(N-1)/N of its share of ``nbytes``."""
    orders = channel_orders(group, domains, mesh)
    n = len(group)
    hops = [[(o[i], o[(i + 1) % n]) for i in range(n)] for o in orders]
    per_hop = passes * (n - 1) / n * nbytes / len(orders)
    return chains_phase(hops, np.full(len(orders), per_hop), passes * (n - 1), label)


def all_gather(group, domains, nbytes, mesh: bool = False):
    """Ring all-gather of ``nbytes`` total output: T = B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 1, "ring all_gather", mesh),)


def reduce_scatter(group, domains, nbytes, mesh: bool = False):
    """Ring reduce-scatter of ``nbytes`` total input: T = B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 1, "ring reduce_scatter", mesh),)


def all_reduce(group, domains, nbytes, mesh: bool = False):
    """Ring all-reduce (reduce-scatter then all-gather, pipelined): T = 2B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 2, "ring all_reduce", mesh),)


def broadcast(group, domains, nbytes, mesh: bool = False):
    """Pipelined chain broadcast from group[0] (NCCL's ring broadcast): T ~ B/W."""
    orders = channel_orders(group, domains, mesh)
    root = group[0]
    chains = []
    for order in orders:
        start = order.index(root)
        seq = order[start:] + order[:start]
        chains.append(list(zip(seq, seq[1:])))
    return (chains_phase(chains, np.full(len(orders), nbytes / len(orders)), len(group) - 1,
                         "ring broadcast"),)
