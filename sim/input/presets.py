"""Model presets and Hugging Face config import.

Each preset cites its source. Fields follow :class:`sim.input.scenario.Model`. The
Hugging Face configs shipped in ``sim/input/hf_configs/`` (Llama 3.1, Mixtral, Qwen3,
Qwen3-MoE, DeepSeek-V2-Lite/V3, Nemotron-4; each names its source in ``"_source"``) are
presets too, under their file names; the key mapping lives in :mod:`sim.input.hf`.
"""

import json
from pathlib import Path

from .. import bounds
from ..errors import InputError
from . import hf

HF_CONFIG_DIR = Path(__file__).resolve().parent / "hf_configs"

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


def _register_hf_configs() -> None:
    """Every shipped ``hf_configs/NAME.json`` as preset NAME (mixtral-8x7b, deepseek-v3, ...)."""
    for file in sorted(HF_CONFIG_DIR.glob("*.json")):
        fields = hf.model_fields(json.loads(file.read_text()), file.name)
        fields.pop("name")
        _register(file.stem, **fields)


_register_hf_configs()


def model_preset(name: str) -> dict:
    """Fields of a preset, or InputError listing the known ones."""
    if name not in MODELS:
        raise InputError("model.preset", f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return dict(MODELS[name])


def hf_config(path: str, base: Path | None = None) -> dict:
    """Model fields from a Hugging Face ``config.json`` (see :mod:`sim.input.hf`)."""
    file = Path(path) if base is None or Path(path).is_absolute() else base / path
    cfg = read_json_object(file, "model.hf_config")
    return hf.model_fields(cfg, str(file))


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
