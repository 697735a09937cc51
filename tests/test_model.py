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


# --- 2026 architectures: MLA, head_dim != hidden/heads, fine-grained MoE -----------------

@pytest.mark.parametrize("preset, total, active, embeddings_in_active", [
    # DeepSeek-V3 README_WEIGHTS.md: main model 671B, 36.7B activated (the paper rounds to
    # 37B; the 14B MTP module is separate). Its count matches 6ND's N: the output head but
    # not the input-embedding lookup (ours: 36.63B, -0.2%; with the lookup 37.55B).
    ("deepseek-v3", 671e9, 36.7e9, 1),
    # Qwen3-235B-A22B model card: 235B total, 22B activated, counting both embedding matrices.
    ("qwen3-235b-a22b", 235e9, 22e9, 2),
])
def test_moe_model_cards_total_and_active_parameters_within_one_percent(preset, total, active,
                                                                        embeddings_in_active):
    d = costs.dims(one_gpu(preset, 4096).model)
    assert costs.main_params(d) == pytest.approx(total, rel=0.01)
    active_params = costs.non_embedding_params(d, active=True) + embeddings_in_active * d.h * d.v
    assert active_params == pytest.approx(active, rel=0.01)


def test_deepseek_v3_mtp_module_matches_readme_weights():
    """README_WEIGHTS.md: the MTP module has 11.5B unique parameters and activates 2.4B
    including the shared 0.9B embedding and 0.9B output head (ours: 11.6B; 0.69B + 1.85B)."""
    d = costs.dims(one_gpu("deepseek-v3", 4096).model)
    assert d.mtp == 1
    assert costs.mtp_params(d) == pytest.approx(11.5e9, rel=0.02)
    assert costs.mtp_params(d, active=True) + 2 * d.h * d.v == pytest.approx(2.4e9, rel=0.07)
    assert costs.total_params(d) == costs.main_params(d) + costs.mtp_params(d)


def test_mtp_depth_adds_its_layer_projection_and_output_head_to_model_flops():
    """Closed form: one depth adds 6 x (its layer's active parameters + 2h^2 + 3h) + 6hV + the
    attention term of one more layer; zero depths change nothing."""
    m = one_gpu("deepseek-v3", 4096).model
    d0 = costs.dims(m.model_copy(update={"mtp_layers": 0}))
    d1 = costs.dims(m.model_copy(update={"mtp_layers": 1}))
    layer = costs.layer_params(d1, d1.layers, active=True) + 2 * d1.h ** 2 + 3 * d1.h
    extra = 6 * layer + 6 * d1.h * d1.v + 12 * d1.attn_width * 4096
    assert costs.model_flops_per_token(d1, 4096) - costs.model_flops_per_token(d0, 4096) == pytest.approx(extra)


def test_qwen3_235b_non_embedding_parameters_match_the_card():
    """Qwen3-235B-A22B card: 234B non-embedding (94 layers of GQA with 64 heads of 128 on a
    4096 hidden, 128 experts of 1536)."""
    d = costs.dims(one_gpu("qwen3-235b-a22b", 4096).model)
    assert (d.dq, d.dv, d.a * d.dq) == (128, 128, 8192)  # head_dim is not hidden / heads = 64
    assert costs.non_embedding_params(d) == pytest.approx(234e9, rel=0.01)


MLA_TINY = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100, "attention": "mla",
            "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}


def tiny(model: dict, seq: int = 32, gpus: int = 1, parallel: dict | None = None):
    return scenario_from_dict({"model": model, "training": {"seq_len": seq, "global_batch": gpus},
                               "cluster": {"gpus": gpus}, "parallel": parallel or {"dp": gpus}})


def test_mla_parameters_and_flops_per_token_by_hand():
    """Per layer: q_a 64*32 + q_a_norm 32 + q_b 32*4*(8+4); kv_a 64*(16+4) + kv_a_norm 16 +
    kv_b 16*4*(8+8); o 4*8*64; two norms 2*64; gelu MLP 2*64*128. Attention FLOPs per token:
    6 * L * s * heads * (d_qk + d_v) with d_qk = 8 + 4 and d_v = 8."""
    layer = (64 * 32 + 32 + 32 * 48) + (64 * 20 + 16 + 16 * 64) + 4 * 8 * 64 + 2 * 64 + 2 * 64 * 128
    assert layer == 24496
    non_embedding = 2 * layer + 64
    expected = 6 * non_embedding + 6 * 64 * 100 + 6 * 2 * 32 * 4 * (12 + 8)
    s = tiny(MLA_TINY)
    d = costs.dims(s.model)
    assert costs.non_embedding_params(d) == non_embedding
    assert costs.model_flops_per_token(d, 32) == expected == 363456
    assert simulated_flops_per_token(simulate(s)) == pytest.approx(expected, rel=1e-9)


def test_mla_without_a_query_latent_projects_queries_from_hidden():
    """DeepSeek-V2-Lite style (q_lora_rank null): q_proj 64 * 4 * 12 replaces q_a, q_a_norm, q_b."""
    with_latent = costs.attention_params(costs.dims(tiny(MLA_TINY).model))
    without = costs.attention_params(costs.dims(tiny({**MLA_TINY, "q_lora_rank": None}).model))
    assert with_latent - without == (64 * 32 + 32 + 32 * 48) - 64 * 48


def test_mla_attention_core_and_projection_kernels():
    """The core attends with d_qk = 12 and d_v = 8 per head (causal half under flash
    attention); the down projections keep whole weights on every TP rank, the up
    projections split heads over TP (Megatron-Core gpt_layer_specs: TELinear 'duplicated',
    TELayerNormColumnParallelLinear)."""
    from sim.model import layers as L

    d = costs.dims(tiny(MLA_TINY).model)
    sh = L.Shard(tokens=32, seq=32, micro=1, tp=2, sp=True, flash=True)
    assert L.attention_core(d, sh).flops == 2 * 32 * 32 * 4 * (12 + 8) / 2 * 0.5
    gemm_shapes = [(k.flops, k.min_dim) for k in L.attention_pre(d, sh) if k.flops]
    assert gemm_shapes == [(2 * 16 * 32 * 64, 16), (2 * 16 * 20 * 64, 16),  # q_a, kv_a on 32/tp tokens
                           (2 * 32 * 24 * 32, 24), (2 * 32 * 32 * 16, 16)]  # q_b, kv_b: heads / tp
    assert [k.flops for k in L.attention_post(d, sh) if k.flops] == [2 * 32 * 64 * 16]  # o: 4 * 8 / tp in


def test_head_dim_wider_than_hidden_over_heads():
    """Qwen3-style: 4 heads of 32 on a hidden of 64 (not 16 wide): q, o are 64 x 128, k, v
    64 x 2 * 32; attention FLOPs 12 * L * s * heads * head_dim."""
    model = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "ffn_hidden": 128, "vocab": 100}
    layer = 64 * 128 + 2 * 64 * 2 * 32 + 128 * 64 + 2 * 64 + 2 * 64 * 128
    expected = 6 * (2 * layer + 64) + 6 * 64 * 100 + 12 * 2 * 32 * (4 * 32)
    s = tiny(model)
    d = costs.dims(s.model)
    assert costs.model_flops_per_token(d, 32) == expected
    plain = costs.dims(tiny({**model, "head_dim": None}).model)
    assert (plain.dq, d.dq) == (16, 32) and costs.model_flops_per_token(d, 32) > costs.model_flops_per_token(plain, 32)
    assert simulated_flops_per_token(simulate(s)) == pytest.approx(expected, rel=1e-9)


def test_relu2_is_a_two_matrix_mlp():
    """Nemotron-4's squared ReLU: up and down projections only (no gate)."""
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 100}
    relu2 = costs.dims(tiny({**model, "mlp": "relu2"}).model)
    swiglu = costs.dims(tiny({**model, "mlp": "swiglu"}).model)
    assert costs.mlp_params(relu2, 0, False) == 2 * 64 * 256 and costs.mlp_params(swiglu, 0, False) == 3 * 64 * 256


def test_mla_down_projections_are_whole_on_every_tp_rank():
    """Megatron-Core duplicates MLA's down projections and latent norms over TP: a TP-2 rank
    holds half of the rest of the layer plus all of them."""
    from types import SimpleNamespace

    from sim.parallel.params import layer_params

    d = costs.dims(tiny({**MLA_TINY, "q_lora_rank": 32}).model)
    ctx = SimpleNamespace(dims=d, layout=SimpleNamespace(sizes={"tp": 2}, ep=1, etp=2))
    whole = 64 * 32 + 32 + 64 * 20 + 16  # q_a, q_a_norm, kv_a, kv_a_norm
    assert layer_params(ctx, 0)[0] == (costs.layer_params(d, 0) - whole) / 2 + whole
