"""Context parallelism with K/V all-gathered before a local attention (``parallel.cp_impl =
"all_gather"``, sim/parallel/cp_all_gather.py: Llama 3 Sec. 3.3.2, Transformer Engine's
AttnFuncWithCPAndKVAllGather). Exact closed forms: the two calls' FLOPs and rate, the copies'
bytes over the streaming HBM rate plus launches, the collectives' bytes; the all-gather and the
reduce-scatter exposed; the Llama 3 rows that run it.

Run: ``python -m pytest tests/test_cp_all_gather.py``.
"""

import json

import pytest

from conftest import REPO
from forked_cli import run_cli
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model import compute
from sim.step import build, build_topology, simulate
from sim.studies import validation

CP, SEQ, HEADS, KV_HEADS, HD, LAYERS = 4, 8192, 8, 2, 128, 2
SMALL = {"name": "cp-ag", "model": {"name": "llama-2l", "layers": LAYERS, "hidden": HEADS * HD, "heads": HEADS,
                                    "kv_heads": KV_HEADS, "ffn_hidden": 3584, "vocab": 32000, "mlp": "swiglu"},
         "training": {"seq_len": SEQ, "global_batch": 1},
         "parallel": {"cp": CP, "cp_impl": "all_gather"}, "cluster": {"gpu": "h100-sxm", "gpus": CP}}
TOKENS = SEQ // CP
KV = TOKENS * 2 * KV_HEADS * HD  # K and V elements of a rank's tokens
PREFIXES = KV * (2 * CP + 1) / 2  # what the two calls copy out of the gathered K/V
NQ = TOKENS * HEADS * HD  # one query-headed tensor (q, out, dq)
SUSTAINED = compute.GEMM_EFFICIENCY["h100-sxm"] / compute.GEMM_KERNEL["h100-sxm"]["bf16"]


def scenario(**training):
    data = json.loads(json.dumps(SMALL))
    data["training"].update(training)
    return scenario_from_dict(data)


def long_scenario():
    """SMALL at 64k tokens: the K/V all-gather (67 MB) outlasts the host's issue of the next
    ops, so a missing dependency would show in the spans."""
    return scenario(seq_len=8 * SEQ)


def ops(**training) -> list:
    s = scenario(**training)
    return build(s, build_topology(s))[1][0].ops


def stream_s(nbytes: float, launches: int) -> float:
    return nbytes / (gpu_preset("h100-sxm").hbm_bw * compute.HBM_EFFICIENCY) + launches * compute.LAUNCH_S


def time_of(program, name: str) -> float:
    return sum(op.duration for op in program if op.name == name)


@pytest.mark.parametrize("backend, fwd_curve, bwd_curve", [("flash2", (0.345, 307), (0.301, 452)),
                                                           ("cudnn", (0.61, 90), (0.53, 350))])
def test_two_calls_carry_the_causal_sequence_at_half_its_keys(backend, fwd_curve, bwd_curve):
    """Per layer two launches whose FLOPs are the rank's queries against the causal sequence
    (4 x tokens x seq / 2 x heads x head dim), at the backend's H100 curve at seq / 2 keys times
    the sustained factor; the backward 2.5x the FLOPs at its own curve, four launches."""
    program = ops(attention_backend=backend)
    keys = SEQ / 2
    flops = 4 * TOKENS * keys * HEADS * HD

    def rate(curve):
        return 989e12 * SUSTAINED * curve[0] * keys / (keys + curve[1])

    fwd = flops / rate(fwd_curve) + 2 * compute.LAUNCH_S
    bwd = 2.5 * flops / rate(bwd_curve) + 4 * compute.LAUNCH_S
    assert time_of(program, "attn_core_fwd") == pytest.approx(LAYERS * fwd, rel=1e-12)
    assert time_of(program, "attn_core_bwd") == pytest.approx(LAYERS * bwd, rel=1e-12)


def test_rank_pairs_cost_what_two_average_calls_cost():
    """Rank r's calls attend r + 1/2 and 2cp - r - 1/2 chunks of keys on average; under
    e(k) = top k / (k + half) a call's time is linear in its keys, so every pair costs what two
    calls at seq / 2 keys cost (why the module charges that, and the ranks fold)."""
    model = compute.ComputeModel(gpu_preset("h100-sxm"))
    span, tokens = SEQ / (2 * CP), TOKENS / 2

    def call(keys, direction):
        k = compute.Kernel(4 * tokens * keys * HEADS * HD, HD, attn=direction, keys=keys)
        return model.flop_time(k)

    for direction in (1, 2):
        average = 2 * call(SEQ / 2, direction)
        for r in range(CP):
            pair = call((r + 0.5) * span, direction) + call((2 * CP - r - 0.5) * span, direction)
            assert pair == pytest.approx(average, rel=1e-12)


def test_copies_are_their_bytes():
    """Forward: the two calls' K/V copied out of the gathered ones (read and write, (2cp + 1) half
    chunks), their outputs copied into out; backward: dk/dv zeroed at the gathered size, the same
    K/V copies, dq copied out, dk and dv added into the buffers (read both, write)."""
    program = ops()
    assert time_of(program, "cp_kv_copy_fwd") == pytest.approx(LAYERS * stream_s(4 * PREFIXES, 2), rel=1e-12)
    assert time_of(program, "cp_out_copy_fwd") == pytest.approx(LAYERS * stream_s(4 * NQ, 2), rel=1e-12)
    assert time_of(program, "cp_dkv_zero_bwd") == pytest.approx(LAYERS * stream_s(2 * CP * KV, 2), rel=1e-12)
    assert time_of(program, "cp_kv_copy_bwd") == pytest.approx(LAYERS * stream_s(4 * PREFIXES, 2), rel=1e-12)
    add = stream_s(4 * NQ, 2) + stream_s(6 * PREFIXES, 4)
    assert time_of(program, "cp_dkv_add_bwd") == pytest.approx(LAYERS * add, rel=1e-12)


def test_kv_all_gathered_per_pass_and_dkv_reduce_scattered():
    """One all-gather of cp x the rank's K/V (kv heads, bf16) per layer and pass, one
    reduce-scatter of the same size in the backward; no ring shifts."""
    program = ops()
    calls = [(op.name, op.comm.op, op.comm.nbytes) for op in program if op.comm is not None and op.category == "cp"]
    assert sorted(calls) == sorted(LAYERS * [("cp_kv_allgather_fwd", "all_gather", CP * 2 * KV),
                                             ("cp_kv_allgather_bwd", "all_gather", CP * 2 * KV),
                                             ("cp_dkv_reducescatter_bwd", "reduce_scatter", CP * 2 * KV)])


def test_all_gather_and_reduce_scatter_are_exposed():
    """The attention waits for the all-gather, and what follows the backward for the
    reduce-scatter: on every layer the spans do not overlap (Llama 3: "exposed in the critical
    path")."""
    spans = simulate(long_scenario()).spans
    spans = spans[spans["rank"] == 0]

    def window(name, layer):
        rows = spans[(spans["name"] == name) & (spans["layer"] == layer)]
        return rows["start_s"].min(), rows["end_s"].max()

    for layer in range(LAYERS):
        assert window("cp_kv_allgather_fwd", layer)[1] <= window("attn_core_fwd", layer)[0]
        assert window("cp_kv_allgather_bwd", layer)[1] <= window("attn_core_bwd", layer)[0]
        assert window("cp_dkv_reducescatter_bwd", layer)[1] <= window("attn_pre_bwd", layer)[0]


def test_llama3_rows_run_fa2_and_the_long_context_row_all_gather():
    rows = {r.id: r for r in validation.modern_rows()}
    llama3 = [r for i, r in rows.items() if i.startswith("l3-405")]
    assert len(llama3) == 3 and all(r.scenario["training"]["attention_backend"] == "flash2" for r in llama3)
    assert [i for i, r in rows.items() if r.scenario["parallel"].get("cp_impl") == "all_gather"] == ["l3-405-cp16-16384"]


def test_all_gather_without_flash_attention_exits_2_naming_the_key():
    out = run_cli(["run", str(REPO / "scenarios/llama3-8b-cp-128k-h100.toml"), "--set", "parallel.cp_impl=all_gather",
                   "--set", "training.flash_attention=false"])
    assert out.code == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "parallel.cp_impl" in out.stderr and "Traceback" not in out.stderr


def test_a_cp_implementation_without_cp_is_refused_and_the_planner_drops_it():
    """cp_impl names how context parallelism runs: at cp = 1 it would do nothing, so it is refused
    (exit 2 naming it); the planner's cp = 1 candidates of a base that sets it run the default."""
    from sim.plan.space import overrides

    for impl in ("torch", "all_gather"):
        out = run_cli(["run", str(REPO / "scenarios/llama3-8b-fsdp-h100.toml"), "--set", f"parallel.cp_impl={impl}"])
        assert out.code == 2 and "parallel.cp_impl" in out.stderr and "Traceback" not in out.stderr
    row = dict(tp=1, pp=1, dp=8, cp=1, ep=1, expert_tp=1, virtual_stages=1, schedule="1f1b", zero=1,
               recompute="none", micro_batch=1, tp_comm_overlap=False, ep_comm_overlap=False)
    assert overrides(row)["parallel.cp_impl"] == "ring"
    assert "parallel.cp_impl" not in overrides({**row, "cp": 2, "dp": 4})
