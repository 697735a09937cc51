"""GPU-to-GPU speed variability: the slowest of N GPUs of one SKU sets a synchronous step.

Identical GPUs do not run at identical speeds. Sinha et al., "Not All GPUs Are Created Equal:
Characterizing Variability in Large-Scale, Accelerator-Rich Systems", SC22 (arXiv 2208.11035),
abstract: over 90% of the GPUs of five clusters (Summit, Vortex, Frontera, Longhorn, Corona),
"8% (max 22%) average performance variation even though the GPU architecture and vendor SKU
are identical within each cluster, with outliers up to 1.5X slower than the median GPU"
(power management and manufacturing variability; SGEMM and four applications).

A training step is synchronous: every layer's TP collective waits for the slowest GPU of its
group, a pipeline runs at the pace of its slowest stage, and the data-parallel gradient sync
waits for the slowest pipeline. To first order the step's tensor-core work runs at the speed
of the slowest of the job's N GPUs. With each GPU's static speed a draw of mean one and
relative standard deviation ``sigma`` (normal), the expected slowdown of that work is the
order statistic

    F(N, sigma) = 1 + sigma * E[max of N standard normals]

(:func:`expected_max`: 0 for N = 1, 1/sqrt(pi) for N = 2, ~2.9 at 256 GPUs, ~3.9 at 12k;
it grows as sqrt(2 ln N)). It is *one* factor for every rank, so folding is untouched and
the simulation costs the same at 16k GPUs as without it (docs/strong_scaling.md, "GPU speed
variability", argues why a uniform factor and not per-rank draws). ``variability.sigma``
sets it (default 0: off); :func:`sim.model.compute.ComputeModel` applies it to the FLOP
time of every kernel (tensor-core work slows with the clock; HBM traffic does not).
"""

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x on [-9, 9], phi(x) and Phi(x): the same for every m (36,001 erf calls, made once)."""
    x = np.linspace(-9.0, 9.0, 36001)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    return x, phi, cdf


@lru_cache(maxsize=None)  # (one integral per distinct m)
def expected_max(m: int) -> float:
    """E[max of m independent standard normals] (m >= 1): the integral of
    x * m * phi(x) * Phi(x)^(m-1) on a fine grid (1/sqrt(pi) for m = 2)."""
    x, phi, cdf = _grid()
    return float(np.trapezoid(x * m * phi * cdf ** (m - 1), x))


def slowest_of(gpus: int, sigma: float) -> float:
    """F(N, sigma): the expected slowdown of the slowest of ``gpus`` GPUs whose speeds are
    mean-one normal draws of relative standard deviation ``sigma`` (1.0 when sigma is 0)."""
    if sigma <= 0 or gpus <= 1:
        return 1.0
    return 1.0 + sigma * expected_max(int(gpus))


def step_slowdown(s, gpus: int) -> float:
    """The factor ``s.variability`` puts on the FLOP time of a job of ``gpus`` GPUs (one
    definition: the builders' compute model and the layer programs' cache key read it)."""
    return slowest_of(gpus, s.variability.sigma)
