"""Scenario files: model x training x cluster x parallel, validated at the edge.

``load_scenario(path, overrides)`` reads TOML (CONTRACT.md), applies ``--set key=value``
overrides, resolves presets, checks every cross-field rule with one clear message, and
returns a frozen :class:`Scenario`. Inside the simulator the data is trusted.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoE(_Section):
    """Mixture of experts in every MLP (except the first ``dense_layers``)."""

    experts: int = Field(8, ge=1)
    top_k: int = Field(2, ge=1)
    capacity_factor: float = Field(1.25, gt=0)
    routing: Literal["token_choice", "expert_choice", "token_drop", "uniform"] = "uniform"
    skew: float = Field(0.0, ge=0)  # Zipf-like exponent of router preference (0: balanced)
    expert_ffn_hidden: int | None = Field(None, ge=1)  # default: the model's ffn_hidden
    shared_experts: int = Field(0, ge=0)  # always-on experts (DeepSeek)
    dense_layers: int = Field(0, ge=0)  # leading layers with a dense MLP (DeepSeek-V3: 3)

    @model_validator(mode="after")
    def _k(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} exceeds experts = {self.experts}")
        return self


class Model(_Section):
    """A decoder-only transformer. Either ``preset``, ``hf_config`` or the fields."""

    preset: str | None = None
    hf_config: str | None = None
    name: str = "custom"
    layers: int = Field(None, ge=1)
    hidden: int = Field(None, ge=1)
    heads: int = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=1)  # default: heads (GQA when smaller)
    ffn_hidden: int | None = Field(None, ge=1)  # default: 4 * hidden
    vocab: int = Field(None, ge=1)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    tied_embeddings: bool = False
    moe: MoE | None = None


class Training(_Section):
    """What one optimizer step processes and how."""

    seq_len: int = Field(ge=1)
    global_batch: int = Field(ge=1)  # sequences per optimizer step
    micro_batch: int = Field(1, ge=1)  # sequences per micro-batch
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    flash_attention: bool = True  # False: attention scores are stored (Korthikanti's 5as/h term)
    grad_bucket_mb: float = Field(25.0, gt=0)  # DDP gradient bucket, MiB (PyTorch default 25)
    fsdp_prefetch: bool = True  # all-gather layer l+1 while layer l computes


class Straggler(_Section):
    """Ranks (or whole nodes) whose compute is slower, optionally from ``start_s`` on."""

    ranks: list[int] = []
    nodes: list[int] = []
    slowdown: float = Field(1.0, ge=1.0)
    start_s: float = Field(0.0, ge=0)  # thermal throttling: slow only after this time


class Jitter(_Section):
    """Seeded random slowdown of every compute op on every rank."""

    sigma: float = Field(0.0, ge=0)  # relative std dev per op
    distribution: Literal["lognormal", "normal"] = "lognormal"
    floor: float = Field(1.0, gt=0)  # normal: multiplier never below this
    mode: Literal["auto", "exact", "sampled"] = "auto"  # auto: exact up to 1,024 GPUs (sim/parallel/jitter.py)
    sample_ranks: int = Field(512, ge=1)  # sampled mode: ranks simulated (whole replicas, at least 4)

    @model_validator(mode="after")
    def _sampled_only(self):
        if self.mode == "exact" and "sample_ranks" in self.model_fields_set:
            raise ValueError("sample_ranks applies to sampled mode, but mode is 'exact'")
        return self


class LinkFault(_Section):
    """A degraded (factor < 1) or failed (factor = 0) link: a GPU's NIC, or a named edge."""

    gpu_nic: int | None = Field(None, ge=0)  # the NIC uplink of this GPU
    node_nics: int | None = Field(None, ge=0)  # every NIC of this server
    spine: int | None = Field(None, ge=0)  # every uplink into this spine
    factor: float = Field(0.5, ge=0, le=1)


class Cluster(_Section):
    """Hardware: a GPU preset on a topology."""

    gpu: str | None = None  # default: the topology's GPU
    topology: str = "dgx-h100"
    nodes: int | None = Field(None, ge=1)
    gpus: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)  # default from the topology
    topology_overrides: dict[str, float | int | str] = {}
    faults: list[LinkFault] = []


class Parallel(_Section):
    """How ranks split the work; tp * pp * dp * cp must equal the GPU count."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    virtual_stages: int = Field(1, ge=1)
    stage_layers: list[int] | None = None
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    zero: Literal[0, 1, 2, 3] = 0
    sequence_parallel: bool = False
    order: str = "tp-cp-dp-pp"  # rank placement, innermost first (Megatron order)
    dp_algo: Literal["auto", "ring", "tree", "hierarchical"] = "auto"
    fold: bool = True  # simulate one rank per class of identical ranks

    @field_validator("order")
    @classmethod
    def _order(cls, order: str) -> str:
        if sorted(order.split("-")) != sorted(("tp", "cp", "dp", "pp")):
            raise ValueError(f"must name each of tp, cp, dp, pp once (innermost first), got {order!r}")
        return order


class Scenario(_Section):
    """A whole scenario. ``model`` holds resolved fields after loading."""

    name: str = "scenario"
    seed: int = Field(0, ge=0)  # numpy seeds every random draw: a non-negative integer
    model: Model
    training: Training
    cluster: Cluster = Cluster()
    parallel: Parallel = Parallel()
    stragglers: list[Straggler] = []
    jitter: Jitter = Jitter()
