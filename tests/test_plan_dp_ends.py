"""The planner's data-parallel ends of a step (sim/plan/dp_ends.py) and its collectives inside
one NVLink domain (sim/plan/comm.py), against the simulator they read: the estimate of small
tp 8 pipelines whose data-parallel groups cross nodes within 2.5% of their simulation (the
estimate before put them 4-10% above it), the schedule's pass counts against Megatron's
interleaved order, the counts of a long schedule equal to those of its short stand-in, and
the reduction queue in closed form.

Run: ``python -m pytest -q tests/test_plan_dp_ends.py``
"""

import numpy as np
import pytest

from sim.collectives import tuner
from sim.collectives.kinds import ALL_GATHER, REDUCE_SCATTER
from sim.hardware.specs import load_spec
from sim.input.load import scenario_from_dict
from sim.plan import dp_ends
from sim.plan.comm import Comm
from sim.plan.inputs import request_of
from sim.plan.published import estimate_of
from sim.step import simulate
from sim.studies.nccl_tests import build_topology, time_collective


def gpt(tp: int, pp: int, dp: int, v: int, global_batch: int, layers: int) -> dict:
    """A 70B-wide GPT (MH-70B-768's layer) cut to ``layers``, ZeRO 1, 1 sequence a micro-batch."""
    return {"model": {"name": "GPT", "layers": layers, "hidden": 8192, "heads": 64, "ffn_hidden": 32768,
                      "vocab": 131072},
            "training": {"seq_len": 4096, "global_batch": global_batch, "micro_batch": 1, "recompute": "selective",
                         "flash_attention": True},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": tp * pp * dp},
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero": 1, "sequence_parallel": True, "virtual_stages": v,
                         "schedule": "interleaved" if v > 1 else "1f1b"}}


# (tp, pp, dp, v, global batch, layers): the estimate on main before dp_ends was +4.1%, +10.2%, +3.1%
@pytest.mark.parametrize("shape", [(8, 2, 8, 2, 64, 8), (8, 2, 32, 2, 128, 8), (8, 2, 8, 1, 32, 8)])
def test_small_tp8_pipelines_estimate_close_to_simulation(shape):
    d = gpt(*shape)
    s = scenario_from_dict(d)
    estimate = float(estimate_of(request_of(d | {"name": "t"}), s)["estimate_s"].iat[0])
    simulated = simulate(s).summary["step_time_s"]
    assert estimate == pytest.approx(simulated, rel=0.025)


def test_published_estimate_keeps_its_dp_knobs():
    """Narayanan et al. 2021's runs reduce gradients after the whole backward
    (``overlap_grad_reduce = false``, no ZeRO): the estimate of such a layout prices that
    reduction exposed (within 2.5% of the simulation; with the search's default, overlapped
    reduction, it was 4.4% below)."""
    d = gpt(8, 2, 8, 2, 64, 8)
    d["parallel"].update(zero=0, overlap_grad_reduce=False)
    s = scenario_from_dict(d)
    estimate = float(estimate_of(request_of(d | {"name": "t"}), s)["estimate_s"].iat[0])
    assert estimate == pytest.approx(simulate(s).summary["step_time_s"], rel=0.025)


def test_passes_follow_megatron_interleaved_order():
    """p 2, v 2, 8 micro-batches, stage 0: F0c0 F1c0 F0c1 ... B6c1 B7c1 B6c0 B7c0. Chunk 1's
    first forward comes after 2 forwards; after its last backward 2 backwards still run."""
    counts = dp_ends.passes("interleaved", 2, 2, 8, 0)
    assert counts.tolist() == [[0, 0, 0, 0], [2, 0, 0, 2]]
    assert dp_ends.passes("1f1b", 4, 1, 8, 1).tolist() == [[0, 0, 0, 0]]


@pytest.mark.parametrize("schedule,p,v", [("interleaved", 4, 2), ("1f1b", 3, 1), ("zb-h1", 4, 1),
                                          ("dualpipev", 2, 2), ("interleaved", 2, 3)])
def test_long_schedule_counted_at_its_short_stand_in(schedule, p, v, monkeypatch):
    m = 12 * p + 2 * (p % 2 == 0 and schedule != "interleaved")
    short = [dp_ends.passes(schedule, p, v, m, s) for s in range(p)]
    assert dp_ends.short_m(schedule, p, m) < m
    monkeypatch.setattr(dp_ends, "short_m", lambda schedule, p, m: m)
    full = [dp_ends.passes(schedule, p, v, m, s) for s in range(p)]
    assert all(np.array_equal(a, b) for a, b in zip(short, full))


def test_reduce_tail_closed_form():
    f, b, one = np.array([1.0]), np.array([2.0]), np.array([1.0])
    counts = np.array([[0, 0, 0, 0], [2, 0, 0, 2]], dtype=float)  # chunk 1: 2 backwards after it
    # unbucketed, last backward at -4: chunk 1 issued at -4 - 2b = -8, done -7; chunk 0 at -4, done -1
    assert dp_ends.reduce_tail(counts, f, b, np.array([[3.0, 1.0]]), one, False, np.array([-4.0]))[0] == -1.0
    # bucketed first chunk, 4 buckets: its first ready at -b + b/4 = -1.5 (chunk 1 done at -3): -1.5 + 3
    assert dp_ends.reduce_tail(counts, f, b, np.array([[3.0, 1.0]]), np.array([4.0]), True, np.array([0.0]))[0] == 1.5
    # a slow chunk 1 (issued at -4, done at 5) holds the stream: chunk 0 queues behind it, 5 + 3
    assert dp_ends.reduce_tail(counts, f, b, np.array([[3.0, 9.0]]), one, False, np.array([0.0]))[0] == 8.0


def test_start_delay_closed_form():
    f, b = np.array([1.0]), np.array([2.0])
    counts = np.array([[0, 0, 0, 0], [2, 0, 0, 2]], dtype=float)
    gather = np.array([[3.0, 4.0]])
    # stage 1: chunk 0 needs 3 by 1 x f (2 late), chunk 1 needs 7 by (1 + 2) f (4 late)
    assert dp_ends.start_delay(counts, f, b, gather, np.array([1.0]), False, 1)[0] == 4.0
    # stage 0, first chunk bucketed in 3: its first bucket (1) before the first forward
    assert dp_ends.start_delay(counts, f, b, gather, np.array([3.0]), True, 0)[0] == 5.0


def test_in_domain_collective_priced_as_simulated():
    """tp 8 all-gather of 64 MiB on a DGX H100: the simulator's 165.7 us, not the tuner's 190.9."""
    comm = Comm(load_spec("dgx-h100"), "h100-sxm")
    nbytes, group = 64 * 2**20, tuple(range(8))
    topo = build_topology("dgx-h100", 8, "h100-sxm")
    algo = tuner.pick(ALL_GATHER, nbytes, (0,) * 8, topo.fabric).name
    simulated = time_collective(topo, ALL_GATHER, algo, group, nbytes)
    assert comm.reduce(ALL_GATHER, nbytes, group) == simulated
    assert tuner.pick(ALL_GATHER, nbytes, (0,) * 8, comm.fabric).time_s > 1.1 * simulated


def test_cross_domain_collective_priced_as_simulated_at_its_ranks():
    """An FSDP all-gather of one Llama 3.1 405B layer (tp 4: 1.6 GB) over the cp x dp group of
    tp 4 x cp 2 x dp 16 on 128 GB200 (ranks 0, 4, ..., 124: 18 in the first NVL72 rack, 14 in
    the second) is priced as the simulator runs it at those ranks, not at NCCL's tuner's
    prediction (2.29 ms against 3.75 ms simulated: the estimate had priced it at the former)."""
    spec = load_spec("gb200-nvl72")
    comm = Comm(spec, "gb200")
    group = comm.groups(4, 2, 16, 1, 1, 4).dp_ranks
    assert group == tuple(range(0, 128, 4))
    nbytes = 2 * 405e9 / 126 / 4
    topo = build_topology("gb200-nvl72", 144, "gb200")
    domains = tuple(r // 72 for r in group)
    for op in (ALL_GATHER, REDUCE_SCATTER):
        algo = tuner.pick(op, nbytes, domains, topo.fabric)
        simulated = time_collective(topo, op, algo.name, group, nbytes)
        assert comm.reduce(op, nbytes, group) == simulated
        assert simulated > 1.5 * algo.time_s  # (the two definitions this replaces differ)
