"""The kernels of an MoE layer's own work on one rank, per micro-batch: the router, the token
dispatcher's memory passes (permute, local sort, unpermute) and the local experts' MLPs, one
after the other or grouped. The dense layer's kernels they reuse (norms, linears, the MLP) are
:mod:`sim.model.layers`; the expert-parallel builder that places them between the all-to-alls
is :mod:`sim.parallel.ep`."""

from functools import lru_cache

from ..input.choices import Precision, Recipe
from .compute import LAUNCH_S, Kernel, elementwise, gemm
from .layers import ELEM, Shard, mlp, norm_and_residual
from .transformer import Dims

# The token dispatcher's memory passes (Megatron-Core core_v0.12.0 token_dispatcher.py,
# MoEAlltoAllTokenDispatcher; moe_utils.py permute/unpermute/sort_chunks_by_idxs): before the
# all-to-all, ``permute`` copies each token once per chosen expert (read T*h, write T*k*h);
# after it, with more than one local expert, the received tokens are re-sorted by local
# expert (a transpose-contiguous under drop-and-pad, sort_chunks_by_idxs otherwise: read and
# write them all) and sorted back after the experts; after the combine, ``unpermute``
# reads the k copies with their probabilities and writes T*h. Backward: the same copies in
# reverse, and unpermute's gradient also reads the forward copies for the probabilities'
# gradient.
#
# Fused or not (scenario ``parallel.moe_permute_fusion``, Megatron-Core's TransformerConfig field,
# default False): fused, Transformer Engine's ``moe_permute`` / ``moe_unpermute`` gather through a
# row map and stream these bytes at :data:`~sim.model.compute.HBM_EFFICIENCY`; unfused,
# moe_utils.py runs them as PyTorch operators -- ``argsort`` of the routing map,
# ``tokens.index_select`` (its backward ``index_add_``, atomic adds), the probabilities
# ``masked_select``-ed and multiplied in, ``scatter_add_`` back to the tokens (atomic adds) -- and
# the same bytes move at :data:`UNFUSED_PERMUTE_SHARE` of the HBM bandwidth, the rate measured.
# The measurement (bench/gpu_measure_permute.py, bench/measured/h200-2026-11-26-permute.json,
# ``profile``, layout grok1): one H200, Megatron-Core's unfused passes forward + backward on 1,024
# routed tokens of 6,144, top 2 of 8, BF16 probabilities (Megatron's default ``moe_router_dtype``
# None, as the Grok-1 and Primus Mixtral runs): 0.3235 ms of device time, where these kernels move
# 2 x 1,024 x 6,144 x (4 + 5 x 2) bytes. Its share of the H200's 4.8 TB/s, launches taken out
# (the six the model charges, 1 forward and 2 backward per kernel), carries to other GPUs as a
# share of their HBM bandwidth (an assumption: atomics and gathers bound by the memory system).
# With fp32 probabilities (NeMo's ``moe_router_dtype = 'fp32'``, DeepSeek-V3) the same file
# measures 3.18 ms at DeepSeek-V3's shape and 1.89 ms at Qwen3's, 1.45-1.5x this rate's time
# (the fp32 promotion of the permuted tokens): not modelled, no scenario key carries the dtype.
UNFUSED_PERMUTE_MEASURED = {"tokens": 1024, "h": 6144, "top_k": 2, "seconds": 323.4956e-6,
                            "hbm_bw": 4800e9}  # h200-2026-11-26-permute.json profile[grok1]; H200 preset


def permute_bytes(h: int, top_k: int, tokens: float) -> float:
    """HBM bytes of :func:`permute` and :func:`unpermute`, forward and backward together."""
    return ELEM * tokens * h * (4 + 5 * top_k)


UNFUSED_PERMUTE_SHARE = permute_bytes(UNFUSED_PERMUTE_MEASURED["h"], UNFUSED_PERMUTE_MEASURED["top_k"],
                                      UNFUSED_PERMUTE_MEASURED["tokens"]) / (
    UNFUSED_PERMUTE_MEASURED["hbm_bw"] * (UNFUSED_PERMUTE_MEASURED["seconds"] - 6 * LAUNCH_S))


def permute(d: Dims, tokens: float, fused: bool = True) -> Kernel:
    """Copy each routed token to its top-k experts' send buffer (and back, backward);
    ``fused``: Transformer Engine's kernel, else Megatron-Core's PyTorch operators."""
    return Kernel(bytes=ELEM * tokens * d.h * (1 + d.top_k), bwd=1.0, hbm_share=0.0 if fused else UNFUSED_PERMUTE_SHARE)


def unpermute(d: Dims, tokens: float, fused: bool = True) -> tuple[Kernel, ...]:
    """Weigh the k returned copies by their probabilities and sum them per token (``fused``:
    as :func:`permute`)."""
    return (Kernel(bytes=ELEM * tokens * d.h * (1 + d.top_k), bwd=(1 + 2 * d.top_k) / (1 + d.top_k),
                   hbm_share=0.0 if fused else UNFUSED_PERMUTE_SHARE),)


def local_sort(n_local: int, received: float, width: float) -> list[Kernel]:
    """Re-sorting the ``received`` dispatched tokens (``width`` elements each) by local
    expert: nothing with one local expert."""
    return [Kernel(bytes=2 * ELEM * received * width, bwd=1.0)] if n_local > 1 else []


# The router's routing and aux-loss kernels are many small launches on tokens x experts scores:
# Megatron-Core's TopKRouter (megatron/core/transformer/moe/router.py ``routing``, moe_utils.py
# ``topk_softmax_with_capacity``, ``group_limited_topk``, ``sequence_load_balancing_loss_func``)
# runs each step as its own PyTorch op -- score function, top-k (per group, then within the chosen
# groups), gather, normalization, scaling, the scatters into probabilities and routing map, the
# aux loss's own scores, top-k and token counts. Megatron-Core's DeepSeek-V3 write-up
# (NVIDIA/Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, section 2.1.4, "Kernel
# Fusion in the Router Part") counted 72 kernels in the router part, 31 with
# ``--moe-router-fusion`` (TE PR 1883), 17 with DeepEP's fused preprocess. ``router_kernels``
# (scenario ``model.moe.router_kernels``) is that count without the gating GEMM; they move the
# scores' bytes between them (3 fp32 passes over tokens x experts, as the fused kernel). The
# backward follows :meth:`Kernel.backward` (two launches per forward launch: an assumption, the
# write-up counts the forward).


@lru_cache(maxsize=1024)
def router(d: Dims, sh: Shard, launches: int = 1) -> list[Kernel]:
    """Norm, router logits, the routing and aux-loss kernels (fp32 scores, tokens x experts,
    in ``launches`` kernel launches) and the permutation of an MoE layer's tokens into the
    dispatch buffer."""
    scores = elementwise(3 * 4 * sh.tokens * d.experts, count=launches)
    return tuple(norm_and_residual(d, sh)[:1] + [gemm(sh.tokens, d.experts, d.h), scores,
                                                   permute(d, sh.tokens, sh.fused_permute)])


def routed_experts(d: Dims, sh: Shard, local_loads: tuple[float, ...], scale: int = 1) -> list[Kernel]:
    """The local experts' MLPs on the tokens each received (x ``scale`` when an expert-tp
    group gathered them), sorted by local expert before and back after; one expert after the
    other (Megatron-Core's SequentialMLP), or with ``sh.grouped_gemm`` as one grouped MLP
    (:func:`grouped_mlp`)."""
    sort = local_sort(len(local_loads), scale * sum(local_loads), d.h)
    each = {load: mlp(d, sh, d.f_expert, load * scale) for load in set(local_loads)}  # (equal loads: one list)
    if sh.grouped_gemm:
        return sort + grouped_mlp([each[load] for load in local_loads if load > 0], split_quantize(sh)) + sort
    return sort + [k for load in local_loads for k in each[load]] + sort


def split_quantize(sh: Shard) -> bool:
    """Whether Transformer Engine's ``split_quantize`` launches one quantize kernel per expert for a
    grouped linear's input (and output gradient): every recipe but delayed scaling, whose quantizers
    alone take the fused ``nvte_multi_cast_transpose`` (TransformerEngine release_v2.9
    transformer_engine/pytorch/csrc/extensions/cast.cpp ``multi_tensor_quantize_impl``: "Quantize
    kernels individually" otherwise). Here: MXFP8 and NVFP4 under ``training.fp8_recipe = "te"``
    (``fp8`` with it is delayed scaling, sim/model/delayed_scaling.py)."""
    return sh.fp8 and sh.recipe is Recipe.TE and sh.quant is not Precision.FP8


def grouped_mlp(per_expert: list, per_split: bool = False) -> list[Kernel]:
    """The experts' MLPs (kernel lists of one shape) as Megatron-Core's TEGroupedMLP runs them
    (Megatron-LM 1e057005 moe/experts.py: fc1, one activation over all tokens, fc2), each linear one
    Transformer Engine GroupedLinear call launching a cuBLAS GEMM per expert from C++ (TE 07afda98
    common/gemm/cublaslt_gemm.cu ``nvte_multi_stream_cublas_gemm``): every GEMM after the first is
    ``grouped`` (host cost: sim/model/host.py), each memory-bound kernel one launch of the summed bytes
    -- but with ``per_split`` (:func:`split_quantize`) a linear's quantize kernel (the memory-bound
    kernel right before its GEMM) is one launch per expert: the first expert's, then the others'
    as one ``grouped`` kernel of ``E - 1`` launches (host: ``SPLIT_QUANTIZE_S`` each)."""
    out: list[Kernel] = []
    kinds = per_expert[0] if per_expert else ()
    for i, same in enumerate(zip(*per_expert)):
        first = same[0]
        if first.flops:
            out += [first] + [k._replace(grouped=True) for k in same[1:]]
        elif per_split and len(same) > 1 and i + 1 < len(kinds) and kinds[i + 1].flops:
            out += [first, first._replace(bytes=sum(k.bytes for k in same[1:]), count=len(same) - 1, grouped=True)]
        else:
            out.append(first._replace(bytes=sum(k.bytes for k in same)))
    return out


@lru_cache(maxsize=1024)
def experts(d: Dims, sh: Shard, local_loads: tuple[float, ...]) -> list[Kernel]:
    """The local experts' routed MLPs (:func:`routed_experts`), plus shared experts."""
    kernels = routed_experts(d, sh, local_loads)
    for _ in range(d.shared):
        kernels += mlp(d, sh, d.f_expert)
    return tuple(kernels + norm_and_residual(d, sh)[1:])
