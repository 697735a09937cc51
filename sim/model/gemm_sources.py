"""Where the GEMM curves' shapes and the FP8 / BF16 kernel ratios come from: the half-efficiency
sizes, Hopper FP8's reduction-dim term, and the published kernel benchmarks whose FP8 / BF16 share
ratios :data:`sim.model.compute.GEMM_KERNEL` takes (AMD's max-achievable FLOPs, Transformer
Engine's pre-quantized GEMM tutorial), each read through the same curves the compute model runs.

Run: ``python -m pytest -q tests/test_precision_kernels.py tests/test_fp8_k_curve.py``.
"""

from ..hardware.gpus import GPUS, LOW_PRECISION_PEAK, Precision

# AMD's max-achievable FLOPs: (BF16 FLOP/s at smallest dim 4096, FP8 FLOP/s at smallest dim 3648).
AMD_MAF = {"mi300x": (708e12, 1273e12), "mi325x": (843e12, 1519e12)}


def maf_fp8_ratio(gpu: str) -> float:
    """(FP8 share / its curve) / (BF16 share / its curve) of :data:`AMD_MAF`, the shares of the
    preset's dense peaks, the curves' half sizes 256 (FP8) and 128 (BF16): :data:`HALF_SIZE`."""
    bf16, fp8 = AMD_MAF[gpu]
    part = GPUS[gpu]
    return (fp8 / part.fp8_flops / (3648 / (3648 + 256))) / (bf16 / part.peak_flops / (4096 / (4096 + 128)))


GEMM_HALF_SIZE = 128  # smallest GEMM dim at which efficiency is half of e_max (tile size 128)
# FP8 size dependence: a tile's fixed cost (prologue, epilogue, wave tail) does not shrink when
#   the MMA runs twice as fast, so the half-efficiency size doubles. Measured: fitting
#   e*K/(K+c) to the tilelang FP8 K-sweep gives c ~ 380 (M=N=8192, K=256..16384) where the
#   BF16 sm_90 cuBLAS table of XLA (tensorflow/tensorflow third_party/xla/xla/service/gpu/
#   model/matmul_interpolator_data.h, m=n=4096, k=256..4096) gives c ~ 215: a ratio of ~1.8.
FP8_GEMM_HALF_SIZE = 2 * GEMM_HALF_SIZE
# NVFP4: the MMA runs twice as fast again as FP8 on Blackwell; by the same fixed-cost argument
#   the half-efficiency size doubles again (an extrapolation of the FP8 measurement above, no
#   FP4 K-sweep is shipped).
HALF_SIZE = {Precision.FP8: FP8_GEMM_HALF_SIZE, Precision.MXFP8: FP8_GEMM_HALF_SIZE, Precision.NVFP4: 2 * FP8_GEMM_HALF_SIZE}
# Hopper FP8: a fixed cost per output element besides the min-dim curve. time = FLOPs / (peak x e_max)
#   x (1 + c / x + c_K / K), K the reduction dim: the epilogue's work per output tile (the BF16
#   output written, the scales applied) does not shrink with K, so a GEMM of small K spends a larger
#   share of its time outside the MMA main loop, more so in FP8, whose main loop runs twice as fast.
#   c_K fitted GLOBALLY (bench/measured_gemm_fit.py) on every shape of bench/measured/
#   h100-2026-11-26.json and h200-2026-11-26.json's ``gemm`` (BF16 F.linear and FP8 torch._scaled_mm
#   at the same 74 shapes; the launch-bound squares left out) to FP8's time against BF16's at the
#   same shape (what an FP8 row is compared by), one level per GPU: 203 (mean |log error| 0.054 ->
#   0.037; the ratio's K-sweep, m = n = 8192, had missed by -32% / -41% at K 128 and -15% / -16% at
#   K 512, now within -13% .. +6%). BF16's own small-K loss stays out of the model (fitted alone it
#   would take 82; applying it moves every BF16 row and needs a refit of the whole table), so c_K is
#   FP8's excess over it and the small-K FP8 GEMM stays as optimistic as the BF16 one (K 256: -23%
#   against BF16's -16%). Other GPUs: not measured, 0.
FP8_K_HALF = {"h100-sxm": 203.0, "h100-500w": 203.0, "h200": 203.0, "h800": 203.0}
# Transformer Engine's GEMM profiling tutorial (NVIDIA/TransformerEngine
# docs/examples/gemm_profiling/gemm_profiling.rst @8f2e635, "Autocast vs Pre-quantized" and "Worked
# Example: 5B Model on H200"; benchmarks/gemm/benchmark_gemm.py --pre-quantize): the 12 GEMMs of one
# layer of hidden 4,096, intermediate 16,384 and M = 31 x 512 = 15,872 tokens (QKV, attention out,
# MLP up, MLP down; forward, dgrad and wgrad each), inputs quantized before the timed loop, so only
# the GEMM kernels are in it; per-layer seconds on an "NVIDIA B300 SXM6 AC" and an "H200 NVL":
# BF16, FP8 current scaling (tensor-wise scales) and, on the B300, MXFP8.
TE_TUTORIAL_LAYER = (4096, 16384, 31 * 512)  # hidden, intermediate, tokens
TE_TUTORIAL_PREQUANTIZED_S = {"b300": {Precision.BF16: 13.102e-3, Precision.FP8: 6.812e-3, Precision.MXFP8: 7.161e-3,
                                       Precision.NVFP4: 3.764e-3},
                              "h200": {Precision.BF16: 31.968e-3, Precision.FP8: 16.785e-3}}


def te_tutorial_gemms() -> list[tuple[int, int, int]]:
    """The tutorial's 12 GEMMs of one layer as (m, n, k): forward (M, N, K) of QKV, attention
    out, MLP up and down, then each one's dgrad (M, K, N) and wgrad (K, N, M)."""
    h, inter, m = TE_TUTORIAL_LAYER
    fwd = [(m, 3 * h, h), (m, h, h), (m, inter, h), (m, h, inter)]
    return fwd + [(a, k, n) for a, n, k in fwd] + [(k, n, a) for a, n, k in fwd]


def te_fp8_ratio(gpu: str) -> float:
    """(FP8 share / its curve) / (BF16 share / its curve) of the tutorial's pre-quantized layer on
    ``gpu``: the shares of the preset's dense peaks that the 12 GEMMs' FLOPs need to take the
    measured times through the curves (half sizes :data:`GEMM_HALF_SIZE` and
    :data:`FP8_GEMM_HALF_SIZE`; on Hopper FP8 also :data:`FP8_K_HALF`'s c_K / K), one ratio for
    the whole layer."""
    return te_share_ratio(gpu, Precision.FP8)


def te_share_ratio(gpu: str, fmt: Precision) -> float:
    """:func:`te_fp8_ratio` for any quantized format the tutorial timed on ``gpu``: that format's
    share of its own dense peak (``GPU.fp8_flops``, ``mxfp8_flops``, ``fp4_flops``) through its
    curve (:data:`HALF_SIZE`), over the BF16 share through the BF16 curve."""
    times = TE_TUTORIAL_PREQUANTIZED_S[gpu]
    share = full_share_s(gpu, fmt) / times[fmt]
    return share / (full_share_s(gpu, Precision.BF16) / times[Precision.BF16])


def full_share_s(gpu: str, fmt: Precision) -> float:
    """Seconds the tutorial's 12 GEMMs take on ``gpu`` in ``fmt`` at share 1 of that format's dense
    peak, through its curve (:data:`HALF_SIZE`; BF16 :data:`GEMM_HALF_SIZE`; Hopper FP8 with
    :data:`FP8_K_HALF`'s c_K / K)."""
    part = GPUS[gpu]
    if fmt is Precision.BF16:
        peak, half, c_k = part.peak_flops, GEMM_HALF_SIZE, 0.0
    else:
        peak, half = getattr(part, LOW_PRECISION_PEAK[fmt]), HALF_SIZE[fmt]
        c_k = FP8_K_HALF.get(gpu, 0.0) if fmt is Precision.FP8 else 0.0
    return sum(2 * m * n * k / (peak * min(m, n, k) / (min(m, n, k) + half)) + 2 * m * n * c_k / peak
               for m, n, k in te_tutorial_gemms())


# Blackwell's FP8 GEMM against its BF16 one: the tutorial's B300 layer (above), 0.991.
BLACKWELL_FP8_RATIO = te_fp8_ratio("b300")
# MXFP8 against FP8 with tensor-wise scales, both pre-quantized, on the same B300 and layer: the MX
# kernel, which also loads one E8M0 scale per 32 elements of each operand, keeps 6.812 / 7.161 =
# 0.951 of the FP8 kernel's rate at the same shapes and peak (tcgen05.mma kind::mxf8f6f4 and
# kind::f8f6f4 share it).
MX_FP8_RATIO = TE_TUTORIAL_PREQUANTIZED_S["b300"][Precision.FP8] / TE_TUTORIAL_PREQUANTIZED_S["b300"][Precision.MXFP8]
# NVFP4 against BF16, pre-quantized, on the same B300 and layer: 3.764 ms against 13.102 ms (3.48x,
# the tutorial's "NVFP4 vs BF16: 3.48x" of the pre-quantized table, @8f2e635 line 148), on a part
# whose dense NVFP4 peak is 6x its BF16 one (15 of 2.5 PFLOP/s: sim.hardware.gpus ``b300``). Through
# the curves (half size 512 for NVFP4: :data:`HALF_SIZE`) the NVFP4 kernel keeps about 0.63 of the
# BF16 share (:func:`te_share_ratio`): the B300's (and GB300's) NVFP4 share, :func:`nvfp4_share_ratio`.
NVFP4_RATIO = te_share_ratio("b300", Precision.NVFP4)


def nvfp4_share_ratio(gpu: str) -> float:
    """NVFP4's share over the BF16 share on a Blackwell part, from the tutorial's B300 layer, as a
    k-tile of a block-scaled GEMM runs: the MMAs at the FP4 rate plus the rest of the tile's work
    at the rate of the SM's other units. CUTLASS's SM100 block-scaled mainloop
    (NVIDIA/cutlass@7107b055 include/cutlass/gemm/collective/sm100_blockscaled_mma_warpspecialized.hpp
    lines 1017-1034) has the MMA warp copy each k-tile's scale factors from shared into tensor memory
    (``tiled_copy_s2t_SFA`` / ``_SFB``, UTCCP) and then issue that tile's MMAs, in one stream; the
    copy does not get faster with the FP4 MMA. Blackwell Ultra raised the dense FP4 MMA rate 1.5x
    and nothing else (B300 / GB300 NVFP4 peak 3x FP8, B200 / GB200 2x, FP8 equal: sim.hardware.gpus).
    So NVFP4 time = the tile's MMAs at the FP8 kernel's efficiency of the FP4 peak + a rest that is
    a fixed fraction ``rho`` of the FP8 layer's time on every part: on the B300, NVFP4 / FP8 =
    3.764 / 6.812 = 0.553 measured, the MMAs at share 1 over FP8's through the curves
    (:func:`full_share_s`) kappa = 0.353, rho = 0.200. On a part with kappa_X: NVFP4 share / FP8 share
    = kappa_X / (kappa_X + rho). B300, GB300: 0.639 (= :data:`NVFP4_RATIO` / :data:`BLACKWELL_FP8_RATIO`,
    exactly); B200, GB200 (kappa 0.529): 0.726, an NVFP4 GEMM 1.14x faster than a B300-share one.
    Not a Blackwell part (no ``fp4_flops``): the B300's ratio (the rules refuse NVFP4 there).
    Both GPU presets' peaks are cited in sim/hardware/gpus.py."""
    part, b300 = GPUS[gpu], GPUS["b300"]
    if not part.fp4_flops or not part.fp8_flops or part.fp4_flops / part.fp8_flops == b300.fp4_flops / b300.fp8_flops:
        return NVFP4_RATIO  # (the measured part's FP4 : FP8 ratio, or no FP4: the measured share itself)
    times = TE_TUTORIAL_PREQUANTIZED_S["b300"]
    kappa_b300 = full_share_s("b300", Precision.NVFP4) / full_share_s("b300", Precision.FP8)
    rho = times[Precision.NVFP4] / times[Precision.FP8] - kappa_b300
    kappa = full_share_s(gpu, Precision.NVFP4) / full_share_s(gpu, Precision.FP8)
    return BLACKWELL_FP8_RATIO * kappa / (kappa + rho)
