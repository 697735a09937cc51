"""Direct (pairwise) all-to-all and point-to-point send/recv.

All-to-all: each of N ranks holds S bytes (nccl-tests' size) and sends S/N to each of
the N-1 others, all at once; each pair is its own chain. With B = N*S total payload,
T = B(N-1)/(W N^2) (the seeds' formula).

An uneven all-to-all (MoE dispatch to hot experts, and the combine back) takes per-member
send and receive weights: member a sends nbytes * send[a] * recv[b] to member b; the even
exchange is send = 1, recv = 1/N.
"""

import numpy as np

from .schedule import chains_phase


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


def send_recv(group, domains, nbytes):
    """group[0] sends nbytes to group[1]."""
    return (chains_phase([[(group[0], group[1])]], np.array([float(nbytes)]), 1, "send/recv"),)


def ring_shift(group, domains, nbytes):
    """Every member sends nbytes to the next one (one step of ring attention's K/V pass)."""
    n = len(group)
    chains = [[(group[i], group[(i + 1) % n])] for i in range(n)]
    return (chains_phase(chains, np.full(n, float(nbytes)), 1, "ring shift"),)
