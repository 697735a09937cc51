"""The cross-field rules of the parallel knobs: TP and EP overlap, the token dispatcher, the
data-parallel overlap knobs and HSDP, and the embedding wgrad deferral. Each failed rule raises
:class:`~sim.errors.InputError` naming the key (:func:`sim.input.rules.check_all` runs them in
the order a user fixes them).
"""

from ..errors import InputError
from .choices import (ONE_F_ONE_B_SCHEDULES, Attention, Dispatcher, ExpertRouting, MlaDownProj, Precision, Recipe,
                      Recompute, Schedule)


def check_overlap(m, p, t) -> None:
    """Megatron's rules: --tp-comm-overlap needs sequence parallelism (arguments.py), which
    needs tp > 1; EP all-to-all overlap (--overlap-moe-expert-parallel-comm,
    transformer_config.py) needs ep > 1, no full recompute, and virtual stages when pp > 1."""
    if p.tp_comm_overlap and (p.tp == 1 or not p.sequence_parallel):
        raise InputError("parallel.tp_comm_overlap", f"needs tp > 1 and sequence_parallel = true (got tp = {p.tp}, "
                                                     f"sequence_parallel = {str(p.sequence_parallel).lower()})")
    if p.tp_overlap_fp8_rs and not (t.precision is Precision.FP8 and t.fp8_recipe is Recipe.TE):
        raise InputError("parallel.tp_overlap_fp8_rs", f"needs precision 'fp8' with fp8_recipe 'te' (Transformer "
                                                       f"Engine's FP8 buffers); got '{t.precision}', '{t.fp8_recipe}'")
    check_mla_down_proj(m, p)
    check_dispatcher(m, p)
    if not p.ep_comm_overlap:
        return
    if p.ep == 1:
        raise InputError("parallel.ep_comm_overlap", "needs expert parallelism (ep > 1)")
    if t.recompute is Recompute.FULL:
        raise InputError("parallel.ep_comm_overlap", "does not work with training.recompute = 'full' (Megatron's rule)")
    if p.pp > 1 and p.virtual_stages == 1 and p.schedule is not Schedule.DUALPIPE:
        raise InputError("parallel.ep_comm_overlap", f"with pp = {p.pp} needs virtual_stages > 1 (interleaved 1F1B; "
                                                     "Megatron's rule)")
    if p.schedule is Schedule.GPIPE:
        raise InputError("parallel.ep_comm_overlap", "runs a combined 1F1B schedule; schedule = 'gpipe' has none")
    if p.pp == 1 and t.global_batch // (p.dp * t.micro_batch) < 2:
        raise InputError("parallel.ep_comm_overlap", "needs at least 2 micro-batches per step (one's all-to-alls "
                                                     "run under the other's compute)")

def check_mla_down_proj(m, p) -> None:
    """``parallel.mla_down_proj = "column"``: Megatron-Core's MLA spec of core 0.12-0.13
    (gpt_layer_specs.py at 1c425a83, the commit that made the down projections
    TEColumnParallelLinear, to e63aee46, which made them TELinear again). Only MLA has down
    projections; and at those commits MLA's linears pass no ``tp_comm_buffer_name``, which
    Megatron-Core's TE wrapper asserts under ``tp_comm_overlap`` (extensions/transformer_engine.py
    at 7094270c: "Buffer name should be set to configure communication overlap settings")."""
    if p.mla_down_proj is not MlaDownProj.COLUMN:
        return
    if m.attention is not Attention.MLA:
        raise InputError("parallel.mla_down_proj", f"'column' splits MLA's down projections; model.attention = "
                                                   f"'{m.attention}' has none")
    if p.tp_comm_overlap:
        raise InputError("parallel.mla_down_proj", "'column' (Megatron-Core 0.12-0.13's MLA spec) runs no TP-comm "
                                                   "overlap: its linears have no userbuffers name (set "
                                                   "tp_comm_overlap = false)")


def check_dispatcher(m, p) -> None:
    """DeepEP's exchange (sim/collectives/direct.py ``Dedup``) is modelled for what the published
    DeepEP runs did: expert parallelism, expert TP 1 and balanced routing (its deduplication is
    the expectation under uniform top-k draws)."""
    if p.ep_dispatcher is not Dispatcher.DEEPEP:
        return
    if m.moe is None or p.ep == 1:
        raise InputError("parallel.ep_dispatcher", "'deepep' needs an MoE model with expert parallelism (ep > 1)")
    if (p.expert_tp or p.tp) != 1:
        raise InputError("parallel.ep_dispatcher", f"'deepep' is modelled with expert_tp = 1 only "
                                                   f"(got {p.expert_tp or p.tp})")
    if m.moe.routing is not ExpertRouting.UNIFORM:
        raise InputError("parallel.ep_dispatcher", f"'deepep' is modelled for balanced routing only "
                                                   f"(model.moe.routing = 'uniform'; got '{m.moe.routing}')")

def check_data_parallel(p) -> None:
    """The DP overlap knobs and HSDP (sim/parallel/dp.py states their meanings): each applies
    to the ZeRO stages that have what it switches, so a setting never does nothing."""
    if p.overlap_grad_reduce is False and p.zero == 3:
        raise InputError("parallel.overlap_grad_reduce", "false needs zero 0, 1 or 2: FSDP (zero = 3) "
                                                         "reduce-scatters each layer's gradients as its backward ends")
    if p.overlap_param_gather is not None and p.zero not in (1, 2):
        raise InputError("parallel.overlap_param_gather", f"applies to the distributed optimizer's parameter "
                                                          f"all-gather (zero 1 or 2), got zero = {p.zero}")
    if p.ddp_bucket_mb is not None and (p.zero == 3 or p.overlap_grad_reduce is False):
        why = ("FSDP (zero = 3) gathers and reduces layer by layer, without buckets" if p.zero == 3 else
               "overlap_grad_reduce = false reduces all gradients in one bucket after the backward (Megatron)")
        raise InputError("parallel.ddp_bucket_mb", f"(or its alias training.grad_bucket_mb) does nothing here: {why}")
    if p.grad_reduce_in_fp32 and p.zero == 3 and p.dp * p.cp == 1:
        raise InputError("parallel.grad_reduce_in_fp32", "with zero = 3 is FSDP's fp32 reduce-scatter and accumulation, "
                                                         "but dp * cp = 1 leaves FSDP no group to reduce over")
    if p.gradient_accumulation_fusion is not None and p.zero == 3:
        raise InputError("parallel.gradient_accumulation_fusion", "is Megatron's weight-gradient GEMM accumulating into "
                                                                  "its main_grad buffer (zero 0-2); FSDP (zero = 3) has none")
    if p.reshard_after_forward is not None and p.zero != 3:
        raise InputError("parallel.reshard_after_forward", f"is FSDP's (zero = 3) choice of freeing gathered "
                                                           f"parameters after the forward, got zero = {p.zero}")
    if p.dp_shard is None:
        return
    if p.dp % p.dp_shard:
        raise InputError("parallel.dp_shard", f"{p.dp_shard} must divide dp = {p.dp} (dp / dp_shard replicas of "
                                              "each shard group)")
    if p.dp_shard * p.cp == 1 and p.dp > 1:
        raise InputError("parallel.dp_shard", "1 (with cp = 1) leaves every shard on one rank: that is plain "
                                              "data parallelism, zero = 0")
    if p.dp_shard < p.dp and p.zero == 0:
        raise InputError("parallel.dp_shard", f"{p.dp_shard} < dp = {p.dp} shards ZeRO/FSDP state within groups, "
                                              "but zero = 0 shards nothing: use zero >= 1")

def check_wgrad_deferral(p) -> None:
    """Megatron-Core's embedding wgrad deferral (model_parallel_config.py raises without a pipeline;
    its two 1F1B schedules drain it, schedules.py ``finish_embedding_wgrad_compute``)."""
    if p.wgrad_deferral_limit and not p.defer_embedding_wgrad_compute:
        raise InputError("parallel.wgrad_deferral_limit", "does nothing without defer_embedding_wgrad_compute = true")
    if p.defer_embedding_wgrad_compute and (p.pp == 1 or p.schedule not in ONE_F_ONE_B_SCHEDULES):
        raise InputError("parallel.defer_embedding_wgrad_compute", f"needs pp > 1 with schedule '1f1b' or "
                                                                   f"'interleaved' (got pp = {p.pp}, '{p.schedule}')")
