"""PyTorch's experimental context parallelism (``parallel.cp_impl = "torch"``,
sim/parallel/cp_torch.py): fp32 out/lse merges, fp32 gradient accumulators and dk/dv
shifts, K/V all-gathered at the query heads. Exact closed forms: bytes over the streaming
HBM rate plus launches, collective bytes; Megatron's ring unchanged.

Run: ``python -m pytest tests/test_cp_torch.py``.
"""

import json

import pytest

from conftest import REPO
from forked_cli import run_cli
from sim.input.load import scenario_from_dict
from sim.model import compute
from sim.hardware.gpus import gpu_preset
from sim.step import build, build_topology
from sim.studies import frontier

CP, SEQ, HEADS, KV_HEADS, HD = 4, 8192, 8, 2, 128
SMALL = {"name": "cp", "model": {"name": "llama-2l", "layers": 2, "hidden": HEADS * HD, "heads": HEADS,
                                 "kv_heads": KV_HEADS, "ffn_hidden": 3584, "vocab": 32000, "mlp": "swiglu"},
         "training": {"seq_len": SEQ, "global_batch": 1, "kernels": "pytorch", "compile": True},
         "parallel": {"cp": CP, "cp_impl": "torch"}, "cluster": {"gpu": "h100-sxm", "gpus": CP}}
TOKENS = SEQ // CP
N, NL = TOKENS * HEADS * HD, TOKENS * HEADS  # elements of one query-headed tensor, logsumexp values


def ops(parallel=None, **training) -> list:
    data = json.loads(json.dumps(SMALL))
    data["training"].update(training)
    data["parallel"].update(parallel or {})
    s = scenario_from_dict(data)
    return build(s, build_topology(s))[1][0].ops


def stream_s(nbytes: float, launches: int) -> float:
    return nbytes / (gpu_preset("h100-sxm").hbm_bw * compute.HBM_EFFICIENCY) + launches * compute.LAUNCH_S


def time_of(program, name: str) -> float:
    return sum(op.duration for op in program if op.name == name)


def test_compiled_merges_and_accumulators_are_their_fp32_bytes():
    """Per layer: cp-1 fused merges of 10 bytes an output element (fp32 accumulator read and
    written, BF16 chunk read) and 10 per logsumexp value, a cast back of 6; backward cp
    fused fp32 accumulations of dq, dk, dv (10 bytes an element) and a cast back of 6."""
    program = ops()
    layers = 2
    merge = (CP - 1) * stream_s(10 * N + 10 * NL, 1) + stream_s(6 * (N + NL), 1)
    assert time_of(program, "cp_merge_fwd") == pytest.approx(layers * merge, rel=1e-12)
    acc = CP * stream_s(10 * 3 * N, 1) + stream_s(6 * 3 * N, 1)
    assert time_of(program, "cp_grad_acc_bwd") == pytest.approx(layers * acc, rel=1e-12)
    assert time_of(program, "cp_kv_cat_fwd") == pytest.approx(layers * stream_s(2 * 2 * 2 * N, 1), rel=1e-12)


def test_eager_merge_is_the_operator_sum():
    """Eagerly a merge is 4 full-size operators (38 bytes an element) and 5 logsumexp ones
    (12 bytes a value each); the K/V cat runs at every step but the last."""
    program = ops(compile=False)
    merge = (CP - 1) * (stream_s(38 * N, 4) + stream_s(5 * 12 * NL, 5)) + stream_s(6 * (N + NL), 1)
    assert time_of(program, "cp_merge_fwd") == pytest.approx(2 * merge, rel=1e-12)
    assert time_of(program, "cp_kv_cat_fwd") == pytest.approx(2 * (CP - 1) * stream_s(8 * N, 1), rel=1e-12)


def test_exchanges_carry_query_heads_and_fp32_gradients():
    """K/V all-gathered once per pass at the query heads (repeat_kv), cp x the rank's share;
    dk, dv shifted in fp32 after every backward chunk. The ring moves the kv heads."""
    program = ops()
    gathers = {op.comm.nbytes for op in program if op.name == "cp_kv_allgather_fwd"}
    assert gathers == {CP * 2 * 2 * N}
    shifts = [op.comm for op in program if op.name == "cp_dkv_shift_bwd"]
    assert len(shifts) == 2 * CP and {c.nbytes for c in shifts} == {4 * 2 * N} and {c.op for c in shifts} == {"ring_shift"}
    ring = ops({"cp_impl": "ring"})
    assert {op.comm.nbytes for op in ring if op.name == "kv_shift_fwd"} == {2 * TOKENS * 2 * KV_HEADS * HD}
    assert not any(op.name.startswith("cp_") for op in ring)


def test_torch_costs_more_than_the_ring():
    assert sum(op.duration for op in ops()) > sum(op.duration for op in ops({"cp_impl": "ring"}))


def test_torchtitan_cp_rows_run_pytorchs_cp_and_others_keep_the_ring():
    row = next(r for r in frontier.frontier_rows() if r.id == "tt_h100_l8b_cp8_262k")
    assert row.scenario["parallel"]["cp_impl"] == "torch"
    assert all("cp_impl" not in r.scenario["parallel"] for r in frontier.frontier_rows()
               if r.scenario["parallel"].get("cp", 1) == 1)


def test_bad_cp_impl_exits_2_naming_the_key():
    out = run_cli(["run", str(REPO / "scenarios/llama3-8b-cp-128k-h100.toml"), "--set", "parallel.cp_impl=megatron"])
    assert out.code == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "parallel.cp_impl" in out.stderr and "Traceback" not in out.stderr


def test_ring_calls_run_at_pytorchs_measured_fa2_rate():
    """torchtitan's SDPA is PyTorch's FA2 (attention_backend "flash2"): each of the cp calls of
    a layer is 4 x tokens x keys x heads x head dim FLOPs (keys = seq / cp / 2, the causal half)
    at the H100's measured curve, forward 0.345 x keys / (keys + 307) of the peak times the
    sustained factor, plus a launch; the backward 2.5x the FLOPs at 0.301 x keys / (keys + 452)."""
    program = ops(attention_backend="flash2")
    keys = SEQ / CP / 2
    flops = 4 * TOKENS * keys * HEADS * HD
    sustained = compute.GEMM_EFFICIENCY["h100-sxm"] / compute.GEMM_KERNEL["h100-sxm"]["bf16"]
    fwd = flops / (989e12 * sustained * 0.345 * keys / (keys + 307)) + compute.LAUNCH_S
    bwd = 2.5 * flops / (989e12 * sustained * 0.301 * keys / (keys + 452)) + 2 * compute.LAUNCH_S
    layers = 2
    assert time_of(program, "attn_core_fwd") == pytest.approx(layers * CP * fwd, rel=1e-12)
    assert time_of(program, "attn_core_bwd") == pytest.approx(layers * CP * bwd, rel=1e-12)
