"""GPU presets: the numbers a simulation needs about one accelerator.

Each number cites its source. Units are SI: FLOP/s, bytes, bytes/s.
Fabric efficiencies (what share of a link's line rate NCCL actually reaches) live in
:data:`FABRIC_EFFICIENCY`, one constant per fabric, calibrated globally against the
nccl-tests figures copied into ``sim/data/collectives_measured.csv``.
"""

from dataclasses import dataclass

from ..errors import InputError
from ..units import GB, GIB, TFLOPS


@dataclass(frozen=True)
class GPU:
    """One accelerator. ``nvlink_bw`` is per direction per GPU; ``nic_bw`` per NIC."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float  # bytes
    hbm_bw: float  # bytes/s
    nvlink_bw: float  # bytes/s per direction per GPU
    nic_bw: float  # bytes/s per NIC (one NIC per GPU on every preset here)
    pcie_bw: float  # bytes/s GPU <-> NIC per direction
    hbm_unit: str = "GB"  # the unit the datasheet's capacity is in: "GiB" for the 80 GB A100/H100 (80 * 2**30 bytes)
    fp8_flops: float = 0.0  # dense FP8 FLOP/s (0: no FP8 tensor cores, e.g. A100)


GPUS: dict[str, GPU] = {}


def _register(gpu: GPU) -> None:
    if gpu.name in GPUS:
        raise ValueError(f"duplicate GPU preset {gpu.name}")
    GPUS[gpu.name] = gpu


# NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e,
# NVLink3 600 GB/s bidirectional = 300 GB/s per direction; DGX A100: 8x 200 Gb/s HDR
# ConnectX-6 = 25 GB/s each; PCIe gen4 x16 ~ 32 GB/s per direction. No FP8 tensor cores
# (FP8 arrived with Hopper), so fp8_flops stays 0 and training.precision = "fp8" is refused.
_register(GPU("a100-80gb", 312 * TFLOPS, 80 * GIB, 2039 * GB, 300 * GB, 25 * GB, 32 * GB, hbm_unit="GiB"))
# NVIDIA H100 datasheet (SXM5): 989 TFLOP/s dense BF16, 80 GB HBM3 at 3.35 TB/s,
# NVLink4 900 GB/s bidirectional = 450 per direction; DGX H100: 8x 400 Gb/s NDR
# ConnectX-7 = 50 GB/s each; PCIe gen5 x16 ~ 64 GB/s per direction.
# Dense FP8: 1,979 TFLOP/s (the datasheet's 3,958 is with 2:4 sparsity).
_register(GPU("h100-sxm", 989 * TFLOPS, 80 * GIB, 3350 * GB, 450 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS, hbm_unit="GiB"))
# NVIDIA H200 datasheet (SXM): same Hopper compute as H100 (989 TFLOP/s dense BF16),
# 141 GB HBM3e at 4.8 TB/s, NVLink4 450 GB/s per direction; 400 Gb/s NICs.
# Dense FP8: 1,979 TFLOP/s (H200 datasheet: 3,958 with sparsity).
_register(GPU("h200", 989 * TFLOPS, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS))
# NVIDIA DGX B200 datasheet: 72 PFLOP/s FP8 training per 8 GPUs -> 2.25 PFLOP/s dense
# BF16 per GPU (half of FP8); 1,440 GB HBM3e / 8 = 180 GB at 8 TB/s; NVLink5 1.8 TB/s
# bidirectional = 900 GB/s per direction; 8x 400 Gb/s ConnectX-7; PCIe gen5.
# Dense FP8: the datasheet's 72 PFLOP/s FP8 per 8 GPUs is with sparsity -> 4.5 PFLOP/s dense per GPU.
_register(GPU("b200", 2250 * TFLOPS, 180 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB, fp8_flops=4500 * TFLOPS))
# NVIDIA GB200 NVL72 datasheet: 180 PFLOP/s dense FP16/BF16 per 72 GPUs = 2.5 PFLOP/s
# per GPU; 13.4 TB HBM3e / 72 = 186 GB at 8 TB/s; NVLink5 900 GB/s per direction;
# one 400 Gb/s ConnectX-7 per GPU for the scale-out fabric.
# Dense FP8: 360 PFLOP/s per 72 GPUs (720 with sparsity) = 5 PFLOP/s per GPU.
_register(GPU("gb200", 2500 * TFLOPS, 186 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB, fp8_flops=5000 * TFLOPS))
# NVIDIA Blackwell Ultra (HGX B300) datasheet: 288 GB HBM3e at 8 TB/s (the seeds: "a
# B300 is 288 GB"); dense BF16 as Blackwell (2.5 PFLOP/s); NVLink5 900 GB/s per
# direction; ConnectX-8 800 Gb/s = 100 GB/s per GPU.
# Dense FP8: HGX B300 datasheet, 72 PFLOP/s FP8 per 8 GPUs with sparsity -> 4.5 PFLOP/s dense
# per GPU (the same table gives 36 PFLOP/s sparse BF16 = 2.25 dense, below the 2.5 used above).
_register(GPU("b300", 2500 * TFLOPS, 288 * GB, 8000 * GB, 900 * GB, 100 * GB, 64 * GB, fp8_flops=4500 * TFLOPS))

# Share of a link's line rate that NCCL reaches for large messages, per fabric.
# nvlink: nccl-tests issue 212 (maintainer): H100 8-GPU ring all-gather busbw ~370 GB/s
#   of 450 GB/s line rate -> 370/450 = 0.822; applied to every NVLink generation.
# ib: nccl-tests issue 290: NDR 400 Gb/s NIC gives 46-48 GB/s of 50 (0.94); nccl issue
#   812: HDR gives ~24 of 25 GB/s (0.96); one constant for both: 0.95.
# pcie: GPU<->NIC hop, never the bottleneck on these systems; 0.9 (typical PCIe efficiency).
FABRIC_EFFICIENCY = {"nvlink": 370 / 450, "ib": 0.95, "pcie": 0.9}

# Per-hop latency of one link, seconds. NVLink through NVSwitch: ~1 us GPU to GPU
# (two hops), IB: ~1 us per switch hop plus NIC, as nccl-tests small-message all-reduce
# latencies on DGX systems (~10-30 us for 8-64 GPUs) suggest.
LINK_LATENCY = {"nvlink": 0.5e-6, "ib": 0.6e-6, "pcie": 0.5e-6}


def gpu_preset(name: str) -> GPU:
    """Return the preset named ``name`` or raise InputError listing the known ones."""
    try:
        return GPUS[name]
    except KeyError:
        known = ", ".join(sorted(GPUS))
        raise InputError("cluster.gpu", f"unknown GPU {name!r}; known: {known}") from None


# --- per-architecture constants for in-switch reduction and the collective tuner ---------
# NCCL's tuner keys its constants by compute capability (NVIDIA/nccl src/graph/tuning.cc:
# Volta, Ampere, Hopper, Blackwell); presets not listed here get Ampere's (no NVLS).
ARCH = {"a100-80gb": "ampere", "h100-sxm": "hopper", "h200": "hopper",
        "b200": "blackwell", "gb200": "blackwell", "b300": "blackwell"}
# NVLink SHARP (NVLS) efficiency: the share of the NVLink a byte of in-switch reduction or
# multicast gets, NVIDIA/nccl src/graph/tuning.cc ``nvlsEfficiency`` (Hopper 0.85,
# Blackwell 0.74; Volta/Ampere NVSwitches cannot reduce). 8x H100: busbw
# 370 * 0.85 * 2(N-1)/(N+1) = 489 vs ~480 measured (nccl-tests issue 212, NCCL issue 2140).
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
# NVLink efficiency where it differs from FABRIC_EFFICIENCY["nvlink"] (an NVLink4 figure):
# NVLink5 (Blackwell). coreweave/nccl-tests README "Expected Performance / GB200" (NCCL
# 2.26.2, job script from coreweave/nccl-tests PR 43 with NCCL_NVLS_ENABLE=0): one GB200
# NVL72 rack, 72-GPU all-reduce busbw 835-847 GB/s at 4-8 GiB on 900 GB/s links -> 0.93.
NVLINK_EFFICIENCY = {"blackwell": 0.93}


def arch(gpu_name: str) -> str:
    """The GPU architecture NCCL's tuner constants are keyed by (default: Ampere's)."""
    return ARCH.get(gpu_name, "ampere")


def nvlink_efficiency(gpu_name: str) -> float:
    """Share of NVLink line rate NCCL's point-to-point traffic reaches on this GPU."""
    return NVLINK_EFFICIENCY.get(arch(gpu_name), FABRIC_EFFICIENCY["nvlink"])
