"""Model presets and Hugging Face config import.

Each preset cites its source. Fields follow :class:`sim.input.scenario.Model`.
"""

import json
from pathlib import Path

from .. import bounds
from ..errors import InputError

MODELS: dict[str, dict] = {}


def _register(name: str, **fields) -> None:
    if name in MODELS:
        raise ValueError(f"duplicate model preset {name}")
    MODELS[name] = {"name": name, **fields}


# GPT-3 175B: Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads);
# vocab 51200 as in Megatron-LM's GPT-2 BPE padding (Narayanan et al. 2021).
_register("gpt3-175b", layers=96, hidden=12288, heads=96, ffn_hidden=49152, vocab=51200, mlp="gelu")
# Megatron GPT sizes of Narayanan et al. 2021 Table 1 (vocab 51200).
_register("gpt-1.7b", layers=24, hidden=2304, heads=24, ffn_hidden=9216, vocab=51200)
_register("gpt-7.5b", layers=36, hidden=4096, heads=32, ffn_hidden=16384, vocab=51200)
_register("gpt-39b", layers=48, hidden=8192, heads=64, ffn_hidden=32768, vocab=51200)
_register("gpt-146b", layers=80, hidden=12288, heads=96, ffn_hidden=49152, vocab=51200)
_register("gpt-530b", layers=105, hidden=20480, heads=128, ffn_hidden=81920, vocab=51200)
# Megatron-Core GPT sizes of the Megatron-LM README scaling table (vocab 131072).
_register("mcore-gpt-1.7b", layers=24, hidden=2048, heads=16, ffn_hidden=8192, vocab=131072)
_register("mcore-gpt-16b", layers=32, hidden=6144, heads=48, ffn_hidden=24576, vocab=131072)
_register("mcore-gpt-70b", layers=84, hidden=8192, heads=64, ffn_hidden=32768, vocab=131072)
_register("mcore-gpt-177b", layers=96, hidden=12288, heads=96, ffn_hidden=49152, vocab=131072)
_register("mcore-gpt-462b", layers=112, hidden=18432, heads=144, ffn_hidden=73728, vocab=131072)
# Llama 3: Dubey et al. 2024 ("The Llama 3 Herd of Models"), Table 3; vocab 128256.
_register("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, mlp="swiglu")
_register("llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, mlp="swiglu")
_register("llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256, mlp="swiglu")
# Mixtral 8x7B: Jiang et al. 2024 and its HF config (32 layers, 4096, 32/8 heads,
# 8 experts top-2 of ffn 14336, vocab 32000).
_register("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
          mlp="swiglu", moe={"experts": 8, "top_k": 2, "capacity_factor": 1.25, "routing": "token_choice"})
# DeepSeek-V3-like: DeepSeek-AI 2024 (61 layers, hidden 7168, 128 heads, 256 routed
# experts top-8 of ffn 2048 + 1 shared, first 3 layers dense with ffn 18432, vocab 129280).
# MLA attention is approximated by standard multi-head attention of the same width.
_register("deepseek-v3", layers=61, hidden=7168, heads=128, ffn_hidden=18432, vocab=129280, mlp="swiglu",
          moe={"experts": 256, "top_k": 8, "capacity_factor": 1.0, "routing": "token_choice",
               "expert_ffn_hidden": 2048, "shared_experts": 1, "dense_layers": 3})


def model_preset(name: str) -> dict:
    """Fields of a preset, or InputError listing the known ones."""
    if name not in MODELS:
        raise InputError("model.preset", f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return dict(MODELS[name])


_HF_KEYS = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
            "num_key_value_heads": "kv_heads", "intermediate_size": "ffn_hidden", "vocab_size": "vocab",
            "n_layer": "layers", "n_embd": "hidden", "n_head": "heads", "n_inner": "ffn_hidden"}


def hf_config(path: str, base: Path | None = None) -> dict:
    """Model fields from a Hugging Face ``config.json`` (Llama, Mistral/Mixtral, GPT-2 styles)."""
    file = Path(path) if base is None or Path(path).is_absolute() else base / path
    cfg = read_json_object(file, "model.hf_config")
    fields = {ours: cfg[theirs] for theirs, ours in _HF_KEYS.items() if cfg.get(theirs) is not None}
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu")))
    fields["mlp"] = "swiglu" if act in ("silu", "swiglu") else "gelu"
    fields["name"] = str(cfg.get("_name_or_path") or cfg.get("model_type") or file.stem)
    fields["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    if cfg.get("num_local_experts"):
        fields["moe"] = {"experts": cfg["num_local_experts"], "top_k": cfg.get("num_experts_per_tok", 2),
                         "routing": "token_choice"}
    missing = {"layers", "hidden", "heads", "vocab"} - fields.keys()
    if missing:
        raise InputError("model.hf_config", f"{file} lacks {', '.join(sorted(missing))}")
    return fields


def read_json_object(file: Path, key: str) -> dict:
    """A JSON object from a regular file within the size and depth limits of sim/bounds.py."""
    if not file.exists():
        raise InputError(key, f"cannot read {file}: no such file")
    try:
        cfg = json.loads(bounds.read_text(file, key))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(key, f"cannot read {file}: {exc or 'nested too deeply'}") from None
    if not isinstance(cfg, dict):
        raise InputError(key, f"{file}: expected a JSON object, got a JSON {type(cfg).__name__}")
    bounds.check_depth(cfg, key)
    return cfg
