"""GPU presets: the numbers a simulation needs about one accelerator.

Each number cites its source. Units are SI: FLOP/s, bytes, bytes/s.
Fabric efficiencies (what share of a link's line rate NCCL actually reaches) live in
:data:`FABRIC_EFFICIENCY`, one constant per fabric, calibrated globally against the
nccl-tests figures copied into ``sim/data/collectives_measured.csv``.
"""

from dataclasses import dataclass
from enum import StrEnum

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
    mxfp8_flops: float = 0.0  # dense MXFP8 FLOP/s: FP8 with one E8M0 scale per 32 elements in the
    #                           tensor-core instruction (OCP MX v1.0; 0: no MX tensor cores, Hopper, CDNA3)
    fp4_flops: float = 0.0  # dense NVFP4 FLOP/s (E2M1 with an E4M3 scale per 16 elements; Blackwell only)
    peer_links: int = 0  # > 0: no switch in the node; this many point-to-point links (AMD xGMI), one per peer,
    #                      each at nvlink_bw / peer_links per direction (nvlink_bw is then the GPU's sum)
    vendor: str = "nvidia"  # "nvidia" (NVLink and NVSwitch) | "amd" (Infinity Fabric / xGMI)
    host_issue: float = 1.0  # the host CPU's time to issue work, over the x86 host sim/model/host.py's
    #                          costs were measured on (:data:`GRACE_HOST_ISSUE`: the Grace of a GB200/GB300)

    @property
    def link_bw(self) -> float:
        """Bytes/s per direction of one xGMI link (the whole NVLink port on a switched GPU)."""
        return self.nvlink_bw / self.peer_links if self.peer_links else self.nvlink_bw


GPUS: dict[str, GPU] = {}

# The Grace CPU of a GB200 / GB300 superchip issues GPU work slower than an x86 DGX host: TransformerEngine
# issue 2053 ("[PyTorch] High CPU overhead on Grace systems", 2025-08-11; BF16 Linear forward, hidden 2,048,
# 8,192 tokens, host time per call): torch.nn.Linear 37.08 us on a GB200 against 13.48 us on an H100 DGX
# (Xeon Platinum 8480C), 2.75x (GH200 33.17 us; TE's te.Linear 99.66 us on the GB200). Every host cost of
# sim/model/host.py (measured on an x86 H100 host) scales by it on those parts: the issue of kernels, NCCL
# calls and the schedule's Python alike (sim/parallel/program.py RankBuilder._issue). It binds only where a
# step's issue comes to exceed its GPU time: not CUDA-graphed, fast layers (docs/precision.md, "The Grace host
# binds the 405B FP8 rows").
GRACE_HOST_ISSUE = 37.08 / 13.48


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
# Streaming multiprocessors of an H100 SXM5: 132 (NVIDIA H100 Tensor Core GPU Architecture
# whitepaper, "The full implementation of the GH100 GPU ... 144 SMs"; the H100 SXM5 has 132). What
# communication kernels take from compute is counted against it on every GPU
# (sim/parallel/tp_overlap.py COMM_SM_SHARE, sim/parallel/ep.py deepep_sm_share).
H100_SMS = 132
_register(GPU("h100-sxm", 989 * TFLOPS, 80 * GIB, 3350 * GB, 450 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS, hbm_unit="GiB"))
# Meta's Grand Teton H100 (torchtitan's published H100 benchmarks, pytorch/torchtitan
# docs/performance.md: "H100 SXM 96GB ... @500W"): the H100 SXM's tensor cores and NVLink4
# (peaks at max boost: 989 / 1,979 TFLOP/s dense BF16 / FP8) with 96 GB of HBM under a 500 W
# power cap instead of 700 W. The cap lowers the clock a GEMM sustains, which is what the
# sustained factor of this part (sim/model/compute.py, fitted on its rows) carries. Its HBM is
# HBM2e: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (the same page, commit eaea6f6).
_register(GPU("h100-500w", 989 * TFLOPS, 96 * GB, 2400 * GB, 450 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS))
# NVIDIA H200 datasheet (SXM): same Hopper compute as H100 (989 TFLOP/s dense BF16),
# 141 GB HBM3e at 4.8 TB/s, NVLink4 450 GB/s per direction; 400 Gb/s NICs.
# Dense FP8: 1,979 TFLOP/s (H200 datasheet: 3,958 with sparsity).
_register(GPU("h200", 989 * TFLOPS, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS))
# NVIDIA H800 SXM5 (the export variant DeepSeek-V3 was trained on): Hopper compute as H100 SXM
# (989 TFLOP/s dense BF16, 1,979 dense FP8), 80 GB HBM3 at 3.35 TB/s, NVLink cut to 400 GB/s
# bidirectional = 200 GB/s per direction; 8x 400 Gb/s ConnectX-7 per node (DeepSeek-AI 2025,
# "Insights into DeepSeek-V3: Scaling Challenges and Reflections on Hardware for AI
# Architectures", ISCA '25, section 2: "NVLink bandwidth reduced from 900 GB/s to 400 GB/s",
# "eight 400G Infiniband CX7 NICs"; DeepSeek-V3 technical report, arXiv:2412.19437, 3.2.2).
_register(GPU("h800", 989 * TFLOPS, 80 * GIB, 3350 * GB, 200 * GB, 50 * GB, 64 * GB, fp8_flops=1979 * TFLOPS, hbm_unit="GiB"))
# NVIDIA DGX B200 datasheet: 72 PFLOP/s FP8 training per 8 GPUs -> 2.25 PFLOP/s dense
# BF16 per GPU (half of FP8); 1,440 GB HBM3e / 8 = 180 GB at 8 TB/s; NVLink5 1.8 TB/s
# bidirectional = 900 GB/s per direction; 8x 400 Gb/s ConnectX-7; PCIe gen5.
# Dense FP8: the datasheet's 72 PFLOP/s FP8 per 8 GPUs is with sparsity -> 4.5 PFLOP/s dense per GPU.
# MXFP8: Blackwell's tensor cores take the block scales in the MMA instruction (tcgen05.mma
# kind::mxf8f6f4, PTX ISA 8.7) at the FP8 rate; NVIDIA's Blackwell datasheets list "FP8/FP6"
# as one rate. NVFP4: DGX B200 144 PFLOP/s FP4 per 8 GPUs with sparsity -> 9 PFLOP/s dense per GPU.
_register(GPU("b200", 2250 * TFLOPS, 180 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB, fp8_flops=4500 * TFLOPS,
              mxfp8_flops=4500 * TFLOPS, fp4_flops=9000 * TFLOPS))
# The "B200 (power limited)" torchtitan's MXFP8 benchmarks ran on (pytorch/torchtitan docs/mxfp8.md
# == pytorch/ao torchao/prototype/mx_formats/README.md: "B200 (power limited)", clocks and power
# cap not stated; 19-25% MFU published): the DGX B200's datasheet rates above, unchanged. The cap
# lowers the clock a GEMM sustains, which is what this part's sustained factor (sim/model/
# compute.py, fitted on those three rows alone) carries, as h100-500w does for Grand Teton H100.
_register(GPU("b200-power-limited", 2250 * TFLOPS, 180 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB,
              fp8_flops=4500 * TFLOPS, mxfp8_flops=4500 * TFLOPS, fp4_flops=9000 * TFLOPS))
# NVIDIA GB200 NVL72 datasheet: 180 PFLOP/s dense FP16/BF16 per 72 GPUs = 2.5 PFLOP/s
# per GPU; 13.4 TB HBM3e / 72 = 186 GB at 8 TB/s; NVLink5 900 GB/s per direction;
# one 400 Gb/s ConnectX-7 per GPU for the scale-out fabric.
# Dense FP8 (and MXFP8, as B200): 360 PFLOP/s per 72 GPUs (720 with sparsity) = 5 PFLOP/s per
# GPU. NVFP4: 1,440 PFLOP/s sparse per 72 GPUs -> 10 PFLOP/s dense per GPU.
_register(GPU("gb200", 2500 * TFLOPS, 186 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB, fp8_flops=5000 * TFLOPS,
              mxfp8_flops=5000 * TFLOPS, fp4_flops=10000 * TFLOPS, host_issue=GRACE_HOST_ISSUE))
# The GB200s torchtitan's Llama 4 Scout MoE rows ran on (pytorch/torchtitan docs/mxfp8.md,
# "MoE models": 64 nodes x 4 GB200): the GB200's datasheet rates above, unchanged. Its sustained
# factor (sim/model/compute.py, fitted on those two rows alone) carries that run's software
# stack -- torchtitan's prototype MoE path (grouped GEMMs, HSDP expert shards, activation
# checkpointing off "because of a bug", per the doc) -- as h100-500w and b200-power-limited carry
# torchtitan's H100 and B200 runs; the plain gb200 takes a NeMo-class factor instead.
_register(GPU("gb200-torchtitan", 2500 * TFLOPS, 186 * GB, 8000 * GB, 900 * GB, 50 * GB, 64 * GB,
              fp8_flops=5000 * TFLOPS, mxfp8_flops=5000 * TFLOPS, fp4_flops=10000 * TFLOPS, host_issue=GRACE_HOST_ISSUE))
# NVIDIA HGX B300 (Blackwell Ultra) datasheet, per 8 GPUs: FP4 144 | 108 PFLOP/s (sparse |
# dense), FP8/FP6 72 PFLOP/s and BF16 36 PFLOP/s with sparsity -> per GPU 2.25 PFLOP/s dense
# BF16 (was 2.5, the NVL72 rack's figure: corrected 2026-11-26), 4.5 dense FP8 and MXFP8,
# 13.5 dense NVFP4; 2.3 TB HBM3e / 8 = 288 GB at 8 TB/s; NVLink5 900 GB/s per direction;
# ConnectX-8 SuperNIC 800 Gb/s = 100 GB/s per GPU on its own PCIe gen6 x16 (128 GB/s per
# direction; was gen5's 64, which capped the 800 Gb/s NIC at 58 GB/s: corrected 2026-11-26).
_register(GPU("b300", 2250 * TFLOPS, 288 * GB, 8000 * GB, 900 * GB, 100 * GB, 128 * GB, fp8_flops=4500 * TFLOPS,
              mxfp8_flops=4500 * TFLOPS, fp4_flops=13500 * TFLOPS))
# NVIDIA GB300 NVL72 datasheet, per 72 GPUs: FP4 1,440 | 1,080 PFLOP/s (sparse | dense),
# FP8/FP6 720 and FP16/BF16 360 PFLOP/s with sparsity -> per GPU 2.5 PFLOP/s dense BF16,
# 5 dense FP8 and MXFP8, 15 dense NVFP4; up to 21 TB HBM3e (288 GB per GPU) at 576 TB/s
# (8 TB/s per GPU); NVLink5 130 TB/s per rack = 900 GB/s per direction per GPU; one
# ConnectX-8 SuperNIC 800 Gb/s per GPU = 100 GB/s, PCIe gen6 x16 (128 GB/s per direction).
_register(GPU("gb300", 2500 * TFLOPS, 288 * GB, 8000 * GB, 900 * GB, 100 * GB, 128 * GB, fp8_flops=5000 * TFLOPS,
              mxfp8_flops=5000 * TFLOPS, fp4_flops=15000 * TFLOPS, host_issue=GRACE_HOST_ISSUE))
# AMD Instinct MI300X datasheet (CDNA3, gfx942): 1,307.4 TFLOP/s dense BF16, 2,614.9 dense
# FP8 (E4M3/E5M2 FNUZ; no MX formats on CDNA3: AMD CDNA 3 ISA guide), 192 GB HBM3 at 5.3 TB/s
# (ROCm docs "GPU hardware specifications": 192 GiB listed, the datasheet's 192 GB kept), 7 AMD
# Infinity Fabric (xGMI) links of 128 GB/s bidirectional = 64 GB/s per direction, one to each
# of the 7 peers of an 8-GPU OAM platform ("Understanding RCCL Bandwidth and xGMI Performance
# on AMD Instinct MI300X", ROCm blogs 2025-03-02: "fully connected mesh", "64 GB/s for each
# point-to-point link"); PCIe gen5 x16 = 64 GB/s per direction to one 400 Gb/s NIC per GPU
# (Azure ND MI300X v5: 8x 400 Gb/s NDR per VM; AMD Pollara 400 / ConnectX-7).
_register(GPU("mi300x", 1307.4 * TFLOPS, 192 * GB, 5300 * GB, 7 * 64 * GB, 50 * GB, 64 * GB,
              fp8_flops=2614.9 * TFLOPS, peer_links=7, vendor="amd"))
# AMD Instinct MI325X datasheet (CDNA3, gfx942): the MI300X's compute (1,307.4 / 2,614.9
# TFLOP/s dense BF16 / FP8) with 256 GB HBM3E at 6 TB/s; the same 7 xGMI links at 128 GB/s
# bidirectional; one 400 Gb/s NIC per GPU, PCIe gen5 x16.
_register(GPU("mi325x", 1307.4 * TFLOPS, 256 * GB, 6000 * GB, 7 * 64 * GB, 50 * GB, 64 * GB,
              fp8_flops=2614.9 * TFLOPS, peer_links=7, vendor="amd"))
# AMD Instinct MI355X datasheet (CDNA4, gfx950; AMD CDNA 4 architecture whitepaper): 2.5 PFLOP/s
# dense BF16 (2,516.6 TFLOP/s), 5.0 dense FP8 and the same for MXFP8 (CDNA4's MFMA takes E8M0
# block scales of 32: V_MFMA_SCALE_F32_*_F8F6F4, CDNA 4 ISA guide), MXFP4 10 PFLOP/s (not NVFP4:
# that is NVIDIA's format with E4M3 scales of 16); 288 GB HBM3E at 8 TB/s; 7 xGMI links of 153.6
# GB/s bidirectional = 76.8 GB/s per direction (1,075.2 GB/s in all); one 400 Gb/s NIC per GPU
# (AMD Pollara 400), PCIe gen5 x16.
_register(GPU("mi355x", 2516.6 * TFLOPS, 288 * GB, 8000 * GB, 7 * 76.8 * GB, 50 * GB, 64 * GB,
              fp8_flops=5033.2 * TFLOPS, mxfp8_flops=5033.2 * TFLOPS, peer_links=7, vendor="amd"))

# Share of a link's line rate that NCCL reaches for large messages, per fabric.
# nvlink: nccl-tests issue 212 (maintainer): H100 8-GPU ring all-gather busbw ~370 GB/s
#   of 450 GB/s line rate -> 370/450 = 0.822; applied to every NVLink generation.
# ib: nccl-tests issue 290: NDR 400 Gb/s NIC gives 46-48 GB/s of 50 (0.94); nccl issue
#   812: HDR gives ~24 of 25 GB/s (0.96); one constant for both: 0.95.
# pcie: GPU<->NIC hop, never the bottleneck on these systems; 0.9 (typical PCIe efficiency).
# xgmi: the ROCm blog above ("Understanding RCCL Bandwidth and xGMI Performance on AMD
#   Instinct MI300X"): CRC and protocol overhead leave 45-48 GB/s of a link's 64 GB/s per
#   direction, and the slowest of a GPU's 7 links sets what a collective gets. Fitted to the
#   blog's two 8x MI300X measurements at once: rccl-tests all_reduce busbw 318.98 GB/s at
#   16 GiB (rings over all 7 links: 7 x 45.57) and TransferBench all-to-all, 317.6 GB/s per GPU
#   over 7 direct links (7 x 45.37) -> 45.5 GB/s per link = 0.711. The same share is assumed
#   for CDNA4's 76.8 GB/s links. (RCCL's own topology model assumes 48: src/graph/topo.h.)
FABRIC_EFFICIENCY = {"nvlink": 370 / 450, "ib": 0.95, "pcie": 0.9, "xgmi": 45.5 / 64}

# Per-hop latency of one link, seconds. NVLink through NVSwitch: ~1 us GPU to GPU
# (two hops), IB: ~1 us per switch hop plus NIC, as nccl-tests small-message all-reduce
# latencies on DGX systems (~10-30 us for 8-64 GPUs) suggest.
# xGMI: one direct hop, no switch; taken as NVLink's.
LINK_LATENCY = {"nvlink": 0.5e-6, "ib": 0.6e-6, "pcie": 0.5e-6, "xgmi": 0.5e-6}


class Precision(StrEnum):
    """``training.precision`` (sim/input/choices.py re-exports it); FP8, MXFP8 and NVFP4 are
    the quantized linear-layer formats (:data:`sim.model.compute.QUANTIZED`)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


# The GPU field holding each quantized precision's dense peak (training.precision).
LOW_PRECISION_PEAK = {Precision.FP8: "fp8_flops", Precision.MXFP8: "mxfp8_flops", Precision.NVFP4: "fp4_flops"}


def low_peak(gpu: GPU, precision: str) -> float:
    """The dense FLOP/s of ``precision``'s tensor cores on ``gpu`` (0: it has none, or
    ``precision`` is not a quantized one)."""
    field = LOW_PRECISION_PEAK.get(precision)
    return getattr(gpu, field) if field else 0.0


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
# AMD parts are keyed by CDNA generation (RCCL keeps NCCL's model and its own tables; no NVLS).
ARCH = {"a100-80gb": "ampere", "h100-sxm": "hopper", "h100-500w": "hopper", "h200": "hopper", "h800": "hopper",
        "b200": "blackwell", "b200-power-limited": "blackwell", "gb200": "blackwell", "gb200-torchtitan": "blackwell",
        "b300": "blackwell", "gb300": "blackwell",
        "mi300x": "cdna3", "mi325x": "cdna3", "mi355x": "cdna4"}
# NVLink SHARP (NVLS) efficiency: the share of the NVLink a byte of in-switch reduction or
# multicast gets, NVIDIA/nccl src/graph/tuning.cc ``nvlsEfficiency`` (Hopper 0.85,
# Blackwell 0.74; Volta/Ampere NVSwitches cannot reduce). 8x H100: busbw
# 370 * 0.85 * 2(N-1)/(N+1) = 489 vs ~480 measured (nccl-tests issue 212, NCCL issue 2140).
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
# What NCCL's topology takes one NVLink of the GPU to carry (NVIDIA/nccl src/graph/topo.h
# ``SM90_NVLINK_BW`` 20.6, ``SM100_NVLINK_BW`` 40.1 GB/s), as a share of the link's line rate
# (NVLink4 25, NVLink5 50 GB/s per direction): NCCL sizes NVLS channels from it (search.cc
# ``ncclTopoSearchTryNvls`` over the GPU<->NVSwitch paths) and its nvlsEfficiency is relative
# to it, on an 8-GPU board and in an NVL72 rack alike. So an NVLS byte gets
# eta_nvls x this share of line rate: 8 GB300 of one rack 721.8 x 0.74 x 14/9 = 831 GB/s busbw
# vs 841.6 measured (OCI GB300 quickstart, NCCL 2.28.7).
NCCL_NVLINK_SHARE = {"hopper": 20.6 / 25, "blackwell": 40.1 / 50}
# NVLink efficiency where it differs from FABRIC_EFFICIENCY["nvlink"] (an NVLink4 figure):
# every NVLink5 (Blackwell) part, on an 8-GPU board (b200, b300) and in an NVL72 rack (gb200,
# gb300) alike, takes NCCL's own figure for an SM100 GPU's NVLink, NVIDIA/nccl
# src/graph/topo.h ``SM100_NVLINK_BW`` 40.1 GB/s per link x 18 links = 721.8 of 900 GB/s (0.802;
# NCCL issue 1807 shows it as "maxBw 721.8" on 8x B200; its SM90 figure, 20.6 x 18 = 370.8 of
# 450, is the H100's 370 above). Measured on 8x B300 (NCCL issue 2140, NCCL 2.30.4): ring
# all-reduce busbw 695 GB/s (NVLS off), 845 with NVLS; 8x B200 "830+" (NCCL issue 1807, NCCL
# 2.27.1 default algorithm). In a rack: OCI's GB200 quickstart (oracle-quickstart/
# oci-gpu-quickstarts nvidia/GB200) shows nvbandwidth SM copies between two GPUs of 717 GB/s one
# way (device_to_device_memcpy_write_sm, 8606.87 over 12 pairs), and OCI's and Azure's rack
# all-to-alls and 4-GPU rings (611-685 GB/s busbw) sit at or below 721.8. No ring figure above
# it: coreweave/nccl-tests' 72-GPU GB200 table (busbw 835-847 GB/s, README-labelled NCCL 2.26.2
# with NCCL_NVLS_ENABLE=0) first appears in coreweave/nccl-tests PR 43 (2025-02-20), whose job
# script (commit aa40070) sets NCCL_NVLS_ENABLE=1 on NCCL 2.25.1 (2.26.2 came out 2025-03-12;
# NVLS was turned off on 2025-04-14, PR 47): most likely an NVLS run, not a ring (docs/collectives.md
# "Not reproduced" note (b)).
_NVLINK5 = 40.1 * 18 / 900
NVLINK_EFFICIENCY = {name: _NVLINK5 for name in
                     ("gb200", "gb200-torchtitan", "gb300", "b200", "b200-power-limited", "b300")}


def arch(gpu_name: str) -> str:
    """The GPU architecture NCCL's tuner constants are keyed by (default: Ampere's)."""
    return ARCH.get(gpu_name, "ampere")


def nvlink_efficiency(gpu_name: str) -> float:
    """Share of NVLink (on AMD parts: xGMI) line rate NCCL's / RCCL's point-to-point traffic
    reaches on this GPU."""
    if GPUS[gpu_name].peer_links:
        return FABRIC_EFFICIENCY["xgmi"]
    return NVLINK_EFFICIENCY.get(gpu_name, FABRIC_EFFICIENCY["nvlink"])
