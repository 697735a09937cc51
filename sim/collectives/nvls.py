"""NVLink SHARP (NVLS): the NVSwitch reduces and multicasts (NCCL 2.17+, Hopper and newer).

As NCCL runs it (NVIDIA/nccl src/device/all_reduce.h, ``NCCL_ALGO_NVLS``): GPU i owns
shard i; a ``multimem.ld_reduce`` pulls shard i from every GPU through the switch, which
reduces it and returns one copy to i; i then writes the result once with
``multimem.st`` and the switch multicasts it to every GPU. A hop to or from the switch
is the GPU's own NVLink (``sim.hardware.switching.nvls_port``); each shard is one chain
(the multicast down is one rate into N GPUs). Per GPU the link carries B + B/N up and
B/N + B down, so an all-reduce takes

    T = B (1 + 1/N) / (W eta_nvls),   busbw = W eta_nvls 2(N-1)/(N+1)

with W the NVLink bandwidth after fabric efficiency and eta_nvls NCCL's NVLS efficiency
(``sim.hardware.gpus.NVLS_EFFICIENCY``). 8x H100: 370 x 0.85 x 14/9 = 489 GB/s vs ~480
measured (nccl-tests issue 212; NCCL issue 2140: 370 -> 480 with NVLS). Reduce-scatter
sends S and receives S/N, all-gather sends S/N and receives S (S. Jeaugey, NCCL issue
1083): slower than a ring, which is why NCCL's tuner keeps rings for them.

Across NVLink domains: with SHARP switches, NVLS reduces inside each domain to one owner
per shard and the IB switches reduce across domains (NCCL's NVLS + CollNet); without
them, NVLS_TREE joins the owners by NCCL's double binary trees over the network
(``NCCL_ALGO_NVLS_TREE``). The fixed latencies are tuning.cc's ``hwLatencies``: NVLS 25
us on NVLink, +18 us for SHARP across nodes.

Heads: NCCL's NVLS graph has one channel per head GPU, at most ``NCCL_MAX_NVLS_ARITY`` = 32
(src/include/device.h; search.cc ``maxChannels = min(NCCL_MAX_NVLS_ARITY, ngpus)``,
connect.cc ``connectNvls``), so in a domain of more than 32 GPUs only 32 own a shard and
reduce it (the rest scatter and gather): a head's link carries B + B/32 each way, busbw
W eta_nvls 2(N-1)/N x 32/33. NCCL runs NVLS reduce-scatter and all-gather only up to 32
local ranks (enqueue.cc), as :mod:`sim.collectives.tuner` does.
"""

import math

import numpy as np

from ..hardware.switching import nvls_port, sharp_port
from .ring import domain_members
from .schedule import chains_phase
from .tree import tree_edges

MAX_NVLS_ARITY = 32  # NVIDIA/nccl src/include/device.h NCCL_MAX_NVLS_ARITY: NVLS heads per domain
NVLS_LATENCY = 25e-6  # s, tuning.cc hwLatencies[NVLINK][NVLS][SIMPLE]
SHARP_NVLS_LATENCY = 18e-6  # s, tuning.cc hwLatencies[NET][NVLS][SIMPLE] (NVLS + CollNet)


def _up(members) -> list:
    return [(m, nvls_port(m)) for m in members]


def _down(members) -> list:
    return [(nvls_port(m), m) for m in members]


def all_reduce(group, domains, nbytes, fabric=None):
    """One domain: in-switch reduce-scatter then multicast, one chain per shard. Several
    domains: NVLS in each domain, SHARP across (needs ``fabric.sharp``)."""
    if len(set(domains)) > 1:
        return (_nvls_sharp(group, domains, nbytes, fabric),)
    heads = group[:MAX_NVLS_ARITY]
    chains = [_up(group) + [(nvls_port(i), i), (i, nvls_port(i))] + _down(group) for i in heads]
    return (chains_phase(chains, np.full(len(heads), nbytes / len(heads)), 4, "nvls all_reduce", NVLS_LATENCY),)


def reduce_scatter(group, domains, nbytes, fabric=None):
    """Every GPU sends its whole input up; the switch returns each shard reduced to its owner."""
    n = len(group)
    chains = [_up(group) + [(nvls_port(i), i)] for i in group]
    return (chains_phase(chains, np.full(n, nbytes / n), 2, "nvls reduce_scatter", NVLS_LATENCY),)


def all_gather(group, domains, nbytes, fabric=None):
    """Every GPU writes its shard once; the switch multicasts it to every GPU."""
    n = len(group)
    chains = [[(i, nvls_port(i))] + _down(group) for i in group]
    return (chains_phase(chains, np.full(n, nbytes / n), 2, "nvls all_gather", NVLS_LATENCY),)


def owners(group, domains) -> tuple[list[list[int]], int]:
    """Members per domain and the shard count k (the largest domain's member count);
    shard j of domain d is owned by its member j mod size."""
    per_domain = domain_members(group, domains)
    return per_domain, max(len(m) for m in per_domain)


def sharp_tree(owned: list[int], fabric) -> tuple[list, list]:
    """Up and down hops of a SHARP aggregation tree over GPUs ``owned`` (one per domain):
    each NIC up to its leaf, leaves up to the root's leaf, and the reverse."""
    root = owned[0]
    seen, leaves = {fabric.leaf(root)}, []
    for g in owned[1:]:
        if fabric.leaf(g) not in seen:
            seen.add(fabric.leaf(g))
            leaves.append(g)
    up = [(g, sharp_port(g)) for g in owned] + [(sharp_port(g), sharp_port(root)) for g in leaves]
    down = [(sharp_port(root), sharp_port(g)) for g in leaves] + [(sharp_port(g), g) for g in owned]
    return up, down


def heads(group, domains) -> tuple[list[list[int]], int]:
    """:func:`owners` with NCCL's NVLS head count: at most MAX_NVLS_ARITY shards."""
    per_domain, k = owners(group, domains)
    return per_domain, min(k, MAX_NVLS_ARITY)


def _nvls_sharp(group, domains, nbytes, fabric):
    per_domain, k = heads(group, domains)
    chains = []
    for j in range(k):
        own = [m[j % len(m)] for m in per_domain]
        up, down = sharp_tree(own, fabric)
        reduce_in = [h for m, o in zip(per_domain, own) for h in _up(m) + [(nvls_port(o), o)]]
        cast_out = [h for m, o in zip(per_domain, own) for h in [(o, nvls_port(o))] + _down(m)]
        chains.append(reduce_in + up + down + cast_out)
    return chains_phase(chains, np.full(k, nbytes / k), 6, "nvls+sharp all_reduce",
                        NVLS_LATENCY + SHARP_NVLS_LATENCY)


def endpoint_time(phase, group, domains, fabric) -> float:
    """Seconds the busiest endpoint link of ``phase`` needs alone (no latency): each GPU's
    NVLink up and down (an NVLS byte weighs 1/eta_nvls), and its NIC up and down for a hop to
    another domain; the bandwidth term of an NVLS schedule on a non-blocking fabric."""
    where = dict(zip(group, domains))
    load: dict[tuple, float] = {}
    for a, b, c in zip(phase.src.tolist(), phase.dst.tolist(), phase.chain.tolist()):
        size = float(phase.nbytes[c])
        if a < 0 or b < 0:
            ends, size = [("nv_down", b) if a < 0 else ("nv_up", a)], size / fabric.nvls
        elif where[a] != where[b]:
            ends = [("nic_up", a), ("nic_down", b)]
        else:
            ends = [("nv_up", a), ("nv_down", b)]
        for end in ends:
            load[end] = load.get(end, 0.0) + size
    return max(v / (fabric.nic_w if k.startswith("nic") else fabric.nvlink_w) for (k, _), v in load.items())


def tree_all_reduce(group, domains, nbytes, fabric=None):
    """NVLS_TREE: NVLS reduce to the shard owner in each domain, two complementary binary
    trees over the owners across domains (reduce up, broadcast down), NVLS multicast."""
    per_domain, k = heads(group, domains)
    chains = []
    for j in range(k):
        own = [m[j % len(m)] for m in per_domain]
        reduce_in = [h for m, o in zip(per_domain, own) for h in _up(m) + [(nvls_port(o), o)]]
        cast_out = [h for m, o in zip(per_domain, own) for h in [(o, nvls_port(o))] + _down(m)]
        for order in (own, own[::-1]):
            up = tree_edges(order)
            chains.append(reduce_in + up + [(p, c) for c, p in up[::-1]] + cast_out)
    steps = 4 + 2 * math.ceil(math.log2(len(per_domain)))
    return (chains_phase(chains, np.full(len(chains), nbytes / len(chains)), steps, "nvls_tree all_reduce",
                         NVLS_LATENCY),)
