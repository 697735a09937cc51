"""The kernels of one transformer layer on one rank, per micro-batch.

A rank computes ``tokens = micro_batch * seq_len / cp`` tokens with 1/tp of every
weight matrix (Megatron column/row split); with sequence parallelism the norms,
dropouts and residuals work on tokens/tp. FLOPs per GEMM are 2mnk; memory-bound
kernels are counted by the HBM bytes they move (bf16 activations).

Kernel roles (the parallel layer's TP-communication overlap relies on them): every linear
layer's kernels (its FP8 cast and its GEMM) carry their role under tensor parallelism in
``Kernel.tp``: 1 for the column-parallel GEMMs that read the sequence-parallel gathered
input (QKV, MLA's up projections, FC1), 2 for the row-parallel GEMM whose output TP reduces
(the attention output projection, FC2), 0 for everything local (norms, MLA's duplicated
down projections and latent norms, which Megatron runs on the sequence shard before
gathering the latents: :func:`entry_width` is the width that is gathered). A sublayer's
kernels are in execution order, so each role forms one run.

Attention: MHA/GQA projects Q, K, V in one GEMM; MLA (Megatron-Core multi_latent_attention.py,
gpt_layer_specs.py: TELinear 'duplicated' down projections, or column-parallel ones: :func:`mla_latent_widths`;
TELayerNormColumnParallelLinear up projections, TERowParallelLinear output) runs
q down -> q norm -> q up and kv down (+ the shared rotary key) -> kv norm -> kv up, then
the core with d_qk = qk_nope + qk_rope and d_v = v_head_dim. MLPs: gelu and relu2 (squared
ReLU, Nemotron-4) read and write f activations per token, the gated swiglu and geglu (GELU
gating a third matrix: Grok-1, Gemma) read 2f and write f;
all are memory-bound, their arithmetic hidden under the traffic.

Quantized linears (``training.precision`` fp8, mxfp8, nvfp4; ``training.fp8_recipe``): which
kernels cast what, and who casts (Transformer Engine or torchao), is :mod:`sim.model.quant`;
:func:`linear` puts the casts beside each linear's GEMM. The optimizer step's kernels are
:mod:`sim.model.optimizer`; the plain PyTorch operators' bytes are :mod:`sim.model.eager`.

Plain PyTorch operators (``training.kernels = "pytorch"`` without ``training.compile``): the
stacks above run fused kernels (Transformer Engine's norms and fused RoPE, Megatron's fused
bias-SwiGLU, or Inductor's fusion under torch.compile), which is what the kernels here count
by default. torchtitan's Llama code, run eagerly, issues every elementwise step as its own
kernel reading and writing whole tensors (pytorch/torchtitan 9dec370, the commit its H100
table ran: torchtitan/models/norms.py ``RMSNorm`` -- ``self._norm(x.float()).type_as(x) *
self.weight``, the default ``norm_type = "rmsnorm"`` of train_configs/llama3_*.toml;
models/llama/model.py ``apply_rotary_emb`` in complex fp32 and ``FeedForward``
``w2(F.silu(w1(x)) * w3(x))``; ``h = x + attention(...)`` without dropout). Their bytes per
element are :data:`EAGER_RMSNORM`, :data:`EAGER_ROPE`, :data:`EAGER_SWIGLU` and
:data:`EAGER_RESIDUAL`. The check: torchtitan's own table (docs/performance.md, Llama 3 8B on
8 and 128 H100) measured torch.compile at +15.7% and +16.2% tokens/s over eager BF16
(tests/test_eager_kernels.py; ``clustersim validate`` rows ``tt_h100_l8b_*_compile_bf16``).
"""

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from ..input.choices import Precision, Recipe
from .compute import QUANTIZED, Kernel, elementwise, gemm
from .eager import EAGER_RESIDUAL, EAGER_RMSNORM, EAGER_ROPE, EAGER_SWIGLU, eager
from .quant import fp8_cast, torchao_cast
from .rope import megatron_rope
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
    fp8: bool = False  # linear layers quantized (training.precision = "fp8", "mxfp8" or "nvfp4")
    quant: Precision = Precision.FP8  # which of sim.model.compute.QUANTIZED they run in (when fp8)
    recipe: Recipe = Recipe.TE  # who quantizes them (training.fp8_recipe; sim.model.quant)
    eager: bool = False  # elementwise steps as plain PyTorch operators (training.kernels = "pytorch", no compile)
    fused_permute: bool = True  # parallel.moe_permute_fusion: the token permutation's kernels (permute)
    rope_fused: bool = True  # training.rope_fusion: False runs Megatron-Core's unfused RoPE (megatron_rope)
    grouped_gemm: bool = False  # parallel.moe_grouped_gemm: the local experts as one grouped MLP (routed_experts)
    mla_column: bool = False  # parallel.mla_down_proj = "column" at tp > 1: MLA's down projections column-parallel
    main_grad: int = 0  # bytes per element of the main_grad buffer the linears' weight-gradient GEMMs accumulate
    #                     into inside the GEMM (parallel.gradient_accumulation_fusion; 0: they write a fresh gradient)

    def __post_init__(self):
        """Strings become :class:`Precision` and :class:`Recipe` here, once (an unknown name: ValueError)."""
        object.__setattr__(self, "quant", Precision(self.quant))
        object.__setattr__(self, "recipe", Recipe(self.recipe))

    @property
    def norm_tokens(self) -> float:
        """Tokens the elementwise kernels touch."""
        return self.tokens / self.tp if self.sp else self.tokens


def linear(m: float, n: float, k: float, sh: Shard, fused: bool = False, tp: int = 0) -> list[Kernel]:
    """A linear layer on ``m`` tokens, k -> n features: one BF16 GEMM, or under FP8 its
    cast kernel and an FP8 GEMM (``fused``: the input comes from a norm that emits FP8);
    ``tp``: its role under tensor parallelism (:class:`~sim.model.compute.Kernel`). With
    ``sh.main_grad`` the GEMM's weight gradient reads and writes its n x k main_grad
    (:func:`weight_accumulation`)."""
    acc = weight_accumulation(n, k, sh)
    return [g._replace(acc=acc) if g.flops and acc else g for g in _linear(m, n, k, sh, fused, tp)]


def weight_accumulation(n: float, k: float, sh: Shard) -> float:
    """Bytes of main_grad an n x k weight's gradient GEMM reads and writes when it accumulates there
    (Megatron's gradient_accumulation_fusion, FP8 GEMMs alike: TE's general_gemm(out=main_grad,
    accumulate=True)): 2 x main_grad bytes per element (sim.model.compute.WGRAD_ACC_P); 0 without."""
    return 2.0 * sh.main_grad * n * k


def _linear(m: float, n: float, k: float, sh: Shard, fused: bool, tp: int) -> list[Kernel]:
    if not sh.fp8:
        return [gemm(m, n, k)._replace(tp=tp)]
    if sh.recipe is Recipe.TORCHAO:  # no norm emits FP8 fused; the weight is cast every micro-batch
        return [torchao_cast(m, n, k, sh.quant)._replace(tp=tp),
                gemm(m, n, k, fp8=True, operand=QUANTIZED[sh.quant])._replace(tp=tp)]
    if sh.quant is not Precision.FP8:  # MX / NVFP4: operands with block scales, no norm fusion
        operand = QUANTIZED[sh.quant]
        return [fp8_cast(m * k, m * n, False, operand)._replace(tp=tp),
                gemm(m, n, k, fp8=True, operand=operand)._replace(tp=tp)]
    return [fp8_cast(m * k, m * n, fused)._replace(tp=tp), gemm(m, n, k, fp8=True)._replace(tp=tp)]


def norm_and_residual(d: Dims, sh: Shard) -> list[Kernel]:
    if sh.eager:
        n = sh.norm_tokens * d.h
        return [eager(EAGER_RMSNORM, n), eager(EAGER_RESIDUAL, n)]
    nbytes = ELEM * sh.norm_tokens * d.h
    return [elementwise(3 * nbytes), elementwise(5 * nbytes)]  # layernorm; dropout + residual add


def rope(d: Dims, sh: Shard) -> list[Kernel]:
    """Rotary embedding of q and k as separate kernels: eager PyTorch's (torchtitan), or
    Megatron-Core's unfused path (:func:`megatron_rope`, ``training.rope_fusion = false``); the
    fused stacks apply it inside other kernels, not counted. MLA rotates only its qk_rope part."""
    if not sh.eager:
        return megatron_rope(d, sh.tokens, sh.tp) if not sh.rope_fused else []
    width = d.a * d.qk_rope + d.qk_rope if d.mla else (d.a + d.g) * d.dq
    return [eager(EAGER_ROPE, sh.tokens * width / sh.tp)._replace(count=2 * EAGER_ROPE[2])]


def entry_width(d: Dims, rotary_key: bool = True) -> int:
    """Elements per token the attention sublayer all-gathers under sequence parallelism:
    hidden for MHA; MLA gathers its latents instead (the q latent, or hidden when queries
    come straight from hidden, the kv latent and, with ``rotary_key``, the shared rotary key,
    which the column-parallel down projections and the up projections' own gather leave out)."""
    return (d.q_lora or d.h) + d.kv_lora + (d.qk_rope if rotary_key else 0) if d.mla else d.h


def attention_core(d: Dims, sh: Shard, kv_share: float = 1.0) -> Kernel:
    """QK^T and AV over ``kv_share`` of the keys: 2 * tokens * seq * heads * (d_qk + d_v) / tp
    FLOPs (the contract's attention term is 3x this); flash attention skips the causal
    upper half and runs at the flash-attention efficiency of the keys each query attends
    (:data:`sim.model.compute.ATTENTION_KERNEL`); without it the scores are batched GEMMs
    with the head dimension as their inner size. BF16 under FP8 too."""
    causal = 0.5 if sh.flash else 1.0
    keys = sh.seq * kv_share * causal
    flops = 4 * sh.tokens * keys * d.attn_width / sh.tp
    io = ELEM * sh.tokens * (d.a * (d.dq + d.dv) + d.kv_width) / sh.tp
    if not sh.flash:  # scores, mask, softmax, dropout written and read back (Megatron 2021)
        io += 4 * ELEM * sh.micro * d.a / sh.tp * (sh.tokens / sh.micro) * sh.seq * kv_share
        return Kernel(flops, min(d.dq, d.dv), io, 1, 2.0)
    return Kernel(flops, min(d.dq, d.dv), io, 1, 2.5, attn=1, keys=keys)


def _mla_projections(d: Dims, sh: Shard) -> list[Kernel]:
    """MLA's down projections (whole weights, on the sequence shard), latent norms, up projections."""
    down = linear(sh.norm_tokens, d.q_lora, d.h, sh) if d.q_lora else []
    return down + linear(sh.norm_tokens, d.kv_lora + d.qk_rope, d.h, sh) + _latent_norms(d, sh) + _mla_up(d, sh)


def _latent_norms(d: Dims, sh: Shard) -> list[Kernel]:  # q_a_layernorm, kv_a_layernorm
    return [elementwise(3 * ELEM * sh.norm_tokens * (d.q_lora + d.kv_lora))]


def mla_latent_widths(d: Dims) -> tuple[int, ...]:
    """The down projections' widths (q's with a q latent; kv's, kv latent and rotary key): with ``mla_down_proj =
    "column"`` (Megatron-Core 7094270c gpt_layer_specs.py) each a TEColumnParallelLinear (:func:`mla_column_down`)."""
    return ((d.q_lora,) if d.q_lora else ()) + (d.kv_lora + d.qk_rope,)


@lru_cache(maxsize=1024)
def mla_column_down(d: Dims, sh: Shard) -> tuple[tuple[Kernel, ...], ...]:  # (see mla_latent_widths)
    return tuple(tuple(linear(sh.tokens, w / sh.tp, d.h, sh, tp=1)) for w in mla_latent_widths(d))


def mla_column_pre(d: Dims, sh: Shard) -> tuple[Kernel, ...]:
    """The input norm and :func:`mla_column_down`: :func:`attention_pre` up to the latents' last-dim gather."""
    return tuple(norm_and_residual(d, sh)[:1]) + sum(mla_column_down(d, sh), ())


@lru_cache(maxsize=1024)
def mla_column_up(d: Dims, sh: Shard) -> tuple[Kernel, ...]:
    """The rest: the last-dim gathers' copies (mappings.py ``torch.cat``; SP: the kv latent split), norms, up, RoPE."""
    copy = 2 * ELEM * (sh.tokens * sum(mla_latent_widths(d)) + (sh.norm_tokens * d.kv_lora if sh.sp else 0))
    return tuple([Kernel(bytes=copy, count=len(mla_latent_widths(d)) + sh.sp, bwd=1.0)]
                 + _latent_norms(d, sh) + _mla_up(d, sh) + rope(d, sh))


def _mla_up(d: Dims, sh: Shard) -> list[Kernel]:
    """MLA's TP-split up projections (q from its latent, or from hidden without one; k and v)."""
    up = linear(sh.tokens, d.a * d.dq / sh.tp, d.q_lora or d.h, sh, fused=bool(d.q_lora), tp=1)
    return up + linear(sh.tokens, d.a * (d.qk_nope + d.dv) / sh.tp, d.kv_lora, sh, fused=True, tp=1)


@lru_cache(maxsize=1024)
def mla_up_recompute(d: Dims, sh: Shard) -> tuple[Kernel, ...]:
    """What ``training.recompute = "mla_up_proj"`` reruns before the attention core's backward:
    Megatron-Core's ``--recompute-modules mla_up_proj`` checkpoints ``qkv_up_proj_and_rope_apply``
    with ``CheckpointWithoutOutput`` (megatron/core/transformer/multi_latent_attention.py at
    7094270c): the up projections, the RoPE and the q / k / v assembly, whose outputs it discards
    after the core's forward. Local kernels here (``tp`` role 0: not chunked under TP-comm overlap);
    the up projections' input all-gather it reruns is sim/parallel/passes.py's."""
    return tuple(k._replace(tp=0) for k in _mla_up(d, sh) + rope(d, sh))


@lru_cache(maxsize=1024)
def attention_pre(d: Dims, sh: Shard) -> list[Kernel]:
    """Norm and the Q, K, V projections (MLA: down, norm, up)."""
    if d.mla and sh.mla_column:  # norm, the column down projections, then mla_column_up
        return mla_column_pre(d, sh) + mla_column_up(d, sh)
    norm = norm_and_residual(d, sh)[:1]
    if d.mla:
        return tuple(norm + _mla_projections(d, sh) + rope(d, sh))
    return tuple(norm + linear(sh.tokens, (d.a * d.dq + d.kv_width) / sh.tp, d.h, sh, fused=True, tp=1)
                 + rope(d, sh))


@lru_cache(maxsize=1024)
def attention_post(d: Dims, sh: Shard) -> list[Kernel]:
    """Output projection, dropout and residual."""
    return tuple(linear(sh.tokens, d.h, d.a * d.dv / sh.tp, sh, tp=2) + norm_and_residual(d, sh)[1:])


def mlp(d: Dims, sh: Shard, ffn: int | None = None, tokens: float | None = None,
        fused: bool = False) -> list[Kernel]:
    """MLP (gelu, relu2: 2 matrices, swiglu, geglu: 3) on ``tokens`` (default: the shard's);
    ``fused``: its input comes from a norm that emits FP8 (the dense MLP's FC1)."""
    return list(_mlp(d, sh, ffn or d.f, sh.tokens if tokens is None else tokens, fused))


@lru_cache(maxsize=8192)  # (an MoE layer asks once per expert, mostly for equal loads)
def _mlp(d: Dims, sh: Shard, f: int, t: float, fused: bool) -> tuple[Kernel, ...]:
    if t <= 0:
        return ()
    up = linear(t, (d.mats - 1) * f / sh.tp, d.h, sh, fused, tp=1)
    act = elementwise(ELEM * t * f / sh.tp * d.mats)  # gelu, relu2: read f, write f; gated: 2f, f
    if sh.eager and d.mats == 3:  # eager gating: the activation and the product apart
        act = eager(EAGER_SWIGLU, t * f / sh.tp)
    return tuple(up + [act] + linear(t, d.h, f / sh.tp, sh, tp=2))


@lru_cache(maxsize=1024)
def mlp_block(d: Dims, sh: Shard) -> list[Kernel]:
    """Norm, dense MLP, dropout and residual."""
    nr = norm_and_residual(d, sh)
    return tuple(nr[:1] + mlp(d, sh, fused=True) + nr[1:])


@lru_cache(maxsize=1024)  # (asked once per block and micro-batch of every rank built)
def op_recompute(d: Dims, sh: Shard) -> tuple[Kernel, ...]:
    """What torchtitan's per-op selective activation checkpointing recomputes of one dense
    block in backward (``training.recompute = "op"``; pytorch/torchtitan 9dec370
    parallelisms/parallelize_llama.py, and unchanged at 6fc499f llama3/infra/parallelize.py:
    ``_save_list`` = aten.mm, the SDPA kernels, reduce-scatter and max; the policy saves the
    ops in it "except every second mm" and prefers recomputing everything else). Its Llama
    block runs seven mm in order -- wq, wk, wv, wo, w1, w3, w2 (model.py ``Attention``,
    ``FeedForward``) -- so wk, wo and w3 are recomputed; the attention core is saved; every
    elementwise kernel (norms, RoPE, the gating, residuals, the FP8 casts -- only their amax,
    a ``max``, is saved) is recomputed. A quantized linear counts as an mm too: torchao's
    Float8Linear and MX linears call ``torch.mm`` on their tensor subclasses, and the
    checkpoint's dispatch mode sees that aten.mm before the subclass turns it into
    ``torch._scaled_mm``."""
    block = attention_pre(d, sh) + attention_post(d, sh) + mlp_block(d, sh)
    t = sh.tokens
    mms = [linear(t, d.g * d.dq / sh.tp, d.h, sh, tp=1), linear(t, d.h, d.a * d.dv / sh.tp, sh, tp=2),
           linear(t, d.f / sh.tp, d.h, sh, tp=1)]  # wk, wo, w3
    return tuple([k for k in block if not k.flops and not k.attn] + [k for mm in mms for k in mm if k.flops])


class Direction(StrEnum):
    """Which way a pass over a layer runs: its forward kernels, or :func:`backward` of them.
    The builders of :mod:`sim.parallel` pass it down a layer's pieces (the expert, context
    parallel and FSDP ops); its value ends their op names (``a2a_dispatch_fwd``)."""

    FWD = "fwd"
    BWD = "bwd"


def backward(kernels: list[Kernel] | tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """The backward pass of a forward kernel list."""
    return _backward(tuple(kernels))


@lru_cache(maxsize=1024)
def _backward(kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    return tuple(k.backward() for k in kernels)
