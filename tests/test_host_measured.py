"""sim/model/host.py's measured host costs against the measurement files they cite.

Each measured constant is read here from the field of bench/measured/h100-2026-11-26.json (or
its second run, h100-2026-11-26-fp8-step.json) that its definition names, not from a copy:
the constant must equal the field rounded to 0.01 us, and the composed costs must follow
their closed forms. Run ``python -m pytest -q tests/test_host_measured.py``.
"""

import json

import pytest

from conftest import REPO
from sim.model import host
from sim.model.compute import Kernel
from sim.input.load import scenario_from_dict
from sim.step import build, build_topology

MEASURED = REPO / "bench" / "measured"
MAIN = json.loads((MEASURED / "h100-2026-11-26.json").read_text())
SECOND = json.loads((MEASURED / "h100-2026-11-26-fp8-step.json").read_text())
US = 1e-6
ROUNDING = 0.005 * US  # the constants are the fields rounded to 0.01 us


def _field(doc: dict, path: str) -> float:
    for key in path.split("."):
        doc = doc[key]
    return doc


CITED = [  # (constant's value, file's document, field)
    (lambda: host.KERNEL_ISSUE_S, MAIN, "host.eager_add_inplace.host_s"),
    (lambda: host.GEMM_ISSUE_S, MAIN, "host.eager_linear_1k.host_s"),
    (lambda: host.GRAPH_LAUNCH_S, MAIN, "host.cuda_graph_100_adds.host_s_per_replay"),
    (lambda: host.SYNC_ROUND_TRIP_S, MAIN, "host.sync_round_trip.host_s"),
    (lambda: host.nccl_call_s("all_reduce"), MAIN, "nccl.all_reduce_4KiB.host_s"),
    (lambda: host.nccl_call_s("reduce_scatter"), MAIN, "nccl.reduce_scatter_4KiB.host_s"),
    (lambda: host.nccl_call_s("all_to_all"), MAIN, "nccl.all_to_all_4KiB.host_s"),
    (lambda: host.nccl_call_s("all_gather"), SECOND, "nccl_more.all_gather_4KiB.host_s"),
    (lambda: host.nccl_call_s("broadcast"), SECOND, "nccl_more.broadcast_4KiB.host_s"),
]


@pytest.mark.parametrize("value, doc, field", CITED, ids=[c[2] for c in CITED])
def test_measured_constant_is_the_cited_field(value, doc, field):
    assert doc["env"]["gpu"].startswith("NVIDIA H100")
    assert value() == pytest.approx(_field(doc, field), abs=ROUNDING)


def test_d2h_sync_is_one_measured_round_trip_and_three_more_copies():
    """Megatron's 4 split-size copies and one wait: the .item() round trip less its add, plus
    3 eager copies at the measured eager-op cost."""
    h = MAIN["host"]
    expected = h["sync_round_trip"]["host_s"] + 2 * h["eager_add_inplace"]["host_s"]
    assert host.D2H_SYNC_S == pytest.approx(expected, abs=3 * ROUNDING)


def test_unmeasured_point_to_point_keeps_the_estimate():
    """No peer on a world of one GPU: send/recv and the ring shift stay at the eager op and 3
    CUDA calls, below every measured collective."""
    for op in ("send_recv", "ring_shift"):
        assert host.nccl_call_s(op) == host.EAGER_OP_S + 3 * host.CUDA_LAUNCH_S
        assert host.nccl_call_s(op) < min(host.nccl_call_s(k) for k in ("all_reduce", "all_gather", "broadcast"))


def test_every_collective_op_has_a_call_cost():
    from sim.collectives import OPS

    assert set(host.NCCL_CALL_S) == set(OPS)
    with pytest.raises(ValueError):
        host.nccl_call_s("all_reduce_async")


def test_issue_cost_by_kernel_kind():
    """A GEMM or attention launch costs the measured F.linear call, a memory-bound one the
    measured eager add, each per launch it stands for, plus the step's Python around each
    launch (STEP_PYTHON_S, tests/test_host_step.py)."""
    gemm, attn, memory = Kernel(1e9, 1024), Kernel(1e9, 128, attn=1), Kernel(bytes=1e6, count=3)
    assert host.issue_s([gemm, attn, memory]) == pytest.approx(
        2 * MAIN["host"]["eager_linear_1k"]["host_s"] + 3 * MAIN["host"]["eager_add_inplace"]["host_s"]
        + 5 * host.STEP_PYTHON_S,
        abs=5 * ROUNDING)


def test_collective_ops_are_issued_at_their_kinds_cost():
    """In a built MoE program (dp 4 x ep 4 over 8 GPUs with tp 2), every collective op's issue
    is its kind's measured call cost and the step's Python around it (STEP_PYTHON_S) plus what
    the host spent before it (never less), and some op of each kind is issued at exactly that."""
    spec = {"model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                      "moe": {"experts": 8, "top_k": 2}},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallel": {"tp": 2, "pp": 1, "dp": 4, "ep": 4},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 8}}
    s = scenario_from_dict(spec)
    ops = [op for op in build(s, build_topology(s))[1][0].ops if op.comm is not None]
    kinds = {op.comm.op for op in ops}
    assert {"all_to_all", "all_reduce", "all_gather"} <= kinds
    for kind in kinds:
        cost = host.NCCL_CALL_S[kind] + host.STEP_PYTHON_S
        issued = [op.issue for op in ops if op.comm.op == kind]
        assert min(issued) == pytest.approx(cost, rel=1e-12), kind
