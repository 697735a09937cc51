"""Scenario files: model x training x cluster x parallel, validated at the edge.

``load_scenario(path, overrides)`` reads TOML (CONTRACT.md), applies ``--set key=value``
overrides, resolves presets, checks every cross-field rule with one clear message, and
returns a frozen :class:`Scenario`. Inside the simulator the data is trusted.

Convention for every field (new keys too): declare it with a strict, bounded type of
sim/input/fields.py -- ``count(B.X)`` for whole numbers, ``real(B.X)`` for finite
numbers, ``Flag`` for booleans, ``Text`` for free strings, a ``StrEnum`` of sim/input/choices.py for choices --
where ``B.X`` is a :class:`sim.bounds.Bound` with its one-line reason (add one there if
none fits; CONTRACT.md lists them). Then ``true`` is never a count, ``1.5`` never a
count, ``nan``/``inf`` never a number, and a value past physics or representability is
exit 2 naming the key. Cross-field rules live in sim/input/load.py.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import bounds as B
from ..hardware.calibration import Calibration, from_dump as calibration_from_dump
from .choices import (DP_ALGORITHMS, Algorithm, Attention, AttentionBackend, CpImpl, Dispatcher, Distribution,
                      ExpertRouting, JitterMode, Kernels, MicroBatches, MlaDownProj, Mlp, Precision, Recipe, Recompute,
                      RLMode, Schedule,
                      WeightRoute, WeightSync)
from .fields import Flag, PathText, Text, choice, count, real



class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoE(_Section):
    """Mixture of experts in every MLP (except the first ``dense_layers``)."""

    experts: count(B.EXPERTS) = 8
    top_k: count(B.EXPERTS) = 2
    capacity_factor: real(B.CAPACITY) = 1.25
    routing: ExpertRouting = ExpertRouting.UNIFORM
    skew: real(B.SKEW) = 0.0  # Zipf-like exponent of router preference (0: balanced)
    expert_ffn_hidden: count(B.FFN) | None = None  # default: the model's ffn_hidden
    shared_experts: count(B.EXPERTS._replace(lo=0)) = 0  # always-on experts (DeepSeek)
    dense_layers: count(B.LAYERS._replace(lo=0)) = 0  # leading layers with a dense MLP (DeepSeek-V3: 3)
    # token_drop: every expert's buffer holds exactly its capacity (GShard / Switch static
    # shapes; Megatron --moe-pad-expert-input-to-capacity): compute and all-to-all carry the
    # padding. Default: true for token_drop (the only routing with a capacity to pad to).
    pad_to_capacity: Flag | None = None
    # Kernel launches of the router's routing and aux-loss part in one forward (scores, top-k,
    # their normalization and scatter into probabilities and the routing map, the aux loss),
    # beside its gating GEMM: sim/model/layers.py ``router``. 1: one fused kernel (the default,
    # as before); Megatron-Core's unfused DeepSeek-V3 router: 71 (72 with the gating GEMM).
    router_kernels: count(B.ROUTER_KERNELS) = 1

    @model_validator(mode="after")
    def _k(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k = {self.top_k} exceeds experts = {self.experts}")
        if self.pad_to_capacity and self.routing is not ExpertRouting.TOKEN_DROP:
            raise ValueError(f"pad_to_capacity needs routing = 'token_drop' (a capacity to pad to), "
                             f"got routing = '{self.routing}'")
        return self

    @property
    def padded(self) -> bool:
        """Whether expert buffers are padded to capacity (see ``pad_to_capacity``)."""
        return self.routing is ExpertRouting.TOKEN_DROP and self.pad_to_capacity is not False


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
    # relu2: squared ReLU, two matrices (Nemotron-4); geglu: gated GELU, three (Grok-1, Gemma)
    mlp: Mlp = Mlp.GELU
    head_dim: count(B.HEAD_DIM) | None = None  # default: hidden / heads (Qwen3: 128)
    # Multi-head latent attention (DeepSeek-V2/V3), with the Hugging Face names of its ranks.
    attention: Attention = Attention.MHA  # mha: multi-head, GQA when kv_heads < heads
    q_lora_rank: count(B.LORA_RANK) | None = None  # None: queries projected from hidden
    kv_lora_rank: count(B.LORA_RANK) | None = None
    qk_nope_head_dim: count(B.HEAD_DIM) | None = None
    qk_rope_head_dim: count(B.HEAD_DIM) | None = None
    v_head_dim: count(B.HEAD_DIM) | None = None
    tied_embeddings: Flag = False
    # Multi-token prediction (DeepSeek-V3; Megatron-Core --mtp-num-layers): each depth is a
    # transformer layer, two norms, a 2h -> h projection and one more output layer and loss,
    # all on the last pipeline stage.
    mtp_layers: count(B.MTP_LAYERS) = 0
    moe: MoE | None = None


class Training(_Section):
    """What one optimizer step processes and how."""

    seq_len: count(B.SEQ_LEN)
    global_batch: count(B.BATCH)  # sequences per optimizer step
    micro_batch: count(B.BATCH) = 1  # sequences per micro-batch
    precision: Precision = Precision.BF16
    # "op": torchtitan's per-op selective checkpointing (sim/model/layers.py op_recompute)
    recompute: Recompute = Recompute.NONE
    flash_attention: Flag = True  # False: attention scores are stored (Korthikanti's 5as/h term)
    # The fused-attention kernels (sim/model/attention_rates.py ATTENTION_KERNEL): "cudnn", what
    # Transformer Engine runs on Hopper by default, or "flash2" (FlashAttention-2, TE with
    # NVTE_FUSED_ATTN=0). Needs flash_attention.
    attention_backend: AttentionBackend | None = None
    # Alias of parallel.ddp_bucket_mb (the one definition), kept for older scenario files: the
    # loader moves it there (sim/input/load.py) and refuses both at once; None after loading.
    grad_bucket_mb: real(B.BUCKET_MB) | None = None
    fsdp_prefetch: Flag = True  # all-gather layer l+1 while layer l computes
    # CUDA graphs (Transformer Engine make_graphed_callables; Megatron --cuda-graph-impl
    # transformer_engine): each transformer layer's static part replays as one graph launch
    # per micro-batch and direction (sim/model/host.py; sim/parallel/passes.py says which part)
    cuda_graphs: Flag = False
    compile: Flag = False  # torch.compile: elementwise chains fused into one kernel (sim/model/host.py)
    # Which stack quantizes the linears under fp8 / mxfp8 (sim/model/quant.py): "te",
    # Transformer Engine (Megatron-Core, NeMo: casts fused with transposes and norms, FP8 weights
    # cached per step) or "torchao" (torchtitan's Float8Linear / MXLinear under torch.compile:
    # dynamic scales, x, w and the output gradient quantized every micro-batch).
    fp8_recipe: Recipe = Recipe.TE
    # Megatron-Core's --tp-only-amax-red: Transformer Engine's delayed-scaling amax reduction
    # (per model chunk, micro-batch and direction) over the tp x cp group instead of every rank
    # of the pipeline stage, tp x cp x dp (sim/parallel/amax.py). Only with precision "fp8" and
    # fp8_recipe "te".
    tp_only_amax_red: Flag = False
    # Quantized parameters (Megatron-Core --fp8-param-gather; Megatron-Bridge's fp8_param_gather,
    # on in its FP8 and MXFP8 recipes; NeMo's fp8_params): Transformer Engine keeps each weight
    # in its quantized copies only, without the BF16 one beside them (sim/parallel/memory.py
    # weight_bytes). Memory only: the parameter all-gather is still BF16 (docs/precision.md).
    # Only with a quantized precision and fp8_recipe "te".
    fp8_params: Flag = False
    # The elementwise kernels the model code runs: "fused" (Transformer Engine / Megatron fused
    # norms, RoPE and bias-SwiGLU; what torch.compile makes of plain code too) or "pytorch"
    # (plain PyTorch operators one kernel each, as torchtitan's Llama runs eagerly:
    # sim/model/eager.py EAGER_*); "pytorch" with compile = true is fused.
    kernels: Kernels = Kernels.FUSED
    # RoPE as one fused kernel (true: Transformer Engine's / Apex's, not counted apart) or as
    # Megatron-Core's unfused PyTorch operators (false: TransformerConfig.apply_rope_fusion = False,
    # which NeMo's DeepSeek-V3 config sets; with MLA also its q / k / v assembly copies):
    # sim/model/rope.py. Not with kernels = "pytorch" (torchtitan's eager RoPE).
    rope_fusion: Flag = True


class Straggler(_Section):
    """Ranks (or whole nodes) whose compute is slower, optionally from ``start_s`` on."""

    ranks: list[count(B.RANK)] = Field([], max_length=B.GPUS.hi)
    nodes: list[count(B.RANK)] = Field([], max_length=B.GPUS.hi)
    slowdown: real(B.SLOWDOWN) = 1.0
    start_s: real(B.START_S) = 0.0  # thermal throttling: slow only after this time


class Jitter(_Section):
    """Seeded random slowdown of every compute op on every rank."""

    sigma: real(B.JITTER_SIGMA) = 0.0  # relative std dev per op
    distribution: Distribution = Distribution.LOGNORMAL
    floor: real(B.JITTER_FLOOR) = 1.0  # normal: multiplier never below this
    mode: JitterMode = JitterMode.AUTO  # auto: exact up to 1,024 GPUs (sim/parallel/jitter.py)
    sample_ranks: count(B.JITTER_SAMPLE) = 512  # sampled mode: ranks simulated (whole replicas, at least 4)

    @model_validator(mode="after")
    def _sampled_only(self):
        if self.mode is JitterMode.EXACT and "sample_ranks" in self.model_fields_set:
            raise ValueError("sample_ranks applies to sampled mode, but mode is 'exact'")
        return self


class Variability(_Section):
    """GPU-to-GPU speed spread within one SKU: the step runs at the slowest of its GPUs
    (sim/hardware/variability.py: one factor, 1 + sigma * E[max of N standard normals])."""

    sigma: real(B.VARIABILITY_SIGMA) = 0.0  # relative std dev of a GPU's static speed; 0: off


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
    # Slurm ``sbatch --segment``: nodes per segment, each segment in its own NVLink domain
    # (sim/hardware/specs.py segmented); None: the job packed into whole domains
    segment: count(B.SEGMENT) | None = None
    faults: list[LinkFault] = Field([], max_length=B.FAULTS.hi)
    # A calibration profile (`clustersim calibrate`): its path in a file; the loader replaces it
    # with the profile's overrides (sim/hardware/calibration.py), which the hardware and compute
    # models apply where they are built.
    calibration: PathText | Calibration | None = None

    @field_validator("calibration", mode="before")
    @classmethod
    def _calibration(cls, value):
        if isinstance(value, dict) and set(value) == set(Calibration.__dataclass_fields__):
            return calibration_from_dump(value)  # this model's own dump, read back (sim/rl/trainer.py)
        if value is not None and not isinstance(value, (str, Calibration)):
            raise ValueError(f"expected the path of a calibration profile (clustersim calibrate --out), got {value!r}")
        return value


class Parallel(_Section):
    """How ranks split the work; tp * pp * dp * cp must equal the GPU count."""

    tp: count(B.GPUS) = 1
    pp: count(B.GPUS) = 1
    dp: count(B.GPUS) = 1
    cp: count(B.GPUS) = 1
    ep: count(B.GPUS) = 1
    virtual_stages: count(B.LAYERS) = 1
    stage_layers: list[count(B.LAYERS._replace(lo=0))] | None = Field(None, max_length=B.LAYERS.hi)
    schedule: Schedule | None = None
    # default: interleaved when virtual_stages > 1, else 1f1b; zb-v and dualpipev run two chunks per rank
    # (virtual_stages 1 means 2 there, as the zero-bubble repo sets it: megatron/core/zbpp_utils.py)
    zero: count(B.ZERO) = 0
    sequence_parallel: Flag = False
    tp_comm_overlap: Flag = False  # Megatron --tp-comm-overlap: TP collectives pipelined with GEMM chunks
    # TE userbuffers' pipelined forward reduce-scatter (proj_fprop, fc2_fprop) on FP8 buffers: NeMo's
    # FP8 userbuffers configs set fp8_buf = True there; TE's default keeps them BF16; inert without
    # tp_comm_overlap (sim/parallel/tp.py fp8_reduce_scatter)
    tp_overlap_fp8_rs: Flag = False
    ep_comm_overlap: Flag = False  # MoE all-to-alls under another micro-batch's compute (combined 1F1B)
    # Megatron-Core's TransformerConfig.moe_permute_fusion (default False): Transformer Engine's fused
    # token permute/unpermute kernels; False runs moe_utils.py's PyTorch operators (sim/model/layers.py)
    moe_permute_fusion: Flag = False
    # Megatron-Core's TransformerConfig.moe_grouped_gemm (--moe-grouped-gemm, default False): the local
    # experts as Transformer Engine's grouped GEMMs (TEGroupedMLP); False runs them one after the other
    # (SequentialMLP), every expert's GEMMs and activation issued from Python (sim/model/layers.py)
    moe_grouped_gemm: Flag = False
    # Megatron-Core's MoE token dispatcher: "alltoall" (--moe-token-dispatcher-type alltoall: one
    # NCCL all-to-all carrying every token-expert copy) or "deepep" (--moe-token-dispatcher-type flex
    # --moe-flex-dispatcher-backend deepep: DeepEP's kernels, each token sent once per rank and once
    # per node; sim/collectives/direct.py Dedup)
    ep_dispatcher: Dispatcher = Dispatcher.ALLTOALL
    # MLA's down projections under TP (Megatron-Core's layer spec): "duplicated" (whole weights on the
    # sequence shard, the latents gathered; core 0.14 on) or "column" (TEColumnParallelLinear: each
    # gathers the hidden input, its output gathered along the last dim; core 0.12-0.13, NeMo 25.04)
    mla_down_proj: MlaDownProj = MlaDownProj.DUPLICATED
    expert_tp: count(B.GPUS) | None = None  # expert layers' tp (default: tp); MoE parallel folding
    # Context parallelism's implementation (sim/parallel/cp.py): "ring", Megatron / Transformer
    # Engine's ring of K/V shifts; "torch", PyTorch's experimental context parallelism as
    # torchtitan runs it (sim/parallel/cp_torch.py); "all_gather", K and V all-gathered, then each
    # rank's two chunks of queries attend locally (Llama 3, Sec. 3.3.2; Transformer Engine's
    # cp_comm_type "all_gather": sim/parallel/cp_all_gather.py).
    cp_impl: CpImpl = CpImpl.RING
    order: Text = "tp-cp-dp-pp"  # rank placement, innermost first (Megatron order)
    dp_algo: choice(Algorithm, DP_ALGORITHMS) = Algorithm.AUTO  # every Algorithm but direct
    fold: Flag = True  # simulate one rank per class of identical ranks
    # Data-parallel overlap knobs (Megatron-Core DistributedDataParallelConfig; PyTorch FSDP2;
    # torchtitan). None = the default the rules of sim/parallel/dp.py state (what NeMo's recipes run).
    overlap_grad_reduce: Flag | None = None  # bucketed reduction issued during the backward (default true)
    overlap_param_gather: Flag | None = None  # zero 1/2: updated-parameter all-gather under the next forward
    ddp_bucket_mb: real(B.BUCKET_MB) | None = None  # MiB of gradients per bucket (default Megatron's rule)
    reshard_after_forward: Flag | None = None  # zero 3: free gathered parameters after the forward (default true)
    dp_shard: count(B.GPUS) | None = None  # HSDP: ranks a ZeRO/FSDP shard spans (divides dp; default dp)
    grad_reduce_in_fp32: Flag = False  # gradients accumulated and reduced in fp32 (zero 0-2: sim/parallel/dp.py; 3: fsdp.py)
    # Megatron's gradient_accumulation_fusion (None: on, Megatron-LM's and NeMo's default;
    # --no-gradient-accumulation-fusion): zero 0-2's weight-gradient GEMMs accumulate into the main_grad
    # buffer inside the GEMM (sim/model/compute.py WGRAD_ACC_P). Zero 3 (PyTorch FSDP2) has no such GEMM.
    gradient_accumulation_fusion: Flag | None = None
    # Megatron-Core's ModelParallelConfig.defer_embedding_wgrad_compute / wgrad_deferral_limit: the
    # output layer's weight-gradient GEMMs of the first wgrad_deferral_limit micro-batches (0: all)
    # run after the last backward, in the pipeline flush (sim/parallel/wgrad_deferral.py)
    defer_embedding_wgrad_compute: Flag = False
    wgrad_deferral_limit: count(B.WGRAD_DEFERRAL) = 0

    @field_validator("order")
    @classmethod
    def _order(cls, order: str) -> str:
        if sorted(order.split("-")) != sorted(("tp", "cp", "dp", "pp")):
            raise ValueError(f"must name each of tp, cp, dp, pp once (innermost first), got {order!r}")
        return order


class RLLengths(_Section):
    """Response lengths of the RL loop: lognormal per prompt, capped (``clustersim rl``)."""

    mean: real(B.RL_LENGTH_MEAN)  # tokens, mean response length at step 0
    sigma: real(B.RL_LENGTH_SIGMA) = 0.0  # tokens, standard deviation at step 0 (0: every response = mean)
    growth: real(B.RL_GROWTH) = 0.0  # relative growth of mean and sigma per training step
    max: count(B.RL_TOKENS)  # tokens: responses stop here (the generation cap)


class RL(_Section):
    """An RL loop on one cluster: generator GPUs (inference engines) and trainer GPUs (the
    ``[parallel]`` layout). ``clustersim rl SCENARIO``; see docs/rl.md."""

    mode: RLMode = RLMode.SYNC
    generator_gpus: count(B.GPUS)
    trainer_gpus: count(B.GPUS)
    generator_tp: count(B.DOMAIN) = 1  # tensor parallel GPUs per inference engine
    max_staleness: count(B.RL_STALENESS) | None = None  # async / pipeline: steps of run-ahead (default 1)
    steps: count(B.RL_STEPS)  # training steps simulated
    prompt_tokens: count(B.RL_TOKENS) = 512  # tokens per prompt (prefill)
    max_seqs: count(B.RL_SEQS) = 256  # sequences an engine runs at once, at most (vLLM max_num_seqs)
    memory_fraction: real(B.RL_MEMORY_FRACTION) = 0.9  # HBM share for weights + KV cache (vLLM gpu_memory_utilization)
    weight_route: WeightRoute = WeightRoute.BROADCAST  # trainer -> generators (docs/rl.md)
    weight_sync: WeightSync = WeightSync.BLOCKING  # overlapped: the next step trains meanwhile
    lengths: RLLengths


class Simulation(_Section):
    """How the simulator runs a scenario, not what the scenario is. ``micro_batches =
    "steady"``: simulate the step at three small micro-batch counts, check that the step
    time and every additive summary quantity is linear in the count, and extrapolate to the
    scenario's own (sim/steady.py); a step that is not linear, or a scenario whose
    micro-batches differ (jitter, stragglers that start late), runs exactly instead."""

    micro_batches: MicroBatches = MicroBatches.ALL


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
    variability: Variability = Variability()  # opt-in (docs/strong_scaling.md, "GPU speed variability")
    rl: RL | None = None  # an RL loop (clustersim rl); [parallel] is then the trainer pool's layout
    simulation: Simulation = Simulation()
