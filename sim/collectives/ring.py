"""Ring collectives with NCCL-style channels.

A ring spanning several NVLink domains with k members in each runs k channels (k rings
carrying 1/k of the data each), rotated inside every domain so that each channel leaves
a domain through a different GPU and so a different NIC: a ring across DGX nodes uses
every NIC of the node, as NCCL does (NCCL docs, "rings ... one per NIC"). Each hop of a
channel carries (N-1)/N of its chunk for all-gather and reduce-scatter, twice that for
all-reduce (Patarasuk & Yuan 2009; nccl-tests doc/PERFORMANCE.md).
"""

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


def channel_orders(group: tuple[int, ...], domains: tuple[int, ...]) -> list[list[int]]:
    """The ring order of every channel."""
    per_domain = domain_members(group, domains)
    if len(per_domain) == 1:
        return [list(group)]
    # one channel per member of the largest domain; a smaller (partial) domain's GPUs
    # serve several channels, sharing their links
    channels = max(len(members) for members in per_domain)
    return [[r for members in per_domain for r in rotated(members, c)] for c in range(channels)]


def ring_phase(group, domains, nbytes: float, passes: int, label: str) -> Phase:
    """One phase: every channel moves passes*(N-1)/N of its share of ``nbytes``."""
    orders = channel_orders(group, domains)
    n = len(group)
    hops = [[(o[i], o[(i + 1) % n]) for i in range(n)] for o in orders]
    per_hop = passes * (n - 1) / n * nbytes / len(orders)
    return chains_phase(hops, np.full(len(orders), per_hop), passes * (n - 1), label)


def all_gather(group, domains, nbytes):
    """Ring all-gather of ``nbytes`` total output: T = B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 1, "ring all_gather"),)


def reduce_scatter(group, domains, nbytes):
    """Ring reduce-scatter of ``nbytes`` total input: T = B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 1, "ring reduce_scatter"),)


def all_reduce(group, domains, nbytes):
    """Ring all-reduce (reduce-scatter then all-gather, pipelined): T = 2B(N-1)/(W N)."""
    return (ring_phase(group, domains, nbytes, 2, "ring all_reduce"),)


def broadcast(group, domains, nbytes):
    """Pipelined chain broadcast from group[0] (NCCL's ring broadcast): T ~ B/W."""
    orders = channel_orders(group, domains)
    root = group[0]
    chains = []
    for order in orders:
        start = order.index(root)
        seq = order[start:] + order[:start]
        chains.append(list(zip(seq, seq[1:])))
    return (chains_phase(chains, np.full(len(orders), nbytes / len(orders)), len(group) - 1,
                         "ring broadcast"),)
