"""Compute time of one rank's kernels: a roofline with size-dependent tensor-core efficiency.

time(kernel) = launch + max(FLOPs / (peak * efficiency), bytes / (HBM bw * 0.8))

One efficiency model per GPU type, three kinds of tensor-core work:

- BF16 GEMMs reach ``e_max * x / (x + 128)`` of the dense BF16 peak, x the GEMM's smallest
  dimension (small tiles leave SMs idle). ``e_max`` (:data:`GEMM_EFFICIENCY`) is what a
  large GEMM reaches *in training*: the cuBLAS kernel's share of peak (:data:`GEMM_KERNEL`,
  cited) times one **sustained factor** per GPU type (:data:`SUSTAINED`), the only fitted
  constant: the share of its datasheet rate a GPU keeps through a training step (clocks
  under the sustained power limit, launch gaps, framework work between kernels). It is
  fitted once per GPU type on every published run shipped in sim/data together
  (``clustersim validate --fit``), never per row.
- FP8 GEMMs (Transformer Engine linears under ``training.precision = "fp8"``) reach the
  same sustained factor times the FP8 kernel's share of the dense FP8 peak, with a doubled
  half-size (:data:`.gemm_sources.FP8_GEMM_HALF_SIZE`); on Hopper also a fixed cost per output element,
  a share ``c_K / K`` of the main loop's time, K the reduction dim (:data:`FP8_K_HALF`).
- Microscaling and FP4 GEMMs (``training.precision = "mxfp8"``: OCP MX FP8, one E8M0 scale
  per block of 32 elements along the reduction dimension, Blackwell and MI355X; ``"nvfp4"``:
  NVIDIA's FP4, E2M1 with one E4M3 scale per 16 elements, Blackwell) run at their own dense
  peak (``GPU.mxfp8_flops``, ``GPU.fp4_flops``) times the same sustained factor and that
  format's kernel share; operands carry their scales (1 + 1/32 and 0.5 + 1/16 bytes per
  element). One quantized format runs per scenario: :data:`QUANTIZED` names them.
- Flash attention (forward and backward kernels, BF16 also under FP8) follows its own
  measured curve in the keys each query attends (:data:`ATTENTION_KERNEL`), times the same
  sustained factor.

So one fitted number per GPU type scales every kind of tensor-core work; the ratios
between kinds are kernel benchmarks, cited where they are defined.
"""

from typing import NamedTuple

from ..errors import InputError
from ..hardware.calibration import Calibration
from ..hardware.gpus import GPU, Precision, low_peak
from ..input.choices import AttentionBackend
from .attention_rates import ATTENTION_KERNEL
from .gemm_sources import (AMD_MAF, BLACKWELL_FP8_RATIO, FP8_K_HALF, GEMM_HALF_SIZE, HALF_SIZE, MX_FP8_RATIO,
                           maf_fp8_ratio, nvfp4_share_ratio)

# Kernel-level share of the dense peak a large GEMM reaches (cuBLAS, no training around it).
# a100-80gb bf16: ~0.80 (NVIDIA A100 whitepaper: cuBLAS large BF16/FP16 GEMMs at ~250 of 312
#   TFLOP/s).
# h100-sxm bf16: 8192^3 ~797 of 989 TFLOP/s = 0.806 (github zzc0721/torch-performance-test-
#   data issue 79).
# Hopper fp8: measured on one H100 SXM and one H200 (bench/measured/h100-2026-11-26.json and
#   h200-2026-11-26.json, ``gemm``: torch._scaled_mm with tensor-wise scales, the kernel
#   torchao's Float8Linear and Transformer Engine's cuBLASLt path run, against F.linear in BF16
#   at the 60 Llama 3 8B/70B/405B layer shapes). An FP8 GEMM keeps less of its (doubled) peak
#   than a BF16 one: the median over the shapes of (FP8 share / its curve) / (BF16 share / its
#   curve) is 0.962 on the H100 and 0.983 on the H200 (8192^3: 0.696 of the FP8 peak against
#   0.771 of the BF16 one on the H100). The measured GEMMs ran in cuBLASLt's precise
#   accumulation mode (torch._scaled_mm's default use_fast_accum = False), which promotes
#   Hopper's reduced-precision FP8 WGMMA partial sums to FP32 on the CUDA cores (DeepSeek-V3
#   technical report, arXiv:2412.19437, section 3.3.2). It is the mode of two of a linear's
#   three GEMMs in both stacks: torchao float8/config.py ``gemm_config_grad_input`` and
#   ``gemm_config_grad_weight`` (use_fast_accum False; only ``gemm_config_output`` True),
#   Transformer Engine module/base.py ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`` (``_2X_ACC_FPROP
#   = False``). No fast-accumulation figure was measured, so all three take this share.
#   fp8 = 0.806 x that median: 0.776 (h100-sxm, h100-500w, h800: the same die), 0.793 (h200)
#   with the min-dim curve alone; with Hopper's reduction-dim term (:data:`FP8_K_HALF`, fitted on
#   the same two files) the FP8 curve is lower at every shape, the median 0.997 / 1.006 and
#   fp8 = 0.804 (H100) / 0.811 (H200) (bench/measured_gemm_fit.py prints both).
#   It replaces a cuBLASLt figure from other H100s with no BF16 figure beside it (8192^3 FP8
#   E4M3 1,599-1,630 of 1,979 TFLOP/s, gitea d-robotics test_gpu_scripts
#   reports_cublaslt_fp8_crosscheck_20260524.md).
# Blackwell parts (b200, gb200, b300, gb300 and the torchtitan rows' parts): the BF16 share is
#   assumed (Hopper's). FP8 against it: Transformer Engine's GEMM profiling tutorial on a B300
#   (:data:`.gemm_sources.TE_TUTORIAL_PREQUANTIZED_S`), the 12 GEMMs of one training layer timed with their
#   inputs quantized before the loop: 13.102 ms BF16, 6.812 ms FP8 (current scaling, tensor-wise
#   scales), 1.923x. Through the curves (every one of those GEMMs has smallest dimension 4,096) FP8
#   keeps 0.991 of the BF16 share (:func:`.gemm_sources.te_fp8_ratio`): fp8 = 0.806 x 0.991 = 0.799; MXFP8 keeps
#   0.951 of that (:data:`MX_FP8_RATIO`, the same table): 0.760. The same tutorial's H200 layer gives
#   1.005 by the same method (with :data:`FP8_K_HALF`'s term; 0.981 without), where our own H200
#   measured 1.006 (0.983 without): the method checks out on Hopper. It replaces, since 2026-11-27, the median over OpenXLA's sm_100 cuBLAS table
#   (tensorflow/tensorflow third_party/xla/xla/backends/gpu/cost_model/matmul_interpolator_data.h,
#   "sm_100", bf16xbf16->bf16 vs f8e4m3fnxf8e4m3fn->bf16 at b 1, m 4,096, n and k 1,024-4,096):
#   0.900, from per-shape ratios that rise from 0.66 at 4,096 x 1,024 x 1,024 to 1.03 at
#   4,096 x 4,096 x 2,048 -- shapes of 8.6-137 GFLOP, 10-100 microseconds on a B200, where a
#   fixed cost per kernel weighs on the twice-as-fast FP8 kernel; a training step's linears are
#   the tutorial's size (docs/precision.md, "Blackwell's FP8 share"). NVFP4: the tutorial's NVFP4
#   layer (3.764 ms, 3.48x BF16 of a 6x peak) keeps 0.63 of the BF16 share (:data:`.gemm_sources.NVFP4_RATIO`):
#   nvfp4 = 0.806 x that on the B300 and GB300; adopted 2026-11-27 with the first NVFP4 row (docs/precision.md,
#   "Full-power Blackwell rows"). On the B200 and GB200, whose FP4 MMA is 2x (not 3x) their FP8 one, the
#   same layer read as MMAs plus a rest that does not speed up with them: 0.580 (:func:`.gemm_sources.
#   nvfp4_share_ratio`, since 2026-11-28; docs/precision.md, "NVFP4 on Blackwell and Blackwell Ultra").
# AMD Instinct CDNA3 (mi300x, mi325x): FP8 against BF16 from AMD's max-achievable FLOPs (ROCm
#   blogs, "Measuring Max-Achievable FLOPs - Part 2", ROCm/rocm-blogs blogs/software-tools-
#   optimization/measuring-max-achievable-flops-part2, Table 1: hipBLASLt-bench, BF16 at m 4096,
#   n 4864, k 32896, FP8 at m 4096, n 3648, k 32896): MI300X 708 of 1,307.4 and 1,273 of 2,614.9
#   TFLOP/s, MI325X 843 and 1,519 -- through the curves at those shapes (smallest dimension 4096
#   and 3648), FP8 keeps 0.933 (MI300X) and 0.935 (MI325X) of the BF16 share (:data:`AMD_MAF`).
#   The BF16 share stays assumed (Hopper's); the sustained factor per GPU type is fitted on AMD's
#   published MI325X / MI355X training throughputs (sim/data/frontier_runs.csv). MI355X (CDNA4):
#   no measurement shipped, the assumed shares.
_BF16 = 0.806  # the H100 SXM's large BF16 GEMM share (above): every part's BF16, the base of the others' ratios
_ASSUMED = {"bf16": _BF16, "fp8": _BF16, "mxfp8": _BF16, "nvfp4": _BF16}
_CDNA3 = {g: {**_ASSUMED, "fp8": _BF16 * maf_fp8_ratio(g)} for g in AMD_MAF}
_BLACKWELL = {g: {**_ASSUMED, "fp8": _BF16 * BLACKWELL_FP8_RATIO, "mxfp8": _BF16 * BLACKWELL_FP8_RATIO * MX_FP8_RATIO,
                  "nvfp4": _BF16 * nvfp4_share_ratio(g)}
              for g in ("b200", "b200-power-limited", "gb200", "gb200-torchtitan", "b300", "gb300")}
_H100 = {"bf16": _BF16, "fp8": 0.804}
_H200 = {"bf16": _BF16, "fp8": 0.811}
GEMM_KERNEL = {"a100-80gb": {"bf16": 0.80}, "h100-sxm": _H100, "h100-500w": _H100, "h200": _H200, "h800": _H100,
               **_BLACKWELL,
               "mi300x": _CDNA3["mi300x"], "mi325x": _CDNA3["mi325x"], "mi355x": _ASSUMED}

# The sustained factor per GPU type: `clustersim validate --fit` over every shipped row of
# that GPU at once (sim/data/published_runs.csv, modern_runs.csv, frontier_runs.csv), mean
# |log error|.
# a100-80gb: the 8 Narayanan et al. 2021 rows. h100-sxm: the 5 Megatron-LM README rows and
#   the 16 NeMo DGX-Cloud rows (BF16 and FP8).
#   Fitted 2026-11-23 (`clustersim validate --fit`): e_max a100 0.6774, h100 0.6424. Refit
#   2026-11-24 after the MoE corrections (dispatcher bytes, Grok-1's geglu): h100 unchanged;
#   MAPE over the 29 rows 4.8% (README, "Fidelity").
# Fitted 2026-11-26 on the frontier rows (`clustersim validate --fit --rows tt_,amd_`; the
#   b200 rows alone with the search's lower bound at 0.2), each GPU type on all of its rows:
#   mi325x 0.6518 (3 AMD rows), mi355x 0.5793 (1 AMD row: fitted exactly, so no check of it).
#   Refit 2026-11-26 after torchtitan's rows run as torchtitan runs them (plain-PyTorch
#   elementwise kernels when not compiled, per-op checkpointing, torchao's casts, PyTorch's
#   context parallelism, the Grand Teton H100's 2.4 TB/s HBM: sim/studies/frontier.py), with
#   `clustersim validate --fit --rows tt_h100` (and tt_h200, tt_b200, tt_gb200): h100-500w
#   0.6505 (11 rows on 500 W Grand Teton H100; it was 0.5351 when those costs were missing:
#   0.6505 is 0.816 of the H100 SXM's factor, about the clock a 500 W cap leaves of 700 W),
#   h200 0.7656 (2 rows; 0.96 of the H100 SXM's on the same tensor cores), b200-power-limited
#   0.3055 (3 rows on "power limited" B200: 19-25% MFU published), gb200-torchtitan 0.5012 (2
#   Llama-4-Scout rows). Refit 2026-11-26 after Blackwell's FP8 kernel share (0.900 of BF16's,
#   OpenXLA's sm_100 table) and torchao's MX cast rates (sim.model.quant.MX_CAST_SHARE): `clustersim validate
#   --fit --rows tt_b200,tt_gb200`: b200-power-limited 0.3236 (was 0.3055), gb200-torchtitan
#   unchanged (its BF16 row pins the fit); after CDNA3's FP8 share (AMD_MAF), `clustersim validate
#   --fit --rows amd_mi325x`: mi325x 0.6789 (was 0.6518). Refit 2026-11-27 after the H100's flash2
#   curve was measured (ATTENTION_KERNEL: PyTorch's causal FA2, 0.86 / 0.90 of the paper curve at
#   16k tokens), `clustersim validate --fit --rows tt_h100`: h100-500w 0.6755 (was 0.6505; 0.848 of
#   the H100 SXM's factor). Refit 2026-11-27 after FlashAttention-2's
#   rate on Blackwell (the H100's, ATTENTION_KERNEL) and MXFP8's share (MX_FP8_RATIO), `clustersim
#   validate --fit --rows tt_b200,tt_gb200`: b200-power-limited 0.4736 (was 0.3236: attention had
#   been timed at 2.3x its measured rate, and the fit had slowed every GEMM to make up for it),
#   gb200-torchtitan 0.7010 (was 0.5012); after CDNA3's measured attention rate
#   (CDNA3_ATTENTION_RATIO), `--fit --rows amd_mi325x`: mi325x 0.7913 (was 0.6789; mi300x takes it).
#   mi355x refit by the same rule, `clustersim validate --fit --rows amd_mi355x`: 0.6008 (was 0.5793,
#   fitted before Megatron's unfused token permutation, sim/studies/frontier.py, moved its one row
#   from 0.0% to -3.1%). One row: the fit is exact and checks nothing; with the MI325X's factor
#   (the CDNA3 sibling) that row would read +11.1%. Refit it whenever the MoE costs move. Refit
#   2026-11-27 after Blackwell's FP8 share was taken from Transformer Engine's B300 layer (0.991 of
#   BF16's, was 0.900: BLACKWELL_FP8_RATIO), `clustersim validate --fit --rows tt_b200,tt_gb200`:
#   b200-power-limited 0.4569 (was 0.4736: the FP8 rows had held it up), gb200-torchtitan
#   unchanged (its BF16 row pins the fit again). Parts without rows take their nearest fitted
#   sibling: h800 the H100 SXM's (the same 700 W part, NVLink cut); mi300x the MI325X's (same
#   CDNA3 die).
# b200, gb200 and gb300 (full-power DGX B200 and NVL72 racks): fitted 2026-11-27 on NVIDIA's own
#   Megatron-Bridge performance summary and DGX Cloud benchmarking recipes (the nb_ rows of
#   sim/data/frontier_runs.csv: Llama 3 8B on 8 GPUs in FP8 and MXFP8, NeMo 25.11; Llama 3 70B on 64
#   GPUs in MXFP8 and NVFP4, NeMo 26.02; Llama 3.1 405B on 128 GB200 in BF16 and FP8, dgxc-benchmarking
#   v25.05), each GPU type on all of its rows, `clustersim validate --fit --rows nb_` (gb200 refit
#   with its 405B rows, `--fit --rows nb_gb200`): b200 0.7613 (2 rows), gb200 0.6560 (6 rows; 0.6927
#   on its first 4), gb300 0.8466 (2 rows); each had the H100 SXM's 0.7970 before. With 0.7970 the
#   Megatron-Bridge rows read b200 +2.9 / +3.8%, gb200 +9.0 / +12.1 / +18.3 / +11.2% in tokens/s
#   (predicted faster: the GB200's 2.5 PFLOP/s datasheet rate is 1.11x the B200's, its published
#   8B step only 1.03x) and gb300 -5.1 / -6.1%; fitted, every nb_ row within 10% (docs/precision.md,
#   "Full-power Blackwell rows and NVFP4"). Refit 2026-11-27 after cuDNN attention on these parts was
#   measured (sim/model/attention_rates.py CUDNN_GB200 / CUDNN_GB300) and 8 rows were added (405B on
#   128-256 GPUs of all three parts), each GPU type on all of its rows: gb200 0.6498, gb300 0.8222;
#   b200 0.7497, the upper end of its fit's valley (mean |log error| 0.0526 at 0.6664, 0.0538 at
#   0.7497: its two 8B rows against its two 405B rows; below ~0.70 the MLPerf check below fails).
#   What the three factors carry, and what not (docs/precision.md, "Why GB200, GB300 and B200 take
#   different sustained factors"): at one layout and release (Megatron-Bridge 25.11, Llama 3.1 405B
#   MXFP8 on 128 GPUs) the three parts fit 0.6618 / 0.5228 / 0.5989, so most of the spread between
#   the factors is which releases and layouts each part's rows come from, not the GPU.
#   b300 (HGX B300, no row) takes the b200's: the same 8-GPU board. Before that
#   fit these parts took the H100 SXM's factor, on the assumption that Blackwell's kernels and
#   frameworks keep the same share of their datasheet peak through a training step as Hopper's
#   (the kernel shares above are Hopper's too); the check against MLPerf Training below still holds
#   with the fitted factors. Check against MLPerf Training (NVIDIA Technical
#   Blog, "NVIDIA Blackwell Delivers up to 2.6x Higher Performance in MLPerf Training v5.0",
#   June 2025: Blackwell 2.2x Hopper per GPU on Llama 3.1 405B pretraining at the same scale,
#   DGX B200 2.5x 8x H100 on Llama 2 70B LoRA fine-tuning; "up to 2.6x" per GPU in all. MLPerf
#   Training v5.1, NVIDIA's round summary, Nov 2025: GB300 NVL72 "more than 4x" Hopper per GPU
#   on Llama 3.1 405B with NVFP4 and "nearly 2x" GB200, i.e. GB200 above 2x Hopper): with this
#   factor 8x B200 and 8 GPUs of a GB200 NVL72 simulate 2.0-2.6x 8x H100 on the same dense
#   step (tests/test_blackwell_speedup.py). The power-limited torchtitan rows are their own
#   part (b200-power-limited) and the Scout rows theirs (gb200-torchtitan: a MoE step whose
#   torchtitan-specific costs are not all modelled), so neither drags the plain parts. (The
#   plain gb200 took the H100 SXM's factor x 0.5011 / 0.5351 before the refit above, on the
#   argument that torchtitan's H100 factor measured the framework; with the framework's costs
#   modelled that ratio measures the 500 W cap instead, so it no longer applies.)
SUSTAINED = {"a100-80gb": 0.8467, "h100-sxm": 0.7970, "h100-500w": 0.6755, "h200": 0.7656,
             "b200-power-limited": 0.4569, "gb200-torchtitan": 0.7010, "mi325x": 0.7913, "mi355x": 0.6008,
             "b200": 0.7497, "gb200": 0.6498, "gb300": 0.8222}
SUSTAINED.update(h800=SUSTAINED["h100-sxm"], mi300x=SUSTAINED["mi325x"], b300=SUSTAINED["b200"])

# Large-GEMM efficiency in training (BF16): kernel share x sustained factor.
GEMM_EFFICIENCY = {gpu: GEMM_KERNEL[gpu]["bf16"] * SUSTAINED[gpu] for gpu in GEMM_KERNEL}


# The quantized linear-layer precisions and the bytes per element of an operand with its block
# scales (MX: one 1-byte E8M0 scale per 32 elements, OCP Microscaling Formats v1.0; NVFP4: one
# 1-byte E4M3 scale per 16 elements plus a per-tensor FP32 scale, NVIDIA "Pretraining Large
# Language Models with NVFP4", arXiv:2509.25149). Their dense peaks: sim.hardware.gpus.low_peak.
QUANTIZED = {Precision.FP8: 1.0, Precision.MXFP8: 1 + 1 / 32, Precision.NVFP4: 0.5 + 1 / 16}


def quantized(precision: str) -> bool:
    """Whether ``training.precision`` runs the transformer layers' linears on low-precision
    tensor cores (fp8, mxfp8, nvfp4) rather than BF16/FP16."""
    return precision in QUANTIZED


# Flash attention's curves per GPU and backend live in sim/model/attention_rates.py.
HBM_EFFICIENCY = 0.8  # achievable share of HBM bandwidth for streaming kernels (STREAM-like)
LAUNCH_S = 4e-6  # seconds per kernel launch + tail (CUDA launch latency ~3-5 us)

# A weight-gradient GEMM that accumulates into the main_grad buffer inside the GEMM (Megatron's
# gradient_accumulation_fusion: APEX fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 / _fp16 in
# megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication, Transformer
# Engine's fuse_wgrad_accumulation, general_gemm(..., out=main_grad, accumulate=True): cuBLAS with C =
# main_grad and beta = 1) reads and writes C, 2 x main_grad bytes per weight element, whatever its token
# count. Measured (bench/measured/h100-2026-11-27-wgrad.json and h200-2026-11-27-wgrad.json, section
# ``wgrad`` and ``grouped_wgrad``: the BF16-out wgrad t_g against the FP32-accumulating one, CUDA graphs,
# 132 shapes whose FP32 C is >= 128 MB, i.e. not L2-resident) it is one closed form over both GPUs:
#     t = (t_g ** P + f ** P) ** (1 / P),  f = C bytes / (WGRAD_ACC_HBM_SHARE x HBM bandwidth),
# P = 1.5, share 0.62 of the datasheet HBM bandwidth: mean |log error| 0.042, worst +15.7% (GPT-3 tp 4's
# FC1), H100 +2.2% and H200 -4.0% on average (bench/measured_wgrad.py prints every shape). The max
# (P = inf, 0.50) misses by 13% on average, the sum (P = 1, 0.825) by 8%. It is homogeneous of degree
# one: a kernel split into token chunks (TP-comm overlap) costs the same in all. Not measured: a BF16
# main_grad (4 bytes of C per element, taken by its bytes), A100, Blackwell and AMD (taken by their HBM
# bandwidth): the floor is memory traffic, and one share fits two parts 1.43x apart in bandwidth.
WGRAD_ACC_P = 1.5
WGRAD_ACC_HBM_SHARE = 0.62


def wgrad_accumulate_s(t_g: float, acc_bytes: float, hbm_bw: float) -> float:
    """Seconds of a weight-gradient GEMM of ``t_g`` seconds (BF16 out) that accumulates into a
    main_grad buffer, reading and writing ``acc_bytes`` of it (:data:`WGRAD_ACC_P`)."""
    f = acc_bytes / (WGRAD_ACC_HBM_SHARE * hbm_bw)
    return (t_g ** WGRAD_ACC_P + f ** WGRAD_ACC_P) ** (1 / WGRAD_ACC_P)


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
    attn: int = 0  # flash attention: 1 forward, 2 backward kernel (ATTENTION_KERNEL), 0 not
    keys: float = 0.0  # flash attention: keys a query attends (the efficiency curve's variable)
    tp: int = 0  # role under tensor parallelism: 0 local (the sequence shard, or whole weights),
    #              1 reads the TP-gathered input (column-parallel), 2 writes the partial sums TP
    #              reduces (row-parallel); sim/parallel/tp_overlap.py chunks 1 and 2
    hbm_share: float = 0.0  # > 0: the measured share of the HBM bandwidth this memory-bound kernel
    #                         reaches, in place of HBM_EFFICIENCY (sim.model.quant.MX_CAST_SHARE)
    grouped: bool = False  # launched from inside a grouped GEMM's one library call (Transformer Engine's
    #                        GroupedLinear, not its first expert): the host pays the library's per-GEMM
    #                        work and the expert's Python (sim.model.host.GROUPED_GEMM_ISSUE_S,
    #                        EXPERT_PYTHON_S), or for a memory-bound kernel split_quantize's per-expert
    #                        quantize launches (SPLIT_QUANTIZE_S each); the GPU time is the same
    inv_k: float = 0.0  # a GEMM's 1 / K (its reduction dim), the FLOP-weighted mean over the GEMMs it
    #                     stands for (:data:`FP8_K_HALF`'s term is linear in it, so the mean is exact)
    bwd_inv_k: float = 0.0  # the same of its backward: dgrad reduces over n, wgrad over m, half the FLOPs each
    acc: float = 0.0  # bytes of the main_grad buffer its weight gradient reads and writes, accumulating
    #                   there inside the GEMM (:data:`WGRAD_ACC_P`); the builder declares it on the forward GEMM
    wgrad: float = 0.0  # share of this kernel's time that is that weight-gradient GEMM: 0 a forward, 0.5 a
    #                     GEMM's backward (dgrad and wgrad), 1 the wgrad alone (sim/parallel/tp.py splits them)

    def backward(self) -> "Kernel":
        """The kernel's backward pass (a GEMM's dgrad and wgrad run in its precision); two launches per
        forward launch, but one for split_quantize's per-expert casts (``grouped``, memory-bound): the
        backward quantizes the output gradient once per expert, the input's columnwise copy came with
        the forward (TransformerEngine release_v2.9 pytorch/module/grouped_linear.py ``backward``:
        ``tex.split_quantize(grad_output_view, ctx.m_splits, ctx.grad_output_quantizers)``)."""
        nbytes = self.bytes * (2 if self.flops else self.bwd)
        count = self.count if self.grouped and not self.flops else self.count * 2
        return Kernel(self.flops * self.bwd, self.min_dim, nbytes, count, self.bwd, self.fp8,
                      2 if self.attn else 0, self.keys, self.tp, self.hbm_share, self.grouped, self.bwd_inv_k,
                      self.bwd_inv_k, self.acc, 0.5 if self.acc else 0.0)


def gemm(m: float, n: float, k: float, elem: int = 2, fp8: bool = False, operand: float = 1.0) -> Kernel:
    """An (m x k) @ (k x n) GEMM in ``elem``-byte precision (``fp8``: operands quantized,
    ``operand`` bytes per element with their scales -- :data:`QUANTIZED` -- output BF16)."""
    inv = {"inv_k": 1 / k, "bwd_inv_k": (1 / m + 1 / n) / 2}
    if fp8:
        return Kernel(2 * m * n * k, min(m, n, k), operand * (m * k + k * n) + 2 * m * n, fp8=True, **inv)
    return Kernel(2 * m * n * k, min(m, n, k), elem * (m * k + k * n + m * n), **inv)


def elementwise(nbytes: float, count: int = 1) -> Kernel:
    """A memory-bound kernel moving ``nbytes``."""
    return Kernel(bytes=nbytes, count=count)


class ComputeModel:
    """Times kernels on one GPU type. ``e_max``: the training large-BF16-GEMM efficiency
    (default :data:`GEMM_EFFICIENCY`); FP8 GEMMs and flash attention follow it through
    their kernel benchmarks (the same sustained factor). ``e_max_fp8`` overrides the FP8
    large-GEMM efficiency (tests); ``attention``: the flash-attention backend whose kernel
    curve :data:`ATTENTION_KERNEL` times the attention core (None: the default, cuDNN's;
    ``training.attention_backend`` passes through as given); ``precision``: which quantized
    format the kernels marked ``fp8`` run in (fp8, mxfp8 or nvfp4: its peak, kernel share and
    half size); ``slowdown``: every kernel's FLOP time times this factor, the slowest of the
    job's GPUs under ``variability.sigma`` (:func:`sim.hardware.variability.slowest_of`; 1: off)."""

    def __init__(self, gpu: GPU, e_max: float | None = None, e_max_fp8: float | None = None,
                 attention: AttentionBackend | None = None, calibration: Calibration | None = None,
                 precision: Precision = Precision.FP8, slowdown: float = 1.0):
        self.gpu, self.slowdown = gpu, slowdown
        kernel = GEMM_KERNEL[gpu.name]
        curves = ATTENTION_KERNEL[gpu.name][attention or AttentionBackend.CUDNN]
        self.half, self.hbm_efficiency = GEMM_HALF_SIZE, HBM_EFFICIENCY
        if calibration is not None:  # a measured profile (sim/hardware/calibration.py)
            kernel, curves, e_max = self._calibrated(calibration, kernel, curves, e_max)
        self.e_max = e_max if e_max is not None else GEMM_EFFICIENCY[gpu.name]
        self.sustained = self.e_max / kernel["bf16"]
        fmt = Precision(precision) if precision in QUANTIZED else Precision.FP8
        self.low_flops, self.low_half = low_peak(gpu, fmt), HALF_SIZE[fmt] * self.half / GEMM_HALF_SIZE
        self.e_max_fp8 = e_max_fp8 if e_max_fp8 is not None else self.sustained * kernel.get(fmt, 0.0)
        self.low_k_half = FP8_K_HALF.get(gpu.name, 0.0) if fmt is Precision.FP8 else 0.0
        self.attention = tuple((self.sustained * top, half) for top, half in curves)
        self._memo: dict[tuple, float] = {}

    def _calibrated(self, cal: Calibration, kernel: dict, curves: tuple, e_max: float | None):
        """The profile's kernel shares, curves and sustained factor in place of the presets'
        (a fitted GEMM share scales the FP8 share by the same ratio: one set of tensor cores)."""
        if cal.gemm_kernel is not None:
            ratio = cal.gemm_kernel / kernel["bf16"]
            kernel = {p: share * ratio for p, share in kernel.items()}
        curves = (cal.attention_forward or curves[0], cal.attention_backward or curves[1])
        if e_max is None and (cal.sustained is not None or cal.gemm_kernel is not None):
            sustained = cal.sustained if cal.sustained is not None else SUSTAINED[self.gpu.name]
            e_max = kernel["bf16"] * sustained
            if e_max > 1.0:  # (gemm_kernel alone may pass 1: sim/hardware/calibration.py, KERNEL)
                raise InputError("cluster.calibration", f"{cal.source}: compute.gemm_kernel x sustained = "
                                                        f"{e_max:.3g}, past the GPU's peak (at most 1)")
        self.half = cal.gemm_half_size if cal.gemm_half_size is not None else self.half
        self.hbm_efficiency = cal.hbm_efficiency if cal.hbm_efficiency is not None else self.hbm_efficiency
        return kernel, curves, e_max

    def efficiency(self, min_dim: float) -> float:
        """Share of peak a GEMM with this smallest dimension reaches."""
        return self.e_max * min_dim / (min_dim + self.half)

    def fp8_efficiency(self, min_dim: float) -> float:
        """Share of the dense quantized peak (FP8, MXFP8 or NVFP4) a quantized GEMM with this
        smallest dimension reaches."""
        return self.e_max_fp8 * min_dim / (min_dim + self.low_half)

    def attention_efficiency(self, direction: int, keys: float) -> float:
        """Share of the BF16 peak a flash-attention kernel (1 forward, 2 backward) reaches
        when each query attends ``keys`` keys."""
        top, half = self.attention[direction - 1]
        return top * keys / (keys + half)

    def flop_time(self, k: Kernel) -> float:
        """Seconds of ``k``'s FLOPs alone, at the tensor-core rate of its precision."""
        if not k.flops:
            return 0.0
        if k.fp8:  # the min-dim curve, plus Hopper's cost per output element (FP8_K_HALF / K)
            t = k.flops / (self.low_flops * self.fp8_efficiency(k.min_dim)) + \
                k.flops * self.low_k_half * k.inv_k / (self.low_flops * self.e_max_fp8)
        elif k.attn:
            t = k.flops / (self.gpu.peak_flops * self.attention_efficiency(k.attn, k.keys))
        else:
            t = k.flops / (self.gpu.peak_flops * self.efficiency(k.min_dim))
        return t * self.slowdown  # (x 1.0 is exact: off, every time is as before)

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
            mem_time = k.bytes / (self.gpu.hbm_bw * (k.hbm_share or self.hbm_efficiency))
            t = max(flop_time, mem_time)
            if k.acc and k.wgrad:  # the wgrad's share, accumulating into main_grad (WGRAD_ACC_P)
                t += wgrad_accumulate_s(t * k.wgrad, k.acc, self.gpu.hbm_bw) - t * k.wgrad
            total += LAUNCH_S * k.count + t
        return total
