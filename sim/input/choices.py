"""Every choice a scenario makes, as a type: one ``StrEnum`` per choice key.

The scenario schema (:mod:`.scenario`) declares each choice field with its enum, so a loaded
:class:`~sim.input.scenario.Scenario` holds members, and the rules, builders, model, planner
and outputs compare members (``t.precision is Precision.FP8``), never strings. The members
are ``StrEnum``: TOML values, ``--set`` values, JSON summaries, CSV columns, f-strings and
the bad-input message (``Input should be 'bf16', 'fp16', ...``) read and write their plain
value, unchanged from the ``Literal`` strings they replace; a str-keyed table answers a
member too (equal hashes). An enum lives in the lowest layer that reads it: the jitter's
:class:`~sim.hardware.faults.Distribution` and :class:`~sim.hardware.gpus.Precision` (a GPU's
peak per precision) in the hardware layer, re-exported here, the rest here; the
model, collectives and parallel layers import them from this module.

Run: ``python -m pytest -q tests/test_choices.py``
"""

from enum import StrEnum

from ..hardware.faults import Distribution
from ..hardware.gpus import Precision


class ExpertRouting(StrEnum):
    """``model.moe.routing``: how tokens pick experts (sim/model/routing.py)."""

    TOKEN_CHOICE = "token_choice"
    EXPERT_CHOICE = "expert_choice"
    TOKEN_DROP = "token_drop"
    UNIFORM = "uniform"


class Mlp(StrEnum):
    """``model.mlp``: the MLP's activation (gated ones have three matrices)."""

    GELU = "gelu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"  # gated GELU, three matrices (Grok-1, Gemma)
    RELU2 = "relu2"  # squared ReLU, two matrices (Nemotron-4)


class Attention(StrEnum):
    """``model.attention``: multi-head (GQA when kv_heads < heads) or latent (DeepSeek MLA)."""

    MHA = "mha"
    MLA = "mla"


class Recompute(StrEnum):
    """``training.recompute``: activation checkpointing (sim/model/transformer.py)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP = "op"  # torchtitan's per-op selective checkpointing (sim/model/layers.py op_recompute)
    # Megatron-Core's --recompute-granularity selective --recompute-modules mla_up_proj: MLA's up
    # projections, RoPE and q/k/v assembly rerun before the attention core's backward, the core not
    # (sim/model/layers.py mla_up_recompute)
    MLA_UP_PROJ = "mla_up_proj"


class AttentionBackend(StrEnum):
    """``training.attention_backend``: the fused-attention kernels (sim/model/attention_rates.py)."""

    CUDNN = "cudnn"
    FLASH2 = "flash2"


class Recipe(StrEnum):
    """``training.fp8_recipe``: who quantizes the linears (sim/model/quant.py)."""

    TE = "te"  # Transformer Engine (Megatron-Core, NeMo): casts fused with norms, weights once per step
    TORCHAO = "torchao"  # torchao under torch.compile (torchtitan): sim.model.quant.TORCHAO_CAST_BYTES


class Kernels(StrEnum):
    """``training.kernels``: the elementwise kernels the model code runs (sim/model/eager.py)."""

    FUSED = "fused"
    PYTORCH = "pytorch"


class JitterMode(StrEnum):
    """``jitter.mode``: every rank simulated, or whole replicas sampled (sim/parallel/jitter.py)."""

    AUTO = "auto"
    EXACT = "exact"
    SAMPLED = "sampled"


class Schedule(StrEnum):
    """``parallel.schedule``: the pipeline schedule (sim/parallel/pp.py, pp_zero_bubble.py)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"
    ZB_H2 = "zb-h2"
    ZB_V = "zb-v"
    DUALPIPE = "dualpipe"
    DUALPIPEV = "dualpipev"


# schedules that split the backward into input- and weight-gradient passes
# (sim/parallel/pp_zero_bubble.py), and those of them that run two chunks per rank in a V
ZERO_BUBBLE_SCHEDULES = (Schedule.ZB_H1, Schedule.ZB_H2, Schedule.ZB_V, Schedule.DUALPIPE, Schedule.DUALPIPEV)
V_SCHEDULES = (Schedule.ZB_V, Schedule.DUALPIPEV)
DUALPIPE_SCHEDULES = (Schedule.DUALPIPE, Schedule.DUALPIPEV)  # DeepSeek's, with paired F-B steps
ONE_F_ONE_B_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)  # Megatron's two 1F1B (wgrad deferral drains in them)


class Dispatcher(StrEnum):
    """``parallel.ep_dispatcher``: Megatron-Core's token dispatcher (its ``moe_token_dispatcher_type``)."""

    ALLTOALL = "alltoall"  # NCCL all-to-all of every token-expert copy
    DEEPEP = "deepep"  # flex dispatcher on DeepEP's kernels: each token once per rank and node


class MlaDownProj(StrEnum):
    """``parallel.mla_down_proj``: how Megatron-Core's layer spec splits MLA's down projections
    under tensor parallelism (megatron/core/models/gpt/gpt_layer_specs.py, MLASelfAttentionSubmodules)."""

    DUPLICATED = "duplicated"  # TELinear parallel_mode "duplicated": whole weights on the sequence shard
    COLUMN = "column"  # TEColumnParallelLinear: each gathers the hidden input (Megatron-Core 1c425a83..e63aee46)


class CpImpl(StrEnum):
    """``parallel.cp_impl``: context parallelism's implementation (sim/parallel/cp.py)."""

    RING = "ring"  # Megatron / Transformer Engine's ring of K/V shifts
    TORCH = "torch"  # PyTorch's experimental context parallelism (sim/parallel/cp_torch.py)
    ALL_GATHER = "all_gather"  # K/V all-gathered, then local attention (Llama 3; sim/parallel/cp_all_gather.py)


class Algorithm(StrEnum):
    """A collective algorithm, as NCCL names them (``NCCL_ALGO``: Ring, Tree, NVLS, NVLSTree,
    CollNet, PAT), plus the hierarchical and direct ones of :mod:`sim.collectives` and
    ``auto`` (NCCL's tuner picks). A protocol, where one is named, is written after it
    (``ring:ll``: :data:`sim.collectives.protocols.PROTOCOLS`); a call's ``algo`` then stays
    that text. The scenario's ``parallel.dp_algo`` is one of them but ``direct``
    (:data:`DP_ALGORITHMS`); the command line's ``--algo`` becomes a member where it is
    checked. Re-exported by :mod:`sim.collectives.kinds`."""

    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    NVLS_TREE = "nvls_tree"
    COLLNET = "collnet"
    PAT = "pat"
    HIERARCHICAL = "hierarchical"
    DIRECT = "direct"
    AUTO = "auto"


# ``parallel.dp_algo``: the data-parallel reductions' algorithm (direct is all-to-all only)
DP_ALGORITHMS = (Algorithm.AUTO, Algorithm.RING, Algorithm.TREE, Algorithm.HIERARCHICAL, Algorithm.NVLS,
                 Algorithm.NVLS_TREE, Algorithm.COLLNET, Algorithm.PAT)


class MicroBatches(StrEnum):
    """``simulation.micro_batches``: how many of a step's micro-batches the engine simulates."""

    ALL = "all"  # every one: the exact step (the default)
    STEADY = "steady"  # a few, the step extrapolated from them, checked linear (sim/steady.py)


class RLMode(StrEnum):
    """``rl.mode``: how generation and training overlap (docs/rl.md)."""

    SYNC = "sync"
    ASYNC = "async"
    PIPELINE = "pipeline"


class WeightRoute(StrEnum):
    """``rl.weight_route``: how the trainer's weights reach the generators (sim/rl/transfer.py)."""

    BROADCAST = "broadcast"
    P2P = "p2p"


class WeightSync(StrEnum):
    """``rl.weight_sync``: whether the next step trains while weights travel."""

    BLOCKING = "blocking"
    OVERLAPPED = "overlapped"


__all__ = ["Algorithm", "Attention", "AttentionBackend", "CpImpl", "DP_ALGORITHMS", "Dispatcher", "Distribution",
           "DUALPIPE_SCHEDULES", "ExpertRouting", "JitterMode", "Kernels", "MicroBatches", "MlaDownProj", "Mlp",
           "ONE_F_ONE_B_SCHEDULES", "Precision", "Recipe", "Recompute", "RLMode", "Schedule", "V_SCHEDULES",
           "WeightRoute", "WeightSync", "ZERO_BUBBLE_SCHEDULES"]
