"""DeepEP's kernels slowed beside compute under EP overlap (sim/parallel/ep.py
``DEEPEP_BESIDE_COMPUTE``; deepseek-ai/DeepEP issue 184: dispatch 3.54 -> 4.18 ms, combine +0.9%).

Closed forms: inside a combined-1F1B layer pair (``parallel.ep_comm_overlap``, sim/parallel/
ep_overlap.py) a DeepEP dispatch lasts 4.18/3.54 times, a combine 1.009 times, what it lasts
alone; the warm-up forward's and the cool-down backward's all-to-alls, and every all-to-all
without the overlap, are not stretched. The schedule's bytes on the wire and the planner's price
scale by the same factor. The layout is tests/test_deepep.py's scaled-down Qwen3 (ep 32 over 4
DGX H100), 4 micro-batches so that pairs exist.

Run: ``python -m pytest -q tests/test_deepep_beside_compute.py``
"""

import numpy as np
import pytest

from conftest import host_wait_share
from sim.collectives import schedule
from sim.collectives.direct import Dedup, dedup_wire, hit
from sim.hardware.specs import load_spec
from sim.input.load import scenario_from_dict
from sim.parallel.ep import DEEPEP_BESIDE_COMPUTE
from sim.plan.comm import P2P_LATENCY_S, Comm
from sim.step import simulate
from test_deepep import GPU_BOUND_SEQ, MOE, README_EP32_LOGICAL_RDMA

MICRO_BATCHES = 4


def run(overlap: bool):
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": GPU_BOUND_SEQ, "global_batch": 16 * MICRO_BATCHES},
        "cluster": {"topology": "dgx-h100", "gpus": 32},
        "parallel": {"tp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True,
                     "ep_dispatcher": "deepep", "ep_comm_overlap": overlap}}))


def _alone(name: str, mb: int) -> bool:
    """Outside every pair: with pp = 1 the first micro-batch's forward and the last one's backward."""
    return (mb == 0 and "_fwd" in name) or (mb == MICRO_BATCHES - 1 and "_bwd" in name)


@pytest.mark.parametrize("overlap", [True, False])
def test_paired_all_to_alls_last_the_measured_factor_longer(overlap):
    result = run(overlap)
    assert host_wait_share(result) < 0.1  # (the pairs' host work is issued in one piece: 6% here)
    alone = 4 * GPU_BOUND_SEQ / 2 * MOE["hidden"] * 2 * hit(MOE["moe"]["experts"], MOE["moe"]["top_k"], 32) \
        / README_EP32_LOGICAL_RDMA  # tests/test_deepep.py: DeepEP's logical RDMA rate over 4 nodes
    a2a = result.spans[result.spans.name.str.startswith("a2a_")]
    want = [alone * (1.0 if not overlap or _alone(n, mb) else DEEPEP_BESIDE_COMPUTE["combine" in n])
            for n, mb in zip(a2a.name, a2a.micro_batch)]
    assert len(a2a) == 2 * 2 * MOE["layers"] * MICRO_BATCHES
    assert np.allclose(a2a.end_s - a2a.start_s, want, rtol=0, atol=5e-6)
    stretched = np.array(want) > alone
    assert stretched.sum() == (2 * 2 * MOE["layers"] * (MICRO_BATCHES - 1) if overlap else 0)


@pytest.mark.parametrize("slowdown", [4.18 / 3.54, 1.009, 2.0])
def test_schedule_and_planner_scale_by_the_slowdown(slowdown):
    nbytes, domains = 8e6, (0,) * 8 + (1,) * 8 + (2,) * 8 + (3,) * 8
    (phase,) = schedule("all_to_all", "direct", tuple(range(32)), nbytes, domains,
                        Dedup(0.25, 0.75, slowdown)).phases
    assert phase.wire == pytest.approx(dedup_wire(domains) * slowdown, rel=1e-15)
    (inside,) = schedule("all_to_all", "direct", tuple(range(8)), nbytes, (0,) * 8, Dedup(0.25, 1.0, slowdown)).phases
    assert inside.wire == pytest.approx(slowdown, rel=1e-15)  # one node: the kernel's own slowdown only
    comm = Comm(load_spec("dgx-h100"), "h100-sxm")
    base = comm.all_to_all(nbytes, domains, Dedup(0.25, 0.75)) - P2P_LATENCY_S
    got = comm.all_to_all(nbytes, domains, Dedup(0.25, 0.75, slowdown)) - P2P_LATENCY_S
    assert got == pytest.approx(slowdown * base, rel=1e-12)


def _beside_compute(spans, rank: int) -> dict:
    """Per all-to-all span of ``rank`` (name, micro-batch, layer): seconds of it under the rank's compute."""
    own = spans[spans["rank"] == rank]
    comp = own[own["category"].astype(str) == "compute"]
    cs, ce = comp.start_s.to_numpy(), comp.end_s.to_numpy()
    a2a = own[own["name"].str.startswith("a2a_")]
    return {(n, mb, layer): float(np.clip(np.minimum(ce, e) - np.maximum(cs, s), 0, None).sum())
            for n, mb, layer, s, e in zip(a2a.name, a2a.micro_batch, a2a.layer, a2a.start_s, a2a.end_s)}


def test_fill_and_drain_all_to_alls_run_beside_no_compute_every_paired_one_does():
    """What combined 1F1B cannot hide (NVIDIA/Megatron-LM d4194b74 pipeline_parallel/combined_1f1b.py
    ``combined_1f1b_schedule_for_no_pipelining``: "The forward step for the first microbatch is
    executed alone, no a2a overlapping" and likewise the last backward): with pp 1 and M micro-batches,
    the first forward's and the last backward's 2 x 2 x layers all-to-alls have no compute of their
    rank beside them (exposed whole), and every one of the other (M - 1) x 2 x 2 x layers does."""
    spans = run(True).spans
    beside = _beside_compute(spans, int(spans["rank"].iloc[0]))
    alone = [v for (n, mb, _), v in beside.items() if _alone(n, mb)]
    paired = [v for (n, mb, _), v in beside.items() if not _alone(n, mb)]
    assert len(alone) == 2 * 2 * MOE["layers"] and len(paired) == 2 * 2 * MOE["layers"] * (MICRO_BATCHES - 1)
    assert max(alone) == 0.0
    assert min(paired) > 0.0
