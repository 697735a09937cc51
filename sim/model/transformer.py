"""Transformer costs: parameters, FLOPs and activation bytes, from the model section only.

FLOPs count a multiply-add as 2. Model FLOPs per token follow CONTRACT.md (PaLM appendix
B): 6 * (non-embedding active parameters) + 6 * hidden * vocab + 12 * layers * hidden *
seq_len. Activation memory follows Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), Table 2.
"""

from dataclasses import dataclass

from ..input.scenario import Model


@dataclass(frozen=True)
class Dims:
    """The sizes the formulas need, resolved from a Model section."""

    layers: int
    h: int  # hidden
    a: int  # attention heads
    g: int  # kv heads
    f: int  # ffn hidden (dense MLP)
    v: int  # vocab
    mats: int  # weight matrices per MLP: 2 (gelu) or 3 (swiglu)
    experts: int = 0
    top_k: int = 0
    f_expert: int = 0
    shared: int = 0
    dense_layers: int = 0

    @property
    def d(self) -> int:
        """Head dimension."""
        return self.h // self.a


def dims(m: Model) -> Dims:
    """Resolve defaults (kv_heads = heads, ffn = 4h) into plain numbers."""
    mats = 3 if m.mlp == "swiglu" else 2
    f = m.ffn_hidden or 4 * m.hidden
    base = Dims(m.layers, m.hidden, m.heads, m.kv_heads or m.heads, f, m.vocab, mats)
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
    """Q, K, V and output projections (no biases) plus the layer's two norms."""
    return d.h * (d.h + 2 * d.g * d.d) + d.h * d.h + 2 * d.h


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


def total_params(d: Dims, tied: bool = False) -> int:
    """Every parameter, embeddings included."""
    return non_embedding_params(d) + d.v * d.h * (1 if tied else 2)


def model_flops_per_token(d: Dims, seq_len: int) -> float:
    """CONTRACT.md / PaLM appendix B: 6N_active + 6hV + 12 L h s (recompute not counted)."""
    return 6 * non_embedding_params(d, active=True) + 6 * d.h * d.v + 12 * d.layers * d.h * seq_len


def activation_bytes_per_layer(d: Dims, seq: int, micro: int, tp: int, sp: bool, recompute: str,
                               flash: bool) -> float:
    """Bytes one layer keeps for backward per micro-batch (Korthikanti et al. 2022, Table 2)."""
    sbh = seq * micro * d.h
    scores = 0 if flash else 5 * d.a * seq / d.h  # attention scores + softmax + dropout mask
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)  # only the layer input
    if recompute == "selective":
        scores = 0
    if sp:
        return sbh * (34 + scores) / tp
    return sbh * (10 + (24 + scores) / tp)
