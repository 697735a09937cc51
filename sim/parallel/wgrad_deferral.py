"""The output layer's weight gradients deferred into the pipeline flush: Megatron-Core's
``defer_embedding_wgrad_compute`` with ``wgrad_deferral_limit`` (``parallel.`` keys of the same
names; NeMo's performance recipes set them: nemo/collections/llm/recipes/llama3_70b.py
``pretrain_performance_optimizations``, NeMo d2b21556: ``defer_embedding_wgrad_compute=True,
wgrad_deferral_limit=22``; llama31_405b.py: 50).

What Megatron-Core runs (NVIDIA/Megatron-LM ee6737da, the commit NeMo d2b21556's container pins):

- forward: the last stage's output layer (``ColumnParallelLinear.forward``,
  megatron/core/tensor_parallel/layers.py lines 928-933) keeps its input of the first
  ``wgrad_deferral_limit`` micro-batches (0: all of them);
- backward: ``LinearWithGradAccumulationAndAsyncCommunication.backward`` (lines 450-456) keeps
  those micro-batches' output gradients instead of running the weight-gradient GEMM: only the
  input-gradient GEMM runs (and the sequence-parallel re-gather of the input is skipped);
- after the schedule's last backward and before ``finalize_model_grads``
  (pipeline_parallel/schedules.py ``finish_embedding_wgrad_compute``, called by both 1F1B
  schedules, lines 1547 and 1949): megatron/core/utils.py ``drain_embedding_wgrad_compute``
  all-gathers each kept input over TP (sequence parallel: the first synchronously, each next one
  asynchronously under the previous GEMM) and runs the kept weight-gradient GEMMs one after
  another (``wgrad_gemm_accum_fp32``).

So the last stage, which holds the output layer beside its share of the layers, does that
work while the other stages drain the pipeline instead of inside its steady state. The
gradient buckets do not wait for it (the output weight's hook fires in the last, not deferred,
micro-batch's backward); the optimizer does. The deferred GEMMs are the weight-gradient half of
the output projection's backward (:func:`.tp.grad_parts`, as the zero-bubble W passes split it).

Run: ``python -m pytest -q tests/test_wgrad_deferral.py`` (the census of its ops: tests/test_work.py).
"""

from ..engine.kinds import Phase
from ..model.layer_ids import is_output
from . import tp
from .pp_zero_bubble import Kind


def kept(p, m: int) -> int:
    """How many of ``m`` micro-batches keep their output-layer weight gradient for the flush
    (parallel settings ``p``): the first ``wgrad_deferral_limit`` backwards (0: all)."""
    if not p.defer_embedding_wgrad_compute:
        return 0
    return m if p.wgrad_deferral_limit == 0 else min(m, p.wgrad_deferral_limit)


def ops_per_kept(p) -> int:
    """Ops :func:`drain` adds per kept micro-batch: its GEMM, and its input's all-gather
    (sequence parallel with tp > 1)."""
    return 1 + int(p.tp > 1 and p.sequence_parallel)


def flush_ops(p, m: int, m0: int) -> int:
    """Ops the drain of ``m`` micro-batches adds beyond that of ``m0`` (the census's skeleton
    runs ``m0``: sim/parallel/layer_program.py ``step_skeleton``)."""
    return (kept(p, m) - kept(p, m0)) * ops_per_kept(p)


def deferred(b, mb: int) -> bool:
    """Whether micro-batch ``mb``'s output-layer weight gradient waits for the flush (the
    output layer's backwards run in micro-batch order: :func:`kept`)."""
    return mb < kept(b.ctx.scenario.parallel, mb + 1)


def in_step(b, chunks: dict, step: tuple) -> bool:
    """Whether ``step`` runs a deferring output-layer backward (built, never replayed:
    sim/parallel/replay.py's templates would carry one kind of that pass to the other)."""
    return any(kind is not Kind.F and deferred(b, mb) and any(is_output(b.ctx.dims, x) for x in chunks[chunk])
               for kind, mb, chunk in step)


def output_backward(b, name: str, kernels, deps, layer: int, mb: int) -> int:
    """The output layer's backward op: whole, or (deferred) its input-gradient part, the
    weight-gradient part recorded in ``b.embedding_wgrads`` for :func:`drain`."""
    if not deferred(b, mb):
        return b.compute(name, kernels, deps, layer, mb)
    outer, b.deferred = b.deferred, b.embedding_wgrads
    try:
        return b.compute(name, kernels, deps, layer, mb)
    finally:
        b.deferred = outer


def drain(b, deps) -> int | None:
    """After the rank's last backward (``deps``): the kept inputs' TP all-gathers and the
    kept weight-gradient GEMMs, pipelined as ``drain_embedding_wgrad_compute`` runs them;
    the last GEMM (None when nothing was deferred)."""
    kept, b.embedding_wgrads = b.embedding_wgrads, []
    if not kept:
        return None
    with b.phase_of(Phase.BACKWARD):
        gemm = deps
        gather = _gather(b, kept[0], gemm)  # (synchronous: async_op=False)
        for i, (name, kernels, _op, layer, mb) in enumerate(kept):
            nxt = _gather(b, kept[i + 1], gemm) if i + 1 < len(kept) else None  # under this GEMM
            gemm = b.compute(f"{name}_wgrad", kernels, (gather, gemm), layer, mb, weights=False)
            gather = nxt
    return gemm


def _gather(b, kept: tuple, deps):
    """The sequence-parallel all-gather of one kept input (nothing without SP)."""
    _name, _kernels, _op, layer, mb = kept
    return tp.enter(b, "logits_wgrad", layer, mb, deps, tag=("deferred",))
