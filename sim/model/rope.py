"""Megatron-Core's unfused rotary embedding (``training.rope_fusion = false``): the kernels
sim/model/layers.py ``rope`` puts after the Q/K projections when the stack runs RoPE as plain
PyTorch operators instead of one fused kernel."""

from .compute import Kernel
from .eager import eager
from .transformer import Dims


# Megatron-Core's unfused RoPE (TransformerConfig.apply_rope_fusion = False, which NeMo's
# DeepSeekConfig sets: NVIDIA/NeMo 7a8f1cc nemo/collections/llm/gpt/model/deepseek.py; NeMo 25.04
# pins Megatron-Core 7094270c, core_r0.12.0). megatron/core/models/common/embeddings/rope_utils.py
# ``_apply_rotary_pos_emb_bshd`` on each rotated tensor t, in bf16 elements read + written per
# element of t (the tuples below: bytes, 2 an element): MLA's de-interleave
# ``cat((t[..., 0::2], t[..., 1::2]))`` 1+1 (MLA only), ``t * cos_`` 1+1, ``_rotate_half``: ``-x2`` 0.5+0.5 and ``cat((-x2, x1))`` 1+1, ``* sin_`` 1+1,
# the sum 2+1, ``cat((t, t_pass))`` 1+1: 12 (14 with MLA), in 6 launches on t (7) and 6 on the
# [s, 1, 1, d] frequencies (cos, sin, each scaled by mscale and cast); backward per element: the
# two products' gradients 2 + 2, the negation's 1, the halves' gradients put together (chunk's
# backward) 2, the two paths summed 3 = 10, and with MLA the two strided slices' gradients
# scattered back and summed 1 + 1 + 3 = 17.
MEGATRON_ROPE = (2 * 12, 2 * 10, 12)  # (forward bytes, backward bytes, forward launches), as EAGER_ROPE
MEGATRON_ROPE_MLA = (2 * 14, 2 * 17, 13)
# MLA's q / k / v assembly after the up projections (megatron/core/transformer/
# multi_latent_attention.py at 7094270c, ``qkv_up_proj_and_rope_apply``): ``query =
# torch.cat([q_no_pe, q_pos_emb])`` reads and writes a * (qk_nope + qk_rope) per token, ``key =
# torch.cat([k_no_pe, k_pos_emb.expand(...)])`` reads a * qk_nope (the broadcast rotary key is one
# vector a token) and writes a * (qk_nope + qk_rope), ``value.contiguous()`` reads and writes a * dv
# (a strided slice of kv): a * (4 qk_nope + 3 qk_rope + 2 dv) elements in 3 launches. Backward the
# same: the q and kv splits' gradients put together, a * 2 (qk_nope + qk_rope) and
# a * 2 (qk_nope + dv), and the expanded key's gradient summed over heads, a * qk_rope.
# The later fused MLA RoPE (the "Yarn RoPE fusion" of Megatron-LM's DeepSeek-V3 GB200 write-up,
# section 1) writes q and k in place of all three, so this runs with the unfused RoPE only.
MLA_ASSEMBLY = (2, 2, 3)  # as the eager specs, per element read or written: bf16, 2 bytes each way; 3 launches


def mla_assembly_elements(d: Dims) -> int:
    """Elements per token and head :data:`MLA_ASSEMBLY` reads and writes (forward and backward)."""
    return 4 * d.qk_nope + 3 * d.qk_rope + 2 * d.dv


def megatron_rope(d: Dims, tokens: float, tp: int) -> list[Kernel]:
    """Megatron-Core's unfused RoPE on q and k of ``tokens`` tokens, heads / ``tp`` of them (MLA:
    q's qk_rope part and the one shared rotary key a token, then the q / k / v assembly)."""
    heads = d.a / tp
    if not d.mla:
        return [eager(MEGATRON_ROPE, tokens * (heads + d.g / tp) * d.dq)._replace(count=2 * MEGATRON_ROPE[2])]
    rotary = eager(MEGATRON_ROPE_MLA, tokens * (heads + 1) * d.qk_rope)._replace(count=2 * MEGATRON_ROPE_MLA[2])
    return [rotary, eager(MLA_ASSEMBLY, tokens * heads * mla_assembly_elements(d))]
