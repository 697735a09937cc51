"""Full-power Blackwell against Hopper: the same dense step on 8x B200 (dgx-b200) and 8x H100
(dgx-h100) must speed up as MLPerf Training measured, not as the power-limited torchtitan B200
rows (the b200-power-limited part) do.

MLPerf Training v5.0 (NVIDIA Technical Blog, "NVIDIA Blackwell Delivers up to 2.6x Higher
Performance in MLPerf Training v5.0", June 2025): Blackwell 2.2x Hopper per GPU on Llama 3.1
405B pretraining at the same scale; DGX B200 (8 GPUs) 2.5x 8x H100 on Llama 2 70B LoRA.
Accepted band: 2.0x to 2.6x -- the published 2.2-2.5x, widened by 10% below because those
ratios are FP8 runs each tuned by NVIDIA for its round while this compares one BF16 layout
unchanged, and by 0.1 above. The power-limited factor (0.305) gave 0.87x here.

GB200 NVL72 against the same H100s: MLPerf Training v5.0's 2.2x on Llama 3.1 405B (the blog
above) was NVIDIA's GB200 NVL72 submission against Hopper at the same GPU count; MLPerf
Training v5.1 (NVIDIA's round summary, Nov 2025) puts GB300 NVL72 at "more than 4x" Hopper and
"nearly 2x" GB200 per GPU on the same benchmark (NVFP4), i.e. GB200 at about 2x or more. The
same band, 2.0x to 2.6x. The GB200's factor fitted on torchtitan's two Scout rows
(gb200-torchtitan, 0.501 before its MoE costs were modelled) gave 1.64x here. Since 2026-11-27
b200, gb200 and gb300 carry factors fitted on NVIDIA's own Megatron-Bridge rows (sim/model/
compute.py; the nb_ rows of sim/data/frontier_runs.csv), and these ratios still hold with them.

Run: ``python -m pytest tests/test_blackwell_speedup.py``
"""

from sim import simulate
from sim.input.load import scenario_from_dict

MLPERF_BAND = (2.0, 2.6)


def step_s(topology: str, gpu: str | None = None, nodes: int = 1) -> float:
    """Llama 3 8B, FSDP (ZeRO-3) over 8 GPUs (one 8-GPU node, or two 4-GPU trays of an NVL72
    rack), 8192 tokens, selective recompute, BF16."""
    cluster = {"topology": topology, "nodes": nodes} | ({"gpu": gpu} if gpu else {})
    s = scenario_from_dict({"name": "blackwell-vs-hopper", "seed": 0, "model": {"preset": "llama3-8b"},
                            "training": {"seq_len": 8192, "global_batch": 16, "micro_batch": 1,
                                         "recompute": "selective"},
                            "cluster": cluster, "parallel": {"dp": 8, "zero": 3}})
    return simulate(s).summary["step_time_s"]


def test_dgx_b200_over_dgx_h100_within_mlperf_per_gpu_ratio():
    speedup = step_s("dgx-h100") / step_s("dgx-b200")
    assert MLPERF_BAND[0] <= speedup <= MLPERF_BAND[1], speedup


def test_power_limited_b200_is_the_slower_part_on_the_same_board():
    """The torchtitan part keeps its fitted factor: on the same DGX B200 board it is well below
    a full-power B200, yet faster than the 500 W H100 the other torchtitan rows ran on, as
    published (torchtitan, BF16 + compile, Llama 3.1 8B: 8,307.5 tokens/s per power-limited B200
    against 6,667 per 500 W H100). Its rows' low MFU (19-25%) is mostly FlashAttention-2, which
    runs at the H100's rate on Blackwell (sim/model/attention_rates.py ATTENTION_KERNEL), not the clock."""
    h100_500w, full = step_s("dgx-h100", "h100-500w"), step_s("dgx-b200")
    capped = step_s("dgx-b200", "b200-power-limited")
    assert h100_500w > capped > 1.4 * full


def test_gb200_nvl72_over_dgx_h100_within_mlperf_per_gpu_ratio():
    speedup = step_s("dgx-h100") / step_s("gb200-nvl72", nodes=2)
    assert MLPERF_BAND[0] <= speedup <= MLPERF_BAND[1], speedup


def test_torchtitan_scout_gb200_part_keeps_its_fitted_factor():
    """The part the Scout rows run on stays where its two rows put it: above 1.5x the H100 SXM
    on this step. Since 2026-11-27 the plain gb200 has its own factor, fitted on NVIDIA's own
    GB200 rows (the nb_gb200 rows, 0.6498): two independent fits, one on torchtitan's MoE
    stack (0.7010) and one on Megatron-Core's dense steps, 7.9% apart (the plain part's measured
    cuDNN attention, faster than the Hopper shares the torchtitan part keeps, makes up some of it),
    so the same dense step runs slower on the plain part -- within 8%, and not the other way round."""
    h100, plain, tt = step_s("dgx-h100"), step_s("gb200-nvl72", nodes=2), step_s("gb200-nvl72", "gb200-torchtitan", 2)
    assert tt < h100 / 1.5
    assert tt < plain < 1.08 * tt, plain / tt
