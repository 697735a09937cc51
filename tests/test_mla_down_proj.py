"""MLA's down projections under tensor parallelism (issue 27): ``parallel.mla_down_proj``.

Megatron-Core's MLA spec ran the down projections as TEColumnParallelLinear from 1c425a83
(2025-02-24) to e63aee46 (2025-06-13), so in core 0.12 / 0.13 -- the 7094270c that NeMo 25.04's
DeepSeek-V3 run pinned; before and after, as TELinear "duplicated" (the default here). Column:
each down projection all-gathers the hidden input itself (SP), runs on every token with 1/tp of
its outputs, and its output is all-gathered along the last dim; backward, each re-gathers its input
and reduce-scatters its input gradient, and the sequence split's backward all-gathers the latents'
gradients. Closed forms: the FLOPs equal the duplicated mode's, the copies' bytes by hand, every TP
collective of a built step's MLA layer by name and bytes, the recompute's up gather; tp 1 builds
the same ops either way; bad values exit 2 naming the key; the planner's rule agrees with the
loader's. Run ``python -m pytest -q tests/test_mla_down_proj.py``.
"""

import pandas as pd
import pytest

from conftest import assert_refusals
from sim.errors import InputError
from sim.input.load import scenario_from_dict
from sim.model.layers import Shard, attention_pre, mla_column_down, mla_column_up
from sim.model.transformer import Dims
from sim.plan import rules as plan_rules
from sim.step import build, build_topology
from sim.studies import validation

DSV3 = Dims(layers=61, h=7168, a=128, g=128, f=18432, v=129280, mats=3, q_lora=1536, kv_lora=512, qk_nope=128,
            qk_rope=64, v_dim=128)
DUP = Shard(tokens=4096, seq=4096, micro=1, tp=2, sp=True, flash=True)
COL = Shard(tokens=4096, seq=4096, micro=1, tp=2, sp=True, flash=True, mla_column=True)
T, H, QL, KL, R = 1024, 1024, 256, 128, 32  # the small spec below: tokens, hidden, q / kv latent, rotary


def test_column_down_projections_by_hand_and_the_same_flops():
    """q_a (4096 tokens x 1536 / 2 x 7168) and kv_a (4096 x 576 / 2 x 7168) on every token, where
    the duplicated mode runs them whole on the 2,048-token shard: the same FLOPs."""
    q, kv = mla_column_down(DSV3, COL)
    assert (q[0].flops, kv[0].flops) == (2 * 4096 * 768 * 7168, 2 * 4096 * 288 * 7168)
    assert all(k.tp == 1 for k in q + kv)
    flops = lambda shard: sum(k.flops for k in attention_pre(DSV3, shard))  # noqa: E731
    assert flops(COL) == flops(DUP)
    assert attention_pre(DSV3, COL) == (attention_pre(DSV3, DUP)[0],) + q + kv + mla_column_up(DSV3, COL)


def test_the_column_copies_by_hand():
    """torch.cat of the two last-dim gathers (4,096 x (1,536 + 576) read and written) and, under SP,
    the kv latent's split to the sequence shard (2,048 x 512 read and written), bf16; 3 launches."""
    copy = mla_column_up(DSV3, COL)[0]
    assert copy.bytes == 2 * 2 * (4096 * 2112 + 2048 * 512) and copy.count == 3 and copy.bwd == 1.0


def _spec(down: str = "column", **extra) -> dict:
    spec = {"model": {"layers": 2, "hidden": H, "heads": 8, "ffn_hidden": 4096, "vocab": 32000, "attention": "mla",
                      "q_lora_rank": QL, "kv_lora_rank": KL, "qk_nope_head_dim": 64, "qk_rope_head_dim": R,
                      "v_head_dim": 64},
            "training": {"seq_len": T, "global_batch": 2, "micro_batch": 1},
            "parallel": {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True, "mla_down_proj": down},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 2}}
    for key, value in extra.items():
        section, name = key.split(".")
        spec[section][name] = value
    return spec


def _tp_bytes(spec: dict) -> dict:
    """TP collective name -> bytes of each call, over the first rank's step (one value per name)."""
    s = scenario_from_dict(spec)
    out = {}
    for op in build(s, build_topology(s))[1][0].ops:
        if op.comm is not None and op.layer == 0 and op.micro_batch == 0:
            out.setdefault(op.name, set()).add(op.comm.nbytes)
    return out


def test_a_built_layer_runs_every_column_collective_at_its_bytes():
    col, dup = _tp_bytes(_spec()), _tp_bytes(_spec("duplicated"))
    assert col["attn_down_ag"] == col["attn_down_input_ag"] == col["attn_down_grad_rs"] == {2 * T * H * 2}
    assert col["attn_latent_ag"] == {T * (QL + KL + R) * 2}
    assert col["attn_latent_grad_ag"] == {T * (QL + KL) * 2}
    assert col["attn_ag"] == col["attn_input_ag"] == col["attn_grad_rs"] == {T * (QL + KL) * 2}  # no rotary key
    assert dup["attn_ag"] == dup["attn_input_ag"] == dup["attn_grad_rs"] == {T * (QL + KL + R) * 2}
    assert set(col) - set(dup) == {"attn_down_ag", "attn_latent_ag", "attn_latent_grad_ag", "attn_down_input_ag",
                                   "attn_down_grad_rs"}
    assert {k: v for k, v in col.items() if not k.startswith("attn_")} == \
        {k: v for k, v in dup.items() if not k.startswith("attn_")}


def test_the_up_projection_recompute_regathers_its_latents():
    """``mla_up_proj`` reruns q_b and kv_b, TELayerNormColumnParallelLinear: their input gather too
    (the rotary key's is outside the checkpoint), in either mode; not under TP-comm overlap."""
    for down in ("column", "duplicated"):
        assert _tp_bytes(_spec(down, **{"training.recompute": "mla_up_proj"}))["attn_up_recompute_ag"] == \
            {T * (QL + KL) * 2}
    overlap = _spec("duplicated", **{"training.recompute": "mla_up_proj", "parallel.tp_comm_overlap": True})
    assert "attn_up_recompute_ag" not in _tp_bytes(overlap)


def test_tp_1_builds_the_same_ops_either_way():
    one = {"parallel.tp": 1, "parallel.sequence_parallel": False, "cluster.gpus": 1}
    a, b = (scenario_from_dict(_spec(down, **one)) for down in ("column", "duplicated"))
    ops = lambda s: [(o.name, o.duration, o.comm) for o in build(s, build_topology(s))[1][0].ops]  # noqa: E731
    assert ops(a) == ops(b)


def test_only_the_deepseek_row_runs_column():
    rows = {r.id: r.scenario["parallel"].get("mla_down_proj") for r in validation.load_rows()}
    assert rows.pop("dg-dsv3-1024") == "column" and set(rows.values()) == {None}


@pytest.mark.parametrize("extra, key", [
    ({"parallel.mla_down_proj": "row"}, "parallel.mla_down_proj"),
    ({"parallel.tp_comm_overlap": True}, "parallel.mla_down_proj"),
])
def test_bad_values_are_refused_naming_the_key(extra, key):
    with pytest.raises(InputError) as err:
        scenario_from_dict(_spec(**extra))
    assert err.value.key == key


def test_bad_values_exit_2_through_the_cli(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 4\ntp = 2\n'
                    'sequence_parallel = true\n')
    assert_refusals(path, [(["parallel.mla_down_proj=column"], "parallel.mla_down_proj"),  # no MLA
                           (["parallel.mla_down_proj=rows"], "parallel.mla_down_proj")])


def test_the_planner_refuses_what_the_loader_refuses():
    s = scenario_from_dict(_spec())
    table = pd.DataFrame([dict(tp=2, pp=1, dp=1, cp=1, ep=1, expert_tp=2, virtual_stages=1, schedule="1f1b", zero=0,
                               recompute="none", micro_batch=1, tp_comm_overlap=on, ep_comm_overlap=False)
                          for on in (False, True)])
    codes = plan_rules.codes(table, plan_rules.fixed_of(s))
    assert codes[0] == 0 and plan_rules.REASONS[codes[1] - 1].key == "parallel.mla_down_proj"
    assert list(plan_rules.codes(table, plan_rules.fixed_of(scenario_from_dict(_spec("duplicated"))))) == [0, 0]
