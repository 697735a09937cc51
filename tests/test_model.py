"""Model FLOPs and parameter counts against closed forms computed here.

CONTRACT.md: model FLOPs per token = 6 * (non-embedding active parameters)
+ 6 * hidden * vocab + 12 * layers * hidden * seq_len (PaLM appendix B); the seeds:
pretraining FLOPs ~ 6ND. The simulator's figure is read back from the summary
(tflops_per_gpu * step_time_s * num_gpus) so the whole path is checked.

Run: ``python -m pytest tests/test_model.py``
"""

import pytest

from sim.model import transformer as costs
from sim.input.load import scenario_from_dict
from sim.step import simulate


def layer_params(h, a, g, f, mats, experts=0, active=0):
    """One decoder layer: q, o (h^2 each), k, v (h * g * h/a each), the MLP (mats weight
    matrices of h*f per expert; ``active`` of them run per token), router h*E, 2 norms."""
    attn = 2 * h * h + 2 * h * g * (h // a)
    if not experts:
        return attn + mats * h * f + 2 * h
    return attn + (active or experts) * mats * h * f + h * experts + 2 * h


def closed_form(m, seq: int) -> tuple[float, float]:
    """(model FLOPs per token, total parameters) from the architecture fields."""
    h, L, V = m.hidden, m.layers, m.vocab
    mats = 3 if m.mlp == "swiglu" else 2
    experts = m.moe.experts if m.moe else 0
    top_k = m.moe.top_k if m.moe else 0
    f = (m.moe.expert_ffn_hidden or m.ffn_hidden) if m.moe else m.ffn_hidden
    non_emb_active = L * layer_params(h, m.heads, m.kv_heads, f, mats, experts, top_k) + h
    total = L * layer_params(h, m.heads, m.kv_heads, f, mats, experts) + h + V * h * (1 if m.tied_embeddings else 2)
    return 6 * non_emb_active + 6 * h * V + 12 * L * h * seq, total


def one_gpu(preset: str, seq: int):
    """One GPU, one sequence; MoE presets route uniformly (the routing lab is not needed)."""
    model = {"preset": preset}
    if preset.startswith("mixtral"):
        model["moe"] = {"routing": "uniform"}
    return scenario_from_dict({"model": model, "training": {"seq_len": seq, "global_batch": 1},
                               "cluster": {"gpus": 1}, "parallel": {}})


def simulated_flops_per_token(result) -> float:
    s, sc = result.summary, result.scenario
    flops = s["tflops_per_gpu"] * 1e12 * s["step_time_s"] * s["num_gpus"]
    return flops / (sc.training.global_batch * sc.training.seq_len)


@pytest.mark.parametrize("preset, seq", [
    ("llama3-8b", 8192), ("llama3-70b", 8192), ("llama3-405b", 8192), ("gpt3-175b", 2048),
    ("mixtral-8x7b", 4096), ("gpt-1.7b", 2048), ("mcore-gpt-16b", 4096)])
def test_model_flops_per_token_is_6n_plus_attention_plus_logits(preset, seq):
    s = one_gpu(preset, seq)
    expected, _ = closed_form(s.model, seq)
    assert costs.model_flops_per_token(costs.dims(s.model), seq) == pytest.approx(expected, rel=1e-3)


def test_llama3_8b_total_parameters():
    s = one_gpu("llama3-8b", 2048)
    assert costs.total_params(costs.dims(s.model)) == pytest.approx(8.03e9, rel=1e-3)
    assert closed_form(s.model, 2048)[1] == pytest.approx(8.03e9, rel=1e-3)


@pytest.mark.parametrize("preset, seq", [("llama3-8b", 8192), ("mixtral-8x7b", 4096), ("gpt-1.7b", 2048)])
def test_summary_flops_match_the_closed_form(preset, seq):
    """The summary's tflops_per_gpu * step * GPUs is exactly the contract's model FLOPs."""
    result = simulate(one_gpu(preset, seq))
    expected, _ = closed_form(result.scenario.model, seq)
    assert simulated_flops_per_token(result) == pytest.approx(expected, rel=1e-3)


def test_model_flops_do_not_count_recompute_or_depend_on_parallelism():
    base = {"model": {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000},
            "training": {"seq_len": 2048, "global_batch": 8}}
    expected, _ = closed_form(scenario_from_dict({**base, "cluster": {"gpus": 1}}).model, 2048)
    for parallel, recompute in (({"dp": 8}, "none"), ({"tp": 2, "pp": 2, "dp": 2}, "full"),
                                ({"dp": 4, "cp": 2, "zero": 3}, "selective")):
        s = scenario_from_dict({**base, "cluster": {"gpus": 8}, "parallel": parallel},
                               {"training.recompute": recompute})
        assert simulated_flops_per_token(simulate(s)) == pytest.approx(expected, rel=1e-9)


def test_dense_pretraining_flops_are_about_6nd():
    """GPT-3 175B at 2048 tokens: attention and the logits add ~2.5% to 6ND (the seeds'
    6ND counts the input embedding, a lookup, as if it were a matmul)."""
    s = one_gpu("gpt3-175b", 2048)
    per_token, total = closed_form(s.model, 2048)
    m = s.model
    assert per_token == pytest.approx(6 * total, rel=0.03)
    exact_6n = 6 * (total - m.vocab * m.hidden)  # every weight except the embedding lookup
    assert per_token - exact_6n == pytest.approx(12 * m.layers * m.hidden * 2048, rel=1e-9)


def test_moe_counts_only_active_experts():
    s = one_gpu("mixtral-8x7b", 4096)
    per_token, total = closed_form(s.model, 4096)
    attention = 12 * 32 * 4096 * 4096
    # ~12.9B active parameters of 46.7B (with both embeddings; the input one is a lookup)
    assert (per_token - attention) / 6 == pytest.approx(12.9e9 - 32000 * 4096, rel=0.01)
    assert per_token < 0.35 * 6 * total
