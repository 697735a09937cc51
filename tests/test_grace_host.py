"""The Grace host of GB200 / GB300 parts issues GPU work 2.75x slower than the x86 host the model's
host costs were measured on (sim.hardware.gpus.GRACE_HOST_ISSUE, TransformerEngine issue 2053), and
on the 405B FP8 layouts of the nb_ rows that makes the layer host-bound while its BF16 twin stays
GPU-bound (docs/precision.md, "The Grace host binds the 405B FP8 rows").

Run: ``python -m pytest -q tests/test_grace_host.py``
"""

import pytest

from sim.hardware.gpus import GPUS, GRACE_HOST_ISSUE
from sim.input.load import scenario_from_dict
from sim.parallel import layer_program as lp
from sim.studies.validation import load_rows

GRACE_PARTS = {"gb200", "gb200-torchtitan", "gb300"}


def _programs(row_id: str):
    s = scenario_from_dict(next(r for r in load_rows() if r.id == row_id).scenario)
    return lp.programs(s, s.cluster.gpu, kinds=(lp.Kind.DENSE,))[lp.Kind.DENSE]


def test_grace_parts_take_the_measured_host_ratio():
    # issue 2053: torch.nn.Linear forward 37.08 us of host on a GB200, 13.48 us on an H100 DGX
    assert GRACE_HOST_ISSUE == pytest.approx(2.7507, abs=1e-4)
    for name, gpu in GPUS.items():
        assert gpu.host_issue == (GRACE_HOST_ISSUE if name in GRACE_PARTS else 1.0), name


def test_every_op_of_a_grace_layer_issues_at_the_ratio():
    """The same 405B MXFP8 layer on a GB200 and on a DGX B200 (x86): op for op, the GB200's host
    seconds are the B200's x 37.08 / 13.48 (kernels, the TP collectives and the schedule's Python alike)."""
    grace, x86 = _programs("nb_gb200_l405b_128g_mxfp8"), _programs("nb_b200_l405b_128g_mxfp8")
    assert [(op.stream, op.category, op.phase, op.kernels) for op in grace.ops] == \
        [(op.stream, op.category, op.phase, op.kernels) for op in x86.ops]
    assert sum(op.issue > 0 for op in x86.ops) > 20
    for i, (a, b) in enumerate(zip(grace.ops, x86.ops)):
        assert a.issue == pytest.approx(b.issue * GRACE_HOST_ISSUE, rel=1e-12, abs=0.0), i


def _host_over_gpu(row_id: str) -> float:
    p = _programs(row_id)
    return p.issue_s / (p.forward_s + p.backward_s)  # (properties: issue_s, forward_s, backward_s)


def test_the_grace_host_nears_the_405b_fp8_layer_and_not_its_bf16_twin():
    """Issue over GPU seconds of one layer and micro-batch, with userbuffers' chunks and exchanges issued
    from one C++ call each (sim/parallel/tp_overlap.py; tests/test_ub_host.py) and context parallelism's
    copies and merges issued eagerly (sim/model/cp_merge.py; tests/test_cp_merge.py): 0.6-1 for the FP8
    layers on the GB200 (MXFP8's scale gathers above delayed FP8's), past 1 on the faster GB300 (the layer
    is host-bound); the BF16 layer (twice the GPU time) and the x86 B200's FP8 one below 0.45."""
    gb200, gb300 = _host_over_gpu("nb_gb200_l405b_128g_mxfp8"), _host_over_gpu("nb_gb300_l405b_128g_mxfp8")
    delayed = _host_over_gpu("nb_gb200_l405b_128g_fp8")
    assert 0.6 < delayed < gb200 < 1.0 < gb300 < 1.3
    assert _host_over_gpu("nb_gb200_l405b_128g_bf16") < 0.45
    assert _host_over_gpu("nb_b200_l405b_128g_mxfp8") < 0.45
