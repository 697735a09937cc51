"""Scenario files: model x training x cluster x parallel, validated at the edge.

``load_scenario(path, overrides)`` reads TOML (CONTRACT.md), applies ``--set key=value``
overrides, resolves presets, checks every cross-field rule with one clear message, and
returns a frozen :class:`Scenario`. Inside the simulator the data is trusted.

Convention for every field (new keys too): declare it with a strict, bounded type of
sim/input/fields.py -- ``count(B.X)`` for whole numbers, ``real(B.X)`` for finite
numbers, ``Flag`` for booleans, ``Text`` for free strings, ``Literal[...]`` for choices --
where ``B.X`` is a :class:`sim.bounds.Bound` with its one-line reason (add one there if
none fits; CONTRACT.md lists them). Then ``true`` is never a count, ``1.5`` never a
count, ``nan``/``inf`` never a number, and a value past physics or representability is
exit 2 naming the key. Cross-field rules live in sim/input/load.py.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import bounds as B
from .fields import Flag, PathText, Text, count, real


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoE(_Section):
    """Mixture of experts in every MLP (except the first ``dense_layers``)."""

    experts: count(B.EXPERTS) = 8
    top_k: count(B.EXPERTS) = 2
    capacity_factor: real(B.CAPACITY) = 1.25
    routing: Literal["token_choice", "expert_choice", "token_drop", "uniform"] = "uniform"
    skew: real(B.SKEW) = 0.0  # Zipf-like exponent of router preference (0: balanced)
    expert_ffn_hidden: count(B.FFN) | None = None  # default: the model's ffn_hidden
    shared_experts: count(B.EXPERTS._replace(lo=0)) = 0  # always-on experts (DeepSeek)
    dense_layers: count(B.LAYERS._replace(lo=0)) = 0  # leading layers with a dense MLP (DeepSeek-V3: 3)

    @model_validator(mode="after")
    def _k(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} exceeds experts = {self.experts}")
        return self


class Model(_Section):
    """A decoder-only transformer. Either ``preset``, ``hf_config`` or the fields."""

    preset: Text | None = None
    hf_config: PathText | None = None
    name: Text = "custom"
    layers: count(B.LAYERS) = None
    hidden: count(B.HIDDEN) = None
    heads: count(B.HEADS) = None
    kv_heads: count(B.HEADS) | None = None  # default: heads (GQA when smaller)
    ffn_hidden: count(B.FFN) | None = None  # default: 4 * hidden
    vocab: count(B.VOCAB) = None
    mlp: Literal["gelu", "swiglu"] = "gelu"
    tied_embeddings: Flag = False
    moe: MoE | None = None


class Training(_Section):
    """What one optimizer step processes and how."""

    seq_len: count(B.SEQ_LEN)
    global_batch: count(B.BATCH)  # sequences per optimizer step
    micro_batch: count(B.BATCH) = 1  # sequences per micro-batch
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    flash_attention: Flag = True  # False: attention scores are stored (Korthikanti's 5as/h term)
    grad_bucket_mb: real(B.BUCKET_MB) = 25.0  # DDP gradient bucket, MiB (PyTorch default 25)
    fsdp_prefetch: Flag = True  # all-gather layer l+1 while layer l computes


class Straggler(_Section):
    """Ranks (or whole nodes) whose compute is slower, optionally from ``start_s`` on."""

    ranks: list[count(B.RANK)] = Field([], max_length=B.GPUS.hi)
    nodes: list[count(B.RANK)] = Field([], max_length=B.GPUS.hi)
    slowdown: real(B.SLOWDOWN) = 1.0
    start_s: real(B.START_S) = 0.0  # thermal throttling: slow only after this time


class Jitter(_Section):
    """Seeded random slowdown of every compute op on every rank."""

    sigma: real(B.JITTER_SIGMA) = 0.0  # relative std dev per op
    distribution: Literal["lognormal", "normal"] = "lognormal"
    floor: real(B.JITTER_FLOOR) = 1.0  # normal: multiplier never below this


class LinkFault(_Section):
    """A degraded (factor < 1) or failed (factor = 0) link: a GPU's NIC, or a named edge."""

    gpu_nic: count(B.RANK) | None = None  # the NIC uplink of this GPU
    node_nics: count(B.RANK) | None = None  # every NIC of this server
    spine: count(B.SPINES._replace(lo=0)) | None = None  # every uplink into this spine
    factor: real(B.FAULT_FACTOR._replace(lo=0.0)) = 0.5  # 0: failed; else at least FAULT_FACTOR.lo (load.py)


class Cluster(_Section):
    """Hardware: a GPU preset on a topology."""

    gpu: Text | None = None  # default: the topology's GPU
    topology: PathText = "dgx-h100"
    nodes: count(B.GPUS) | None = None
    gpus: count(B.GPUS) | None = None
    gpus_per_node: count(B.DOMAIN) | None = None  # default from the topology
    topology_overrides: dict[Text, Any] = {}  # values checked as a topology file's (load.py)
    faults: list[LinkFault] = Field([], max_length=B.FAULTS.hi)


class Parallel(_Section):
    """How ranks split the work; tp * pp * dp * cp must equal the GPU count."""

    tp: count(B.GPUS) = 1
    pp: count(B.GPUS) = 1
    dp: count(B.GPUS) = 1
    cp: count(B.GPUS) = 1
    ep: count(B.GPUS) = 1
    virtual_stages: count(B.LAYERS) = 1
    stage_layers: list[count(B.LAYERS._replace(lo=0))] | None = Field(None, max_length=B.LAYERS.hi)
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    zero: count(B.ZERO) = 0
    sequence_parallel: Flag = False
    order: Text = "tp-cp-dp-pp"  # rank placement, innermost first (Megatron order)
    dp_algo: Literal["auto", "ring", "tree", "hierarchical"] = "auto"
    fold: Flag = True  # simulate one rank per class of identical ranks

    @field_validator("order")
    @classmethod
    def _order(cls, order: str) -> str:
        if sorted(order.split("-")) != sorted(("tp", "cp", "dp", "pp")):
            raise ValueError(f"must name each of tp, cp, dp, pp once (innermost first), got {order!r}")
        return order


class Scenario(_Section):
    """A whole scenario. ``model`` holds resolved fields after loading."""

    name: Text = "scenario"
    seed: count(B.SEED) = 0  # numpy seeds every random draw: a non-negative integer
    model: Model
    training: Training
    cluster: Cluster = Cluster()
    parallel: Parallel = Parallel()
    stragglers: list[Straggler] = Field([], max_length=B.FAULTS.hi)
    jitter: Jitter = Jitter()
