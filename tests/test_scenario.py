"""Scenario loading: presets, Hugging Face configs, ``--set`` overrides and one clear
InputError (key + reason) per consistency rule.

Parameter counts are recomputed here from the architecture (never read back from the
simulator) and compared with the published figures of each preset's source.

Run: ``python -m pytest tests/test_scenario.py``
"""

import json
from pathlib import Path

import pytest

import sim
from sim.input import presets
from sim.errors import InputError
from sim.hardware.gpus import GPUS
from sim.input.load import parse_value, scenario_from_dict
from sim.hardware.specs import TOPOLOGY_DIR

REPO = Path(__file__).resolve().parent.parent

TINY = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "vocab": 128}


def base(**sections) -> dict:
    """A small valid scenario dict: 8 GPUs of one DGX H100, data parallel."""
    d = {"name": "t", "model": dict(TINY), "training": {"seq_len": 1024, "global_batch": 8},
         "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"dp": 8}}
    for k, v in sections.items():
        merge = isinstance(v, dict) and not (k == "model" and "preset" in v)
        d[k] = {**d.get(k, {}), **v} if merge else v
    return d


def error_of(data: dict, overrides=None) -> InputError:
    with pytest.raises(InputError) as info:
        scenario_from_dict(data, overrides)
    return info.value


# --- parameter counts from first principles -------------------------------------------

def llama_params(L, h, a, g, f, V, tied=False, experts=0, top_k=0):
    """Llama/Mixtral: q,o (h*h each), k,v (h*g*h/a each), SwiGLU MLP (3*h*f per expert),
    two RMSNorms per layer, a final norm, embeddings (+ untied output), router h*E."""
    d = h // a
    attn = 2 * h * h + 2 * h * g * d
    n_mlp = top_k if top_k else max(experts, 1)
    mlp = n_mlp * 3 * h * f + (h * experts if experts else 0)
    return L * (attn + mlp + 2 * h) + h + V * h * (1 if tied else 2)


def n21_params(L, h, V, s=2048):
    """Narayanan et al. 2021, section 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))
    (tied embeddings, learned positions, biases)."""
    return 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))


def gpt_params_untied(L, h, V, f):
    """Megatron-Core GPT (no biases counted, untied output layer)."""
    return L * (4 * h * h + 2 * h * f + 2 * h) + h + 2 * V * h


def loaded_model(preset: str):
    return scenario_from_dict(base(model={"preset": preset})).model


@pytest.mark.parametrize("preset, published", [
    # Hugging Face model cards (safetensors parameter counts)
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),
])
def test_llama3_presets_match_published_parameter_counts(preset, published):
    m = loaded_model(preset)
    assert m.mlp == "swiglu" and m.kv_heads == 8 and m.vocab == 128256
    n = llama_params(m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)
    assert n == pytest.approx(published, rel=1e-3)


def test_mixtral_preset_total_and_active_parameters():
    m = loaded_model("mixtral-8x7b")
    assert (m.moe.experts, m.moe.top_k) == (8, 2)
    args = (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab)
    total = llama_params(*args, experts=8)
    active = llama_params(*args, experts=8, top_k=2)
    assert total == pytest.approx(46_702_792_704, rel=1e-3)  # HF model card
    assert active == pytest.approx(12.9e9, rel=0.01)  # Jiang et al. 2024: 13B active


def test_gpt3_preset_is_brown_table_2_1():
    m = loaded_model("gpt3-175b")
    assert (m.layers, m.hidden, m.heads, m.ffn_hidden, m.vocab) == (96, 12288, 96, 49152, 51200)
    assert n21_params(m.layers, m.hidden, m.vocab) / 1e9 == pytest.approx(174.6, abs=0.05)  # N21 Table 2


@pytest.mark.parametrize("preset, billions", [
    ("gpt-1.7b", 1.7), ("gpt-7.5b", 7.5), ("gpt-39b", 39.1), ("gpt-146b", 145.6), ("gpt-530b", 529.6)])
def test_megatron_n21_presets_match_table_1(preset, billions):
    m = loaded_model(preset)
    assert n21_params(m.layers, m.hidden, m.vocab) / 1e9 == pytest.approx(billions, abs=0.05)


@pytest.mark.parametrize("preset, billions", [
    ("mcore-gpt-1.7b", 1.7), ("mcore-gpt-16b", 16), ("mcore-gpt-70b", 70), ("mcore-gpt-177b", 177),
    ("mcore-gpt-462b", 462)])
def test_megatron_core_presets_match_readme_sizes(preset, billions):
    m = loaded_model(preset)
    n = gpt_params_untied(m.layers, m.hidden, m.vocab, m.ffn_hidden) / 1e9
    assert n == pytest.approx(billions, rel=0.03)  # the README rounds the sizes


def test_explicit_fields_override_the_preset():
    m = scenario_from_dict(base(model={"preset": "llama3-8b", "layers": 2})).model
    assert (m.layers, m.hidden, m.kv_heads) == (2, 4096, 8)


def test_unknown_preset_lists_the_known_ones():
    e = error_of(base(model={"preset": "llama9"}))
    assert e.key == "model.preset" and "llama9" in e.reason
    assert all(name in e.reason for name in presets.MODELS)


# --- Hugging Face config.json ---------------------------------------------------------

def write_toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SCENARIO_WITH_HF = """
name = "hf"
[model]
hf_config = "config.json"
[training]
seq_len = 512
global_batch = 8
[cluster]
gpus = 8
[parallel]
dp = 8
"""


def test_hf_llama_config_is_imported_relative_to_the_scenario(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
           "intermediate_size": 1376, "num_hidden_layers": 3, "num_attention_heads": 8,
           "num_key_value_heads": 2, "vocab_size": 1000, "hidden_act": "silu", "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = sim.load_scenario(write_toml(tmp_path / "s.toml", SCENARIO_WITH_HF))
    m = s.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (3, 512, 8, 2, 1376, 1000)
    assert m.mlp == "swiglu" and m.tied_embeddings and m.moe is None
    assert sim.simulate(s).summary["step_time_s"] > 0


def test_hf_gpt2_and_mixtral_styles(tmp_path):
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "n_inner": None,
            "vocab_size": 500, "activation_function": "gelu_new"}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    m = sim.load_scenario(write_toml(tmp_path / "s.toml", SCENARIO_WITH_HF)).model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.mlp) == (2, 256, 4, 4, 1024, "gelu")
    mixtral = {"hidden_size": 256, "intermediate_size": 896, "num_hidden_layers": 2, "num_attention_heads": 8,
               "num_key_value_heads": 2, "vocab_size": 500, "hidden_act": "silu", "num_local_experts": 4,
               "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(mixtral))
    m = sim.load_scenario(tmp_path / "s.toml").model
    assert (m.moe.experts, m.moe.top_k, m.mlp) == (4, 2, "swiglu")


def test_hf_config_missing_fields_or_file_is_an_input_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 256}))
    with pytest.raises(InputError) as info:
        sim.load_scenario(write_toml(tmp_path / "s.toml", SCENARIO_WITH_HF))
    assert info.value.key == "model.hf_config" and "layers" in info.value.reason
    (tmp_path / "config.json").unlink()
    with pytest.raises(InputError, match="model.hf_config: cannot read"):
        sim.load_scenario(tmp_path / "s.toml")


# --- --set overrides ------------------------------------------------------------------

def test_set_overrides_on_a_bundled_scenario():
    path = REPO / "scenarios" / "llama3-8b-fsdp-h100.toml"
    s = sim.load_scenario(path, ["parallel.dp=32", "cluster.nodes=4", "training.global_batch=32",
                                 "training.recompute=full", "model.layers=2"])
    assert (s.parallel.dp, s.cluster.gpus, s.training.global_batch) == (32, 32, 32)
    assert s.training.recompute == "full" and s.model.layers == 2 and s.model.hidden == 4096
    assert sim.load_scenario(path, {"parallel.zero": 1}).parallel.zero == 1


def test_parse_value_reads_toml_scalars_and_falls_back_to_strings():
    assert parse_value("8") == 8 and parse_value("1.5") == 1.5 and parse_value("true") is True
    assert parse_value("[7, 9]") == [7, 9] and parse_value("gpipe") == "gpipe"


def test_malformed_set_and_missing_file():
    assert error_of(base(), ["parallel.dp"]).key == "--set"
    assert error_of(base(), ["parallel.tp=2", "parallel=3"]).key == "parallel"
    with pytest.raises(InputError, match="scenario: no such file"):
        sim.load_scenario(REPO / "scenarios" / "missing.toml")


# --- one InputError per consistency rule ----------------------------------------------

def test_gpu_count_mismatch_prints_every_factor():
    e = error_of(base(model={"layers": 6}, cluster={"gpus": 32}, parallel={"tp": 2, "pp": 3, "dp": 5}))
    assert e.key == "parallel"
    assert "tp*pp*dp*cp = 2*3*5*1 = 30" in e.reason and "32 GPUs" in e.reason


@pytest.mark.parametrize("model, tp, key", [
    ({"hidden": 1536, "heads": 12, "kv_heads": 12}, 8, "model.heads = 12"),
    ({"heads": 8, "kv_heads": 2}, 4, "model.kv_heads = 2"),
])
def test_tp_must_divide_heads_and_kv_heads(model, tp, key):
    e = error_of(base(model=model, cluster={"gpus": tp}, parallel={"tp": tp, "dp": 1}, training={"global_batch": 1}))
    assert e.key == "parallel.tp" and f"tp = {tp}" in e.reason and key in e.reason


def test_pipeline_stage_without_layers():
    e = error_of(base(parallel={"pp": 8, "dp": 1}))  # 4 layers on 8 stages
    assert e.key == "parallel.pp" and "4 layers" in e.reason and "8 stages" in e.reason
    # a chunk may be empty only when it holds the embedding (first) or the loss (last)
    e = error_of(base(parallel={"pp": 4, "dp": 2, "stage_layers": [2, 0, 1, 1]}))
    assert e.key == "parallel.stage_layers" and "entry 1 is 0" in e.reason and "at least one layer" in e.reason
    e = error_of(base(parallel={"pp": 2, "dp": 4, "stage_layers": [5, -1]}))
    assert e.key == "parallel.stage_layers.1" and "-1 is outside 0..1,024" in e.reason  # the entry, by its bound
    s = scenario_from_dict(base(parallel={"pp": 2, "dp": 4, "stage_layers": [4, 0]}))  # last chunk: the loss only
    assert s.parallel.stage_layers == [4, 0]


def test_stage_layers_length_and_sum():
    e = error_of(base(parallel={"pp": 2, "dp": 4, "stage_layers": [1, 1, 2]}))
    assert e.key == "parallel.stage_layers" and "3 entries" in e.reason and "2" in e.reason
    e = error_of(base(parallel={"pp": 2, "dp": 4, "stage_layers": [1, 2]}))
    assert e.key == "parallel.stage_layers" and "sums to 3" in e.reason and "4 layers" in e.reason


def test_batch_size_floor_and_divisibility():
    e = error_of(base(training={"global_batch": 4}))  # dp = 8
    assert e.key == "training.global_batch"
    assert "floor" in e.reason and "dp * micro_batch = 8 * 1 = 8" in e.reason and "got 4" in e.reason
    e = error_of(base(training={"global_batch": 16, "micro_batch": 4}))  # 8 * 4 = 32 > 16
    assert e.key == "training.global_batch" and "= 32" in e.reason
    e = error_of(base(training={"global_batch": 12}))
    assert e.key == "training.global_batch" and "not divisible" in e.reason and "8" in e.reason


def test_unknown_gpu_and_topology_list_the_known_ones():
    e = error_of(base(cluster={"gpu": "h900"}))
    assert e.key == "cluster.gpu" and "h900" in e.reason and all(g in e.reason for g in GPUS)
    e = error_of(base(cluster={"topology": "dgx-z"}))
    known = [p.stem for p in TOPOLOGY_DIR.glob("*.toml")]
    assert e.key == "cluster.topology" and "dgx-z" in e.reason and known and all(k in e.reason for k in known)


@pytest.mark.parametrize("overrides, key", [
    ({"parallel.tensor": 2}, "parallel.tensor"),
    ({"training.sequence_length": 2}, "training.sequence_length"),
    ({"model.hiden": 2}, "model.hiden"),
    ({"cluster.gpu_count": 2}, "cluster.gpu_count"),
    ({"seeds": 1}, "seeds"),
    ({"model.moe.expert": 2, "model.moe.experts": 2, "model.moe.top_k": 1}, "model.moe.expert"),
    ({"cluster.topology_overrides.nics": 2}, "cluster.topology_overrides.nics"),
])
def test_unknown_keys_are_rejected(overrides, key):
    e = error_of(base(), overrides)
    assert e.key == key and "unknown key" in e.reason


@pytest.mark.parametrize("overrides, key", [
    ({"parallel.tp": -1}, "parallel.tp"),
    ({"parallel.zero": 4}, "parallel.zero"),
    ({"parallel.schedule": "zigzag"}, "parallel.schedule"),
    ({"training.seq_len": "long"}, "training.seq_len"),
    ({"training.precision": "int4"}, "training.precision"),
    ({"model.mlp": "relu"}, "model.mlp"),
    ({"model.preset": 7}, "model.preset"),
    ({"model.hf_config": ["a"]}, "model.hf_config"),
    ({"parallel.ep": 2}, "parallel.ep"),
    ({"cluster.topology_overrides.nic_gbps": 0}, "cluster.topology_overrides.nic_gbps"),
    ({"cluster.topology_overrides.spines": -1}, "cluster.topology_overrides.spines"),
    ({"cluster.topology_overrides.spines": 2.5}, "cluster.topology_overrides.spines"),
    ({"cluster.topology_overrides.routing": "random"}, "cluster.topology_overrides.routing"),
    ({"cluster.gpus": 16, "cluster.nodes": 1}, "cluster.gpus"),
])
def test_bad_values_name_the_key(overrides, key):
    assert error_of(base(), overrides).key == key


def test_straggler_nodes_follow_the_topologys_server_size():
    """gb200-nvl72 servers (compute trays) hold 4 GPUs: 72 GPUs are nodes 0..17."""
    d = base(cluster={"topology": "gb200-nvl72", "gpus": 72}, parallel={"dp": 72}, training={"global_batch": 72})
    assert scenario_from_dict({**d, "stragglers": [{"nodes": [17], "slowdown": 1.5}]}).stragglers
    e = error_of({**d, "stragglers": [{"nodes": [18], "slowdown": 1.5}]})
    assert e.key == "stragglers[0].nodes" and "18" in e.reason
    assert error_of({**d, "stragglers": [{"ranks": [72]}]}).key == "stragglers[0].ranks"


def test_bundled_scenarios_all_load():
    paths = sorted((REPO / "scenarios").glob("*.toml"))
    assert len(paths) >= 2
    for path in paths:
        s = sim.load_scenario(path)
        p = s.parallel
        assert p.tp * p.pp * p.dp * p.cp == (s.cluster.gpus if s.rl is None else s.rl.trainer_gpus)


def test_schedule_defaults_to_interleaved_with_virtual_stages():
    """Megatron: giving layers per virtual stage alone asks for interleaved 1F1B."""
    s = scenario_from_dict(base(model={"layers": 8}, training={"global_batch": 16},
                                parallel={"pp": 2, "dp": 4, "virtual_stages": 2}))
    assert s.parallel.schedule == "interleaved"
    assert scenario_from_dict(base(parallel={"pp": 2, "dp": 4})).parallel.schedule == "1f1b"
    e = error_of(base(model={"layers": 8}, training={"global_batch": 16},
                      parallel={"pp": 2, "dp": 4, "virtual_stages": 2, "schedule": "1f1b"}))
    assert e.key == "parallel.schedule"
