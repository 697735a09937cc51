"""What Transformer Engine's userbuffers (``parallel.tp_comm_overlap``) cost the host, and what MXFP8 adds
around them (sim/parallel/tp_overlap.py; sim/model/host.py ``UB_*``; docs/precision.md, "Userbuffers on
the host"): one Python-level GEMM is one C++ call that issues its chunks and exchanges itself.

Run: ``python -m pytest -q tests/test_ub_host.py``
"""

import pytest

from sim.collectives.kinds import ALL_GATHER, REDUCE_SCATTER, RING_SHIFT
from sim.engine.kinds import Category
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.parallel import layer_program as lp
from sim.parallel.tp_overlap import MX_BLOCK
from sim.studies.validation import load_rows

ROW = "nb_b200_l405b_128g_mxfp8"  # x86 host (host_issue 1), tp 4 with TP comm overlap, MXFP8 under TE


def _layer(row_id: str = ROW, **overrides):
    s = scenario_from_dict(next(r for r in load_rows() if r.id == row_id).scenario, overrides or None)
    return s, lp.programs(s, s.cluster.gpu, kinds=(lp.Kind.DENSE,))[lp.Kind.DENSE]


def _calls(ops, kind, issue=None):
    return [op for op in ops if op.collective is not None and op.collective.op is kind and op.category is Category.TP
            and (issue is None or op.issue == pytest.approx(issue, abs=1e-15))]


def test_userbuffers_exchanges_are_cuda_calls_not_c10d_calls():
    """Every ring-exchange step and pipelined reduce-scatter chunk of the layer is issued inside the GEMM's
    C++ call: 6 and 3 CUDA runtime calls (2 us each), not a c10d call and the step's Python."""
    s, p = _layer(**{"training.precision": "fp8"})
    tp = s.parallel.tp
    ring, pipe = _calls(p.ops, RING_SHIFT), _calls(p.ops, REDUCE_SCATTER, 6e-6)
    # forward: qkv and fc1 gather by ring (tp - 1 steps each); backward: proj and fc2's output gradient
    assert len(ring) == 4 * (tp - 1)
    assert all(op.issue == pytest.approx(12e-6, abs=1e-15) for op in ring)
    assert len(pipe) == 2 * 4  # proj, fc2: RS_SPLITS chunks each


def test_a_later_chunk_is_its_gemms_library_launches():
    """A compute op that waits for a ring step is a chunk after the first: it issues a whole number of
    library GEMM launches (GEMM_ISSUE_S - KERNEL_ISSUE_S + CUDA_LAUNCH_S = 11.15 us each), no Python."""
    _, p = _layer(**{"training.precision": "fp8"})
    shifts = {i for i, op in enumerate(p.ops) if op.collective is not None and op.collective.op is RING_SHIFT
              and op.category is Category.TP}  # (context parallelism's K/V ring is its own)
    later = [op for op in p.ops if op.collective is None and shifts.intersection(op.deps)]  # waits for an arrival
    assert len(later) == len(shifts)
    assert host.UB_GEMM_CHUNK_S == pytest.approx(11.15e-6, abs=1e-12)
    for op in later:
        n = op.issue / host.UB_GEMM_CHUNK_S
        assert n == pytest.approx(round(n), abs=1e-9) and 1 <= round(n) <= 2, op


def test_mxfp8_adds_eight_scale_gathers_and_two_gradient_regathers_a_layer():
    """TE v2.9 with MXFP8 and userbuffers: a blocking c10d all-gather of the block scales before each of the
    8 userbuffers all-gathers of a layer and micro-batch (forward qkv, fc1; backward the output gradient of
    proj and fc2 twice, and the bulk input gathers of qkv and fc1), each 1/32 of the gathered FP8 bytes; and
    the row-parallel output gradient gathered a second time (columnwise) by userbuffers, whole."""
    s, mx = _layer()
    _, fp8 = _layer(**{"training.precision": "fp8"})
    tp, c10d = s.parallel.tp, host.collective_issue_s(ALL_GATHER)
    tokens, h = s.training.micro_batch * s.training.seq_len // s.parallel.cp, s.model.hidden
    assert len(mx.ops) - len(fp8.ops) == 10
    scales = [op for op in _calls(mx.ops, ALL_GATHER, c10d) if op.collective.nbytes * MX_BLOCK <= 2 * tokens * h]
    assert len(scales) == 8 and not [op for op in _calls(fp8.ops, ALL_GATHER, c10d)
                                     if op.collective.nbytes * MX_BLOCK <= 2 * tokens * h]
    assert sorted(op.collective.nbytes * MX_BLOCK for op in scales)[:4] == [tokens * h] * 4  # the output gradients
    regather = _calls(mx.ops, ALL_GATHER, 8e-6 + 27.9e-6 + (3 * (tp - 1) + 6) * 2e-6)
    assert len(regather) == 2 and {op.collective.nbytes for op in regather} == {tokens * h}
    assert not _calls(fp8.ops, ALL_GATHER, 8e-6 + 27.9e-6 + (3 * (tp - 1) + 6) * 2e-6)


def test_only_mxfp8_with_overlap_adds_them():
    _, base = _layer(**{"training.precision": "fp8", "parallel.tp_comm_overlap": False})
    _, off = _layer(**{"parallel.tp_comm_overlap": False})
    assert len(off.ops) == len(base.ops)


def test_torchtitans_async_tp_keeps_its_python_chunks():
    """Under torch.compile (torchtitan's async TP: torch/distributed/_symmetric_memory loops over the chunks
    in Python) the exchanges stay charged as calls of their own, not userbuffers' CUDA calls."""
    _, p = _layer("tt_h100_l70b_256g_2d_asynctp")
    ring = _calls(p.ops, RING_SHIFT)
    assert ring and all(op.issue == pytest.approx(host.collective_issue_s(RING_SHIFT), abs=1e-15) for op in ring)
