"""Compute time of one rank's kernels: a roofline with a size-dependent GEMM efficiency.

time(kernel) = launch + max(FLOPs / (peak * efficiency(shape)), bytes / (HBM bw * 0.8))

One efficiency model per GPU type (:data:`GEMM_EFFICIENCY`): large GEMMs reach
``e_max`` of peak; a GEMM whose smallest dimension is x reaches e_max * x / (x + 128),
since small tiles leave SMs idle. ``e_max`` is fitted once per GPU type to every
published run in ``sim/data/published_runs.csv`` together (``clustersim validate
--fit``), never per row.
"""

from typing import NamedTuple

from ..hardware.gpus import GPU

# Large-GEMM efficiency per GPU family (share of dense bf16 peak, end to end in training).
# a100-80gb: `clustersim validate --rows N21 --fit` -> 0.693 (mean |log error| over all 8
#   Narayanan et al. 2021 rows at once, sim/data/published_runs.csv); cuBLAS reaches ~0.8
#   of peak on large bf16 GEMMs (NVIDIA A100 whitepaper), whole training kernels less.
# h100-sxm: `clustersim validate --rows MH --fit` -> 0.685 (mean |log error| over all 5
#   Megatron-LM README rows at once). h200 shares Hopper's tensor cores.
#   Blackwell parts (b200, gb200, b300) have no published rows here: Hopper's value is
#   assumed until measurements exist.
GEMM_EFFICIENCY = {"a100-80gb": 0.693, "h100-sxm": 0.685, "h200": 0.685, "b200": 0.685, "gb200": 0.685, "b300": 0.685}
GEMM_HALF_SIZE = 128  # smallest GEMM dim at which efficiency is half of e_max (tile size 128)
HBM_EFFICIENCY = 0.8  # achievable share of HBM bandwidth for streaming kernels (STREAM-like)
LAUNCH_S = 4e-6  # seconds per kernel launch + tail (CUDA launch latency ~3-5 us)


class Kernel(NamedTuple):
    """One kernel's work: FLOPs at a GEMM shape (smallest dim), and HBM bytes. (A named
    tuple: lists of them key the compute-time memo, and tuples hash and compare in C.)"""

    flops: float = 0.0
    min_dim: float = 1e9  # smallest of m, n, k (GEMMs); attention: head dim
    bytes: float = 0.0
    count: int = 1  # kernel launches it stands for
    bwd: float = 2.0  # backward work / forward work (dgrad + wgrad; flash attention 2.5)

    def backward(self) -> "Kernel":
        """The kernel's backward pass."""
        return Kernel(self.flops * self.bwd, self.min_dim, self.bytes * 2, self.count * 2, self.bwd)


def gemm(m: float, n: float, k: float, elem: int = 2) -> Kernel:
    """An (m x k) @ (k x n) GEMM in ``elem``-byte precision."""
    return Kernel(2 * m * n * k, min(m, n, k), elem * (m * k + k * n + m * n))


def elementwise(nbytes: float, count: int = 1) -> Kernel:
    """A memory-bound kernel moving ``nbytes``."""
    return Kernel(bytes=nbytes, count=count)


class ComputeModel:
    """Times kernels on one GPU type."""

    def __init__(self, gpu: GPU, e_max: float | None = None):
        self.gpu = gpu
        self.e_max = e_max if e_max is not None else GEMM_EFFICIENCY[gpu.name]
        self._memo: dict[tuple, float] = {}

    def efficiency(self, min_dim: float) -> float:
        """Share of peak a GEMM with this smallest dimension reaches."""
        return self.e_max * min_dim / (min_dim + GEMM_HALF_SIZE)

    def time(self, kernels: list[Kernel] | tuple[Kernel, ...]) -> float:
        """Seconds for a sequence of kernels (memoized: a step repeats the same lists)."""
        key = tuple(kernels)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._time(key)
        return found

    def _time(self, kernels: tuple[Kernel, ...]) -> float:
        total = 0.0
        for k in kernels:
            flop_time = k.flops / (self.gpu.peak_flops * self.efficiency(k.min_dim)) if k.flops else 0.0
            mem_time = k.bytes / (self.gpu.hbm_bw * HBM_EFFICIENCY)
            total += LAUNCH_S * k.count + max(flop_time, mem_time)
        return total
