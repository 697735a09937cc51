"""Double binary tree all-reduce, as NCCL builds it (NCCL 2.4+; Sanders et al. 2009).

Inside each NVLink domain the members form a chain to a leader; the domain leaders form
two complementary binary trees (the second mirrors the first, so leaves of one are
interior nodes of the other), each reducing half of the data up to its root and
broadcasting it back down, pipelined. Like NCCL's channels, there is one such structure
per member of a domain, each led by a different GPU (and so a different NIC), carrying
1/k of the data. Every chain of hops moves at one common rate. Large messages take
~2B/W; latency grows with log2(domains) + k steps instead of the ring's 2(N-1).

Channel c's chain through a domain is the in-node path NCCL's topology search found for
that channel (NVIDIA/nccl src/graph/connect.cc ``ncclTopoPreset``: ``treeIntra =
graphs[NCCL_ALGO_TREE]->intra + c*localRanks``; RCCL keeps the same code). Behind an
NVSwitch any order is the same, so it is the rotated one. On a switchless xGMI mesh
(``mesh``) a hop is one peer link, and the search (src/graph/search.cc) takes each
channel's bandwidth off the links its path follows, so later channels take other links:
channel c follows the node's Hamiltonian path entering at c (:func:`.ring.crossing`, the
paths a ring's channels cross a node on; 8 paths on 8 GPUs use every directed link once),
and its chain runs up that path. So on a full 8-GPU node the tree's links carry B/k each
way like the ring's, instead of every channel's chain queueing on the same 7 links.
"""

import math

import numpy as np

from .ring import crossing, domain_members, mesh_paths, rotated
from .schedule import Phase, chains_phase


def tree_edges(order: list[int]) -> list[tuple[int, int]]:
    """(child, parent) edges of a binary heap laid over ``order``."""
    return [(order[i], order[(i - 1) // 2]) for i in range(1, len(order))]


def all_reduce(group, domains, nbytes, mesh: bool = False):
    """Chains to domain leaders, two binary trees over the leaders; reduce then broadcast
    (``mesh``: the domains are xGMI-meshed nodes, each channel's chain on its own path)."""
    per_domain = domain_members(group, domains)
    if all(len(m) == len(per_domain[0]) for m in per_domain):
        return all_reduce_arrays(np.array(per_domain, dtype=np.int64), nbytes, mesh)
    return all_reduce_lists(per_domain, nbytes, mesh)


def _order(members: list[int], c: int, k: int, mesh: bool) -> list[int]:
    """Channel c's chain order through one domain, its leader first."""
    return crossing(members, c, k) if mesh else rotated(members, c)


def all_reduce_lists(per_domain: list[list[int]], nbytes: float, mesh: bool = False) -> tuple[Phase, Phase]:
    """:func:`all_reduce` over the members of each domain (in order), any sizes."""
    k = max(len(m) for m in per_domain)  # channels; a partial domain's GPUs lead several
    up = []
    for c in range(k):
        orders = [_order(m, c, k, mesh) for m in per_domain]
        chains = [(r[i + 1], r[i]) for r in orders for i in range(len(r) - 1)]
        leaders = [r[0] for r in orders]
        up += [chains + tree_edges(leaders), chains + tree_edges(leaders[::-1])]
    down = [[(p, c) for c, p in hops[::-1]] for hops in up]
    steps = max(1, math.ceil(math.log2(len(per_domain))) + max(len(m) for m in per_domain) - 1)
    share = np.full(len(up), nbytes / len(up))
    return (chains_phase(up, share, steps, "tree reduce"), chains_phase(down, share, steps, "tree broadcast"))


def all_reduce_arrays(members: np.ndarray, nbytes: float, mesh: bool = False) -> tuple[Phase, Phase]:
    """:func:`all_reduce_lists` of ``members`` (domains x k GPUs, every domain full) built
    as arrays: the same hops in the same order (a world-wide all-reduce at a 131,072-GPU
    step's end is 2M hops, ~3 s as Python lists); tests/test_collectives.py compares them."""
    n, k = members.shape
    child = np.arange(1, n)
    paths = mesh_paths(k) if mesh else None
    up = []  # (src, dst) per chain: channel c's chains, then its tree (and the mirrored one)
    for c in range(k):
        rot = members[:, list(paths[c]) if paths else (np.arange(k) + c) % k]
        src, dst = rot[:, 1:].reshape(-1), rot[:, :-1].reshape(-1)
        for leaders in (rot[:, 0], rot[::-1, 0]):
            up.append((np.concatenate([src, leaders[child]]), np.concatenate([dst, leaders[(child - 1) // 2]])))
    down = [(d[::-1], s[::-1]) for s, d in up]
    steps = max(1, math.ceil(math.log2(n)) + k - 1)
    share = np.full(len(up), nbytes / len(up))
    return (_phase(up, share, steps, "tree reduce"), _phase(down, share, steps, "tree broadcast"))


def _phase(chains: list[tuple[np.ndarray, np.ndarray]], share: np.ndarray, steps: int, label: str) -> Phase:
    """:func:`~sim.collectives.schedule.chains_phase` of chains given as (src, dst) arrays."""
    chain = np.repeat(np.arange(len(chains), dtype=np.int64), [len(s) for s, _ in chains])
    return Phase(np.concatenate([s for s, _ in chains]).astype(np.int64), np.concatenate([d for _, d in chains]).astype(
        np.int64), chain, np.asarray(share, dtype=float), steps, label)
