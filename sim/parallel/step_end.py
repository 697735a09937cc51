"""Per-step costs every real training step pays besides its passes, in Megatron-Core's
order (megatron/training/training.py ``train_step``):

1. ``zero_grad``: the gradient buffer is zeroed before the first forward
   (``model_chunk.zero_grad_buffer()``; DDP and the distributed optimizer, zero 0-2: a
   memset of every local parameter's gradient; FSDP2 frees its gradients instead);
2. after every gradient reduction, gradient-norm clipping (``optimizer.step()`` ->
   ``get_grad_norm_fp32``): a multi-tensor L2-norm kernel over the fp32 main gradients the
   rank updates, then an all-reduce of one fp32 over the ranks that together hold every
   gradient once -- the whole world with the distributed optimizer or FSDP (Megatron's
   ``intra_dist_opt_group``; under HSDP the ranks of one optimizer instance, i.e. of one
   dp_shard block), the model-parallel group tp x pp with plain DDP
   (megatron/core/optimizer/__init__.py ``grad_stats_parallel_group``). Latency-bound, and
   every rank waits for it: it lines up all pipeline stages before their updates;
3. the optimizer: Adam over the rank's shard as HBM traffic
   (:func:`sim.model.optimizer.optimizer`; ZeRO 1-2 then all-gather the updated parameters
   here when ``overlap_param_gather`` is false: :mod:`.zero`);
4. the loss for logging: the last pipeline stage sums (loss, tokens) over its micro-batches
   and all-reduces those two fp32 over the data- and context-parallel group
   (``torch.distributed.all_reduce(val, group=dp_cp_group)``), every step.

All of them are of the OPTIMIZER phase; their collectives are of the DP category (they run
on the gradient-reduction stream). Run ``clustersim run llama3-8b-fsdp-h100 --json`` and
look for ``grad_norm``, ``grad_norm_ar``, ``optimizer`` and ``loss_ar`` in ``--trace``.
"""

from ..collectives.kinds import ALL_REDUCE
from ..engine.kinds import Category, Phase, StreamName
from ..model.optimizer import grad_norm, optimizer, zero_grad
from ..input.choices import Recipe
from .dp import AXIS, grad_bytes
from .params import rank_params

NORM_BYTES = 4  # one fp32: the squared local norm
NORM_SYNC = "grad_norm_ar"
LOSS_SYNC = "loss_ar"
STEP_SYNCS = frozenset({NORM_SYNC, LOSS_SYNC})  # the step-end syncs: their spans start when the last member
#   arrives (sim/outputs/result.py): the wait before is idle -- the pipeline's drain, a slower rank's step --
#   not communication, so the bubble and the critical rank keep their meaning
LOSS_BYTES = 2 * 4  # two fp32: the summed loss and the token count


def start(b) -> int | None:
    """Step 1: zero the gradient buffer (zero 0-2), the first op of the step."""
    if b.ctx.scenario.parallel.zero >= 3:
        return None
    dense, expert = rank_params(b.ctx, b.stage)
    with b.phase_of(Phase.OPTIMIZER):
        return b.compute("zero_grad", zero_grad(dense + expert, grad_bytes(b.ctx.scenario.parallel)))


def shard_params(b) -> float:
    """Parameters whose update this rank computes: its shard under ZeRO / FSDP (dense over the
    shard group, experts over the expert-data-parallel group), else all it holds."""
    dense, expert = rank_params(b.ctx, b.stage)
    if b.ctx.scenario.parallel.zero >= 1:
        dense /= len(b.ctx.layout.shard_group(b.rank))
        expert /= len(b.ctx.layout.expert_dp_group(b.rank))
    return dense + expert


def finish(b, deps) -> int:
    """Steps 2-4 after ``deps`` (every gradient reduction); returns the optimizer op."""
    with b.phase_of(Phase.OPTIMIZER):
        params = shard_params(b)
        x = b.compute("grad_norm", grad_norm(params), tuple(deps))
        group, group_of = norm_group(b)
        if len(group) > 1:
            x = b.collective(NORM_SYNC, AXIS, ALL_REDUCE, group, NORM_BYTES, x, stream=StreamName.DP,
                             group_of=group_of)
        x = optimizer_step(b, params, x)
        loss_sync(b, x)
        return x


def optimizer_step(b, params: float, deps) -> int:
    """Adam on ``params`` parameters (FSDP2: fp32 sharded parameters, no master copy)."""
    p = b.ctx.scenario.parallel
    dense, expert = rank_params(b.ctx, b.stage)
    te = b.ctx.shard.fp8 and b.ctx.shard.recipe is Recipe.TE  # (torchao casts them every micro-batch instead)
    fp8_weights = dense + expert if te else 0.0  # TE casts the full local weights
    kernels = optimizer(params, fp8_weights, grad_bytes(p) if p.zero < 3 else 4, copies_to_model=p.zero < 3)
    return b.compute("optimizer", kernels, deps)


def norm_group(b):
    """(group, group_of) of the gradient-norm all-reduce (module docstring, step 2);
    group_of None for the world, which has no sibling groups."""
    layout, p = b.ctx.layout, b.ctx.scenario.parallel
    if p.zero == 0:
        return layout.group(b.rank, Category.TP, Category.PP), lambda r: layout.group(r, Category.TP, Category.PP)
    if layout.dp_shard is None:
        return layout.instance_group(None), None
    return layout.instance_group(b.rank), layout.instance_group


def loss_sync(b, deps) -> int | None:
    """Step 4: the last stage's loss all-reduce over dp x cp."""
    layout = b.ctx.layout
    if b.stage != layout.sizes[Category.PP] - 1:
        return None
    group = layout.group(b.rank, Category.CP, Category.DP)
    if len(group) == 1:
        return None
    return b.collective(LOSS_SYNC, AXIS, ALL_REDUCE, group, LOSS_BYTES, deps, stream=StreamName.DP,
                        group_of=lambda r: layout.group(r, Category.CP, Category.DP))
