"""Double binary tree all-reduce (NCCL 2.4+; Sanders et al. 2009).

Two complementary binary trees each reduce half of the data up to a root and broadcast
it back down, pipelined; each tree is one chain (its edges run at a common rate). Every
rank sends about B in the reduce and B in the broadcast, so large messages take ~2B/W,
and latency grows with log2(N) steps instead of N: the tree wins for small messages
across many nodes.
"""

import math

import numpy as np

from .schedule import chains_phase


def _tree_edges(order: list[int]) -> list[tuple[int, int]]:
    """(child, parent) edges of a binary heap laid over ``order``."""
    return [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]


def all_reduce(group, domains, nbytes):
    """Reduce up two trees (half the bytes each), then broadcast down them."""
    order = list(group)
    mirrored = order[::-1]  # leaves of one tree are interior nodes of the other
    up = [_tree_edges(order), _tree_edges(mirrored)]
    down = [[(p, c) for c, p in edges] for edges in up]
    depth = max(1, math.ceil(math.log2(len(group))))
    half = np.full(2, nbytes / 2)
    return (chains_phase(up, half, depth, "tree reduce"),
            chains_phase(down, half, depth, "tree broadcast"))
