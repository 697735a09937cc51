"""Checkpoints of a training campaign: their size from the layout, their cost over the
storage fabric (synchronous or asynchronous), and the Young/Daly optimal interval.

Run ``clustersim campaign SCENARIO --tokens 15e12 [--checkpoint-mode async]
[--storage-gbps 2000] [--checkpoint-every MIN]``.

Size. A checkpoint holds what training needs to resume: bf16 weights (2 bytes per
parameter) and the fp32 Adam state (master weights, momentum, variance: 12 bytes), i.e.
the 16 bytes per parameter of :mod:`sim.parallel.memory` less the gradients. A rank holds
its stage's parameters (:func:`sim.parallel.params.rank_params`); replicated copies are
written once, spread over the replicas (Megatron-LM's fully parallel save,
megatron/core/dist_checkpointing/strategies/fully_parallel.py,
``FullyParallelSaveStrategyWrapper``), so each rank writes its ``1/(dp x cp)`` share of
the dense parameters and ``1/expert_dp`` of its experts, the same sharding groups
ZeRO uses in the memory model. For Llama 3 405B that is 5.7 TB in all, ~350 MB per GPU
on 16,384 GPUs (the paper, section 3.3.1: "1 MB to 4 GB per GPU").

Cost. Every rank writes at once, so a checkpoint takes total bytes / storage bandwidth
(default 2 TB/s: the sustained throughput of Meta's Tectonic storage for Llama 3, section
3.3.1; per-server front-end links are not modelled: at 2.8 GB per 8-GPU server they would
bind only below ~1 GB/s per server). A restart reads it back at the same bandwidth.

- ``sync``: training stalls for the whole write.
- ``async``: training stalls only while each rank copies its share to host memory over
  PCIe (the GPU preset's ``pcie_bw``, 64 GB/s for H100), then the write to storage overlaps
  the following steps (PyTorch DCP ``torch.distributed.checkpoint.async_save`` in
  torch/distributed/checkpoint/state_dict_saver.py; Megatron-LM ``--async-save``,
  megatron/core/dist_checkpointing/strategies/async_utils.py). A checkpoint is durable only
  when its write ends; the next snapshot waits for the previous write.

Interval. With exponential failures of mean M and checkpoint cost C, Young (1974, "A first
order approximation to the optimum checkpoint interval") gives the compute time between
checkpoints ``sqrt(2 C M)``; Daly (2006, "A higher order estimate of the optimum checkpoint
interval for restart dumps", eq. 37) the higher-order ``sqrt(2 C M) (1 + sqrt(C/2M)/3 +
C/(18 M)) - C`` for C < 2M.
"""

from dataclasses import dataclass
import math

from ..engine.kinds import Category
from ..hardware import specs
from ..hardware.gpus import gpu_preset
from ..input.scenario import Scenario
from ..parallel.params import rank_params
from ..parallel.workload import make_context

CHECKPOINT_BYTES_PER_PARAM = 2 + 12  # bf16 weights + fp32 master, momentum, variance (ZeRO paper, section 3.1)
DEFAULT_STORAGE_BW = 2e12  # bytes/s: Tectonic, 2 TB/s sustained (Llama 3 paper, section 3.3.1)
MODES = ("sync", "async")


@dataclass(frozen=True)
class Checkpoint:
    """Bytes of one checkpoint: in all, and the largest share one GPU writes."""

    total_bytes: float
    per_gpu_bytes: float


@dataclass(frozen=True)
class CheckpointCost:
    """Seconds a checkpoint costs a campaign."""

    stall_s: float  # training paused per checkpoint
    write_s: float  # after the stall, until it is durable (0 when synchronous: the stall is the write)
    load_s: float  # reading it back when restarting
    save_s: float  # a blocking save before a planned stop


def checkpoint_size(s: Scenario) -> Checkpoint:
    """Bytes written per checkpoint under the scenario's layout (see the module docstring)."""
    ctx = make_context(s, [], _gpu_name(s))  # memory accounting only: no network, no domains needed
    layout, p = ctx.layout, s.parallel
    dense_group = p.dp * p.cp
    expert_group = max(1, dense_group // layout.ep)
    per_stage = []
    for stage in range(layout.sizes[Category.PP]):
        dense, expert = rank_params(ctx, stage)
        per_stage.append(CHECKPOINT_BYTES_PER_PARAM * (dense / dense_group + expert / expert_group))
    ranks_per_stage = layout.world // layout.sizes[Category.PP]
    return Checkpoint(sum(per_stage) * ranks_per_stage, max(per_stage))


def _gpu_name(s: Scenario) -> str:
    return s.cluster.gpu or specs.load_spec(s.cluster.topology).gpu


def checkpoint_cost(ckpt: Checkpoint, storage_bw: float, mode: str, host_bw: float) -> CheckpointCost:
    """Stall, write, load and blocking-save seconds of ``ckpt`` (bandwidths in bytes/s)."""
    write = ckpt.total_bytes / storage_bw
    if mode == "sync":
        return CheckpointCost(write, 0.0, write, write)
    snapshot = ckpt.per_gpu_bytes / host_bw
    return CheckpointCost(snapshot, write, write, snapshot + write)


def host_bandwidth(s: Scenario) -> float:
    """Device-to-host bytes/s of one GPU (its PCIe link), what an asynchronous snapshot uses."""
    return gpu_preset(_gpu_name(s)).pcie_bw


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): compute seconds between checkpoints, sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006) eq. 37: the higher-order optimum; M itself when C >= 2M."""
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    x = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s
