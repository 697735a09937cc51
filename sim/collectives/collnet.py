"""In-network reduction over InfiniBand: SHARP, as NCCL's CollNet runs it.

NCCL CollNet (NVIDIA/nccl src/device/all_reduce.h, ``NCCL_ALGO_COLLNET_DIRECT``; the
SHARP plugin, Mellanox/nccl-rdma-sharp-plugins): inside each node the GPUs reduce-scatter
over NVLink so that GPU j holds the node's sum of shard j; every GPU's NIC sends its shard
up to the IB switches, which reduce it across nodes (a SHARP aggregation tree: each leaf
reduces its nodes' streams, the spines reduce the leaves') and multicast the result back
down; the GPUs all-gather it over NVLink. NCCL pipelines the three parts chunk by chunk,
so here each shard is one chain through all of them, and a NIC carries B/k each way
(k GPUs per node) instead of a ring's 2B(N-1)/(N k): the traffic per NIC of one GPU per
node is ~B, not 2B(N-1)/N. With k > 1 the NVLink part (2B(k-1)/k per GPU) usually sets
the pace: 8 DGX H100 nodes, B/T = 370 x 8/14 -> busbw 416 GB/s vs 386 measured with
NCCL_ALGO=COLLNETCHAIN (coreweave/nccl-tests README, H100 64-GPU SHARP job).

All-gather and reduce-scatter (the SHARP plugin's ``iallgather`` / ``ireducescatter``,
which NCCL's CollNet Direct uses when every GPU has its own NIC): shard j of the buffer
travels through GPU j of every node. Reduce-scatter: the node reduces shard j on GPU j
over NVLink, GPU j's NIC sends it up, the switches reduce it across nodes and hand each
node's GPU j its 1/nodes of it. All-gather: each GPU sends its piece up, the switches
gather shard j and multicast it to GPU j of every node, which passes it on over NVLink.
A NIC carries B/k one way (a ring: B/k (D-1)/D), in a handful of steps instead of N-1.

Latency: tuning.cc's ``hwLatencies[NET][COLLNET_DIRECT][SIMPLE]`` = 31 us, paid once.
"""

import numpy as np

from ..hardware.switching import sharp_port
from .nvls import owners, sharp_tree
from .schedule import chains_phase, merge

SHARP_LATENCY = 31e-6  # s, NVIDIA/nccl src/graph/tuning.cc


def all_reduce(group, domains, nbytes, fabric=None):
    """One phase, one chain per shard: reduce to the owner over NVLink, SHARP across nodes,
    broadcast from the owner over NVLink."""
    per_domain, k = owners(group, domains)
    chains = []
    for j in range(k):
        own = [m[j % len(m)] for m in per_domain]
        up, down = sharp_tree(own, fabric)
        gather = [(m, o) for ms, o in zip(per_domain, own) for m in ms if m != o]
        scatter = [(o, m) for ms, o in zip(per_domain, own) for m in ms if m != o]
        chains.append(gather + up + down + scatter)
    return (chains_phase(chains, np.full(k, nbytes / k), 4, "collnet all_reduce", SHARP_LATENCY),)


def _pieces(per_domain, own, fabric, nbytes, gather: bool):
    """The B/N pieces of one shard between the aggregation root and each node's owner."""
    root = own[0]
    chains = []
    for ms, o in zip(per_domain, own):
        core = [(sharp_port(o), sharp_port(root))] if fabric.leaf(o) != fabric.leaf(root) else []
        if gather:  # the piece goes up to the root
            chains.append([(o, sharp_port(o))] + core)
        else:  # the reduced piece comes down from the root
            chains.append([(b, a) for a, b in core[::-1]] + [(sharp_port(o), o)])
    n = sum(len(m) for m in per_domain)
    return chains, [nbytes / n] * len(chains)


def reduce_scatter(group, domains, nbytes, fabric=None):
    """Shard j: node reduce to GPU j over NVLink, up to the switches (B/k); each node's
    GPU j gets its reduced 1/nodes back (B/N)."""
    per_domain, k = owners(group, domains)
    shards, pieces, piece_bytes = [], [], []
    for j in range(k):
        own = [m[j % len(m)] for m in per_domain]
        up, _ = sharp_tree(own, fabric)
        shards.append([(m, o) for ms, o in zip(per_domain, own) for m in ms if m != o] + up)
        c, b = _pieces(per_domain, own, fabric, nbytes, gather=False)
        pieces += c
        piece_bytes += b
    return (merge([chains_phase(shards, np.full(k, nbytes / k), 3, "collnet reduce_scatter", SHARP_LATENCY),
                   chains_phase(pieces, piece_bytes, 3)], "collnet reduce_scatter"),)


def all_gather(group, domains, nbytes, fabric=None):
    """Each GPU's piece up (B/N); the switches multicast shard j (B/k) to GPU j of every
    node, which passes it to the node over NVLink."""
    per_domain, k = owners(group, domains)
    shards, pieces, piece_bytes = [], [], []
    for j in range(k):
        own = [m[j % len(m)] for m in per_domain]
        _, down = sharp_tree(own, fabric)
        shards.append(down + [(o, m) for ms, o in zip(per_domain, own) for m in ms if m != o])
        c, b = _pieces(per_domain, own, fabric, nbytes, gather=True)
        pieces += c
        piece_bytes += b
    return (merge([chains_phase(pieces, piece_bytes, 3),
                   chains_phase(shards, np.full(k, nbytes / k), 3, "collnet all_gather", SHARP_LATENCY)],
                  "collnet all_gather"),)
