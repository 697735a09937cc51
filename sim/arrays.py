"""Array helpers every layer may use (foundation: imports numpy only).

:func:`run_bounds` cuts a sorted array into its runs of equal values: the engine's
connected components of transfers (:func:`sim.engine.maxmin.components`, runs of equal
labels) and the outputs' per-rank passes over a spans table in rank order
(:mod:`sim.outputs.metrics`) both read it.

Run: ``python -m doctest sim/arrays.py``
"""

import numpy as np


def run_bounds(values: np.ndarray) -> list[int]:
    """Where each run of equal ``values`` (sorted, or at least grouped) starts, and the
    end: elements ``[b[i], b[i + 1])`` are one run.

    >>> run_bounds(np.array([0, 0, 1, 3, 3, 3]))
    [0, 2, 3, 6]
    """
    return [0, *(np.flatnonzero(np.diff(values)) + 1).tolist(), len(values)]
