"""Overlapped TP and EP communication against the closed forms of chunked pipelines.

- TP comm overlap (``parallel.tp_comm_overlap``, TransformerEngine userbuffers): the
  reduce-scatter after the attention and the MLP runs in 4 chunks, each under the next
  GEMM chunk, so when a chunk's reduce-scatter is shorter than a GEMM chunk only the
  last one is exposed: 2 x T_RS(B/4) per layer and micro-batch forward, nothing in
  backward (ring-exchange and bulk overlaps hide it all). When a ring-exchange step
  is slower than its GEMM chunk c > g, the ring exposes (tp - 1)(c - g).
- EP all-to-all overlap (``parallel.ep_comm_overlap``, Megatron's combined 1F1B): with
  pp = 1 the first forward and the last backward run alone and expose their
  all-to-alls; every other all-to-all runs under the other micro-batch's compute.

Run: ``python -m pytest tests/test_overlap.py``
"""

import pytest

from conftest import assert_input_error, clustersim
from sim.input.load import scenario_from_dict
from sim.model.transformer import activation_bytes_per_layer, dims
from sim.outputs.metrics import length, subtract, union
from sim.parallel import pp
from sim.parallel.tp_overlap import RS_SPLITS
from sim.step import build_topology, simulate
from sim.studies.nccl_tests import time_collective

DENSE = {"layers": 2, "hidden": 8192, "heads": 64, "vocab": 128}
SEQ, TP = 4096, 4


def tp_run(overlap: bool, nvlink_gbps: float | None = None):
    cluster = {"topology": "dgx-h100", "gpus": TP}
    if nvlink_gbps:
        cluster["topology_overrides"] = {"nvlink_gbps": nvlink_gbps}
    s = scenario_from_dict({"model": DENSE, "training": {"seq_len": SEQ, "global_batch": 1}, "cluster": cluster,
                            "parallel": {"tp": TP, "sequence_parallel": True, "tp_comm_overlap": overlap}})
    return s, simulate(s)


def exposed(spans, comm):
    """Time ``comm`` spans are in flight while the rank's compute stream is idle."""
    compute = union(spans[spans.category == "compute"][["start_s", "end_s"]].to_numpy())
    return length(subtract(union(comm[["start_s", "end_s"]].to_numpy()), compute))


def rank0(result):
    return result.spans[result.spans["rank"] == 0]


def test_tp_overlap_exposes_only_the_last_reduce_scatter_chunk():
    s, result = tp_run(True)
    sp = rank0(result)
    layers = sp[(sp.category == "tp") & (sp.layer >= 0) & (sp.layer < DENSE["layers"])]
    act = SEQ * DENSE["hidden"] * 2  # b*s*h bf16: what the tp group gathers / reduces
    topo = build_topology(s)
    t_rs = time_collective(topo, "reduce_scatter", "auto", tuple(range(TP)), act / RS_SPLITS)
    # the regime of the closed form: each reduce-scatter chunk is shorter than a GEMM chunk
    chunks = sp[sp.name.isin(["attn_post_fwd", "mlp_fwd"]) & (sp.layer == 0)]
    assert t_rs < (chunks.end_s - chunks.start_s).max()
    assert exposed(sp, layers) == pytest.approx(DENSE["layers"] * 2 * t_rs, rel=1e-9)
    # and it is what overlap buys: without it every forward collective and every gather of an
    # output gradient is exposed (only the backward's input side runs beside dgrad / wgrad,
    # Megatron's async collectives)
    _, plain = tp_run(False)
    sp0 = rank0(plain)
    plain_layers = sp0[(sp0.category == "tp") & (sp0.layer >= 0) & (sp0.layer < DENSE["layers"])]
    input_side = plain_layers.name.str.endswith("_input_ag") | plain_layers.name.str.endswith("_grad_rs")
    in_path = plain_layers[~input_side]
    assert len(in_path) == DENSE["layers"] * 6
    assert exposed(sp0, in_path) == pytest.approx((in_path.end_s - in_path.start_s).sum(), rel=1e-9)
    assert exposed(sp0, plain_layers) > 10 * exposed(sp, layers)
    assert result.summary["step_time_s"] < plain.summary["step_time_s"]


def test_a_ring_step_slower_than_its_gemm_chunk_exposes_the_difference():
    """Slow NVLink: chunk i's GEMM waits for ring step i-1; the ring of the first
    layer's QKV projection exposes (tp - 1) (c - g)."""
    s, result = tp_run(True, nvlink_gbps=40)
    sp = rank0(result)
    ring = sp[(sp.name == "attn_ag") & (sp.layer == 0)]
    assert len(ring) == TP - 1
    c = time_collective(build_topology(s), "ring_shift", "auto", tuple(range(TP)), SEQ * DENSE["hidden"] * 2 / TP)
    qkv = sp[(sp.name == "attn_pre_fwd") & (sp.layer == 0)]
    g = (qkv.end_s - qkv.start_s).to_numpy()[1:]  # the norm, then tp GEMM chunks
    assert len(g) == TP and g.max() - g.min() < 1e-15 and c > g[0]
    assert exposed(sp, ring) == pytest.approx((TP - 1) * (c - g[0]), rel=1e-9)


def test_tp_overlap_moves_the_same_bytes_as_plain_sequence_parallelism():
    """Ring exchange = all-gather, pipelined chunks = reduce-scatter in bytes. Per layer and
    micro-batch: forward AG + RS for attention and MLP; backward, per sublayer, the gather
    of the output gradient, the gather of the saved input (for the wgrad) and the
    reduce-scatter of the input gradient: 10 collectives of (tp-1)/tp of b*s*h each."""
    _, on = tp_run(True)
    _, off = tp_run(False)
    assert on.summary["comm_bytes_per_gpu"]["tp"] == pytest.approx(off.summary["comm_bytes_per_gpu"]["tp"], rel=1e-12)
    sp = rank0(off)
    layers = sp[(sp.category == "tp") & (sp.layer >= 0) & (sp.layer < DENSE["layers"])]
    act = SEQ * DENSE["hidden"] * 2
    assert len(layers) == 10 * DENSE["layers"]
    assert layers.bytes.sum() == pytest.approx(10 * DENSE["layers"] * act * (TP - 1) / TP, rel=1e-12)


# --- EP all-to-all overlap --------------------------------------------------------------

MOE = {"layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 4, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 5632, "moe": {"experts": 16, "top_k": 2, "routing": "uniform"}}
M = 4  # micro-batches per step


def ep_run(overlap: bool):
    """ep 16 over two DGX H100 nodes: the all-to-alls cross InfiniBand."""
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": 4096, "global_batch": 16 * M},
        "cluster": {"topology": "dgx-h100", "gpus": 16}, "parallel": {"dp": 16, "ep": 16, "ep_comm_overlap": overlap}}))


def test_ep_overlap_hides_every_all_to_all_but_the_first_forward_and_last_backward():
    on, off = ep_run(True), ep_run(False)
    sp = rank0(on)
    a2a = sp[sp.name.str.startswith("a2a_")]  # (the forward's counts all-gather is no token all-to-all)
    for mb in range(M):
        for direction in ("fwd", "bwd"):
            calls = a2a[(a2a.micro_batch == mb) & a2a.name.str.endswith(direction)]
            alone = (mb, direction) in ((0, "fwd"), (M - 1, "bwd"))
            total = (calls.end_s - calls.start_s).sum()
            assert exposed(sp, calls) == pytest.approx(total if alone else 0.0, rel=1e-9, abs=1e-12)
    sp_off = rank0(off)
    a2a_off = sp_off[sp_off.name.str.startswith("a2a_")]
    assert exposed(sp_off, a2a_off) == pytest.approx((a2a_off.end_s - a2a_off.start_s).sum(), rel=1e-9)
    assert on.summary["step_time_s"] < off.summary["step_time_s"]
    assert on.summary["comm_bytes_per_gpu"] == off.summary["comm_bytes_per_gpu"]
    # one more micro-batch's activations in flight (the extra warm-up forward)
    per_layer = activation_bytes_per_layer(dims(on.scenario.model), 4096, 1, 1, False, "none", True)
    assert on.memory.activations - off.memory.activations == pytest.approx(MOE["layers"] * per_layer, rel=1e-9)


@pytest.mark.parametrize("p, v, m", [(1, 1, 4), (2, 2, 4), (4, 2, 8), (4, 3, 4)])
def test_combined_steps_pair_independent_forwards_and_backwards(p, v, m):
    schedule = "interleaved" if v > 1 else "1f1b"
    for stage in range(p):
        steps = pp.steps(schedule, p, v, m, stage, combined=True)
        flat = [item for step in steps for item in step]
        assert sorted(flat) == sorted(pp.order(schedule, p, v, m, stage))  # every pass exactly once
        done = set()
        for step in steps:
            if len(step) == 2:
                (fd, *f), (bd, *b) = step
                assert (fd, bd) == ("F", "B") and tuple(b) in done and f != b  # the backward's forward ran earlier
            done |= {tuple(rest) for d, *rest in step if d == "F"}
    assert pp.steps("1f1b", 1, 1, 3, 0, True) == [(("F", 0, 0),), (("F", 1, 0), ("B", 0, 0)),
                                                  (("F", 2, 0), ("B", 1, 0)), (("B", 2, 0),)]


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    (["parallel.tp_comm_overlap=true"], "parallel.tp_comm_overlap"),  # tp = 1
    (["parallel.tp=2", "parallel.dp=4", "parallel.ep=4", "parallel.tp_comm_overlap=true"], "parallel.tp_comm_overlap"),
    (["parallel.ep_comm_overlap=true", "parallel.ep=1"], "parallel.ep_comm_overlap"),
    (["parallel.ep_comm_overlap=true", "training.recompute=full"], "parallel.ep_comm_overlap"),
    (["parallel.ep_comm_overlap=true", "parallel.pp=2", "parallel.dp=4", "parallel.ep=4"], "parallel.ep_comm_overlap"),
    (["parallel.ep_comm_overlap=true", "parallel.schedule=gpipe"], "parallel.ep_comm_overlap"),
    (["parallel.ep_comm_overlap=true", "training.global_batch=8"], "parallel.ep_comm_overlap"),  # 1 micro-batch
])
def test_overlap_keys_are_checked_at_the_edge(overrides, key):
    base = ["cluster.nodes=1", "parallel.dp=8", "training.global_batch=16"]
    proc = clustersim("run", "scenarios/mixtral-small-ep-h100.toml", *[a for o in base + overrides for a in ("--set", o)])
    assert_input_error(proc, key)


# --- kernel roles and the bytes TP moves under FP8 and MLA ---------------------------

def _shard(**kw):
    from sim.model.layers import Shard

    return Shard(**{"tokens": 4096, "seq": 4096, "micro": 1, "tp": 4, "sp": True, "flash": True, **kw})


def test_roles_follow_the_kernel_tags_under_fp8():
    """FP8 puts a cast before each GEMM: the column-parallel run is [cast, fc1], the
    row-parallel run [cast, fc2], the activation sits between them."""
    from sim.model.layers import mlp_block
    from sim.parallel.tp import roles

    d = dims(scenario_from_dict({"model": {**DENSE, "mlp": "swiglu"}, "training": {"seq_len": SEQ, "global_batch": 1},
                                 "cluster": {"gpus": 1}}).model)
    kernels = mlp_block(d, _shard(fp8=True))
    r = roles(kernels, gather=True, scatter=True)
    assert [k.tp for k in kernels] == [0, 1, 1, 0, 2, 2, 0]
    assert (r.head, r.consumers, r.middle, r.producer, r.tail) == (slice(0, 1), slice(1, 3), slice(3, 4),
                                                                   slice(4, 6), slice(6, 7))
    assert kernels[2].fp8 and kernels[5].fp8 and not kernels[1].flops


def test_mla_down_projections_run_before_the_gather():
    """MLA's duplicated down projections and latent norms work on the sequence shard; only
    the up projections read the gathered latents."""
    from sim.model.layers import attention_pre
    from sim.parallel.tp import roles

    d = dims(scenario_from_dict({"model": {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 128, "attention": "mla",
                                           "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                                           "qk_rope_head_dim": 32, "v_head_dim": 64},
                                 "training": {"seq_len": 1024, "global_batch": 1}, "cluster": {"gpus": 1}}).model)
    kernels = attention_pre(d, _shard())
    r = roles(kernels, gather=True, scatter=False)
    assert [k.tp for k in kernels] == [0, 0, 0, 0, 1, 1]  # norm, q down, kv down, latent norms, q up, kv up
    assert r.head == slice(0, 4) and r.consumers == slice(4, 6)


def _tp_bytes(precision: str, model: dict, overlap: bool) -> dict:
    s = scenario_from_dict({"model": model, "training": {"seq_len": SEQ, "global_batch": 1, "precision": precision},
                            "cluster": {"topology": "dgx-h100", "gpus": TP},
                            "parallel": {"tp": TP, "sequence_parallel": True, "tp_comm_overlap": overlap}})
    sp = rank0(simulate(s))
    tp = sp[(sp.category == "tp") & (sp.layer == 0)]
    return {"ag": tp[tp.name.str.endswith("_ag")].bytes.sum(), "rs": tp[tp.name.str.endswith("_rs")].bytes.sum()}


@pytest.mark.parametrize("overlap", [False, True])
def test_fp8_all_gathers_move_half_the_bytes_and_reductions_do_not_change(overlap):
    """Transformer Engine quantizes before it gathers (layernorm_linear.py,
    gather_along_first_dim(..., quantizer=...)); reduce-scatters stay BF16."""
    bf16, fp8 = _tp_bytes("bf16", DENSE, overlap), _tp_bytes("fp8", DENSE, overlap)
    assert bf16["ag"] > 0 and fp8["ag"] == pytest.approx(bf16["ag"] / 2, rel=1e-12)
    assert fp8["rs"] == pytest.approx(bf16["rs"], rel=1e-12)


def test_mla_attention_gathers_its_latents_not_the_hidden_state():
    """Per token the attention entry gathers q latent + kv latent + rotary key, the MLP's
    entry the hidden state: forward all-gathers of one layer = (2112 + 7168) elements over
    (tp-1)/tp of the tokens, in BF16."""
    mla = {"layers": 2, "hidden": 7168, "heads": 32, "vocab": 128, "attention": "mla", "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    s = scenario_from_dict({"model": mla, "training": {"seq_len": SEQ, "global_batch": 1},
                            "cluster": {"topology": "dgx-h100", "gpus": TP},
                            "parallel": {"tp": TP, "sequence_parallel": True}})
    sp = rank0(simulate(s))
    ag = sp[(sp.category == "tp") & (sp.layer == 0) & (sp.name.isin(["attn_ag", "mlp_ag"]))]
    sent = dict(zip(ag.name, ag.bytes))
    assert sent["attn_ag"] == pytest.approx(SEQ * (1536 + 512 + 64) * 2 * (TP - 1) / TP, rel=1e-12)
    assert sent["mlp_ag"] == pytest.approx(SEQ * 7168 * 2 * (TP - 1) / TP, rel=1e-12)
