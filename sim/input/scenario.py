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
    # token_drop: every expert's buffer holds exactly its capacity (GShard / Switch static
    # shapes; Megatron --moe-pad-expert-input-to-capacity): compute and all-to-all carry the
    # padding. Default: true for token_drop (the only routing with a capacity to pad to).
    pad_to_capacity: bool | None = None

    @model_validator(mode="after")
    def _k(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} exceeds experts = {self.experts}")
        if self.pad_to_capacity and self.routing != "token_drop":
            raise ValueError(f"pad_to_capacity needs routing = 'token_drop' (a capacity to pad to), "
                             f"got routing = {self.routing!r}")
        return self

    @property
    def padded(self) -> bool:
        """Whether expert buffers are padded to capacity (see ``pad_to_capacity``)."""
        return self.routing == "token_drop" and self.pad_to_capacity is not False


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
    mlp: Literal["gelu", "swiglu", "relu2"] = "gelu"  # relu2: squared ReLU, two matrices (Nemotron-4)
    head_dim: int | None = Field(None, ge=1, le=4096)  # default: hidden / heads (Qwen3: 128)
    # Multi-head latent attention (DeepSeek-V2/V3), with the Hugging Face names of its ranks.
    attention: Literal["mha", "mla"] = "mha"  # mha: multi-head, GQA when kv_heads < heads
    q_lora_rank: int | None = Field(None, ge=1, le=65536)  # None: queries projected from hidden
    kv_lora_rank: int | None = Field(None, ge=1, le=65536)
    qk_nope_head_dim: int | None = Field(None, ge=1, le=4096)
    qk_rope_head_dim: int | None = Field(None, ge=1, le=4096)
    v_head_dim: int | None = Field(None, ge=1, le=4096)
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
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None  # default: interleaved when virtual_stages > 1, else 1f1b
    zero: Literal[0, 1, 2, 3] = 0
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False  # Megatron --tp-comm-overlap: TP collectives pipelined with GEMM chunks
    ep_comm_overlap: bool = False  # MoE all-to-alls under another micro-batch's compute (combined 1F1B)
    expert_tp: int | None = Field(None, ge=1)  # expert layers' tp (default: tp); MoE parallel folding
    order: str = "tp-cp-dp-pp"  # rank placement, innermost first (Megatron order)
    dp_algo: Literal["auto", "ring", "tree", "hierarchical", "nvls", "nvls_tree", "collnet", "pat"] = "auto"
    fold: bool = True  # simulate one rank per class of identical ranks

    @field_validator("order")
    @classmethod
    def _order(cls, order: str) -> str:
        if sorted(order.split("-")) != sorted(("tp", "cp", "dp", "pp")):
            raise ValueError(f"must name each of tp, cp, dp, pp once (innermost first), got {order!r}")
        return order


class RLLengths(_Section):
    """Response lengths of the RL loop: lognormal per prompt, capped (``clustersim rl``)."""

    mean: float = Field(ge=1, le=1e6)  # tokens, mean response length at step 0
    sigma: float = Field(0.0, ge=0, le=1e7)  # tokens, standard deviation at step 0 (0: every response = mean)
    growth: float = Field(0.0, ge=0, le=1)  # relative growth of mean and sigma per training step
    max: int = Field(ge=1, le=1_048_576)  # tokens: responses stop here (the generation cap)


class RL(_Section):
    """An RL loop on one cluster: generator GPUs (inference engines) and trainer GPUs (the
    ``[parallel]`` layout). ``clustersim rl SCENARIO``; see docs/rl.md."""

    mode: Literal["sync", "async", "pipeline"] = "sync"
    generator_gpus: int = Field(ge=1, le=1_000_000)
    trainer_gpus: int = Field(ge=1, le=1_000_000)
    generator_tp: int = Field(1, ge=1, le=64)  # tensor parallel GPUs per inference engine
    max_staleness: int | None = Field(None, ge=0, le=1000)  # async / pipeline: steps of run-ahead (default 1)
    steps: int = Field(ge=1, le=10_000)  # training steps simulated
    prompt_tokens: int = Field(512, ge=1, le=1_048_576)  # tokens per prompt (prefill)
    max_seqs: int = Field(256, ge=1, le=65_536)  # sequences an engine runs at once, at most (vLLM max_num_seqs)
    memory_fraction: float = Field(0.9, gt=0, le=1)  # HBM share for weights + KV cache (vLLM gpu_memory_utilization)
    weight_route: Literal["broadcast", "p2p"] = "broadcast"  # trainer -> generators (docs/rl.md)
    weight_sync: Literal["blocking", "overlapped"] = "blocking"  # overlapped: the next step trains meanwhile
    lengths: RLLengths


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
    rl: RL | None = None  # an RL loop (clustersim rl); [parallel] is then the trainer pool's layout
