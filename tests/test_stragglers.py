"""Stragglers, jitter and link faults (issue 6): exact expectations on tiny cases."""

import numpy as np
import pytest

from sim.collectives.kinds import ALL_REDUCE
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.hardware.faults import apply_faults, jitter_fn
from sim.hardware.gpus import FABRIC_EFFICIENCY, gpu_preset
from sim.studies.jitter_scaling import expected_step
from sim.input.load import scenario_from_dict
from sim.studies.nccl_tests import time_collective
from sim.input.scenario import LinkFault
from sim.step import simulate
from sim.hardware import specs, topology

TINY = {
    "name": "tiny-dp",
    "model": {"layers": 2, "hidden": 512, "heads": 8, "vocab": 512},
    "training": {"seq_len": 512, "global_batch": 4, "micro_batch": 1, "grad_bucket_mb": 1000},
    "cluster": {"topology": "dgx-h100", "gpus": 4},
    "parallel": {"dp": 4, "zero": 0, "fold": False},
}


def _scenario(**updates):
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY.items()}
    for key, value in updates.items():
        section, name = key.split("__")
        data.setdefault(section, {})[name] = value
    return scenario_from_dict(data)


def _with(extra: dict):
    data = {**TINY, **extra}
    return scenario_from_dict(data)


def test_slow_rank_in_pure_dp_delays_everyone_by_its_extra_compute(free_host):
    clean = simulate(_scenario())
    slow = simulate(_with({"stragglers": [{"ranks": [2], "slowdown": 1.5}]}))
    comp = clean.spans[(clean.spans["rank"] == 2) & (clean.spans.category == "compute")]
    before = comp[comp.name != "optimizer"]
    extra = 0.5 * float((before.end_s - before.start_s).sum())  # one bucket: no overlap hides it
    opt = comp[comp.name == "optimizer"]
    extra_opt = 0.5 * float((opt.end_s - opt.start_s).sum())  # the slow rank's optimizer ends last
    assert slow.summary["step_time_s"] == pytest.approx(clean.summary["step_time_s"] + extra + extra_opt, rel=1e-9)
    assert slow.summary["straggler_cost_s"] == pytest.approx(extra + extra_opt, rel=1e-9)
    ar = slow.spans[slow.spans.name == "dp_ar"]
    assert ar.end_s.nunique() == 1  # every rank leaves the all-reduce together
    fast_ar = ar[ar["rank"] != 2]
    assert (fast_ar.end_s - fast_ar.start_s).min() > extra * 0.99  # and the others waited in it


def test_overlap_hides_part_of_a_straggler():
    small = {"training": {**TINY["training"], "grad_bucket_mb": 0.5}}
    clean = simulate(_with(small))
    slow = simulate(_with({**small, "stragglers": [{"ranks": [1], "slowdown": 1.5}]}))
    comp = clean.spans[(clean.spans["rank"] == 1) & (clean.spans.category == "compute")]
    extra = 0.5 * float((comp.end_s - comp.start_s).sum())
    assert 0 < slow.summary["straggler_cost_s"] <= extra + 1e-12


def test_node_straggler_and_thermal_start():
    node = simulate(_with({"stragglers": [{"nodes": [0], "slowdown": 1.2}]}))
    late = simulate(_with({"stragglers": [{"ranks": [0], "slowdown": 1.2, "start_s": 1e9}]}))
    assert node.summary["straggler_cost_s"] > 0
    assert late.summary["straggler_cost_s"] == pytest.approx(0.0, abs=1e-15)  # throttles after the step


def test_jitter_step_is_the_max_of_the_ranks_draws():
    """Engine level: each rank computes d * X_r, then all-reduce; step = d * max X_r + AR."""
    scen = _with({"jitter": {"sigma": 0.1}, "seed": 7})
    draw = jitter_fn(scen)
    topo = topology.build(specs.load_spec("dgx-h100"), 8, gpu_preset("h100-sxm"))
    d, group = 1e-3, tuple(range(8))
    progs = []
    for r in group:
        p = RankProgram(r)
        p.add(Op("work", "compute", "compute", d * draw(r, 0)))
        p.add(Op("ar", "dp", "dp", comm=Collective(("ar",), ALL_REDUCE, group, 1e6), deps=(0,)))
        progs.append(p)
    eng = Engine(topo, progs)
    eng.run()
    ar_alone = time_collective(topo, "all_reduce", "auto", group, int(1e6))
    assert eng.env.now == pytest.approx(d * max(draw(r, 0) for r in group) + ar_alone, rel=1e-9)


def test_jitter_grows_with_ranks_like_the_expected_maximum():
    extra = []
    for n in (4, 32):
        base = {**TINY, "training": {**TINY["training"], "global_batch": n},
                "cluster": {"topology": "dgx-h100", "gpus": n}, "parallel": {**TINY["parallel"], "dp": n}}
        clean = simulate(scenario_from_dict(base), baseline=False)
        noisy = np.mean([simulate(scenario_from_dict({**base, "seed": s, "jitter": {"sigma": 0.1}}),
                                  baseline=False).summary["step_time_s"] for s in range(6)])
        expected = expected_step(clean, n, 0.1)
        assert noisy == pytest.approx(expected, rel=0.02)
        extra.append(noisy - clean.summary["step_time_s"])
    assert extra[1] > extra[0] > 0


def test_same_seed_same_result_different_seed_different_jitter():
    a = simulate(_with({"jitter": {"sigma": 0.05}, "seed": 1})).summary
    b = simulate(_with({"jitter": {"sigma": 0.05}, "seed": 1})).summary
    c = simulate(_with({"jitter": {"sigma": 0.05}, "seed": 2})).summary
    strip = lambda s: {k: v for k, v in s.items() if k != "sim_wall_s"}
    assert strip(a) == strip(b)
    assert a["step_time_s"] != c["step_time_s"]


def test_degraded_nic_sets_the_pace_of_a_multinode_ring():
    spec = specs.load_spec("dgx-a100")
    gpu = gpu_preset("a100-80gb")
    n, nbytes = 32, float(2**30)
    graph = topology.fat_tree(n, spec, gpu)
    apply_faults(graph, [LinkFault(gpu_nic=0, factor=0.25)], spec)
    topo = topology.Topology(graph, spec)
    t = time_collective(topo, "all_reduce", "ring", tuple(range(n)), int(nbytes))
    channels = spec.gpus_per_node
    nic = gpu.nic_bw * FABRIC_EFFICIENCY["ib"] * 0.25
    bandwidth_term = 2 * (n - 1) / n * (nbytes / channels) / nic
    latency = t - bandwidth_term
    assert 0 <= latency < 0.01 * t  # the degraded channel's NIC alone sets the time


def test_failed_link_reroutes_and_disconnection_is_an_input_error():
    from sim.errors import InputError

    spec = specs.load_spec("dgx-h100")
    gpu = gpu_preset("h100-sxm")
    graph = topology.fat_tree(16, spec, gpu)
    apply_faults(graph, [LinkFault(spine=0, factor=0.0)], spec)
    topo = topology.Topology(graph, spec)
    assert time_collective(topo, "all_reduce", "ring", tuple(range(16)), 2**26) > 0
    graph = topology.fat_tree(16, spec, gpu)
    apply_faults(graph, [LinkFault(node_nics=1, factor=0.0)], spec)
    with pytest.raises(InputError):
        topo = topology.Topology(graph, spec)
        time_collective(topo, "all_reduce", "ring", tuple(range(16)), 2**26)


def test_report_names_the_straggler():
    from sim.outputs.attribution import report

    slow = simulate(_with({"stragglers": [{"ranks": [3], "slowdown": 1.5}]}))
    text = report(slow)
    assert "rank 3" in text.splitlines()[1]
    assert "straggler" in text


def test_report_marks_every_gpu_of_a_straggling_node():
    from sim.outputs.attribution import report

    def compute_lines(stragglers):
        text = report(simulate(_with({"stragglers": stragglers})))
        return [line for line in text.splitlines() if line.startswith("  compute on rank")]

    node = compute_lines([{"nodes": [0], "slowdown": 1.2}])  # all 4 ranks sit on node 0
    assert node and all(line.endswith("(straggler, 1.2x compute)") for line in node)
    both = compute_lines([{"nodes": [0], "slowdown": 1.2}, {"ranks": [2], "slowdown": 1.4}])
    assert both[0].startswith("  compute on rank 2:")  # the slower entry wins, as in the run
    assert both[0].endswith("(straggler, 1.4x compute)")
