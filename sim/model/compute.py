"""Compute time of one rank's kernels: a roofline with a size-dependent GEMM efficiency.

time(kernel) = launch + max(FLOPs / (peak * efficiency(shape)), bytes / (HBM bw * 0.8))

One efficiency model per GPU type (:data:`GEMM_EFFICIENCY`): large GEMMs reach
``e_max`` of peak; a GEMM whose smallest dimension is x reaches e_max * x / (x + 128),
since small tiles leave SMs idle. ``e_max`` is fitted once per GPU type to every
published run in ``sim/data/published_runs.csv`` together (``clustersim validate
--fit``), never per row.

A kernel marked ``fp8`` (a Transformer Engine linear layer under ``training.precision =
"fp8"``) runs at the GPU's dense FP8 peak with its own efficiency model
(:data:`FP8_GEMM_EFFICIENCY`, :data:`FP8_GEMM_HALF_SIZE`); memory-bound kernels and the
attention core (flash attention stays BF16) are timed as before.
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

# FP8 GEMMs (share of the dense FP8 peak). PROVISIONAL: the lead refits these with the
# BF16 constants on the validation rows (the hook: ComputeModel(e_max_fp8=...)).
# Large-size limit: cuBLAS-class FP8 and BF16 GEMMs reach the same share of their peaks on
#   H100-class parts (BF16 8192^3 ~797 of 989 TFLOP/s, github zzc0721/torch-performance-test-
#   data issue 79; FP8 M=N=8192, K=16384 ~1,523 of 1,979 on H800, github tile-ai/tilelang
#   benchmark/matmul_fp8/README.md), so e_max starts equal to the BF16 value of the GPU.
# Size dependence: a tile's fixed cost (prologue, epilogue, wave tail) does not shrink when
#   the MMA runs twice as fast, so the half-efficiency size doubles. Measured: fitting
#   e*K/(K+c) to the tilelang FP8 K-sweep gives c ~ 380 (M=N=8192, K=256..16384) where the
#   BF16 sm_90 cuBLAS table of XLA (tensorflow/tensorflow third_party/xla/xla/service/gpu/
#   model/matmul_interpolator_data.h, m=n=4096, k=256..4096) gives c ~ 215: a ratio of ~1.8.
FP8_GEMM_EFFICIENCY = {"h100-sxm": 0.685, "h200": 0.685, "b200": 0.685, "gb200": 0.685, "b300": 0.685}
FP8_GEMM_HALF_SIZE = 2 * GEMM_HALF_SIZE
HBM_EFFICIENCY = 0.8  # achievable share of HBM bandwidth for streaming kernels (STREAM-like)
LAUNCH_S = 4e-6  # seconds per kernel launch + tail (CUDA launch latency ~3-5 us)


class Kernel(NamedTuple):
    """One kernel's work: FLOPs at a GEMM shape (smallest dim), and HBM bytes. (A named
    tuple: lists of them key the compute-time memo, and tuples hash and compare in C.)"""

    flops: float = 0.0
    min_dim: float = 1e9  # smallest of m, n, k (GEMMs); attention: head dim
    bytes: float = 0.0
    count: int = 1  # kernel launches it stands for
    bwd: float = 2.0  # backward work / forward work: FLOPs (dgrad + wgrad; flash attention 2.5),
    #                   bytes for a memory-bound kernel (FLOPs 0)
    fp8: bool = False  # runs on the FP8 tensor cores (dense FP8 peak, FP8 efficiency)
    tp: int = 0  # role under tensor parallelism: 0 local (the sequence shard, or whole weights),
    #              1 reads the TP-gathered input (column-parallel), 2 writes the partial sums TP
    #              reduces (row-parallel); sim/parallel/tp_overlap.py chunks 1 and 2

    def backward(self) -> "Kernel":
        """The kernel's backward pass (a GEMM's dgrad and wgrad run in its precision)."""
        nbytes = self.bytes * (2 if self.flops else self.bwd)
        return Kernel(self.flops * self.bwd, self.min_dim, nbytes, self.count * 2, self.bwd, self.fp8, self.tp)


def gemm(m: float, n: float, k: float, elem: int = 2, fp8: bool = False) -> Kernel:
    """An (m x k) @ (k x n) GEMM in ``elem``-byte precision (``fp8``: operands in FP8, one
    byte each, output BF16)."""
    if fp8:
        return Kernel(2 * m * n * k, min(m, n, k), m * k + k * n + 2 * m * n, fp8=True)
    return Kernel(2 * m * n * k, min(m, n, k), elem * (m * k + k * n + m * n))


def elementwise(nbytes: float, count: int = 1) -> Kernel:
    """A memory-bound kernel moving ``nbytes``."""
    return Kernel(bytes=nbytes, count=count)


class ComputeModel:
    """Times kernels on one GPU type."""

    def __init__(self, gpu: GPU, e_max: float | None = None, e_max_fp8: float | None = None):
        self.gpu = gpu
        self.e_max = e_max if e_max is not None else GEMM_EFFICIENCY[gpu.name]
        self.e_max_fp8 = e_max_fp8 if e_max_fp8 is not None else FP8_GEMM_EFFICIENCY.get(gpu.name, 0.0)
        self._memo: dict[tuple, float] = {}

    def efficiency(self, min_dim: float) -> float:
        """Share of peak a GEMM with this smallest dimension reaches."""
        return self.e_max * min_dim / (min_dim + GEMM_HALF_SIZE)

    def fp8_efficiency(self, min_dim: float) -> float:
        """Share of the dense FP8 peak an FP8 GEMM with this smallest dimension reaches."""
        return self.e_max_fp8 * min_dim / (min_dim + FP8_GEMM_HALF_SIZE)

    def flop_time(self, k: Kernel) -> float:
        """Seconds of ``k``'s FLOPs alone, at the tensor-core rate of its precision."""
        if not k.flops:
            return 0.0
        if k.fp8:
            return k.flops / (self.gpu.fp8_flops * self.fp8_efficiency(k.min_dim))
        return k.flops / (self.gpu.peak_flops * self.efficiency(k.min_dim))

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
            flop_time = self.flop_time(k)
            mem_time = k.bytes / (self.gpu.hbm_bw * HBM_EFFICIENCY)
            total += LAUNCH_S * k.count + max(flop_time, mem_time)
        return total
