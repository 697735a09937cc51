"""The cross-field rules of a scenario whose fields each passed their own bounds: the
layout multiplies to the cluster, heads and layers split, MoE, overlap, precision and RL
settings fit together. Each failed rule raises :class:`~sim.errors.InputError` naming the
key and the reason (:func:`sim.input.load.check` runs :func:`check_all`).
"""

from .. import bounds
from ..errors import InputError
from .choices import (DUALPIPE_SCHEDULES as DUALPIPE, V_SCHEDULES as V_SHAPED, ZERO_BUBBLE_SCHEDULES as ZERO_BUBBLE,
                      Algorithm, Attention, CpImpl, Kernels, MicroBatches, Precision, Recipe,
                      Recompute, RLMode, Schedule, WeightRoute, WeightSync)
from .scenario import Scenario
from . import parallel_rules
from ..hardware.gpus import low_peak


def check_all(s: Scenario, gpu, gpus: int, per_node: int) -> None:
    """Every rule, in the order a user fixes them (layout first)."""
    m, p, t = s.model, s.parallel, s.training
    _check_product(p, gpus if s.rl is None else s.rl.trainer_gpus, s.rl is not None)
    _check_dp_algo(p)
    _check_attention(m)
    _check_heads(m, p)
    _check_precision(t, gpu)
    _check_batch(t, p, whole=s.rl is None)
    _check_stages(m, p, t, whole=s.rl is None)
    _check_moe(m, p)
    parallel_rules.check_overlap(m, p, t)
    _check_op_recompute(m, p, t)
    _check_megatron_attention(m, t)
    parallel_rules.check_data_parallel(p)
    parallel_rules.check_wgrad_deferral(p)
    _check_ranks(s, gpus, per_node)
    if s.rl is not None:
        _check_rl(s, m, gpus)


def _check_product(p, gpus: int, trainer_pool: bool = False) -> None:
    product = p.tp * p.pp * p.dp * p.cp
    if product != gpus:
        where = f"rl.trainer_gpus = {gpus}" if trainer_pool else f"the cluster has {gpus} GPUs"
        raise InputError("parallel", f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {product}, but {where}")


def _check_dp_algo(p) -> None:
    """Trees (tree, nvls_tree) implement only all-reduce (DDP); ZeRO reduce-scatters
    and all-gathers. PAT implements only those two (NCCL has no PAT all-reduce). What the
    cluster can run (NVLS, SHARP, one GPU per node) is checked once the groups are known."""
    if p.dp_algo in (Algorithm.TREE, Algorithm.NVLS_TREE) and p.zero > 0:
        raise InputError("parallel.dp_algo", f"'{p.dp_algo}' implements only all-reduce, but zero = {p.zero} "
                                             "reduce-scatters and all-gathers; use ring, hierarchical, nvls, collnet, pat or auto")
    if p.dp_algo is Algorithm.PAT and p.zero == 0:
        raise InputError("parallel.dp_algo", "'pat' implements only all-gather and reduce-scatter (NCCL 2.23+), but "
                                             "zero = 0 all-reduces gradients; use zero >= 1 or another algorithm")


MLA_RANKS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # required with mla


def _check_attention(m) -> None:
    """MLA ranks come together and only with attention = "mla"; MLA has no GQA and no head_dim."""
    given = [k for k in ("q_lora_rank",) + MLA_RANKS if getattr(m, k) is not None]
    if m.attention is not Attention.MLA:
        if given:
            raise InputError(f"model.{given[0]}", 'is a multi-head latent attention rank: set model.attention = "mla" '
                                                  "or remove it")
        return
    missing = [k for k in MLA_RANKS if getattr(m, k) is None]
    if missing:
        raise InputError(f"model.{missing[0]}", 'required with model.attention = "mla" (DeepSeek-V3: kv_lora_rank 512, '
                                                "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)")
    if m.head_dim is not None:
        raise InputError("model.head_dim", "not with MLA, whose head widths are qk_nope_head_dim + qk_rope_head_dim "
                                           "(queries, keys) and v_head_dim (values)")
    if m.kv_heads != m.heads:
        raise InputError("model.kv_heads", f"MLA gives every query head its own key and value: kv_heads = "
                                           f"{m.kv_heads} must equal heads = {m.heads}")
    if m.qk_rope_head_dim % 2:
        raise InputError("model.qk_rope_head_dim", f"rotary embedding turns pairs of channels: {m.qk_rope_head_dim} "
                                                   "must be even")


# Which GPUs run each quantized precision (sim/hardware/gpus.py cites every rate).
_NEEDS = {Precision.FP8: ("FP8 tensor cores", "Hopper, Blackwell and AMD Instinct MI300 or newer have them", Precision.BF16),
          Precision.MXFP8: ("MX (block-scaled FP8) tensor cores", "Blackwell (b200, gb200, b300, gb300) and the MI355X have "
                    "them", Precision.FP8),
          Precision.NVFP4: ("NVFP4 tensor cores", "only Blackwell (b200, gb200, b300, gb300) has them", Precision.FP8)}


def _check_precision(t, gpu) -> None:
    if t.precision in _NEEDS and not low_peak(gpu, t.precision):
        what, who, instead = _NEEDS[t.precision]
        instead = instead if low_peak(gpu, instead) else Precision.BF16
        raise InputError("training.precision", f"'{t.precision}' needs {what}, which {gpu.name} lacks ({who}); "
                                               f"use '{instead}'")
    _check_recipe(t)
    if t.attention_backend is not None and not t.flash_attention:
        raise InputError("training.attention_backend", "chooses the fused-attention kernels, but flash_attention "
                                                       "is false (scores stored, no fused kernel): drop one of them")


def _check_recipe(t) -> None:
    """``training.fp8_recipe`` names who quantizes the linears: only with a quantized precision,
    torchao only for the formats it trains in and as torchtitan runs it, compiled."""
    if t.tp_only_amax_red and (t.precision is not Precision.FP8 or t.fp8_recipe is not Recipe.TE):
        raise InputError("training.tp_only_amax_red", f"chooses the group of Transformer Engine's delayed-scaling "
                                                      f"amax reduction, but precision is '{t.precision}' with "
                                                      f"fp8_recipe '{t.fp8_recipe}' (no amax history is reduced): "
                                                      f"drop it, or use precision 'fp8' with fp8_recipe 'te'")
    if t.fp8_params and (t.precision not in _NEEDS or t.fp8_recipe is not Recipe.TE):
        raise InputError("training.fp8_params", f"keeps Transformer Engine's quantized weights without their BF16 "
                                                f"copy, but precision is '{t.precision}' with fp8_recipe "
                                                f"'{t.fp8_recipe}': drop it, or quantize with fp8_recipe 'te'")
    if "fp8_recipe" not in t.model_fields_set:
        return
    if t.precision not in _NEEDS:  # (the quantized formats)
        raise InputError("training.fp8_recipe", f"chooses how fp8/mxfp8 linears are quantized, but "
                                                f"training.precision is '{t.precision}': drop it or quantize")
    if t.fp8_recipe is Recipe.TORCHAO and t.precision is Precision.NVFP4:
        raise InputError("training.fp8_recipe", "'torchao' trains in fp8 (Float8Linear) and mxfp8 (MXLinear); "
                                                "nvfp4 is modelled as Transformer Engine's recipe: use 'te'")
    if t.fp8_recipe is Recipe.TORCHAO and not t.compile:
        raise InputError("training.fp8_recipe", "'torchao' is modelled as torchtitan runs it, under torch.compile "
                                                "(its eager casts take several more passes): set training.compile "
                                                "= true")


def _check_heads(m, p) -> None:
    if m.head_dim is None and m.attention is Attention.MHA and m.hidden % m.heads:
        raise InputError("model.heads", f"hidden = {m.hidden} is not divisible by heads = {m.heads} "
                                       "(give model.head_dim when heads are not hidden / heads wide)")
    head_dim = m.head_dim or m.hidden // m.heads
    if head_dim > bounds.HEAD_DIM.hi:
        key = "model.head_dim" if m.head_dim else "model.heads"
        raise InputError(key, f"head dim {head_dim} exceeds {bounds.HEAD_DIM.hi} ({bounds.HEAD_DIM.why})")
    if m.heads % m.kv_heads:
        raise InputError("model.kv_heads", f"heads = {m.heads} is not divisible by kv_heads = {m.kv_heads}")
    for key, n in (("heads", m.heads), ("kv_heads", m.kv_heads)):
        if n % p.tp:
            raise InputError("parallel.tp", f"tp = {p.tp} does not divide model.{key} = {n}")


def _check_batch(t, p, whole: bool = True) -> None:
    """``whole``: global_batch is split into micro-batches as given (an RL step's rows come
    from its responses' tokens instead, sim/rl/trainer.py)."""
    per_step = p.dp * t.micro_batch
    if whole and t.global_batch < per_step:
        raise InputError("training.global_batch",
                         f"batch-size floor: every data-parallel rank needs at least one micro-batch of "
                         f"{t.micro_batch} sequence(s), so global_batch >= dp * micro_batch = {p.dp} * "
                         f"{t.micro_batch} = {per_step}, got {t.global_batch}")
    if whole and t.global_batch % per_step:
        raise InputError("training.global_batch", f"{t.global_batch} is not divisible by dp * micro_batch = {per_step}")
    if t.seq_len % p.cp:
        raise InputError("training.seq_len", f"seq_len = {t.seq_len} is not divisible by cp = {p.cp}")
    if p.cp_impl is not CpImpl.RING and p.cp == 1:
        raise InputError("parallel.cp_impl", f"'{p.cp_impl}' is how context parallelism runs, but cp = 1: set cp > 1 or drop it")
    if p.cp_impl is CpImpl.ALL_GATHER and not t.flash_attention:
        raise InputError("parallel.cp_impl", "'all_gather' runs flash attention per query chunk: flash_attention is false")


def _check_stages(m, p, t, whole: bool = True) -> None:
    chunks = p.pp * p.virtual_stages
    if p.schedule in ZERO_BUBBLE:
        _check_zero_bubble(p, t.global_batch // (p.dp * t.micro_batch), whole)
    elif (p.schedule is Schedule.INTERLEAVED) != (p.virtual_stages > 1):
        raise InputError("parallel.schedule", f"schedule = '{p.schedule}' with virtual_stages = {p.virtual_stages}: "
                                              "interleaved needs virtual_stages > 1 and vice versa")
    micro = t.global_batch // (p.dp * t.micro_batch)
    if p.schedule is Schedule.INTERLEAVED and micro % p.pp and whole:
        raise InputError("parallel.virtual_stages", f"interleaved 1F1B needs micro-batches per step ({micro}) "
                                                    f"divisible by pp = {p.pp} (Megatron-LM's rule)")
    if p.stage_layers is None:
        if m.layers < chunks:
            raise InputError("parallel.pp", f"{m.layers} layers cannot fill pp * virtual_stages = {chunks} stages")
        return
    if len(p.stage_layers) != chunks:
        raise InputError("parallel.stage_layers", f"has {len(p.stage_layers)} entries, needs pp * virtual_stages = {chunks}")
    _check_empty_chunks(p.stage_layers)
    if sum(p.stage_layers) != m.layers:
        raise InputError("parallel.stage_layers", f"sums to {sum(p.stage_layers)}, the model has {m.layers} layers")


def _check_zero_bubble(p, micro: int, whole: bool) -> None:
    """What the zero-bubble and DualPipe schedules can run: the zero-bubble repo asserts
    pp > 1 and sets two chunks per rank for its V (megatron/core/zbpp_utils.py
    ``validate_arguments``); DualPipe asserts an even number of ranks and an even number
    of micro-batches of at least twice the ranks, DualPipeV at least twice the ranks
    (deepseek-ai/DualPipe dualpipe.py, dualpipev.py ``step``)."""
    name = p.schedule
    if p.pp == 1:
        raise InputError("parallel.pp", f"schedule = '{name}' is a pipeline schedule: it needs pp > 1")
    chunks = 2 if name in V_SHAPED else 1
    if p.virtual_stages != chunks:
        raise InputError("parallel.virtual_stages", f"schedule = '{name}' runs {chunks} chunk(s) per rank"
                                                    f"{' (a V)' if chunks == 2 else ''}; got virtual_stages = "
                                                    f"{p.virtual_stages}")
    if name is Schedule.DUALPIPE and p.pp % 2:
        raise InputError("parallel.pp", f"dualpipe feeds micro-batches from both ends: it needs an even pp, got {p.pp}")
    if p.zero >= 3:
        raise InputError("parallel.zero", f"schedule = '{name}' defers weight gradients past the layer's backward; "
                                          "FSDP (zero = 3) releasing the layer's gathered weights meanwhile is not "
                                          "modelled")
    if p.ep_comm_overlap and name not in DUALPIPE:
        raise InputError("parallel.ep_comm_overlap", f"schedule = '{name}' has no paired forward-backward steps to "
                                                     "overlap (dualpipe and dualpipev do)")
    if not whole or name not in DUALPIPE:
        return
    if micro < 2 * p.pp or (name is Schedule.DUALPIPE and micro % 2):
        raise InputError("training.global_batch", f"{name} needs {'an even number of ' if name is Schedule.DUALPIPE else ''}"
                                                  f"micro-batches per step of at least 2 * pp = {2 * p.pp} "
                                                  f"(DualPipe's assertion); global_batch / (dp * micro_batch) = {micro}")


def _check_empty_chunks(counts: list[int]) -> None:
    """A chunk may hold no transformer layer only if it holds the embedding (the first) or
    the loss (the last): Megatron's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split (megatron/training/arguments.py) count those as
    a layer each, so with one layer per chunk they fill chunks of their own."""
    last = len(counts) - 1
    for i, n in enumerate(counts):
        if n < 0:
            raise InputError("parallel.stage_layers", f"entry {i} is {n}; layers per stage cannot be negative")
        if n == 0 and i not in (0, last):
            raise InputError("parallel.stage_layers",
                             f"entry {i} is 0: only the first chunk (which holds the embedding) and the last "
                             f"(entry {last}, the loss) may hold no transformer layer; every pipeline stage needs "
                             "at least one layer")


def _check_moe(m, p) -> None:
    if m.moe is None:
        if p.ep > 1:
            raise InputError("parallel.ep", f"ep = {p.ep} needs an MoE model ([model.moe])")
        if p.expert_tp is not None:
            raise InputError("parallel.expert_tp", f"expert_tp = {p.expert_tp} needs an MoE model ([model.moe])")
        return
    if m.moe.dense_layers >= m.layers:
        raise InputError("model.moe.dense_layers", f"{m.moe.dense_layers} dense layers leave no MoE layer of "
                                                   f"the model's {m.layers} (drop [model.moe] for a dense model)")
    if m.moe.experts % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} does not divide model.moe.experts = {m.moe.experts}")
    if p.expert_tp is None or p.expert_tp == p.tp:
        if (p.dp * p.cp) % p.ep:
            raise InputError("parallel.ep", f"ep = {p.ep} must divide dp * cp = {p.dp * p.cp} (experts shard inside "
                                            "dp*cp; set parallel.expert_tp to fold ep over tp ranks)")
        return
    _check_folding(p)


def _check_folding(p) -> None:
    """MoE parallel folding (Megatron-Core parallel_state.initialize_model_parallel):
    expert_tp * ep * expert_dp = tp * cp * dp, i.e. ep * expert_tp divides tp * cp * dp."""
    ranks = p.tp * p.cp * p.dp
    if ranks % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} must divide tp * cp * dp = {p.tp}*{p.cp}*{p.dp} = {ranks}")
    if ranks % (p.ep * p.expert_tp):
        raise InputError("parallel.expert_tp",
                         f"ep * expert_tp = {p.ep}*{p.expert_tp} = {p.ep * p.expert_tp} must divide tp * cp * dp = "
                         f"{ranks} (expert_tp x ep x expert_dp = tp x cp x dp)")
    if p.tp > 1 and not p.sequence_parallel:
        raise InputError("parallel.expert_tp", f"expert_tp = {p.expert_tp} != tp = {p.tp} needs sequence_parallel = "
                                               "true (Megatron's MoE layer requires it with tp > 1)")




def _check_op_recompute(m, p, t) -> None:
    """torchtitan's per-op checkpointing (sim/model/layers.py op_recompute) is modelled for its
    dense blocks without tensor parallelism: MoE blocks recompute grouped GEMMs and TP blocks
    re-run the all-gathers they recompute through, neither of which is counted."""
    if t.recompute is not Recompute.OP:
        return
    if m.moe is not None or m.attention is Attention.MLA:
        raise InputError("training.recompute", "'op' (torchtitan's per-op checkpointing) is modelled for dense "
                                               "blocks with standard attention, not MoE or MLA")
    if p.tp > 1:
        raise InputError("training.recompute", f"'op' (torchtitan's per-op checkpointing) is modelled for tp = 1, "
                                               f"got tp = {p.tp}")


def _check_megatron_attention(m, t) -> None:
    """Megatron-Core's MLA up-projection recompute needs MLA; its unfused RoPE is Megatron's
    operators, not torchtitan's eager ones (sim/model/rope.py, sim/model/layers.py rope)."""
    if t.recompute is Recompute.MLA_UP_PROJ and m.attention is not Attention.MLA:
        raise InputError("training.recompute", f"'mla_up_proj' recomputes MLA's up projections: needs "
                                               f"model.attention = 'mla' (got '{m.attention}')")
    if not t.rope_fusion and t.kernels is Kernels.PYTORCH and not t.compile:
        raise InputError("training.rope_fusion", "false is Megatron-Core's unfused RoPE; with training.kernels = "
                                                 "'pytorch' the RoPE is torchtitan's eager one already")




def _check_ranks(s: Scenario, gpus: int, per_node: int) -> None:
    for i, st in enumerate(s.stragglers):
        if not st.ranks and not st.nodes:
            raise InputError(f"stragglers[{i}]", "names no rank and no node (give ranks = [...] or nodes = [...])")
        bad = [r for r in st.ranks if r >= gpus]
        if bad:
            raise InputError(f"stragglers[{i}].ranks", f"rank {bad[0]} is outside 0..{gpus - 1}")
        bad = [n for n in st.nodes if n * per_node >= gpus]
        if bad:
            raise InputError(f"stragglers[{i}].nodes", f"node {bad[0]} is outside the {gpus // per_node} nodes")


def _check_rl(s: Scenario, m, gpus: int) -> None:
    """The pools fit the cluster, engines split the generator GPUs and the model's heads,
    and whole sequences fit a training row. (Whether one sequence's KV cache fits an
    engine needs the model's sizes: sim/rl/inference.py checks it.)"""
    rl = s.rl
    if rl.generator_gpus + rl.trainer_gpus > gpus:
        raise InputError("rl.generator_gpus", f"generator_gpus + trainer_gpus = {rl.generator_gpus} + "
                                              f"{rl.trainer_gpus} = {rl.generator_gpus + rl.trainer_gpus} "
                                              f"exceeds the cluster's {gpus} GPUs")
    if rl.generator_gpus % rl.generator_tp:
        raise InputError("rl.generator_tp", f"generator_tp = {rl.generator_tp} does not divide "
                                            f"generator_gpus = {rl.generator_gpus} (one engine per generator_tp GPUs)")
    if m.heads % rl.generator_tp or (m.kv_heads % rl.generator_tp and rl.generator_tp % m.kv_heads):
        raise InputError("rl.generator_tp", f"generator_tp = {rl.generator_tp} must divide model.heads = {m.heads} "
                                            f"and divide or be a multiple of model.kv_heads = {m.kv_heads}")
    if rl.mode is RLMode.SYNC and rl.max_staleness not in (None, 0):
        raise InputError("rl.max_staleness", f"{rl.max_staleness} applies to the async and pipeline modes; sync "
                                             "trains each batch on the weights that generated it (staleness 0)")
    if rl.weight_sync is WeightSync.OVERLAPPED and (rl.mode is RLMode.SYNC or rl.weight_route is not WeightRoute.BROADCAST):
        raise InputError("rl.weight_sync", "overlapped needs mode async or pipeline (sync generates with the new "
                                           "weights, so nothing can overlap their transfer) and weight_route = "
                                           "broadcast")
    if rl.prompt_tokens + rl.lengths.max > s.training.seq_len:
        raise InputError("rl.lengths.max", f"prompt_tokens + max = {rl.prompt_tokens} + {rl.lengths.max} exceeds "
                                           f"training.seq_len = {s.training.seq_len}: the trainer packs whole "
                                           "sequences into rows of seq_len tokens")
    if s.stragglers or s.jitter.sigma > 0:
        raise InputError("stragglers" if s.stragglers else "jitter",
                         "not modelled in an [rl] scenario (clustersim rl simulates the pools' steady state)")
    if s.simulation.micro_batches is MicroBatches.STEADY:
        raise InputError("simulation.micro_batches", "'steady' extrapolates one training step (clustersim run); an "
                                                     "[rl] trainer's rows come from its responses: remove it")
