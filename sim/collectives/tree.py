"""Double binary tree all-reduce, as NCCL builds it (NCCL 2.4+; Sanders et al. 2009).

Inside each NVLink domain the members form a chain to a leader; the domain leaders form
two complementary binary trees (the second mirrors the first, so leaves of one are
interior nodes of the other), each reducing half of the data up to its root and
broadcasting it back down, pipelined. Like NCCL's channels, there is one such structure
per member of a domain, each led by a different GPU (and so a different NIC), carrying
1/k of the data. Every chain of hops moves at one common rate. Large messages take
~2B/W; latency grows with log2(domains) + k steps instead of the ring's 2(N-1).
"""

import math

import numpy as np

from .ring import domain_members, rotated
from .schedule import chains_phase


def tree_edges(order: list[int]) -> list[tuple[int, int]]:
    """(child, parent) edges of a binary heap laid over ``order``."""
    return [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]


def all_reduce(group, domains, nbytes):
    """Chains to domain leaders, two binary trees over the leaders; reduce then broadcast."""
    per_domain = domain_members(group, domains)
    k = max(len(m) for m in per_domain)  # channels; a partial domain's GPUs lead several
    up = []
    for c in range(k):
        orders = [rotated(m, c) for m in per_domain]
        chains = [(r[i + 1], r[i]) for r in orders for i in range(len(r) - 1)]
        leaders = [r[0] for r in orders]
        up += [chains + tree_edges(leaders), chains + tree_edges(leaders[::-1])]
    down = [[(p, c) for c, p in hops[::-1]] for hops in up]
    steps = max(1, math.ceil(math.log2(len(per_domain))) + max(len(m) for m in per_domain) - 1)
    share = np.full(len(up), nbytes / len(up))
    return (chains_phase(up, share, steps, "tree reduce"), chains_phase(down, share, steps, "tree broadcast"))
