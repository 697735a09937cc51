"""What NeMo 25.04's DeepSeek-V3 recipe runs in MLA (issue 27): Megatron-Core's unfused RoPE
(``training.rope_fusion = false``, sim/model/rope.py) and its up-projection recompute
(``training.recompute = "mla_up_proj"``, sim/model/layers.py ``mla_up_recompute``).

Closed forms: the unfused RoPE's bytes and launches by hand at DeepSeek-V3's per-rank shape;
a step's attention pieces grow by exactly the compute model's time of those kernels; the
up-projection recompute is the up projections plus the RoPE, the core is no longer recomputed,
and Q, K, V leave the saved activations. Bad values exit 2 naming the key. Run
``python -m pytest -q tests/test_mla_recompute_rope.py``.
"""

import pytest

from conftest import assert_refusals
from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.choices import Recompute
from sim.input.load import scenario_from_dict
from sim.model import transformer as costs
from sim.model.compute import ComputeModel
from sim.model.layers import Shard, attention_pre, backward, mla_up_recompute, rope
from sim.model.transformer import Dims
from sim.step import build, build_topology
from sim.studies import validation

DSV3 = Dims(layers=61, h=7168, a=128, g=128, f=18432, v=129280, mats=3, q_lora=1536, kv_lora=512, qk_nope=128,
            qk_rope=64, v_dim=128)
SHARD = Shard(tokens=4096, seq=4096, micro=1, tp=2, sp=True, flash=True)
UNFUSED = Shard(tokens=4096, seq=4096, micro=1, tp=2, sp=True, flash=True, rope_fused=False)


def test_unfused_mla_rope_bytes_and_launches_by_hand():
    """q's rotary part (64 heads x 64 at tp 2) and the one shared rotary key a token: 28 bytes an
    element forward (de-interleave 4, cos 4, neg 2, cat 4, sin 4, add 6, cat 4), 34 backward, 13
    launches each of the two tensors; the assembly copies 64 x (4 x 128 + 3 x 64 + 2 x 128) = 61,440
    elements a token each way, 2 bytes each, in 3 launches."""
    rotary, assembly = rope(DSV3, UNFUSED)
    assert rotary.bytes == 28 * 4096 * (64 + 1) * 64 == 477_102_080
    assert backward([rotary])[0].bytes == 34 * 4096 * 65 * 64
    assert (rotary.count, backward([rotary])[0].count) == (26, 52)
    assert assembly.bytes == 2 * 4096 * 61_440 == 503_316_480
    assert backward([assembly])[0].bytes == assembly.bytes and assembly.count == 3
    assert rope(DSV3, SHARD) == []  # fused (the default): inside other kernels, not counted


def test_unfused_rope_of_standard_attention_by_hand():
    """GQA (32 query, 8 key heads of 128, tp 2): 24 bytes an element of q and k forward, 20
    backward, 12 launches each."""
    gqa = Dims(layers=32, h=4096, a=32, g=8, f=14336, v=128256, mats=3)
    (kernel,) = rope(gqa, UNFUSED)
    assert kernel.bytes == 24 * 4096 * (16 + 4) * 128
    assert backward([kernel])[0].bytes == 20 * 4096 * 20 * 128 and kernel.count == 24


def test_attention_pre_grows_by_exactly_the_rope_kernels():
    model = ComputeModel(gpu_preset("h100-sxm"))
    extra = rope(DSV3, UNFUSED)
    assert model.time(attention_pre(DSV3, UNFUSED)) - model.time(attention_pre(DSV3, SHARD)) == pytest.approx(
        model.time(extra), rel=1e-12)
    assert model.time(backward(attention_pre(DSV3, UNFUSED))) - model.time(backward(attention_pre(DSV3, SHARD))) \
        == pytest.approx(model.time(backward(extra)), rel=1e-12)


def test_the_up_projection_recompute_is_the_up_gemms_and_the_rope():
    """q_b (4096 x 64 heads x 192 x 1536) and kv_b (4096 x 64 x (128 + 128) x 512), then the RoPE."""
    kernels = mla_up_recompute(DSV3, UNFUSED)
    assert [k.flops for k in kernels if k.flops] == [2 * 4096 * 64 * 192 * 1536, 2 * 4096 * 64 * 256 * 512]
    assert [k for k in kernels if not k.flops] == rope(DSV3, UNFUSED)
    assert all(k.tp == 0 for k in kernels)


def _spec(**training) -> dict:
    return {"model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000, "attention": "mla",
                      "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                      "v_head_dim": 64},
            "training": {"seq_len": 1024, "global_batch": 2, "micro_batch": 1, **training},
            "parallel": {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 2}}


def _ops(spec: dict) -> dict:
    s = scenario_from_dict(spec)
    out = {}
    for op in build(s, build_topology(s))[1][0].ops:
        out.setdefault(op.name, []).append(op)
    return out


def test_a_step_charges_the_unfused_rope_in_each_attention_pass():
    s = scenario_from_dict(_spec(rope_fusion=False))
    d, model = costs.dims(s.model), ComputeModel(gpu_preset("h100-sxm"))
    extra = rope(d, Shard(tokens=1024, seq=1024, micro=1, tp=2, sp=True, flash=True, rope_fused=False))
    base, more = _ops(_spec()), _ops(_spec(rope_fusion=False))
    for name, kernels in (("attn_pre_fwd", extra), ("attn_pre_bwd", backward(extra))):
        # (a sublayer is one op per run of TP roles: the RoPE after the up projections may add one)
        grown = sum(o.duration for o in more[name]) - sum(o.duration for o in base[name])
        assert grown == pytest.approx(4 * model.time(kernels), rel=1e-9)  # 2 layers x 2 micro-batches


def test_mla_up_proj_recomputes_the_up_projections_not_the_core():
    sel, up = _ops(_spec(recompute="selective")), _ops(_spec(recompute="mla_up_proj", rope_fusion=False))
    assert "attn_core_fwd_recompute" in sel and "attn_core_fwd_recompute" not in up
    assert "attn_up_fwd_recompute" not in sel and len(up["attn_up_fwd_recompute"]) == 4
    s = scenario_from_dict(_spec(recompute="mla_up_proj", rope_fusion=False))
    model = ComputeModel(gpu_preset("h100-sxm"))
    kernels = mla_up_recompute(costs.dims(s.model), Shard(tokens=1024, seq=1024, micro=1, tp=2, sp=True, flash=True,
                                                          rope_fused=False))
    assert up["attn_up_fwd_recompute"][0].duration == pytest.approx(model.time(kernels), rel=1e-9)


def test_mla_up_proj_keeps_no_q_k_v():
    """Per token and layer at tp 2 with SP: selective keeps Q, K (2 x 2 bytes x heads x d_qk) and V
    (2 x heads x d_v) split over TP; mla_up_proj does not."""
    d = costs.dims(scenario_from_dict(_spec()).model)
    args = (1024, 1, 2, True)
    sel = costs.activation_bytes_per_layer(d, *args, Recompute.SELECTIVE, True)
    up = costs.activation_bytes_per_layer(d, *args, Recompute.MLA_UP_PROJ, True)
    assert sel - up == pytest.approx(1024 * (4 * 8 * 96 + 2 * 8 * 64) / 2, rel=1e-12)


def test_the_deepseek_row_runs_what_its_recipe_sets():
    rows = {r.id: r for r in validation.load_rows()}
    t = rows["dg-dsv3-1024"].scenario["training"]
    assert (t["recompute"], t["rope_fusion"]) == ("mla_up_proj", False)
    assert all("rope_fusion" not in r.scenario["training"] for r in rows.values() if r.id != "dg-dsv3-1024")


@pytest.mark.parametrize("training, key", [
    ({"recompute": "mla_up_proj"}, "training.recompute"),
    ({"rope_fusion": "no"}, "training.rope_fusion"),
    ({"rope_fusion": False, "kernels": "pytorch"}, "training.rope_fusion"),
])
def test_bad_values_are_refused_naming_the_key(training, key):
    spec = _spec(**training)
    if training.get("recompute") == "mla_up_proj":  # on a model without MLA
        spec["model"] = {k: v for k, v in spec["model"].items() if k == "attention" or "_rank" not in k
                         and "head_dim" not in k} | {"attention": "mha"}
    with pytest.raises(InputError) as err:
        scenario_from_dict(spec)
    assert err.value.key == key


def test_bad_values_exit_2_through_the_cli(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\n')
    assert_refusals(path, [(["training.recompute=mla_up_proj"], "training.recompute"),
                           (["training.rope_fusion=maybe"], "training.rope_fusion"),
                           (["training.rope_fusion=false", "training.kernels=pytorch"], "training.rope_fusion")])
