"""Hugging Face ``config.json`` -> model fields: the key mapping only (presets.py reads files).

Architectures covered (transformers key names): Llama 3.x and Mistral (``hidden_act`` silu:
SwiGLU), Mixtral (``num_local_experts``), Qwen3 (``head_dim`` 128 with hidden 4096 and 64
heads) and Qwen3-MoE (``num_experts``, ``moe_intermediate_size``), DeepSeek-V2/V3
(``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, and MLA:
``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
``v_head_dim``), Nemotron (``hidden_act`` relu2) and GPT-2 (``n_layer``, ``n_embd``, ...).
DeepSeek-V3's multi-token-prediction depths (``num_nextn_predict_layers``) become
``mtp_layers``: trained with the model (DeepSeek-V3 report section 2.2; Megatron-Core and
NeMo's DeepSeek-V3 recipe build them), though not part of the main model's 671B. Keys that
change no cost here (rope_theta, norm eps, ...) are ignored. A layer pattern the simulator cannot express (MoE only every n-th
layer, dense layers in the middle) is an InputError, never a silent approximation.

    python -c "from sim.input.presets import model_preset; print(model_preset('qwen3-235b-a22b'))"
"""

from ..errors import InputError
from .choices import Mlp

KEY = "model.hf_config"

_CORE = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
         "num_key_value_heads": "kv_heads", "intermediate_size": "ffn_hidden", "vocab_size": "vocab",
         "n_layer": "layers", "n_embd": "hidden", "n_head": "heads", "n_inner": "ffn_hidden"}
_MLA = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# hidden_act -> mlp. Ungated two-matrix MLPs (gelu, relu, relu2) move the same bytes; silu
# in these architectures is SwiGLU (gate, up, down projections).
_ACTS = {"silu": Mlp.SWIGLU, "swish": Mlp.SWIGLU, "swiglu": Mlp.SWIGLU, "relu2": Mlp.RELU2, "gelu": Mlp.GELU,
         "gelu_new": Mlp.GELU, "gelu_fast": Mlp.GELU, "gelu_pytorch_tanh": Mlp.GELU, "quick_gelu": Mlp.GELU,
         "relu": Mlp.GELU}
_GATED = ("gemma", "gemma2", "gemma3_text")  # gated MLPs (GeGLU with a gelu act): three matrices


def _typed(cfg: dict, key: str, kind: type, origin: str, default=None):
    """``cfg[key]`` when it is a JSON value of ``kind`` (a whole number is no bool and no
    float: ``1.7`` layers or ``"two"`` MTP depths are refused, never truncated or guessed);
    ``default`` when absent or null."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
        want = {int: "a whole number", bool: "true or false", str: "a string", list: "a list"}[kind]
        raise InputError(KEY, f"{origin}: {key} = {value!r} is not {want}")
    return value


def model_fields(cfg: dict, origin: str) -> dict:
    """Model-section fields of a parsed ``config.json`` (``origin`` names it in errors)."""
    if not isinstance(cfg, dict):
        raise InputError(KEY, f"{origin}: expected a JSON object, got {type(cfg).__name__}")
    fields = {ours: _typed(cfg, theirs, int, origin) for theirs, ours in _CORE.items() if cfg.get(theirs) is not None}
    missing = {"layers", "hidden", "heads", "vocab"} - fields.keys()
    if missing:
        raise InputError(KEY, f"{origin} lacks {', '.join(sorted(missing))}")
    fields.update(attention_fields(cfg, origin))
    fields["mlp"] = mlp_kind(cfg, origin)
    fields["name"] = _typed(cfg, "_name_or_path", str, origin) or _typed(cfg, "model_type", str, origin) or origin
    fields["tied_embeddings"] = _typed(cfg, "tie_word_embeddings", bool, origin, False)
    if _typed(cfg, "num_nextn_predict_layers", int, origin):
        fields["mtp_layers"] = cfg["num_nextn_predict_layers"]
    moe = moe_fields(cfg, origin)
    if moe:
        fields["moe"] = moe
    return fields


def attention_fields(cfg: dict, origin: str) -> dict:
    """``head_dim`` for multi-head attention; ``attention = "mla"`` and its ranks when the
    config has a key/value latent (DeepSeek-V2/V3, whose ``head_dim``, if any, is not ours)."""
    if _typed(cfg, "kv_lora_rank", int, origin) is None:
        head_dim = _typed(cfg, "head_dim", int, origin)
        return {"head_dim": head_dim} if head_dim is not None else {}
    absent = [k for k in _MLA[1:] if cfg.get(k) is None]
    if absent:
        raise InputError(KEY, f"{origin} has kv_lora_rank (MLA) but lacks {', '.join(absent)}")
    return {"attention": "mla", **{k: _typed(cfg, k, int, origin) for k in _MLA}}


def mlp_kind(cfg: dict, origin: str) -> str:
    """``mlp`` from ``hidden_act`` (GPT-2: ``activation_function``; default gelu)."""
    act = _typed(cfg, "hidden_act", str, origin) or _typed(cfg, "activation_function", str, origin, "gelu")
    if act not in _ACTS:
        raise InputError(KEY, f"{origin}: hidden_act {act!r} is not one of {', '.join(sorted(_ACTS))}")
    kind = _ACTS[act]
    gated = cfg.get("model_type") in _GATED
    # a plain value, as TOML gives: the schema makes it a member
    return str(Mlp.GEGLU if gated and kind is Mlp.GELU else kind)


def moe_fields(cfg: dict, origin: str) -> dict:
    """The ``[model.moe]`` table, or {} for a dense model."""
    experts = next((_typed(cfg, k, int, origin) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if cfg.get(k)), 0)
    if not experts:
        return {}
    _check_layer_pattern(cfg, origin)
    moe = {"experts": experts, "top_k": _typed(cfg, "num_experts_per_tok", int, origin, 2), "routing": "token_choice"}
    if cfg.get("moe_intermediate_size") is not None:
        moe["expert_ffn_hidden"] = _typed(cfg, "moe_intermediate_size", int, origin)
    shared = shared_experts(cfg, origin)
    if shared:
        moe["shared_experts"] = shared
    if _typed(cfg, "first_k_dense_replace", int, origin):
        moe["dense_layers"] = cfg["first_k_dense_replace"]
    return moe


def shared_experts(cfg: dict, origin: str) -> int:
    """DeepSeek's ``n_shared_experts``, or Qwen2-MoE's one shared expert of
    ``shared_expert_intermediate_size`` as that many routed-expert widths."""
    if _typed(cfg, "n_shared_experts", int, origin):
        return cfg["n_shared_experts"]
    size = _typed(cfg, "shared_expert_intermediate_size", int, origin)
    unit = _typed(cfg, "moe_intermediate_size", int, origin)
    if not size:
        return 0
    if not unit or size % unit:
        raise InputError(KEY, f"{origin}: shared_expert_intermediate_size = {size} is not a multiple of "
                              f"moe_intermediate_size = {unit} (shared experts are modelled at the expert width)")
    return size // unit


def _check_layer_pattern(cfg: dict, origin: str) -> None:
    """MoE in every layer after the first ``first_k_dense_replace``: nothing else."""
    for key, every in (("moe_layer_freq", 1), ("decoder_sparse_step", 1)):
        if _typed(cfg, key, int, origin, every) != every:
            raise InputError(KEY, f"{origin}: {key} = {cfg[key]} (MoE only every few layers) is not modelled; "
                                  "MoE layers must follow the leading dense ones without gaps")
    if _typed(cfg, "mlp_only_layers", list, origin):
        raise InputError(KEY, f"{origin}: mlp_only_layers = {cfg['mlp_only_layers']} (dense layers among MoE "
                              "layers) is not modelled")
