"""Data parallelism (PyTorch DDP, Li et al. 2020; Megatron-Core's DistributedDataParallel):
gradient all-reduce in buckets, and the knobs real stacks expose for it.

Gradients of the last micro-batch are packed into buckets in the order backward produces
them. ``parallel.overlap_grad_reduce`` (Megatron ``--overlap-grad-reduce``; default true, as
NeMo's recipes run it: nemo/collections/llm/recipes/*.py ``DistributedDataParallelConfig(
overlap_grad_reduce=True, overlap_param_gather=True, ...)``): each bucket's reduction is
issued as soon as its last layer's backward finishes, so it overlaps the backward of earlier
layers; false: every gradient of a chunk is one bucket, reduced after the rank's whole
backward (Megatron's ``finalize_model_grads`` after the schedule; ``bucket_size = None``).

Bucket size (``parallel.ddp_bucket_mb``, MiB of gradients; alias ``training.grad_bucket_mb``):
by default Megatron-Core's ``max(40_000_000, 1_000_000 * dp_cp_size)`` parameters
(megatron/training/training.py ``resolve_ddp_bucket_size``) of :data:`GRAD_BYTES` each. As in
Megatron, only the first model chunk of the first pipeline stage is split into buckets;
every other chunk and stage reduces its gradients as one bucket (training.py: "Bucketing is
disabled for non-first chunks ... or for non-zero pipeline-parallel ranks"), which is not on
the critical path there. Expert gradients reduce over the ranks holding the same experts.
Per step each rank sends 2x its gradient bytes x (N-1)/N.

Gradient bytes (``parallel.grad_reduce_in_fp32``, Megatron-Core's DistributedDataParallelConfig
field, default False): bf16 gradients (:data:`GRAD_BYTES`) are accumulated and reduced; true: an
fp32 gradient buffer, 4 bytes per parameter on the wire and in the buffer. Megatron-LM before
Megatron-Core forced it for bf16 (NVIDIA/Megatron-LM 285068c8, 2023-01-11, megatron/arguments.py:
"bfloat16 requires gradient accumulation and all-reduce to be done in fp32":
``args.accumulate_allreduce_grads_in_fp32 = True`` whenever ``args.bf16``). Megatron buckets count
parameters, so a bucket holds twice the bytes. (With zero 3 the key is FSDP's: sim/parallel/fsdp.py.)

Tied embeddings across a pipeline (``model.tied_embeddings`` with pp > 1), or multi-token
prediction across one (``model.mtp_layers`` with pp > 1: the last stage looks the shifted tokens
up in its own copy): the first and the last stage each hold the word embeddings
(:func:`sim.parallel.params.holds_one_embedding`), and every step all-reduces their gradient,
the full ``vocab x hidden / tp`` matrix at :func:`grad_bytes`, over each such pair:
:func:`embedding_grad_sync`.
"""

import math

from ..collectives.kinds import ALL_REDUCE
from .params import holds_one_embedding, layer_params, stage_layer_ids
from ..engine.kinds import Category, StreamName

AXIS = Category.DP
GRAD_BYTES = 2  # bf16 gradients on the wire (Megatron-Core default: grad_reduce_in_fp32 off)
FP32_GRAD_BYTES = 4  # parallel.grad_reduce_in_fp32: the fp32 gradient buffer (module docstring)
BUCKET_PARAMS = 40_000_000  # Megatron-Core default bucket: max(40M, 1M x dp_cp) parameters
BUCKET_PARAMS_PER_RANK = 1_000_000


def grad_bytes(p) -> int:
    """Bytes per gradient element in the buffer and on the wire under parallel settings ``p``."""
    return FP32_GRAD_BYTES if p.grad_reduce_in_fp32 else GRAD_BYTES


def grads_overlapped(p) -> bool:
    """``parallel.overlap_grad_reduce`` with its default (true)."""
    return p.overlap_grad_reduce is not False


def bucket_bytes(ctx, stage: int, chunk: int) -> float:
    """Gradient bytes per bucket of model chunk ``chunk`` on pipeline ``stage`` (inf: the
    whole chunk in one bucket); see the module docstring."""
    p = ctx.scenario.parallel
    return bucket_size(p, p.dp * p.cp, stage, chunk)


def bucket_size(p, dp_cp: int, stage: int, chunk: int) -> float:
    """:func:`bucket_bytes` of parallel settings ``p`` with ``dp_cp`` data x context-parallel
    ranks (the planner's estimate asks it for every candidate mesh)."""
    if not grads_overlapped(p) or stage > 0 or chunk > 0:
        return math.inf
    if p.ddp_bucket_mb is not None:
        return p.ddp_bucket_mb * 2**20
    return max(BUCKET_PARAMS, BUCKET_PARAMS_PER_RANK * dp_cp) * grad_bytes(p)


class GradSync:
    """Buckets one virtual stage's gradients and issues their reduction."""

    op = ALL_REDUCE
    name = "dp_ar"

    def __init__(self, b, chunk: int = 0):
        self.b = b
        self.bucket_bytes = bucket_bytes(b.ctx, b.stage, chunk)
        self.overlapped = grads_overlapped(b.ctx.scenario.parallel)
        self.pending = [0.0, 0.0]  # dense, expert bytes
        self.grad_bytes = grad_bytes(b.ctx.scenario.parallel)
        self.issued: list[int] = []
        layout = b.ctx.layout
        self.group_fns = (layout.shard_group, layout.expert_dp_group)
        self.groups = tuple(fn(b.rank) for fn in self.group_fns)

    @property
    def active(self) -> bool:
        """Whether any gradient needs reducing across ranks."""
        return any(len(g) > 1 for g in self.groups)

    def add(self, layer: int, op_index: int) -> None:
        """Layer ``layer``'s gradients are ready after ``op_index``."""
        dense, expert = layer_params(self.b.ctx, layer)
        self.pending[0] += dense * self.grad_bytes
        self.pending[1] += expert * self.grad_bytes
        if sum(self.pending) >= self.bucket_bytes:
            self.flush(op_index, layer)

    def flush(self, op_index, layer: int = -1) -> None:
        """Issue the pending bucket's reduction (without overlap: only from :meth:`after_backward`)."""
        if not self.overlapped:
            return
        self._issue(op_index, layer)

    def after_backward(self, deps) -> None:
        """``overlap_grad_reduce = false``: the chunk's one bucket, after the rank's whole backward."""
        if not self.overlapped:
            self._issue(deps, -1)

    def _issue(self, deps, layer: int) -> None:
        for nbytes, group, group_of, kind in zip(self.pending, self.groups, self.group_fns, ("", "_expert")):
            if nbytes > 0 and len(group) > 1:
                self.issued.append(self.reduce(self.name + kind, group, group_of, nbytes, deps, layer))
        self.pending = [0.0, 0.0]

    def reduce(self, name: str, group, group_of, nbytes: float, deps, layer: int) -> int:
        """One bucket's collective on the gradient-reduction stream."""
        return self.b.collective(name, AXIS, self.op, group, nbytes, deps, stream=StreamName.DP, layer=layer,
                                 algo=self.b.ctx.scenario.parallel.dp_algo, group_of=group_of)


def copy_grad_sync(b, vs: int, deps) -> int:
    """DualPipe: ranks s and p-1-s both hold stage ``vs`` (one copy per direction); each
    adds the other's gradients of it before the optimizer (deepseek-ai/DualPipe
    examples/example_dualpipe.py: ``p0.grad += p1all[pp_size - 1 - rank]``), an
    all-reduce over the pair, on the gradient-reduction stream."""
    layout, p = b.ctx.layout, b.ctx.layout.sizes[Category.PP]
    pair = lambda r: tuple(sorted((r, layout.stage_rank(r, p - 1 - layout.coords(r)[Category.PP]))))
    nbytes = grad_bytes(b.ctx.scenario.parallel) * sum(sum(layer_params(b.ctx, l)) for l in stage_layer_ids(b.ctx, vs))
    return b.collective("copy_grad_ar", Category.PP, ALL_REDUCE, pair(b.rank), nbytes, deps, stream=StreamName.DP, tag=(vs,),
                        group_of=pair)


EMBEDDING_SYNC = "embedding_grad_ar"


def embedding_grad_sync(b, deps) -> int | None:
    """Tied embeddings on a pipeline: the first and the last stage all-reduce the gradient of
    their two copies of the word embeddings (module docstring), after the rank's gradient
    reductions, on their stream; None on any other rank.

    Megatron-LM 285068c8 (2023-01-11) megatron/optimizer/optimizer.py
    ``allreduce_word_embedding_grads``: ``torch.distributed.all_reduce(grad,
    group=mpu.get_embedding_group())`` on ``word_embeddings_weight.main_grad`` (the gradient
    buffer's dtype), the group ``[ranks[0], ranks[-1]]`` of every pipeline
    (megatron/core/parallel_state.py), once a step in ``reduce_model_grads`` (before the
    distributed optimizer's reduce-scatter there; Megatron-Core's ``finalize_model_grads``
    ``_allreduce_embedding_grads`` runs it after the data-parallel reduction, the order kept
    here: both precede the optimizer, which waits for both). Of the DP category, as the step's
    other gradient syncs (sim/parallel/step_end.py): a once-a-step reduction, not a pipeline
    transfer (the census counts those per micro-batch: sim/parallel/layer_program.py
    ``step_skeleton``). Multi-token prediction on a pipeline does the same: Megatron-Core
    7094270c megatron/core/distributed/finalize_model_grads.py ``_allreduce_word_embedding_grads``
    all-reduces the embedding's ``main_grad`` over the embedding group ``if
    model_module.share_embeddings_and_output_weights or getattr(config, 'mtp_num_layers', 0)``
    (gpt_model.py builds an embedding on the MTP stage)."""
    ctx = b.ctx
    layout, p = ctx.layout, ctx.layout.sizes[Category.PP]
    copied = ctx.scenario.model.tied_embeddings or ctx.dims.mtp > 0  # (MTP: finalize_model_grads, above)
    if not copied or p == 1 or holds_one_embedding(ctx) or b.stage not in (0, p - 1):
        return None
    pair = lambda r: (layout.stage_rank(r, 0), layout.stage_rank(r, p - 1))
    nbytes = grad_bytes(ctx.scenario.parallel) * ctx.dims.v * ctx.dims.h / layout.sizes[Category.TP]
    return b.collective(EMBEDDING_SYNC, AXIS, ALL_REDUCE, pair(b.rank), nbytes, deps, stream=StreamName.DP,
                        group_of=pair)
