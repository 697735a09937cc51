"""Transformer costs: parameters, FLOPs and activation bytes, from the model section only.

FLOPs count a multiply-add as 2. Model FLOPs per token follow CONTRACT.md (PaLM appendix
B), with the attention term generalized to any head widths: 6 * (non-embedding active
parameters) + 6 * hidden * vocab + 6 * layers * seq_len * heads * (d_qk + d_v), which is
PaLM's 12 * layers * hidden * seq_len when d_qk = d_v = hidden / heads. Activation memory
follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), Table 2, with its attention tensors sized by the head widths and Transformer
Engine's FP8 copies of linear-layer inputs under FP8.

Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core
megatron/core/transformer/multi_latent_attention.py): queries come from a rank-q_lora_rank
latent (or straight from hidden), keys and values from a rank-kv_lora_rank latent plus a
shared qk_rope_head_dim rotary key; each of the heads attends with d_qk = qk_nope_head_dim +
qk_rope_head_dim and d_v = v_head_dim.

    python -c "from sim.model import transformer as t; from sim.input.presets import model_preset; \\
from sim.input.scenario import Model; d = t.dims(Model(**model_preset('deepseek-v3'))); \\
print(t.total_params(d) / 1e9, t.active_params(d) / 1e9)"
"""

from dataclasses import dataclass

from ..input.choices import Attention, Mlp, Recompute
from ..input.scenario import Model

GATED = (Mlp.SWIGLU, Mlp.GEGLU)  # three-matrix MLPs: a gate, an up and a down projection


@dataclass(frozen=True)
class Dims:
    """The sizes the formulas need, resolved from a Model section."""

    layers: int
    h: int  # hidden
    a: int  # attention heads
    g: int  # kv heads (MLA: one per query head)
    f: int  # ffn hidden (dense MLP)
    v: int  # vocab
    mats: int  # weight matrices per MLP: 2 (gelu, relu2) or 3 (swiglu, geglu)
    experts: int = 0
    top_k: int = 0
    f_expert: int = 0
    shared: int = 0
    dense_layers: int = 0
    head_dim: int = 0  # per-head width of q, k, v (0: hidden / heads); MLA uses the fields below
    q_lora: int = 0  # MLA query latent rank (0: queries projected straight from hidden)
    kv_lora: int = 0  # MLA key/value latent rank (0: not MLA)
    qk_nope: int = 0  # MLA per-head q/k width without rotary embedding
    qk_rope: int = 0  # MLA per-head q/k rotary width (the rotary key is shared by all heads)
    v_dim: int = 0  # MLA per-head value width
    mtp: int = 0  # multi-token-prediction depths (each one more transformer layer, after the last)

    @property
    def mla(self) -> bool:
        """Multi-head latent attention."""
        return self.kv_lora > 0

    @property
    def dq(self) -> int:
        """Per-head width of queries and keys."""
        return self.qk_nope + self.qk_rope if self.mla else (self.head_dim or self.h // self.a)

    @property
    def dv(self) -> int:
        """Per-head width of values (and of the attention output)."""
        return self.v_dim if self.mla else (self.head_dim or self.h // self.a)

    @property
    def d(self) -> int:
        """Head dimension of queries and keys."""
        return self.dq

    @property
    def attn_width(self) -> int | float:
        """heads * (d_qk + d_v) / 2: the width the attention core works at (hidden for
        plain multi-head attention), an int whenever it is whole."""
        return _ratio(self.a * (self.dq + self.dv), 2)

    @property
    def kv_width(self) -> int:
        """Elements of K and V per token (all kv heads)."""
        return self.g * (self.dq + self.dv)


def _ratio(num: int, den: int) -> int | float:
    """num / den, an int when exact (keeps plain models' arithmetic in integers)."""
    return num // den if num % den == 0 else num / den


def dims(m: Model) -> Dims:
    """Resolve defaults (kv_heads = heads, ffn = 4h, head_dim = h / heads) into plain numbers."""
    mats = 3 if m.mlp in GATED else 2
    f = m.ffn_hidden or 4 * m.hidden
    attn = {"head_dim": m.head_dim or m.hidden // m.heads}
    if m.attention is Attention.MLA:
        attn = {"q_lora": m.q_lora_rank or 0, "kv_lora": m.kv_lora_rank, "qk_nope": m.qk_nope_head_dim,
                "qk_rope": m.qk_rope_head_dim, "v_dim": m.v_head_dim}
    base = Dims(m.layers, m.hidden, m.heads, m.kv_heads or m.heads, f, m.vocab, mats, **attn, mtp=m.mtp_layers)
    if m.moe is None:
        return base
    moe = m.moe
    return Dims(**{**base.__dict__, "experts": moe.experts, "top_k": moe.top_k,
                   "f_expert": moe.expert_ffn_hidden or f, "shared": moe.shared_experts,
                   "dense_layers": moe.dense_layers})


def is_moe_layer(d: Dims, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) has an MoE MLP."""
    return d.experts > 0 and layer >= d.dense_layers


def attention_params(d: Dims) -> int:
    """Projections (no biases) plus the layer's two norms. MHA/GQA: Q, K, V, output. MLA
    (DeepSeek-V3's config.json names): q_a_proj + q_a_layernorm + q_b_proj (or q_proj),
    kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj, o_proj."""
    out = d.a * d.dv * d.h + 2 * d.h
    if not d.mla:
        return d.h * (d.a * d.dq + d.kv_width) + out
    q = d.q_lora * (d.h + 1 + d.a * d.dq) if d.q_lora else d.h * d.a * d.dq
    kv = d.h * (d.kv_lora + d.qk_rope) + d.kv_lora * (1 + d.a * (d.qk_nope + d.dv))
    return q + kv + out


def attention_replicated_params(d: Dims) -> int:
    """Attention parameters every TP rank holds whole: Megatron-Core builds MLA's down
    projections as ``TELinear(parallel_mode='duplicated')`` (gpt_layer_specs.py); 0 for MHA."""
    if not d.mla:
        return 0
    return d.q_lora * (d.h + 1) + d.h * (d.kv_lora + d.qk_rope) + d.kv_lora


def mlp_params(d: Dims, layer: int, active: bool) -> int:
    """MLP weights of one layer: all experts, or only the ``top_k`` active ones."""
    if not is_moe_layer(d, layer):
        return d.mats * d.h * d.f
    n = (d.top_k if active else d.experts) + d.shared
    return n * d.mats * d.h * d.f_expert + d.h * d.experts  # + router


def layer_params(d: Dims, layer: int, active: bool = False) -> int:
    """Parameters of one transformer layer."""
    return attention_params(d) + mlp_params(d, layer, active)


def non_embedding_params(d: Dims, active: bool = False) -> int:
    """All layers plus the final norm."""
    return sum(layer_params(d, i, active) for i in range(d.layers)) + d.h


def mtp_params(d: Dims, active: bool = False) -> int:
    """Unique parameters of the multi-token-prediction depths (DeepSeek-V3 README_WEIGHTS.md;
    Megatron-Core multi_token_prediction.py): per depth enorm, hnorm, eh_proj (2h -> h), a
    transformer layer like the main model's last and a final norm; the embedding and the
    output head are the main model's. DeepSeek-V3: 11.5B unique (ours 11.6B)."""
    return d.mtp * (layer_params(d, d.layers, active) + 2 * d.h * d.h + 3 * d.h)


def main_params(d: Dims, tied: bool = False) -> int:
    """The main model's parameters, embeddings included (a model card's total)."""
    return non_embedding_params(d) + d.v * d.h * (1 if tied else 2)


def total_params(d: Dims, tied: bool = False) -> int:
    """Every parameter trained: the main model plus its MTP depths."""
    return main_params(d, tied) + mtp_params(d)


def active_params(d: Dims) -> int:
    """Parameters a token's matmuls use (6ND's N): the active non-embedding ones plus the
    output layer (the input embedding is a lookup). DeepSeek-V3: 36.6B, where its
    README_WEIGHTS.md gives 36.7B activated."""
    return non_embedding_params(d, active=True) + d.h * d.v


def model_flops_per_token(d: Dims, seq_len: int) -> float:
    """CONTRACT.md / PaLM appendix B: 6N_active + 6hV + 6 L s heads (d_qk + d_v), which is
    PaLM's 12 L h s for plain attention (recompute not counted). Each MTP depth is the same
    work again for its layer, its eh_proj and its pass through the output head."""
    blocks = d.layers + d.mtp
    return (6 * (non_embedding_params(d, active=True) + mtp_params(d, active=True)) + 6 * d.h * d.v * (1 + d.mtp)
            + 12 * blocks * d.attn_width * seq_len)


def _saved_units(d: Dims, fp8: bool) -> tuple[int | float, int | float]:
    """(kept, split): bytes a layer saves per token, in units of hidden; ``split`` is divided
    by TP, ``kept`` only by sequence parallelism. Korthikanti et al. Table 2 (a GPT layer):
    kept 10 (two norm inputs 4, QKV and FC1 inputs 2 each, two dropout masks 2), split 24
    (Q, K, V, projection input 2 each at the head widths; GeLU input 8, FC2 input 8).
    MLA adds its latents (each a norm input and an up-projection input). FP8 (Transformer
    Engine: transformer_engine/pytorch/module/linear.py saves the FP8 input of each linear
    layer): QKV and FC1 inputs 1 (fused norm emits FP8; MLA's two separate down projections
    each keep an FP8 copy, 2), FC2 input 4, and the projection keeps an FP8 copy beside
    flash attention's BF16 output (3 at the value width)."""
    attn = _ratio(4 * d.a * d.dq + (5 if fp8 else 4) * d.a * d.dv, d.h)
    kept = 10 - (0 if not fp8 else 1 if d.mla else 2)
    if d.mla:
        kept += _ratio((3 if fp8 else 4) * (d.q_lora + d.kv_lora), d.h)
    return kept, (12 if fp8 else 16) + attn


def activation_bytes_per_layer(d: Dims, seq: int, micro: int, tp: int, sp: bool, recompute: Recompute,
                               flash: bool, fp8: bool = False) -> float:
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al. 2022, Table 2;
    ``"op"``: what torchtitan's per-op checkpointing saves, sim/model/layers.py op_recompute --
    the block's input, the SDPA output and the outputs of the odd mm: wq, wv, w1, w2)."""
    if recompute == Recompute.OP:  # (==: the planner's tables hold the values)
        width = d.h + d.a * d.dv + d.a * d.dq + d.g * d.dv + d.f + d.h
        return 2 * seq * micro * width / tp
    sbh = seq * micro * d.h
    scores = 0 if flash else 5 * d.a * seq / d.h  # attention scores + softmax + dropout mask
    if recompute == Recompute.FULL:
        return 2 * sbh / (tp if sp else 1)  # only the layer input
    if recompute == Recompute.SELECTIVE:
        scores = 0
    kept, split = _saved_units(d, fp8)
    if recompute == Recompute.MLA_UP_PROJ:  # Q, K, V discarded after the core's forward (layers.py mla_up_recompute)
        split -= _ratio(4 * d.a * d.dq + 2 * d.a * d.dv, d.h)
    if sp:
        return sbh * (kept + split + scores) / tp
    return sbh * (kept + (split + scores) / tp)
