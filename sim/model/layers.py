"""The kernels of one transformer layer on one rank, per micro-batch.

A rank computes ``tokens = micro_batch * seq_len / cp`` tokens with 1/tp of every
weight matrix (Megatron column/row split); with sequence parallelism the norms,
dropouts and residuals work on tokens/tp. FLOPs per GEMM are 2mnk; memory-bound
kernels are counted by the HBM bytes they move (bf16 activations).

Convention the TP comm overlap relies on (sim/parallel/tp_overlap.py): a sublayer's
kernels are listed in execution order; a GEMM is a kernel with FLOPs; kernels before the
first GEMM (the norm) work on the sequence-parallel shard; the consecutive GEMMs from
the first one read the tp-gathered input; the last GEMM produces the partial sums that
are reduced; kernels after it (dropout, residual) work on the shard again.
"""

from dataclasses import dataclass
from functools import lru_cache

from .compute import Kernel, elementwise, gemm
from .transformer import Dims

ELEM = 2  # bytes per bf16 activation element


@dataclass(frozen=True)
class Shard:
    """What one rank holds of one micro-batch."""

    tokens: int  # micro_batch * seq_len / cp
    seq: int  # full sequence length (keys each query attends over)
    micro: int  # sequences per micro-batch
    tp: int
    sp: bool  # sequence parallelism: norms/dropouts on tokens/tp
    flash: bool  # flash attention: causal half of the scores, no stored scores

    @property
    def norm_tokens(self) -> float:
        """Tokens the elementwise kernels touch."""
        return self.tokens / self.tp if self.sp else self.tokens


def _norm_and_residual(d: Dims, sh: Shard) -> list[Kernel]:
    nbytes = ELEM * sh.norm_tokens * d.h
    return [elementwise(3 * nbytes), elementwise(5 * nbytes)]  # layernorm; dropout + residual add


def attention_core(d: Dims, sh: Shard, kv_share: float = 1.0) -> Kernel:
    """QK^T and AV over ``kv_share`` of the keys: 4 * tokens * seq * h / tp FLOPs (the
    contract's 12*L*h*s term is 3x this); flash attention skips the causal upper half."""
    causal = 0.5 if sh.flash else 1.0
    flops = 4 * sh.tokens * sh.seq * kv_share * d.h / sh.tp * causal
    io = ELEM * sh.tokens * (2 * d.h + 2 * d.g * d.d) / sh.tp
    if not sh.flash:  # scores, mask, softmax, dropout written and read back (Megatron 2021)
        io += 4 * ELEM * sh.micro * d.a / sh.tp * (sh.tokens / sh.micro) * sh.seq * kv_share
    return Kernel(flops, d.d, io, 1, 2.5 if sh.flash else 2.0)


@lru_cache(maxsize=None)
def attention_pre(d: Dims, sh: Shard) -> list[Kernel]:
    """Norm and QKV projection."""
    return tuple(_norm_and_residual(d, sh)[:1] + [gemm(sh.tokens, (d.h + 2 * d.g * d.d) / sh.tp, d.h)])


@lru_cache(maxsize=None)
def attention_post(d: Dims, sh: Shard) -> list[Kernel]:
    """Output projection, dropout and residual."""
    return tuple([gemm(sh.tokens, d.h, d.h / sh.tp)] + _norm_and_residual(d, sh)[1:])


def mlp(d: Dims, sh: Shard, ffn: int | None = None, tokens: float | None = None) -> list[Kernel]:
    """Dense MLP (gelu: 2 matrices, swiglu: 3) on ``tokens`` (default: the shard's)."""
    f, t = ffn or d.f, sh.tokens if tokens is None else tokens
    if t <= 0:
        return []
    up = gemm(t, (d.mats - 1) * f / sh.tp, d.h)
    act = elementwise(ELEM * t * f / sh.tp * d.mats)  # gelu: read f, write f; swiglu: 2f, f
    return [up, act, gemm(t, d.h, f / sh.tp)]


@lru_cache(maxsize=None)
def mlp_block(d: Dims, sh: Shard) -> list[Kernel]:
    """Norm, dense MLP, dropout and residual."""
    nr = _norm_and_residual(d, sh)
    return tuple(nr[:1] + mlp(d, sh) + nr[1:])


@lru_cache(maxsize=None)
def router(d: Dims, sh: Shard) -> list[Kernel]:
    """Norm and router logits of an MoE layer (top-k and permutation are memory-bound)."""
    return tuple(_norm_and_residual(d, sh)[:1] + [gemm(sh.tokens, d.experts, d.h),
                                                   elementwise(2 * ELEM * sh.tokens * d.h * d.top_k)])


@lru_cache(maxsize=None)
def experts(d: Dims, sh: Shard, local_loads: tuple[float, ...]) -> list[Kernel]:
    """The local experts' MLPs on the tokens each received, plus shared experts."""
    kernels = [k for load in local_loads for k in mlp(d, sh, d.f_expert, load)]
    for _ in range(d.shared):
        kernels += mlp(d, sh, d.f_expert)
    return tuple(kernels + _norm_and_residual(d, sh)[1:])


@lru_cache(maxsize=None)
def embedding(d: Dims, sh: Shard) -> list[Kernel]:
    """Token embedding lookup (memory-bound)."""
    return (elementwise(2 * ELEM * sh.tokens * d.h),)


@lru_cache(maxsize=None)
def logits(d: Dims, sh: Shard) -> list[Kernel]:
    """Final norm, output projection over vocab/tp and fp32 cross-entropy."""
    return tuple(_norm_and_residual(d, sh)[:1] + [gemm(sh.tokens, d.v / sh.tp, d.h)]
                 + [elementwise(3 * 4 * sh.tokens * d.v / sh.tp)])


def backward(kernels: list[Kernel] | tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """The backward pass of a forward kernel list."""
    return _backward(tuple(kernels))


@lru_cache(maxsize=None)
def _backward(kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    return tuple(k.backward() for k in kernels)


def optimizer(params: float) -> list[Kernel]:
    """Adam on ``params`` local parameters: read and write fp32 master, m, v, read the
    gradient, write bf16 weights: ~32 bytes per parameter (memory-bound)."""
    return [elementwise(32 * params, count=4)]
