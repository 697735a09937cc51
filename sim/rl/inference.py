"""Inference engine cost model: prefill, decode and KV-cache capacity of one generator engine.

Run ``clustersim rl scenarios/rl-llama3-8b-h100.toml``; ``tests/test_rl.py`` replays the
published vLLM benchmark runs of ``sim/data/inference_measured.csv`` through it.

An engine is ``generator_tp`` GPUs serving one copy of the policy (vLLM / SGLang style,
Megatron tensor parallelism inside the engine):

- **decode** (one token for each of ``b`` running sequences, context ``C`` tokens in all):
  every GPU streams its weight shard and the KV cache of the context from HBM, so
  ``t = max((W/tp + kv * C) / (HBM bw * eta), FLOPs(b) / (peak * e(b))) + 2 * layers * t_allreduce(b h 2 bytes)``.
  ``eta`` (:data:`DECODE_HBM_EFFICIENCY`) is the one constant fitted here; the GEMM
  efficiency ``e(b)`` is the training compute model's (sim/model/compute.py: small-M GEMMs
  reach e_max * b / (b + 128)); the two TP all-reduces per layer (Megatron: after attention
  and after the MLP) run on the network model of the engine's own GPUs.
- **prefill** of ``n`` prompt tokens: compute-bound, 2 N_active n + attention FLOPs at the
  same GEMM efficiency (or the weight stream, if that is longer), plus the all-reduces.
- **KV capacity**: ``memory_fraction * HBM - W/tp - reserve`` (vLLM's
  ``gpu_memory_utilization``: weights, activations, the rest KV blocks;
  vllm/worker/worker.py ``determine_num_available_blocks``). An engine admits a sequence
  only when the KV cache can hold it at its longest (prompt + max response), so it never
  evicts: TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` capacity scheduler
  (tensorrt_llm/_torch/pyexecutor/scheduler.py); vLLM admits on demand and preempts instead.
  The engine's concurrency (``slots``) is that count, at most ``max_seqs`` (vLLM ``max_num_seqs``).

Between two events (a sequence finishing, an admission, a weight swap) the batch is fixed
and only the context grows (by ``b`` tokens per step), so the time of ``k`` decode steps
has a closed form (:meth:`EngineCost.decode_span`) and the loop jumps over them.
"""

from dataclasses import dataclass
from functools import lru_cache
import math

from ..collectives.kinds import ALL_REDUCE
from ..errors import InputError
from ..hardware.gpus import FABRIC_EFFICIENCY, GPU
from ..model.compute import GEMM_EFFICIENCY
from ..model.gemm_sources import GEMM_HALF_SIZE
from ..model.transformer import Dims, non_embedding_params, total_params
from ..units import GB, GIB

# Share of HBM bandwidth a decode step reaches, streaming weights and KV cache.
# `python -m sim.rl.validation --fit` over the 292 decode rounds of the 4 vLLM 0.6 runs of
# sim/data/inference_measured.csv (Lambda Labs, Llama 3 8B on 1 H100 and 70B on 8 H100,
# bf16): the value whose worst run is best (mean step errors +12.2%, +8.5%, -3.3%, -13.0%).
# Like GEMM_EFFICIENCY for training, it also absorbs what a per-byte model leaves out:
# kernel launches, sampling, the scheduler; 8B alone would fit 0.67, 70B TP 8 alone ~0.55.
DECODE_HBM_EFFICIENCY = 0.60
# HBM an engine keeps outside weights and KV blocks: CUDA context, cuBLAS/NCCL workspaces,
# CUDA graphs and the activation peak vLLM profiles (its startup log for Llama 3 8B on an
# H100 reports ~1-2 GiB of non-KV, non-weight memory); one value for every model here.
RESERVE_BYTES = 2 * GIB
ELEM = 2  # bytes per bf16 weight, activation and KV-cache element


def kv_bytes_per_token(d: Dims, tp: int) -> float:
    """KV-cache bytes one token takes on each GPU of a TP-``tp`` engine: K and V of every
    layer for the engine's share of the KV heads (replicated when tp exceeds them, as vLLM does)."""
    heads_per_gpu = max(1, d.g // tp)
    return 2 * d.layers * heads_per_gpu * d.d * ELEM


@dataclass(frozen=True)
class EngineCost:
    """What one engine's steps cost. Bytes and FLOPs are per GPU; times in seconds."""

    tp: int
    layers: int
    hidden: int
    weight_bytes: float  # this GPU's weight shard
    kv_bytes: float  # per context token
    flops_token: float  # linear FLOPs per new token (2 N_active / tp, logits included)
    attn_flops: float  # prefill attention FLOPs per (query, key) pair: 4 h / tp * layers
    hbm_bw: float  # bytes/s
    peak: float  # FLOP/s
    e_max: float
    ar_alpha: float = 0.0  # one TP all-reduce: alpha + beta * bytes (0 for tp = 1)
    ar_beta: float = 0.0
    capacity_tokens: int = 0  # KV cache of the engine, in tokens
    slots: int = 1  # sequences it runs at once
    eta: float = DECODE_HBM_EFFICIENCY
    h2d_bw: float = 0.0  # bytes/s host -> GPU (PCIe, after its efficiency): loading staged weights

    def load_weights(self) -> float:
        """Seconds to copy this GPU's weight shard from host memory (the async swap)."""
        return self.weight_bytes / self.h2d_bw

    def gemm_efficiency(self, m: float) -> float:
        """Training's GEMM efficiency for a GEMM whose smallest side is ``m`` (sim/model/compute.py)."""
        return self.e_max * m / (m + GEMM_HALF_SIZE)

    def allreduces(self, tokens: float) -> float:
        """The step's 2 * layers TP all-reduces of ``tokens * hidden`` bf16 activations."""
        if self.tp == 1:
            return 0.0
        return 2 * self.layers * (self.ar_alpha + self.ar_beta * tokens * self.hidden * ELEM)

    def _decode_parts(self, b: int) -> tuple[float, float, float]:
        """(memory time at zero context, memory time per context token, compute + comm time)."""
        bw = self.hbm_bw * self.eta
        compute = self.flops_token * b / (self.peak * self.gemm_efficiency(b))
        return self.weight_bytes / bw, self.kv_bytes / bw, compute

    def decode_step(self, b: int, context: float) -> float:
        """One decode step of ``b`` sequences holding ``context`` tokens of KV cache in all."""
        m0, per_token, compute = self._decode_parts(b)
        return max(m0 + per_token * context, compute) + self.allreduces(b)

    def decode_span(self, b: int, context: float, k: int) -> float:
        """``k`` decode steps, the context growing by ``b`` tokens each: the sum over
        i < k of max(A + a i, Q) + comm, split where the memory line crosses Q."""
        if k <= 0:
            return 0.0
        m0, per_token, q = self._decode_parts(b)
        a0, slope = m0 + per_token * context, per_token * b
        flat = 0 if a0 >= q else min(k, math.ceil((q - a0) / slope) if slope > 0 else k)
        rising = k - flat
        span = q * flat + rising * a0 + slope * (k * (k - 1) - flat * (flat - 1)) / 2
        return span + k * self.allreduces(b)

    def steps_within(self, b: int, context: float, seconds: float, k: int) -> int:
        """The most decode steps (at most ``k``) that end within ``seconds``."""
        lo, hi = 0, k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_span(b, context, mid) <= seconds * (1 + 1e-12):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def prefill(self, prompts: list[int]) -> float:
        """Prefill of a group of prompts in one step (their first tokens come out of it)."""
        tokens = sum(prompts)
        if tokens == 0:
            return 0.0
        flops = self.flops_token * tokens + self.attn_flops * sum(p * (p + 1) / 2 for p in prompts)
        compute = flops / (self.peak * self.gemm_efficiency(tokens))
        return max(compute, self.weight_bytes / (self.hbm_bw * self.eta)) + self.allreduces(tokens)


def engine_cost(d: Dims, tied: bool, gpu: GPU, tp: int, memory_fraction: float, seq_tokens: int,
                max_seqs: int, allreduce: tuple[float, float] = (0.0, 0.0),
                eta: float = DECODE_HBM_EFFICIENCY) -> EngineCost:
    """The cost model of a TP-``tp`` engine of ``gpu`` holding sequences of up to
    ``seq_tokens`` tokens. Raises InputError when the weights or one sequence's KV cache
    do not fit."""
    weights = total_params(d, tied) * ELEM / tp
    kv = kv_bytes_per_token(d, tp)
    free = memory_fraction * gpu.hbm_bytes - weights - RESERVE_BYTES
    if free <= 0:
        raise InputError("rl.generator_tp", f"an engine of {tp} {gpu.name} GPU(s) cannot hold the weights: "
                                            f"{weights / GB:.1f} GB per GPU + {RESERVE_BYTES / GB:.1f} GB reserve > "
                                            f"memory_fraction * HBM = {memory_fraction * gpu.hbm_bytes / GB:.1f} GB; "
                                            "raise rl.generator_tp")
    capacity = int(free // kv)
    if capacity < seq_tokens:
        raise InputError("rl.lengths.max", f"one sequence of prompt_tokens + max = {seq_tokens} tokens needs "
                                           f"{seq_tokens * kv / GB:.2f} GB of KV cache per GPU, but an engine of "
                                           f"{tp} {gpu.name} GPU(s) has {free / GB:.2f} GB left after weights")
    flops_token = 2 * (non_embedding_params(d, active=True) + d.h * d.v) / tp
    return EngineCost(tp, d.layers, d.h, weights, kv, flops_token, 4 * d.h * d.layers / tp, gpu.hbm_bw,
                      gpu.peak_flops, GEMM_EFFICIENCY[gpu.name], allreduce[0], allreduce[1], capacity,
                      min(max_seqs, capacity // seq_tokens), eta, gpu.pcie_bw * FABRIC_EFFICIENCY["pcie"])


@lru_cache(maxsize=64)
def allreduce_line(topo, group: tuple[int, ...]) -> tuple[float, float]:
    """(alpha s, beta s/byte) of one ring all-reduce on ``group`` by the network model
    alone on the fabric: exactly affine in bytes, so two sizes fix it."""
    if len(group) < 2:
        return 0.0, 0.0
    from ..studies.nccl_tests import time_collective

    small, large = 2**20, 2**21
    t1 = time_collective(topo, ALL_REDUCE, "ring", group, small)
    t2 = time_collective(topo, ALL_REDUCE, "ring", group, large)
    beta = (t2 - t1) / (large - small)
    return t1 - beta * small, beta
