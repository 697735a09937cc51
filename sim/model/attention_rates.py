"""Flash attention's rate per GPU and backend, kernel level: the measured curves that
:mod:`sim.model.compute` times attention kernels with (``ATTENTION_KERNEL[gpu][backend]``,
forward and backward; ``training.attention_backend`` picks the backend). Each curve is cited
where it is defined; `python -m pytest tests/test_attention_backend.py` checks them against
the measurements shipped in bench/measured/.
"""

from ..hardware.gpus import GPUS
from ..input.choices import AttentionBackend

CUDNN, FLASH2 = AttentionBackend  # the keys of each GPU's curves (training.attention_backend)

# Flash attention, kernel level: (share of the BF16 peak at long sequences, keys at which half
# of it is reached) for the forward and the backward kernel; efficiency(L) = max * L / (L + half)
# with L the keys a query attends (causal: half the sequence on average). One curve per
# attention backend (``training.attention_backend``):
# - "cudnn": cuDNN fused attention, what Transformer Engine runs on Hopper by default
#   (NVTE_FUSED_ATTN=1; NeMo / Megatron-Core). h100-sxm, head dim 128, BF16 (Shah et al. 2024,
#   FlashAttention-3, arXiv:2407.08608, figures "Attention forward / backward speed, head dim
#   128 (H100 80GB SXM5)"): forward 497, 574, 617, 609, 600, 595 TFLOP/s and backward 305,
#   408, 465, 499, 518, 516 at 512..16k -> forward (0.61, 90), backward (0.53, 350) fit every
#   point within 7%.
# - "flash2": FlashAttention-2 (Dao 2023), what Transformer Engine runs when cuDNN attention is
#   switched off (NVTE_FUSED_ATTN=0) and FlashAttention-3 is not installed. h100-sxm, the same
#   figures: forward 309, 350, 362, 368, 370, 370 and backward 214, 260, 291, 310, 318, 322 at
#   512..16k -> forward (0.377, 105), backward (0.331, 272) fit every point within 4%.
#   Those figures are without a causal mask; the parts without a measurement of their own
#   (Blackwell, AMD) keep this curve.
# - "flash2" on Hopper, measured: the FlashAttention-2 kernels PyTorch's scaled_dot_product_attention
#   runs as its FLASH_ATTENTION backend (what torchtitan calls, with is_causal=True), causal, head
#   dim 128, BF16, [b, 32, s, 128] at 16k tokens a call, s = 512..16k (bench/measured/
#   h100-2026-11-26.json and h200-2026-11-26.json, ``attention``, PyTorch 2.11, 700 W): H100 80GB
#   SXM forward 0.149, 0.222, 0.295, 0.303, 0.313, 0.318 and backward 0.107, 0.168, 0.203, 0.241,
#   0.277, 0.287 of the dense BF16 peak -> forward (0.345, 307), backward (0.301, 452), every point
#   within 10% / 5% (least squares of the relative error; tests/test_attention_backend.py); H200
#   forward 0.145 .. 0.338, backward 0.098 .. 0.315 -> (0.373, 399), (0.345, 657), within 8% / 9%.
#   At 16k tokens these are 0.86 / 0.90 (H100) of the paper curve above: PyTorch's causal FA2 call
#   keeps less of the peak than the paper's non-causal one. h100-500w and h800 take the H100's
#   (the same die; the 500 W cap is the sustained factor's). The h200 keeps the paper curve for
#   now: its fit is here, but its sustained factor also anchors the H200 trace calibration
#   (docs/calibrate.md), which a change of its curve would have to be redone with.
# a100-80gb: FlashAttention-2 on A100 (Dao 2023, arXiv:2307.08691: forward up to 73% and
#   backward up to 63% of peak; the sequence dependence taken from the H100 fit); no separate
#   cuDNN measurement, so both backends take it.
_HOPPER_ATTN = {CUDNN: ((0.61, 90.0), (0.53, 350.0)), FLASH2: ((0.377, 105.0), (0.331, 272.0))}
FLASH2_H100 = ((0.345, 307.0), (0.301, 452.0))  # PyTorch SDPA's FA2, causal, measured on one H100 SXM
_H100_ATTN = {**_HOPPER_ATTN, FLASH2: FLASH2_H100}
_A100_ATTN = ((0.73, 90.0), (0.63, 350.0))
# - "flash2" on Blackwell (b200, gb200, b300, gb300 and the torchtitan rows' parts): FlashAttention-2's
#   kernels are Ampere-style (mma.sync), which sm_100 runs no faster than Hopper: measured on B200,
#   head dim 128 (meta-pytorch/tritonbench pull 171, flash_v2): forward 352, 354, 362 TFLOP/s at 2k,
#   4k, 8k keys, 0.96-0.98 of the H100 figures above (362, 368, 370); head dim 64
#   (Dao-AILab/flash-attention issue 1589, flash_attn 2.7.4): forward 343-381 and backward 302-334
#   at 2k-16k. So it keeps the H100's absolute rate: the H100 curve's shares times 989 TFLOP/s over
#   the part's BF16 peak (0.44 on a B200, 0.40 on a GB200). It is what PyTorch's SDPA ran on B200
#   until cuDNN attention became its default on sm_100 (pytorch/pytorch pull 162073, 2025-09-04,
#   for 2.9): the torchtitan B200 rows' nightly (2.9.0.dev20250815) predates it. cuDNN's kernels
#   use Blackwell's tensor cores ("cudnn" keeps the Hopper shares of the part's own peak).
BLACKWELL = ("b200", "b200-power-limited", "gb200", "gb200-torchtitan", "b300", "gb300")


# - "cudnn" on full-power Blackwell, measured (since 2026-11-27): cuDNN's own training SDPA benchmark
#   (NVIDIA/cudnn-frontend@fb682ce7 benchmark/sdpa_benchmark_training/results/llama3.1/{gb200,gb300}/
#   llama3.1_2026042*.csv: cuDNN 9.22, BF16, Llama 3.1's 64 query / 8 KV heads, head dim 128, batch 2,
#   causal ("top_left"), non-deterministic backward; causal FLOPs counted half, as this model does),
#   TFLOP/s at 2k, 4k, 8k, 16k, 32k tokens (keys a query attends: half of that), CSV lines 74/75,
#   56/57, 38/39, 20/21, 2/3 (forward / backward):
#   GB200 forward 1097, 1408, 1574, 1708, 1622 and backward 885, 1148, 1332, 1328, 1226;
#   GB300 forward 1373, 1703, 1856, 1915, 1953 and backward 967, 1248, 1435, 1507, 1490.
#   As shares of the 2.5 PFLOP/s BF16 peak both parts have in the presets, least squares of the
#   relative error over 2k-16k (the rows train at 4k-8k): GB200 forward (0.7422, 696), backward
#   (0.5963, 670), within 1.6% / 3.8%; GB300 forward (0.8264, 497), backward (0.6666, 724), within
#   2.4% / 1.6%. At 32k the curves sit above the measurement (GB200 +9.7% / +16.8%: its 32k dip;
#   GB300 +2.7% / +7.1%). At Llama's 8k sequence the GB300 runs the layer's attention (forward + backward) in 0.908
#   of the GB200's time (5.017 / 5.524 ms): Blackwell Ultra's doubled SFU rate for the softmax
#   exponential (MUFU.EX2; NVIDIA technical blog "Making Softmax More Efficient with NVIDIA Blackwell
#   Ultra") shows as 1.18x forward and 1.08x backward, not the "2x attention-layer acceleration" of
#   the datasheet (an inference figure: on Blackwell the backward is bound by shared-memory traffic,
#   not the exponential: FlashAttention-4's "feeds and speeds" analysis, Together AI blog
#   "FlashAttention-4", which also puts cuDNN 9.13's B200 forward at up to 1605 / 1.3 TFLOP/s).
#   The Hopper curve above gave both parts 0.597 / 0.488 at 4k keys. The B200 (the GB200's die)
#   takes the GB200's shares of its own peak, the B300 the GB300's; the torchtitan parts (b200-power-limited, gb200-torchtitan) keep the Hopper shares their
#   factors were fitted with.
CUDNN_GB200 = ((0.7422, 696.0), (0.5963, 670.0))
CUDNN_GB300 = ((0.8264, 497.0), (0.6666, 724.0))
_MEASURED_CUDNN = {"gb200": CUDNN_GB200, "b200": CUDNN_GB200, "gb300": CUDNN_GB300, "b300": CUDNN_GB300}


def _fa2_at_hopper_rate(gpu: str) -> dict:
    """A Blackwell part's attention curves: cuDNN's measured on its die (the Hopper shares where
    none is), FlashAttention-2's at the H100's absolute rate (the shares scaled by the H100 SXM's
    peak over the part's)."""
    scale = GPUS["h100-sxm"].peak_flops / GPUS[gpu].peak_flops
    return {CUDNN: _MEASURED_CUDNN.get(gpu, _HOPPER_ATTN[CUDNN]),
            FLASH2: tuple((top * scale, half) for top, half in _HOPPER_ATTN[FLASH2])}


# - AMD CDNA3 (mi300x, mi325x; one die, 1,307.4 TFLOP/s dense BF16): Megatron on ROCm runs attention
#   in Transformer Engine's CK fused attention, whose v3 kernels are AITER's hand-written assembly
#   (AMD's Primus run instructions export NVTE_CK_USES_BWD_V3=1). AITER's BF16 forward on an MI300X,
#   head dim 128, causal, 8,192 tokens: 472 TFLOP/s (AMD-AGI/Primus-Turbo agent_docs/MI300X/
#   phase1-attention-report.md, PyTorch 2.10 + ROCm 7.1: Triton's 208.5 TFLOP/s is "44.2%" of
#   AITER's; 4,096 tokens non-causal: 229.0 at 47.1%, 486), 0.361 of the peak where the Hopper
#   curve above gives cuDNN 0.597 at the same 4,096 keys on average: :data:`CDNA3_ATTENTION_RATIO`
#   = 0.605 of it. No backward figure is shipped: the backward keeps its Hopper relation to the
#   forward (the same ratio; HipKittens, arXiv:2511.08083, finds AITER's attention backward the
#   weaker of the two on CDNA). MI355X (CDNA4): no measurement, the Hopper shares.
AITER_MI300X_FWD = (472e12, 4096.0)  # FLOP/s, keys a query attends on average (causal 8,192)
CDNA3_ATTENTION_RATIO = (AITER_MI300X_FWD[0] / GPUS["mi300x"].peak_flops) / (0.61 * AITER_MI300X_FWD[1] / (AITER_MI300X_FWD[1] + 90.0))
_CDNA3_ATTN = {b: tuple((top * CDNA3_ATTENTION_RATIO, half) for top, half in c) for b, c in _HOPPER_ATTN.items()}
ATTENTION_KERNEL = {"a100-80gb": {CUDNN: _A100_ATTN, FLASH2: _A100_ATTN},
                    **{g: _H100_ATTN for g in ("h100-sxm", "h100-500w", "h800")},
                    **{g: _HOPPER_ATTN for g in ("h200", "mi355x")},
                    **{g: _CDNA3_ATTN for g in ("mi300x", "mi325x")},
                    **{g: _fa2_at_hopper_rate(g) for g in BLACKWELL}}
