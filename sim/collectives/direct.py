"""Direct (pairwise) all-to-all and point-to-point send/recv.

All-to-all: each of N ranks holds S bytes (nccl-tests' size) and sends S/N to each of
the N-1 others, all at once; each pair is its own chain. With B = N*S total payload,
T = B(N-1)/(W N^2) (the seeds' formula).

An uneven all-to-all (MoE dispatch to hot experts, and the combine back) takes per-member
send and receive weights: member a sends nbytes * send[a] * recv[b] to member b; the even
exchange is send = 1, recv = 1/N.

DeepEP's exchange (:class:`Dedup`, deepseek-ai/DeepEP, the V1 "normal" kernels Megatron-Core's
flex dispatcher calls, docs/legacy.md): ``get_dispatch_layout`` marks each token for every
*rank* (``is_token_in_rank``, ``num_tokens_per_rank``) and every *node* (``num_tokens_per_rdma_rank``)
holding at least one of its top-k experts, and the dispatch sends a token once to each: over
RDMA once per remote node, to the GPU of the same local index there ("asymmetric-domain
bandwidth forwarding ... from NVLink domain to RDMA domain"), which forwards it over NVLink to
the ranks of its node that hold its experts; inside the node once per rank. The combine is the
same exchange backwards (each rank sums a token's expert outputs before sending). Measured on
H800 + CX7 (docs/legacy.md, "Normal kernels with NVLink and RDMA forwarding"): 153-158 GB/s
NVLink intranode (the H800's ~160 GB/s) and 43 / 58 / 51 GB/s RDMA "bottleneck bandwidth" at EP
16 / 32 / 64. The RDMA figures are logical: the benchmark (tests/test_internode.py, e.g. DeepEP
92fe2de) divides ``num_rdma_token_sent`` -- each token counted once per *node* it goes to, its
own node included, whose share never leaves the node -- by the kernel's time (DeepEP's README
says so of its V2 table: "the results are logical bandwidth ... contains local rank traffic").
On N nodes a NIC carries (N - 1) / N of them: 58 x 3/4 = 43.5 GB/s at EP 32 (4 nodes), 51 x 7/8
= 44.6 GB/s at EP 64 (8 nodes), of a 400 Gb/s CX7's 50 (at EP 16, 2 nodes, 21.5 GB/s: there the
H800's NVLink leg is the bottleneck, 3.6x the RDMA bytes at 155 GB/s). So the internode
exchange runs its NIC legs at :data:`DEEPEP_RDMA_EFFICIENCY` of the line rate, where NCCL's
transfers get the fabric's ``ib`` share (0.95, sim/hardware/gpus.py): :func:`dedup_wire`
stretches its bytes on the wire by the ratio (the NVLink legs too, which stay far from their
bound at EP 32 / 64). Inside one node it runs at the fabric's rates.
``nbytes`` is then one rank's tokens once (tokens x hidden x 2 bytes), and member a sends:

- to each member b of its own NVLink domain: ``nodes * nbytes * rank_hit`` (its own tokens for
  b's experts, and the tokens it relays from each of the other ``nodes - 1`` domains);
- to the member of each other domain at its own position there: ``nbytes * node_hit``,

all at once (DeepEP pipelines the RDMA and NVLink legs in chunks: one phase). ``rank_hit`` and
``node_hit`` (:func:`hit`) are the chance that a token has at least one expert on a given rank,
on a given node. Members are matched by position within their domain; the group must hold the
same number in each (Megatron's EP groups on whole nodes do).
"""

from dataclasses import replace
from math import comb
from typing import NamedTuple

import numpy as np

from ..hardware.gpus import FABRIC_EFFICIENCY
from .schedule import chains_phase

# Share of a 400 Gb/s NIC's line rate DeepEP's normal internode kernels move per NIC (module
# docstring: docs/legacy.md's EP 32 row, 58 GB/s logical x 3/4 nodes remote = 43.5 of 50 GB/s;
# its EP 64 row gives 44.6, 0.89). Measured with 24 SMs (test_internode.py ``num_sms = 24``);
# Megatron-Core runs 20 (sim/parallel/ep.py DEEPEP_SMS).
DEEPEP_RDMA_EFFICIENCY = 58 * 3 / 4 / 50


def all_to_all(group, domains, nbytes, shares=None):
    """Every ordered pair exchanges nbytes/N (or nbytes * send[a] * recv[b])."""
    n = len(group)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    chains = [[(group[i], group[j])] for i, j in pairs]
    if shares is None:
        sizes = np.full(len(chains), nbytes / n)
    else:
        send, recv = (np.asarray(w, dtype=float) for w in shares)
        sizes = np.array([nbytes * send[i] * recv[j] for i, j in pairs])
    return (chains_phase(chains, sizes, 1, "direct all_to_all"),)


class Dedup(NamedTuple):
    """DeepEP's deduplicated all-to-all (module docstring): the chance that a token has at least
    one of its experts on a given rank (``rank_hit``) and on a given NVLink domain (``node_hit``);
    ``slowdown``: its kernel's time beside other kernels over its time alone (sim/parallel/ep.py
    ``DEEPEP_BESIDE_COMPUTE``), its bytes on the wire stretched by it."""

    rank_hit: float
    node_hit: float
    slowdown: float = 1.0


def hit(experts: int, top_k: int, held: int) -> float:
    """The chance that ``held`` of ``experts`` experts include at least one of a token's ``top_k``
    (distinct experts drawn uniformly, as balanced routing does): 1 - C(E - m, k) / C(E, k)."""
    return 1.0 - comb(experts - held, top_k) / comb(experts, top_k)


def dedup_pairs(group, domains, nbytes: float, dedup: Dedup) -> tuple[list, list]:
    """(src, dst) member pairs of DeepEP's exchange and the bytes each carries (module docstring)."""
    members: dict[int, list[int]] = {}
    for i, d in enumerate(domains):
        members.setdefault(d, []).append(i)
    counts = {len(m) for m in members.values()}
    if len(counts) != 1:
        raise ValueError(f"DeepEP's exchange needs the same number of members in every NVLink domain, got {sorted(counts)}")
    nodes, pairs, sizes = len(members), [], []
    for i, d in enumerate(domains):
        pos = members[d].index(i)
        for j in members[d]:
            if j != i:
                pairs.append((group[i], group[j]))
                sizes.append(nodes * nbytes * dedup.rank_hit)
        for other, m in members.items():
            if other != d:
                pairs.append((group[i], group[m[pos]]))
                sizes.append(nbytes * dedup.node_hit)
    return pairs, sizes


def dedup_wire(domains) -> float:
    """Bytes on the wire per byte of DeepEP's exchange over members in ``domains``: the fabric's
    InfiniBand share over DeepEP's (:data:`DEEPEP_RDMA_EFFICIENCY`) when it spans several NVLink
    domains, 1 inside one (module docstring)."""
    return FABRIC_EFFICIENCY["ib"] / DEEPEP_RDMA_EFFICIENCY if len(set(domains)) > 1 else 1.0


def dedup_all_to_all(group, domains, nbytes, dedup: Dedup):
    """DeepEP's exchange as one phase of direct chains (:func:`dedup_pairs`), its bytes on the
    wire :func:`dedup_wire` times its ``slowdown``."""
    pairs, sizes = dedup_pairs(group, domains, nbytes, dedup)
    phase = chains_phase([[p] for p in pairs], np.array(sizes, dtype=float), 1, "deepep all_to_all")
    wire = dedup_wire(domains) * dedup.slowdown
    return (phase if wire == 1.0 else replace(phase, wire=wire),)


def send_recv(group, domains, nbytes):
    """group[0] sends nbytes to group[1]."""
    return (chains_phase([[(group[0], group[1])]], np.array([float(nbytes)]), 1, "send/recv"),)


def ring_shift(group, domains, nbytes):
    """Every member sends nbytes to the next one (one step of ring attention's K/V pass)."""
    n = len(group)
    chains = [[(group[i], group[(i + 1) % n])] for i in range(n)]
    return (chains_phase(chains, np.full(n, float(nbytes)), 1, "ring shift"),)
