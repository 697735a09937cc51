"""Low-precision kernel rates on Blackwell: what Transformer Engine's pre-quantized B300 layer says
an FP8 GEMM keeps of the BF16 share (sim.model.gemm_sources.TE_TUTORIAL_PREQUANTIZED_S,
BLACKWELL_FP8_RATIO), and torchao's MX casts at their measured B200 bandwidths
(sim.model.quant.MX_CAST_SHARE), kept apart from Inductor's fused elementwise runs
(sim.model.host.fused); and the FP8 / BF16 GEMM ratio of one layer against Transformer Engine's
own H200 and B300 timings, through the compute model.

Run: ``python -m pytest -q tests/test_precision_kernels.py``
"""

import pytest

from sim.hardware.gpus import gpu_preset
from sim.model import host
from sim.model import layers as L
from sim.model.compute import GEMM_KERNEL, LAUNCH_S, SUSTAINED, ComputeModel, Kernel, elementwise, gemm
from sim.model.gemm_sources import BLACKWELL_FP8_RATIO, NVFP4_RATIO, nvfp4_share_ratio, te_fp8_ratio, te_tutorial_gemms
from sim.model.quant import MX_CAST_SHARE

B200 = gpu_preset("b200")


# Blackwell's FP8 / BF16 share by hand: every GEMM of TE's tutorial layer has smallest dimension
# 4,096, so the curves' ratio is (4096 + 256) / (4096 + 128) for all 12, and the B300's dense FP8
# peak is twice its BF16 one (4.5 / 2.25 PFLOP/s): share ratio = 13.102 / 6.812 / 2 x 4352 / 4224.
FP8_SHARE_BY_HAND = 13.102 / 6.812 / 2 * 4352 / 4224
# NVFP4 likewise: half size 512, and the B300's dense NVFP4 peak is 6x its BF16 one (13.5 / 2.25
# PFLOP/s): 13.102 / 3.764 / 6 x 4608 / 4224.
NVFP4_SHARE_BY_HAND = 13.102 / 3.764 / 6 * 4608 / 4224
# NVFP4 on a part whose FP4 MMA is 2x its FP8 one (B200, GB200), from the same B300 layer read as
# MMAs + a rest: kappa = the MMAs' share-1 time over FP8's (peaks and curves), rho = 3.764 / 6.812 -
# kappa(B300); share / FP8 share = kappa / (kappa + rho).
KAPPA_B300 = 4.5 / 13.5 * 4608 / 4352
RHO = 3.764 / 6.812 - KAPPA_B300
KAPPA_2X = 0.5 * 4608 / 4352
NVFP4_2X_BY_HAND = FP8_SHARE_BY_HAND * KAPPA_2X / (KAPPA_2X + RHO)


def test_blackwell_fp8_ratio_is_transformer_engines_b300_layer_by_hand():
    """0.991 of the BF16 share (0.900 with OpenXLA's small sm_100 shapes, before 2026-11-27), and
    every Blackwell part takes it; MXFP8 keeps 6.812 / 7.161 of it."""
    assert {min(s) for s in te_tutorial_gemms()} == {4096} and len(te_tutorial_gemms()) == 12
    assert BLACKWELL_FP8_RATIO == pytest.approx(FP8_SHARE_BY_HAND, rel=1e-12)
    assert BLACKWELL_FP8_RATIO == pytest.approx(0.9908, abs=1e-4)
    for gpu in ("b200", "b200-power-limited", "gb200", "gb200-torchtitan", "b300", "gb300"):
        assert GEMM_KERNEL[gpu]["fp8"] == pytest.approx(0.806 * FP8_SHARE_BY_HAND, rel=1e-12)
        assert GEMM_KERNEL[gpu]["mxfp8"] == pytest.approx(0.806 * FP8_SHARE_BY_HAND * 6.812 / 7.161, rel=1e-12)
        assert GEMM_KERNEL[gpu]["bf16"] == 0.806
    for gpu in ("b300", "gb300"):
        assert GEMM_KERNEL[gpu]["nvfp4"] == pytest.approx(0.806 * NVFP4_SHARE_BY_HAND, rel=1e-12)
    for gpu in ("b200", "b200-power-limited", "gb200", "gb200-torchtitan"):
        assert GEMM_KERNEL[gpu]["nvfp4"] == pytest.approx(0.806 * NVFP4_2X_BY_HAND, rel=1e-12)


def test_nvfp4_on_blackwell_is_the_b300_layer_read_as_mmas_plus_a_rest():
    """The B300's layer gives back its own share exactly (rho is defined there); on the B200 and
    GB200 (FP4 peak 2x FP8, not 3x) the NVFP4 share is 0.580, not the B300's 0.510; and the compute
    model times the tutorial's layer in NVFP4 at kappa + rho of its FP8 time there (0.729), where
    the B300 measured 3.764 / 6.812 = 0.553 (the 12 launches aside)."""
    assert nvfp4_share_ratio("b300") == pytest.approx(NVFP4_RATIO, rel=1e-12)
    assert nvfp4_share_ratio("gb300") == pytest.approx(NVFP4_RATIO, rel=1e-12)
    assert RHO == pytest.approx(0.1996, abs=1e-4)
    assert 0.806 * NVFP4_2X_BY_HAND == pytest.approx(0.5799, abs=1e-4)
    shapes = te_tutorial_gemms()
    for gpu, want in (("gb200", KAPPA_2X + RHO), ("b200", KAPPA_2X + RHO), ("b300", 3.764 / 6.812)):
        fp8, fp4 = (ComputeModel(gpu_preset(gpu), e_max=0.806, precision=p) for p in ("fp8", "nvfp4"))
        ratio = (sum(fp4.time([gemm(m, n, k, fp8=True)]) for m, n, k in shapes)
                 / sum(fp8.time([gemm(m, n, k, fp8=True)]) for m, n, k in shapes))
        assert ratio == pytest.approx(want, rel=0.01)


def test_nvfp4_share_is_transformer_engines_b300_layer_by_hand():
    """0.633 of the BF16 share (the tutorial's 3.48x of a 6x peak), adopted with the first NVFP4
    row; the model's own B300 layer, run through ComputeModel.time, gives 3.44x against the
    measured 3.48x: the 1.1% left is the 12 kernels' launch charge (4 us each, 48 us of the
    3.76 ms NVFP4 layer)."""
    assert NVFP4_RATIO == pytest.approx(NVFP4_SHARE_BY_HAND, rel=1e-12)
    assert NVFP4_RATIO == pytest.approx(0.633, abs=1e-3)
    cm = ComputeModel(gpu_preset("b300"), e_max=GEMM_KERNEL["b300"]["bf16"], precision="nvfp4")
    shapes = te_tutorial_gemms()
    bf16 = sum(cm.time([gemm(m, n, k)]) for m, n, k in shapes)
    nvfp4 = sum(cm.time([gemm(m, n, k, fp8=True)]) for m, n, k in shapes)
    assert bf16 / nvfp4 == pytest.approx(13.102 / 3.764, rel=0.015)


def test_the_tutorials_h200_layer_gives_back_our_own_h200_fp8_share():
    """The same method on the tutorial's H200 layer (31.968 / 16.785 ms, the H200's dense peaks 989
    and 1,979 TFLOP/s; Hopper's FP8 term c_K / K = 203 / K with it: sum of m n over sum of m n k of
    the 12 GEMMs) gives 1.005 of the BF16 share, where our own H200 measured 0.811 / 0.806 = 1.006
    over the Llama 3 shapes through the same curves: two independent measurements, 0.1% apart."""
    h, inter, m = 4096, 16384, 15872
    mnk = 3 * m * h * (4 * h + 2 * inter)
    mn = m * (5 * h + inter) + m * (3 * h + inter) + 4 * h * h + 2 * h * inter
    by_hand = 31.968 / 16.785 * 989 / 1979 * (4352 / 4096 + 203 * mn / mnk) / (4224 / 4096)
    assert te_fp8_ratio("h200") == pytest.approx(by_hand, rel=1e-12)
    assert te_fp8_ratio("h200") == pytest.approx(GEMM_KERNEL["h200"]["fp8"] / GEMM_KERNEL["h200"]["bf16"], rel=5e-3)


def test_b200_fp8_gemm_time_closed_form():
    """8192^3 in FP8 on a B200: 2 m n k / (4.5 PFLOP/s x sustained x 0.806 x 0.991 x 8192/(8192+256))."""
    cm = ComputeModel(B200, precision="fp8")
    k = gemm(8192, 8192, 8192, fp8=True)
    want = 2 * 8192.0 ** 3 / (4.5e15 * SUSTAINED["b200"] * 0.806 * FP8_SHARE_BY_HAND * 8192 / (8192 + 256))
    assert cm.time([k]) == pytest.approx(LAUNCH_S + want, rel=1e-12)


def test_mx_cast_share_is_the_harmonic_mean_of_the_two_measured_passes():
    """Two passes of equal bytes at 5.5 and 3.9 TB/s of 8 TB/s: 2 / (8/5.5 + 8/3.9) = 0.5705."""
    assert MX_CAST_SHARE == pytest.approx(2 / (8 / 5.5 + 8 / 3.9), rel=1e-12)
    assert MX_CAST_SHARE == pytest.approx(0.5705, abs=1e-4)


def shard(quant: str) -> L.Shard:
    return L.Shard(8192, 8192, 1, 1, False, True, fp8=True, quant=quant, recipe="torchao")


def test_compile_fuses_fp8_casts_into_the_norm_but_keeps_mx_casts_apart():
    """torch.compile merges a norm with a tensorwise cast (one Inductor kernel) but not with
    torchao's MX cast passes, timed at their own measured share."""
    norm = elementwise(3 * 2 * 8192 * 4096)
    fp8_cast = L.linear(8192, 4096, 4096, shard("fp8"))[0]
    mx_cast = L.linear(8192, 4096, 4096, shard("mxfp8"))[0]
    assert len(host.fused([norm, fp8_cast])) == 1
    assert host.fused([norm, mx_cast]) == (norm, mx_cast)
    cm = ComputeModel(B200, precision="mxfp8")
    assert cm.time([mx_cast]) == pytest.approx(LAUNCH_S + mx_cast.bytes / (8e12 * MX_CAST_SHARE), rel=1e-12)


def test_cdna3_fp8_share_reproduces_amds_max_achievable_flops():
    """The model's own curves at AMD's MAF shapes give back AMD's measured FP8 / BF16 rates:
    MI325X 1,519 / 843 TFLOP/s, MI300X 1,273 / 708 (BF16 at smallest dim 4096, FP8 at 3648)."""
    for name, bf16, fp8 in (("mi325x", 843e12, 1519e12), ("mi300x", 708e12, 1273e12)):
        cm = ComputeModel(gpu_preset(name), e_max=GEMM_KERNEL[name]["bf16"], precision="fp8")
        cm.e_max_fp8 = GEMM_KERNEL[name]["fp8"]  # kernel level: sustained factor 1
        measured = (fp8 / 2614.9e12) / (bf16 / 1307.4e12)
        assert (cm.fp8_efficiency(3648) * cm.low_flops / 2614.9e12) / cm.efficiency(4096) == pytest.approx(measured,
                                                                                                         rel=1e-9)
    assert GEMM_KERNEL["mi325x"]["fp8"] == pytest.approx(0.806 * 0.935, abs=5e-4)
    assert GEMM_KERNEL["mi355x"]["fp8"] == 0.806  # CDNA4: no measurement, assumed


def test_flash_attention_2_keeps_the_h100_absolute_rate_on_blackwell():
    """FlashAttention-2 (mma.sync kernels) on a B200 or GB200 at the same sustained factor takes
    exactly the H100's time: flops / (989 TFLOP/s x sustained x 0.377 L / (L + 105)) forward,
    0.331 L / (L + 272) backward; cuDNN's kernels take a share of the part's own peak: the GB200's
    measured one on the B200 and GB200 (0.7422 L / (L + 696), tests/test_blackwell_attention.py),
    the Hopper one (0.61 L / (L + 90)) on the torchtitan parts."""
    flops, keys, sustained = 4.0e13, 4096.0, 0.5
    for name in ("b200", "b200-power-limited", "gb200", "gb200-torchtitan"):
        cm = ComputeModel(gpu_preset(name), e_max=0.806 * sustained, attention="flash2")
        for direction, (top, half) in ((1, (0.377, 105.0)), (2, (0.331, 272.0))):
            want = flops / (989e12 * sustained * top * keys / (keys + half))
            assert cm.flop_time(Kernel(flops, attn=direction, keys=keys)) == pytest.approx(want, rel=1e-12)
        cudnn = ComputeModel(gpu_preset(name), e_max=0.806 * sustained, attention="cudnn")
        top, half = (0.61, 90.0) if name.endswith(("-power-limited", "-torchtitan")) else (0.7422, 696.0)
        want = flops / (gpu_preset(name).peak_flops * sustained * top * keys / (keys + half))
        assert cudnn.flop_time(Kernel(flops, attn=1, keys=keys)) == pytest.approx(want, rel=1e-12)


def test_cdna3_attention_reproduces_aiters_measured_forward_rate():
    """At kernel level (sustained factor 1) the MI300X / MI325X forward attention at 4,096 keys a
    query (causal, 8,192 tokens) runs at AITER's measured 472 TFLOP/s of 1,307.4 (Primus-Turbo's
    MI300X attention report); the backward keeps the Hopper backward / forward relation."""
    for name in ("mi300x", "mi325x"):
        cm = ComputeModel(gpu_preset(name), e_max=0.806, attention="cudnn")  # sustained 1
        assert cm.attention_efficiency(1, 4096.0) * 1307.4e12 == pytest.approx(472e12, rel=1e-9)
        ratio = cm.attention_efficiency(2, 4096.0) / cm.attention_efficiency(1, 4096.0)
        assert ratio == pytest.approx((0.53 * 4096 / (4096 + 350)) / (0.61 * 4096 / (4096 + 90)), rel=1e-12)
    mi355x = ComputeModel(gpu_preset("mi355x"), e_max=0.806, attention="cudnn")
    assert mi355x.attention_efficiency(1, 4096.0) == pytest.approx(0.61 * 4096 / (4096 + 90), rel=1e-12)


# Transformer Engine's GEMM profiling tutorial (NVIDIA/TransformerEngine
# docs/examples/gemm_profiling/gemm_profiling.rst @8f2e635), per-layer totals in ms of its 12 GEMMs,
# inputs quantized before the timed loop: BF16 and FP8 (current scaling, tensor-wise).
TE_TUTORIAL_PREQUANTIZED_MS = {"h200": (31.968, 16.785), "b300": (13.102, 6.812)}


def te_tutorial_layer_ratio(gpu: str) -> float:
    """The model's BF16 / FP8 time of the tutorial's 12 GEMMs at kernel level (sustained factor 1),
    through ComputeModel.time (launches, the roofline's memory side, the curves)."""
    cm = ComputeModel(gpu_preset(gpu), e_max=GEMM_KERNEL[gpu]["bf16"], precision="fp8")
    shapes = te_tutorial_gemms()
    bf16 = sum(cm.time([gemm(m, n, k)]) for m, n, k in shapes)
    return bf16 / sum(cm.time([gemm(m, n, k, fp8=True)]) for m, n, k in shapes)


def test_hopper_fp8_share_reproduces_transformer_engines_gemm_tutorial():
    """On the H200 (an H200 NVL in the tutorial) the layer's pre-quantized GEMMs run 31.968 / 16.785
    = 1.905x faster in FP8; the model's shares (0.793 / 0.806, measured on our own H200 with
    torch._scaled_mm) and curves give 1.907x: an independent check of the Hopper FP8 share at
    training-sized GEMMs (docs/precision.md, "What the Grok-1 FP8 pair is not")."""
    bf16, fp8 = TE_TUTORIAL_PREQUANTIZED_MS["h200"]
    assert te_tutorial_layer_ratio("h200") == pytest.approx(bf16 / fp8, rel=0.01)


def test_blackwell_fp8_share_reproduces_transformer_engines_gemm_tutorial():
    """The same layer on a B300: 13.102 / 6.812 = 1.923x measured; the model gives 1.916x (it gave
    1.741x with OpenXLA's small-shape share, 0.900, until 2026-11-27); the 0.4% left is the 12
    kernels' launch charge, 4 us each, a larger part of the FP8 layer."""
    bf16, fp8 = TE_TUTORIAL_PREQUANTIZED_MS["b300"]
    assert te_tutorial_layer_ratio("b300") == pytest.approx(bf16 / fp8, rel=0.005)
