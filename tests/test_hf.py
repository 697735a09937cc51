"""Hugging Face config.json import: every shipped config (sim/input/hf_configs/) becomes a
preset whose parameter count matches its published card; the key mapping of each
architecture (Llama 3.1, Mixtral, Qwen3, Qwen3-MoE, DeepSeek-V2/V3 with MLA, Nemotron-4);
and one-line input errors for what cannot be expressed.

Run: ``python -m pytest tests/test_hf.py``
"""

import json

import pytest

from conftest import assert_input_error, clustersim
from sim.errors import InputError
from sim.input.load import scenario_from_dict
from sim.input.presets import HF_CONFIG_DIR, MODELS
from sim.model import transformer as costs
from sim.step import simulate

# Published total parameters (model cards; papers where the card gives none).
CARDS = {
    "llama3.1-8b": 8.03e9, "llama3.1-70b": 70.6e9, "llama3.1-405b": 405.9e9,  # HF safetensors counts
    "mixtral-8x7b": 46.7e9,  # HF model card
    "qwen3-8b": 8.2e9, "qwen3-32b": 32.8e9, "qwen3-30b-a3b": 30.5e9, "qwen3-235b-a22b": 235e9,  # Qwen3 cards
    "deepseek-v3": 671e9,  # README_WEIGHTS.md, main model without the MTP module
    "deepseek-v2-lite": 15.7e9,  # DeepSeek-V2 report, appendix B
    "nemotron-4-15b": 15.7e9,  # arXiv 2402.16819: 3.2B embedding + 12.5B non-embedding
    "nemotron-4-340b": 341e9,  # arXiv 2406.11704: 9.4B embedding + 331.6B non-embedding
}
SHIPPED = sorted(p.stem for p in HF_CONFIG_DIR.glob("*.json"))


def scenario(model: dict, gpus: int = 1, **parallel):
    return scenario_from_dict({"model": model, "training": {"seq_len": 4096, "global_batch": max(gpus, 1)},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": parallel or {"dp": gpus}})


def test_every_shipped_config_has_a_card_and_a_source():
    assert SHIPPED == sorted(CARDS)
    for name in SHIPPED:
        source = json.loads((HF_CONFIG_DIR / f"{name}.json").read_text())["_source"]
        assert source["checked_against"] and "hf_repo" in source


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_imports_as_its_preset_and_matches_its_card(name):
    via_file = scenario({"hf_config": str(HF_CONFIG_DIR / f"{name}.json")}).model
    via_preset = scenario({"preset": name}).model
    fields = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "mlp", "head_dim", "attention",
              "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mtp_layers", "moe")
    assert all(getattr(via_file, f) == getattr(via_preset, f) for f in fields)
    assert costs.main_params(costs.dims(via_preset)) == pytest.approx(CARDS[name], rel=0.01)


@pytest.mark.parametrize("name, expect", [
    ("llama3.1-70b", {"mlp": "swiglu", "kv_heads": 8, "head_dim": 128, "moe": None}),
    ("mixtral-8x7b", {"mlp": "swiglu", "moe.experts": 8, "moe.top_k": 2}),
    ("qwen3-32b", {"head_dim": 128, "hidden": 5120, "heads": 64}),  # 64 heads of 128 on 5120
    ("qwen3-30b-a3b", {"moe.experts": 128, "moe.top_k": 8, "moe.expert_ffn_hidden": 768, "head_dim": 128}),
    ("deepseek-v3", {"attention": "mla", "q_lora_rank": 1536, "kv_lora_rank": 512, "moe.shared_experts": 1,
                     "moe.dense_layers": 3, "moe.expert_ffn_hidden": 2048, "ffn_hidden": 18432, "mtp_layers": 1}),
    ("deepseek-v2-lite", {"attention": "mla", "q_lora_rank": None, "moe.shared_experts": 2, "moe.top_k": 6}),
    ("nemotron-4-340b", {"mlp": "relu2", "kv_heads": 8, "tied_embeddings": False}),
])
def test_architecture_keys_are_mapped(name, expect):
    m = MODELS[name]
    for key, value in expect.items():
        got = m.get("moe", {}).get(key[4:]) if key.startswith("moe.") else m.get(key)
        assert got == value, key


def test_deepseek_v3_with_mla_and_fine_grained_experts_simulates_end_to_end():
    """Four layers (three dense, one MoE with 256 experts over EP 8), TP 2 with SP."""
    s = scenario({"preset": "deepseek-v3", "layers": 4, "moe": {"routing": "uniform"}}, 16,
                 tp=2, dp=8, ep=8, sequence_parallel=True)
    r = simulate(s)
    per_token = r.summary["tflops_per_gpu"] * 1e12 * r.summary["step_time_s"] * 16 / (16 * 4096)
    assert per_token == pytest.approx(costs.model_flops_per_token(costs.dims(s.model), 4096), rel=1e-9)
    assert r.summary["fits_in_memory"]


def hf_error(cfg: dict) -> InputError:
    from sim.input.hf import model_fields

    with pytest.raises(InputError) as info:
        model_fields(cfg, "config.json")
    assert info.value.key == "model.hf_config"
    return info.value


BASE_CFG = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 100,
            "hidden_act": "silu"}


def test_hf_configs_the_simulator_cannot_express_are_input_errors():
    assert "qk_nope_head_dim" in hf_error({**BASE_CFG, "kv_lora_rank": 64, "qk_rope_head_dim": 16}).reason
    assert "xielu" in hf_error({**BASE_CFG, "hidden_act": "xielu"}).reason
    moe = {**BASE_CFG, "n_routed_experts": 8, "num_experts_per_tok": 2}
    assert "moe_layer_freq" in hf_error({**moe, "moe_layer_freq": 2}).reason
    assert "mlp_only_layers" in hf_error({**moe, "mlp_only_layers": [3]}).reason
    assert "shared_expert" in hf_error({**moe, "moe_intermediate_size": 96, "shared_expert_intermediate_size": 100}).reason


@pytest.mark.parametrize("key, value", [
    ("num_nextn_predict_layers", "two"), ("num_nextn_predict_layers", 1.7), ("num_nextn_predict_layers", [1]),
    ("num_nextn_predict_layers", True), ("num_hidden_layers", 2.5), ("hidden_size", "256"),
    ("tie_word_embeddings", "false"), ("tie_word_embeddings", 0), ("head_dim", 64.0), ("hidden_act", 3),
    ("num_experts_per_tok", "2"), ("shared_expert_intermediate_size", "x"), ("first_k_dense_replace", 1.5),
])
def test_hf_fields_of_the_wrong_json_type_are_refused_not_misread(key, value):
    """issue 30: "two", Infinity or [1] MTP depths crashed; "false" read as tied, 1.7 as 1."""
    cfg = {**BASE_CFG, "num_experts": 8, "moe_intermediate_size": 96, key: value}
    reason = hf_error(cfg).reason
    assert key in reason and repr(value) in reason


def test_hf_config_files_with_bad_types_exit_2_through_the_cli(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 100, '
                    '"num_nextn_predict_layers": Infinity}')
    scen = tmp_path / "s.toml"
    scen.write_text(f'[model]\nhf_config = "{path}"\n[training]\nseq_len = 128\nglobal_batch = 8\n'
                    '[cluster]\ngpu = "h100-sxm"\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\n')
    assert_input_error(clustersim("run", str(scen)), "model.hf_config")


def test_qwen2_moe_shared_expert_counts_as_expert_widths():
    from sim.input.hf import model_fields

    cfg = {**BASE_CFG, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632}
    assert model_fields(cfg, "c")["moe"]["shared_experts"] == 4


def error_of(model: dict, **training) -> InputError:
    with pytest.raises(InputError) as info:
        scenario_from_dict({"model": model, "training": {"seq_len": 64, "global_batch": 8, **training},
                            "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"tp": 2, "dp": 4}})
    return info.value


MLA = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "attention": "mla", "kv_lora_rank": 16,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}


@pytest.mark.parametrize("model, key", [
    ({**MLA, "kv_lora_rank": None}, "model.kv_lora_rank"),  # MLA ranks missing
    ({**MLA, "v_head_dim": None}, "model.v_head_dim"),
    ({**MLA, "attention": "mha"}, "model.kv_lora_rank"),  # ranks without MLA
    ({**MLA, "head_dim": 16}, "model.head_dim"),  # MLA sets its own head widths
    ({**MLA, "kv_heads": 2}, "model.kv_heads"),  # MLA has no GQA
    ({**MLA, "qk_rope_head_dim": 5}, "model.qk_rope_head_dim"),  # rotary pairs
])
def test_bad_attention_settings_name_their_key(model, key):
    assert error_of(model).key == key


def test_head_dim_frees_hidden_from_heads_but_tp_must_still_split_the_heads():
    """6 heads of 16 on a hidden of 64 is a valid model; 5 heads cannot be split over TP 2."""
    six = {"layers": 2, "hidden": 64, "heads": 6, "kv_heads": 2, "head_dim": 16, "vocab": 100}
    assert scenario_from_dict({"model": six, "training": {"seq_len": 64, "global_batch": 8},
                               "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"tp": 2, "dp": 4}})
    assert error_of({**six, "head_dim": None}).key == "model.heads"
    assert error_of({**six, "heads": 5, "kv_heads": 5}).key == "parallel.tp"


def test_mla_ranks_missing_from_the_command_line_is_one_line_exit_2():
    p = clustersim("run", "scenarios/llama3-8b-fsdp-h100.toml", "--set", "model.attention=mla")
    assert_input_error(p, "model.kv_lora_rank")
