"""The vocabulary's layers, per micro-batch on one rank (sim/model/layers.py has the blocks'):
the token embedding lookup and its weight gradient, a multi-token-prediction depth's input, and
the output logits with their cross-entropy."""

from functools import lru_cache

from .compute import Kernel, elementwise, gemm
from .layers import ELEM, Shard, linear, norm_and_residual, weight_accumulation
from .transformer import Dims


@lru_cache(maxsize=1024)
def embedding(d: Dims, sh: Shard) -> list[Kernel]:
    """Token embedding lookup (memory-bound)."""
    return (elementwise(2 * ELEM * sh.tokens * d.h),)


@lru_cache(maxsize=1024)
def embedding_weight_grad(d: Dims, sh: Shard, grad_elem: int) -> tuple[Kernel, ...]:
    """The backward kernels of one lookup's weight gradient in the rank's [vocab/tp, hidden]
    word-embedding shard, per micro-batch (already backward kernels: not for :func:`backward`).
    PyTorch's embedding backward is dense: it allocates the whole gradient zeroed, then writes
    the looked-up rows (pytorch aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu
    ``embedding_backward_cuda_kernel``: ``at::zeros({num_weights, grad.size(-1)}, ...)``;
    Megatron-Core 7094270c tensor_parallel/layers.py ``VocabParallelEmbedding`` calls
    ``F.embedding``), and the framework adds it into the gradient buffer of ``grad_elem``
    bytes an element (Megatron-Core distributed_data_parallel.py ``_make_backward_post_hook``:
    ``param.main_grad.add_(param.grad.data)``): ELEM written, then ELEM read and the buffer
    read and written. The rows' own gradient (tokens x hidden) is :func:`embedding`'s."""
    n = d.v * d.h / sh.tp
    return (elementwise(ELEM * n), elementwise((ELEM + 2 * grad_elem) * n))


@lru_cache(maxsize=1024)
def mtp_input(d: Dims, sh: Shard) -> list[Kernel]:
    """The input of a multi-token-prediction depth (Megatron-Core multi_token_prediction.py):
    the embedding of the tokens one further on (a lookup), enorm and hnorm, and eh_proj, the
    column-parallel projection of their 2h-wide concatenation back to hidden."""
    norm = ELEM * sh.norm_tokens * d.h
    return tuple([elementwise(2 * ELEM * sh.tokens * d.h), elementwise(3 * norm), elementwise(3 * norm)]
                 + linear(sh.tokens, d.h / sh.tp, 2 * d.h, sh, tp=1))


@lru_cache(maxsize=1024)
def logits(d: Dims, sh: Shard) -> list[Kernel]:
    """Final norm, output projection over vocab/tp and fp32 cross-entropy (BF16 under FP8:
    Megatron's output layer is not a Transformer Engine module; a ColumnParallelLinear, its
    weight gradient accumulates into main_grad as the blocks' do)."""
    out = gemm(sh.tokens, d.v / sh.tp, d.h)._replace(acc=weight_accumulation(d.v / sh.tp, d.h, sh))
    return tuple(norm_and_residual(d, sh)[:1] + [out]
                 + [elementwise(3 * 4 * sh.tokens * d.v / sh.tp)])
