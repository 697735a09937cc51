"""Transformer Engine delayed scaling's amax reduction, once per model chunk, micro-batch and
direction (the kernels and bytes: :mod:`sim.model.delayed_scaling`).

Megatron-Core runs each model chunk's ``TransformerBlock.forward`` inside one
``fp8_autocast(fp8_recipe=DelayedScaling(...), fp8_group=...)`` (megatron/core/transformer/
transformer_block.py; core_r0.9.0 through core_r0.11.0 alike, NeMo 24.12 ships 0.10), with
``fp8_group = parallel_state.get_amax_reduction_group(with_context_parallel=True,
tp_only_amax_red=config.tp_only_amax_red)``: the
``_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP`` -- every rank of the pipeline stage, tp x cp x dp
(expert-parallel ranks are inside dp) -- or, with ``--tp-only-amax-red``
(``training.tp_only_amax_red``), the tp x cp group (megatron/core/parallel_state.py
``get_amax_reduction_group``). Transformer Engine reduces the region's amaxes when the
autocast exits (forward) and in the backward of its first FP8 module (backward)
(transformer_engine/pytorch/fp8.py ``reduce_and_update_fp8_tensors``, v1.13): ``torch.cat``,
``all_reduce(MAX, async_op=False)``, the fused update. The all-reduce is a real NCCL call per
chunk and micro-batch and direction; the compute stream waits for it (``Work.wait()``), so
every rank of the group lines up there and the chunk's output is sent on only after it
(the pipeline send's stream waits on the compute stream when it is issued). A group of one
rank reduces nothing (``get_world_size(group) > 1``) but still updates its scales. Not
modelled: a second forward reduction when full recompute re-enters the autocast in the
backward.

Here: after a chunk's pass (:func:`sim.parallel.workload.close_pass`), the cat and the update
on the compute stream and between them the all-reduce on its own stream (a process group of
its own in PyTorch, so it does not queue behind gradient buckets), reported under the dp axis.
Only ``training.precision = "fp8"`` with Transformer Engine's recipe (``training.fp8_recipe =
"te"``): torchao's tensor-wise recipe (torchtitan's ``tt_*`` rows) computes each scale from the
tensor it casts, with no history and no reduction per region; MXFP8 / NVFP4 use block scales.
Run ``clustersim run llama3.1-70b-fp8-h100 --trace t.json`` and look for ``fp8_amax_ar``.
"""

from ..collectives.kinds import ALL_REDUCE
from ..engine.kinds import Category, StreamName
from ..input.choices import Precision, Recipe
from ..model.delayed_scaling import amax_bytes, amax_kernels
from .pp_zero_bubble import Kind

AXIS = Category.DP  # the group spans the stage's data-parallel ranks: its time is reported as dp
STREAM = StreamName.AMAX
CAT, SYNC, UPDATE = "fp8_amax_cat", "fp8_amax_ar", "fp8_amax_update"
NAMES = frozenset({CAT, SYNC, UPDATE})


def applies(training) -> bool:
    """Whether the linears run Transformer Engine's delayed scaling (FP8, TE recipe)."""
    return training.precision is Precision.FP8 and training.fp8_recipe is Recipe.TE


def enabled(ctx) -> bool:
    """:func:`applies` to the scenario the builder builds."""
    return applies(ctx.scenario.training)


def pass_pair_s(compute, gemms: int, all_reduce) -> float:
    """Seconds one chunk's forward and backward reductions add to a micro-batch when exposed
    (the planner's estimate, sim/plan/estimate.py): each direction's cat and update kernels
    on ``compute`` (a :class:`~sim.model.compute.ComputeModel`) and ``all_reduce(nbytes)``,
    the all-reduce of its amaxes over the group (0 for a group of one)."""
    if gemms <= 0:
        return 0.0
    return sum(compute.time(list(amax_kernels(gemms, fwd))) + all_reduce(amax_bytes(gemms, fwd))
               for fwd in (True, False))


def axes(training) -> tuple[Category, ...]:
    """The amax reduction group's axes (module docstring): tp x cp x dp, or tp x cp."""
    return (Category.TP, Category.CP) if training.tp_only_amax_red else (Category.TP, Category.CP, Category.DP)


def reduce(b, ps, chunk: int) -> None:
    """The amax reduction closing pass ``ps`` of model chunk ``chunk``; advances ``ps.x``.
    The forward pass counts the chunk's FP8 GEMMs (:attr:`RankBuilder.fp8_gemms` since the
    pass opened); its backward reduces the same GEMMs' gradient amaxes."""
    if not enabled(b.ctx) or ps.direction is Kind.W:
        return
    forward = ps.direction is Kind.F
    if forward:
        b.amax_gemms[chunk] = b.fp8_gemms - ps.fp8_mark
    gemms = b.amax_gemms.get(chunk, 0)
    if gemms == 0:  # a chunk of no FP8 module (the embedding or output layer alone) has no buffer
        return
    cat, update = amax_kernels(gemms, forward)
    layer = min(ps.layers)  # (the chunk's key: its first layer, in both directions)
    x = b.compute(CAT, [cat], ps.x, layer, ps.mb)
    layout, names = b.ctx.layout, axes(b.ctx.scenario.training)
    group = layout.group(b.rank, *names)
    if len(group) > 1:
        x = b.collective(SYNC, AXIS, ALL_REDUCE, group, amax_bytes(gemms, forward), x, stream=STREAM,
                         layer=layer, mb=ps.mb, tag=("fwd" if forward else "bwd",),
                         group_of=lambda r: layout.group(r, *names))
    ps.x = b.compute(UPDATE, [update], x, layer, ps.mb)
