"""PAT (Parallel Aggregated Trees): all-gather and reduce-scatter in log2(N) steps.

NCCL 2.23.4 release notes (NVIDIA/nccl commit 68b54236): "Parallel Aggregated Trees,
variation of Bruck algorithm. Logarithmic number of network steps for small sizes at
scale. Only supports one rank per node at the moment." (``PatAGAlgorithm`` and
``PatRSAlgorithm`` in src/include/collectives.h; tuning.cc disables PAT unless
nNodes == nRanks.) Modelled as Bruck's all-gather: at step s = 0, 1, ... every member i
sends the min(2^s, N - 2^s) blocks it holds to member i - 2^s, so ceil(log2 N) phases
move (N-1)/N of the output in all:

    T = ceil(log2 N) alpha + B (N-1) / (N W)

Reduce-scatter runs the same steps in reverse (distance halving), reducing as it goes.
"""

import numpy as np

from .schedule import chains_phase


def _steps(n: int) -> list[tuple[int, int]]:
    """(distance, blocks sent) of each step."""
    out, s = [], 1
    while s < n:
        out.append((s, min(s, n - s)))
        s *= 2
    return out


def all_gather(group, domains, nbytes, fabric=None):
    """ceil(log2 N) phases; step s sends min(2^s, N-2^s) blocks of nbytes/N to i - 2^s."""
    n = len(group)
    return tuple(chains_phase([[(group[i], group[(i - s) % n])] for i in range(n)],
                              np.full(n, blocks * nbytes / n), 1, f"pat all_gather d={s}")
                 for s, blocks in _steps(n))


def reduce_scatter(group, domains, nbytes, fabric=None):
    """The all-gather's steps in reverse order and direction."""
    n = len(group)
    return tuple(chains_phase([[(group[i], group[(i + s) % n])] for i in range(n)],
                              np.full(n, blocks * nbytes / n), 1, f"pat reduce_scatter d={s}")
                 for s, blocks in reversed(_steps(n)))
