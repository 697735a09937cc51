"""SMs held by communication kernels (``Collective.sms``, :class:`sim.engine.sms.SmLedger`):
DeepEP's dispatch and combine run on ``DEEPEP_SMS`` of the GPU's SMs, and compute beside them
runs on the rest (deepseek-ai/DeepEP issue 61: "132 - 20 = 112 SMs") at the measured
``DEEPEP_COMPUTE_COST`` (20%: the Megatron-Core MoE report, sim/parallel/ep.py), more than the
SMs' own share.

Closed forms: a compute op of ``w`` seconds overlapped for ``t`` seconds by a kernel holding a
share ``s`` ends ``s * t`` later (``w >= (1 - s) t``), or with the kernel (``w < (1 - s) t``:
it ran all along at ``1 - s``, ending at ``w / (1 - s)``); a share of 0 changes nothing,
byte for byte. The simulated Qwen3-235B layer: only the DeepEP dispatcher's all-to-alls hold
SMs; the planner's exposed EP time is ``max(s k a2a, k a2a - compute)`` per paired pass, ``k`` the
DeepEP kernels' own slowdown beside compute (sim/parallel/ep.py ``paired_stretch``; 1 for NCCL).
Run ``python -m pytest -q tests/test_sm_share.py``.
"""

import pytest

from conftest import spec_topology
from sim.collectives.kinds import ALL_TO_ALL
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.hardware.gpus import H100_SMS
from sim.input.choices import Dispatcher
from sim.outputs.result import spans_frame
from sim.parallel import ep

TOPO = spec_topology(16)  # two servers of 8: the all-to-all crosses the fabric


def _run(share: float, work: float, compute_after: float = 0.0, nbytes: float = 6.4e7):
    """Ranks 0 and 8 exchange ``nbytes`` (holding ``share`` of their SMs) on stream "ep"; rank
    0 also computes ``work`` seconds on "compute", starting ``compute_after`` seconds in."""
    call = Collective(("a2a",), ALL_TO_ALL, (0, 8), nbytes, "direct", sms=share)
    progs = []
    for r in (0, 8):
        prog = RankProgram(r, holds_sms=share > 0)
        prog.add(Op("a2a", "ep", "ep", comm=call))
        if r == 0:
            first = () if compute_after == 0 else (prog.add(Op("wait", "compute", "compute", compute_after)),)
            prog.add(Op("gemm", "compute", "compute", work, deps=first))
        progs.append(prog)
    engine = Engine(TOPO, progs)
    engine.run()
    spans = spans_frame(engine)
    row = lambda name: spans[(spans["rank"] == 0) & (spans["name"] == name)].iloc[0]
    return row("a2a"), row("gemm")


@pytest.mark.parametrize("share", [20 / 132, 24 / 132, 0.20, 0.5])
def test_compute_beside_the_kernel_ends_share_times_overlap_later(share):
    a2a, _ = _run(0.0, 1.0)
    t = a2a.end_s - a2a.start_s
    work = 3 * t  # outlasts the kernel
    a2a, gemm = _run(share, work)
    assert a2a.end_s - a2a.start_s == pytest.approx(t, rel=1e-12)  # the kernel's own time does not change
    assert gemm.end_s == pytest.approx(work + share * t, rel=1e-12)


def test_compute_started_during_the_kernel_is_slowed_only_while_it_runs():
    a2a, _ = _run(0.0, 1.0)
    t, s = a2a.end_s - a2a.start_s, 20 / 132
    _, gemm = _run(s, 2 * t, compute_after=t / 2)  # (the op before it is slowed too: it ends at t1)
    t1 = t / 2 / (1 - s)
    assert gemm.start_s == pytest.approx(t1, rel=1e-12)
    assert gemm.end_s == pytest.approx(t1 + 2 * t + s * (t - t1), rel=1e-12)  # overlapped for t - t1


def test_compute_inside_the_kernel_runs_at_the_rest_of_the_sms():
    a2a, _ = _run(0.0, 1.0)
    t, s = a2a.end_s - a2a.start_s, 20 / 132
    work = 0.5 * t  # ends while the kernel still runs
    _, gemm = _run(s, work)
    assert gemm.end_s == pytest.approx(work / (1 - s), rel=1e-12)


def test_no_share_is_byte_identical_to_no_ledger():
    a = _run(0.0, 2.5e-3)
    call = Collective(("a2a",), ALL_TO_ALL, (0, 8), 6.4e7, "direct")
    progs = []
    for r in (0, 8):
        prog = RankProgram(r, holds_sms=True)  # a ledger that never holds anything
        prog.add(Op("a2a", "ep", "ep", comm=call))
        if r == 0:
            prog.add(Op("gemm", "compute", "compute", 2.5e-3))
        progs.append(prog)
    engine = Engine(TOPO, progs)
    engine.run()
    spans = spans_frame(engine)
    gemm = spans[(spans["rank"] == 0) & (spans["name"] == "gemm")].iloc[0]
    assert gemm.end_s == a[1].end_s


def test_only_deepep_holds_sms():
    class P:
        ep_dispatcher = Dispatcher.DEEPEP  # a loaded scenario holds the member
    assert ep.sm_share(P) == ep.DEEPEP_COMPUTE_COST == 0.20
    assert ep.sm_share(P) >= ep.DEEPEP_SMS / H100_SMS  # the measured cost is at least the SMs' share
    P.ep_dispatcher = Dispatcher.ALLTOALL
    assert ep.sm_share(P) == 0.0


MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 2048, "moe": {"experts": 128, "top_k": 8, "routing": "uniform", "expert_ffn_hidden": 512}}


def _qwen_like(overlap: bool, dispatcher: str = "deepep"):
    """The Qwen3-235B layout scaled down (as tests/test_deepep.py): ep 32 over tp 2 x dp 16."""
    from sim.input.load import scenario_from_dict
    from sim.step import simulate
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": 1024, "global_batch": 64},
        "cluster": {"topology": "dgx-h100", "gpus": 32},
        "parallel": {"tp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True,
                     "ep_dispatcher": dispatcher, "ep_comm_overlap": overlap}}), force=True)


def _overlap(spans, rank: int) -> list[float]:
    """Per span of ``rank``: seconds its interval shares with the rank's all-to-alls."""
    own = spans[spans["rank"] == rank]
    a2a = own[own["name"].str.startswith("a2a_")]
    return [sum(max(0.0, min(e, b) - max(s, a)) for a, b in zip(a2a.start_s, a2a.end_s))
            for s, e in zip(own.start_s, own.end_s)]


@pytest.mark.parametrize("overlap", [True, False])
def test_every_simulated_compute_span_is_its_kernel_plus_share_times_overlap(overlap, monkeypatch):
    shared = _qwen_like(overlap).spans
    monkeypatch.setattr(ep, "DEEPEP_COMPUTE_COST", 0.0)
    free = _qwen_like(overlap).spans  # the same programs, no SMs held: each compute span is its kernel
    s = 0.20  # DEEPEP_COMPUTE_COST, stated here
    rank = int(shared["rank"].iloc[0])
    mine = shared["rank"] == rank
    compute = (shared["category"].astype(str) == "compute")[mine].to_numpy()
    got = (shared.end_s - shared.start_s)[mine].to_numpy()[compute]
    kernel = (free.end_s - free.start_s)[free["rank"] == rank].to_numpy()[compute]
    over = [o for o, c in zip(_overlap(shared, rank), compute) if c]
    assert got == pytest.approx(kernel + s * __import__("numpy").array(over), rel=1e-9, abs=1e-15)
    if overlap:  # the combined 1F1B pairs compute with the all-to-alls: SMs were taken
        assert sum(over) > 0


@pytest.mark.parametrize("dispatcher", [Dispatcher.DEEPEP, Dispatcher.ALLTOALL])
def test_planner_exposes_max_of_share_times_a2a_and_what_outlasts_compute(dispatcher):
    import numpy as np
    import pandas as pd
    from types import SimpleNamespace
    from sim.plan.estimate import Estimator
    est = SimpleNamespace(s=SimpleNamespace(parallel=SimpleNamespace(ep_dispatcher=dispatcher)))
    a2a, comp = np.array([1.0, 1.0, 0.0]), np.array([3.0, 0.5, 2.0])  # hidden, outlasting, no a2a
    layer = np.zeros((1, 3, 8))
    layer[0, :, 5], layer[0, :, 0] = a2a, comp
    micro = np.array([8.0])
    g = pd.DataFrame({"ep_comm_overlap": [True]})
    got = Estimator._ep_exposed(est, g, layer, micro, 1, 1)[0]
    s = 0.20 if dispatcher == "deepep" else 0.0  # DEEPEP_COMPUTE_COST
    k = (4.18 / 3.54 + 1.009) / 2 if dispatcher == "deepep" else 1.0  # paired DeepEP kernels slowed (issue 184)
    alone = 1 / 8  # pp 1: the first forward and the last backward run alone
    steady = np.maximum(s * k * a2a, k * a2a - comp)
    assert got == pytest.approx(alone * a2a + (1 - alone) * steady, rel=1e-15)
    if dispatcher == "deepep":
        assert steady[0] == pytest.approx(0.20 * k) and steady[1] == pytest.approx(k - 0.5)
    g["ep_comm_overlap"] = False
    assert Estimator._ep_exposed(est, g, layer, micro, 1, 1)[0] == pytest.approx(a2a)  # not paired: all exposed
