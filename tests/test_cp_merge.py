"""Transformer Engine's ring attention beyond its attention kernels (sim/model/cp_merge.py; docs/precision.md,
"Context parallelism's copies and merges"): the packing, half copies, output merges and gradient
accumulations of AttnFuncWithCPAndKVP2P (TE release_v2.9, 70f53666), each a memory-bound kernel and an eager
launch on the host.

Run: ``python -m pytest -q tests/test_cp_merge.py``
"""

import pytest

from sim.engine.kinds import Category
from sim.input.load import scenario_from_dict
from sim.model import cp_merge, host
from sim.model.compute import HBM_EFFICIENCY, LAUNCH_S
from sim.parallel import layer_program as lp
from sim.studies.validation import load_rows

ROW = "nb_b200_l405b_128g_mxfp8"  # Llama 3.1 405B, tp 4, cp 2 (ring), 8,192 tokens a sequence; x86 host
GRACE_ROW = "nb_gb300_l405b_128g_mxfp8"  # the same layout on GB300 (Grace host)
MB = 1e6


def _scenario(row_id: str = ROW, **overrides):
    return scenario_from_dict(next(r for r in load_rows() if r.id == row_id).scenario, overrides or None)


def _layer(s):
    """One dense layer and micro-batch as the builder makes it (built afresh: no cache)."""
    return lp.build(lp.context(s, s.cluster.gpu), lp.Kind.DENSE)


def _shard(s):
    ctx = lp.context(s, s.cluster.gpu)
    return ctx.dims, ctx.shard


def test_ring_bytes_of_the_405b_layout():
    """4,096 tokens a rank (8,192 / cp 2), 128 / tp 4 = 32 query heads and 2 of the 8 kv heads, head dim 128, BF16."""
    d, sh = _shard(_scenario())
    q, o, kv, lse = cp_merge.ring_bytes(d, sh)
    assert (q, o, kv, lse) == (2 * 4096 * 32 * 128, 2 * 4096 * 32 * 128, 2 * 4096 * 2 * 2 * 128, 4 * 4096 * 32)
    assert q / MB == pytest.approx(33.554432) and kv / MB == pytest.approx(4.194304)


def test_forward_and_backward_kernels_at_cp_2():
    """cp 2, rank 0: forward step 0 packs K, V (2 (K+V)); step 1 copies the query half (Q) and merges the
    statistics (clone + 1 correction: 2 + 3 lse bytes) and outputs (init 2 O + 1.5 O): 6 launches. Backward step
    0: lse half, K, V into the send buffer, the q / out / dout halves (Q + 2 O), dq's half copied (Q), dk and dv
    copied (2 (K+V)); step 1: dq 2.5 Q in 2 launches, dk and dv 2.5 (K+V) in 4: 14 launches."""
    d, sh = _shard(_scenario())
    q, o, kv, lse = cp_merge.ring_bytes(d, sh)
    f0, f1 = cp_merge.forward_step(d, sh, 0, 2), cp_merge.forward_step(d, sh, 1, 2)
    assert [(k.bytes, k.count) for k in f0] == [(2 * kv, 1)]
    assert [(k.bytes, k.count) for k in f1] == [(q, 1), (5 * lse, 2), (3.5 * o, 2)]
    (b0, a0), (b1, a1) = cp_merge.backward_step(d, sh, 0, 2), cp_merge.backward_step(d, sh, 1, 2)
    assert [(k.bytes, k.count) for k in b0] == [(lse, 1), (2 * kv, 1), (q + 2 * o, 3)]
    assert [(k.bytes, k.count) for k in a0] == [(q, 1), (2 * kv, 2)]
    assert b1 == () and [(k.bytes, k.count) for k in a1] == [(2.5 * q, 2), (2.5 * kv, 4)]
    assert all(not k.flops and not k.attn for k in f0 + f1 + b0 + a0 + b1 + a1)
    assert sum(k.count for k in f0 + f1) == 6 and sum(k.count for k in b0 + a0 + b1 + a1) == 14


def test_a_middle_step_at_cp_4():
    """cp 4: the steps between the first and the last copy the query half (forward), and in the backward copy
    the three halves, add dq's half (1.5 Q) and dk, dv (3 (K+V))."""
    d, sh = _shard(_scenario(**{"parallel.cp": 4, "parallel.dp": 1}))
    q, o, kv, lse = cp_merge.ring_bytes(d, sh)
    assert [(k.bytes, k.count) for k in cp_merge.forward_step(d, sh, 2, 4)] == [(q, 1)]
    assert [(k.bytes, k.count) for k in cp_merge.forward_step(d, sh, 3, 4)] == [(q, 1), (11 * lse, 4),
                                                                                (6.5 * o, 4)]
    before, after = cp_merge.backward_step(d, sh, 2, 4)
    assert [(k.bytes, k.count) for k in before] == [(q + 2 * o, 3)]
    assert [(k.bytes, k.count) for k in after] == [(1.5 * q, 1), (3 * kv, 2)]


def _attention_ops(p):
    return [op for op in p.ops if op.collective is None and op.category is Category.COMPUTE]


@pytest.mark.parametrize("row_id", [ROW, GRACE_ROW])
def test_the_layer_pays_them_on_the_gpu_and_the_host(row_id):
    """The ring's layer against the same layer with the ring's extra kernels taken out: every extra kernel
    costs its bytes at the HBM rate plus a launch on the GPU, and KERNEL_ISSUE_S + STEP_PYTHON_S per launch on
    the host, times the part's host factor (2.75 on the GB300's Grace); no op is added."""
    s = _scenario(row_id)
    d, sh = _shard(s)
    gpu = lp.context(s, s.cluster.gpu).compute.gpu
    extra = [*cp_merge.forward_step(d, sh, 0, 2), *cp_merge.forward_step(d, sh, 1, 2)]
    for step in (0, 1):
        extra += [k for part in cp_merge.backward_step(d, sh, step, 2) for k in part]
    gpu_s = sum(k.bytes / (gpu.hbm_bw * HBM_EFFICIENCY) + LAUNCH_S * k.count for k in extra)
    host_s = sum(k.count for k in extra) * (host.KERNEL_ISSUE_S + host.STEP_PYTHON_S) * gpu.host_issue
    with_extra = _layer(s)
    original = cp_merge.forward_step, cp_merge.backward_step
    try:
        cp_merge.forward_step = lambda *a: ()
        cp_merge.backward_step = lambda *a: ((), ())
        without = _layer(s)
    finally:
        cp_merge.forward_step, cp_merge.backward_step = original
    assert len(with_extra.ops) == len(without.ops)  # no op added: each rides with its step's attention kernel
    gpu_with = sum(op.duration for op in _attention_ops(with_extra))
    gpu_without = sum(op.duration for op in _attention_ops(without))
    assert gpu_with - gpu_without == pytest.approx(gpu_s, rel=1e-9)
    assert with_extra.issue_s - without.issue_s == pytest.approx(host_s, rel=1e-9)
    assert host_s == pytest.approx(20 * 35.87e-6 * gpu.host_issue, rel=1e-9)


@pytest.mark.parametrize("impl", ["all_gather", "torch"])
def test_only_the_ring_runs_them(impl):
    s = _scenario(**{"parallel.cp_impl": impl})
    original = cp_merge.forward_step, cp_merge.backward_step
    try:
        cp_merge.forward_step = cp_merge.backward_step = None  # any call would fail
        _layer(s)
        _layer(_scenario(**{"parallel.cp": 1, "parallel.dp": 4}))
    finally:
        cp_merge.forward_step, cp_merge.backward_step = original
