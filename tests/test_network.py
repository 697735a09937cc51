"""The flow model and the engine: max-min fair rates, link contention, exact op timing.

Hand-solvable water-filling cases, hypothesis properties of ``max_min_rates``, then
collectives run concurrently through the Engine (separate keys) and small compute
programs whose start and end times are known exactly.
Run ``python -m pytest -q tests/test_network.py``.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import spec_topology
from sim.collectives.kinds import ALL_GATHER, ALL_REDUCE, SEND_RECV
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, LINK_LATENCY as LAT, gpu_preset
from sim.engine.maxmin import max_min_rates
from sim.studies.nccl_tests import time_collective
from sim.outputs.result import spans_frame

H100 = gpu_preset("h100-sxm")


def rates(chain_links, caps, weights=None):
    """max_min_rates from one list of link ids per chain."""
    chain = np.array([c for c, links in enumerate(chain_links) for _ in links], dtype=np.int64)
    link = np.array([l for links in chain_links for l in links], dtype=np.int64)
    w = None if weights is None else np.array([x for ws in weights for x in ws], dtype=float)
    return max_min_rates(chain, link, len(chain_links), np.array(caps, dtype=float), w)


# --- max_min_rates: hand-solved water filling ----------------------------------------

def test_one_link_is_split_evenly():
    assert rates([[0], [0], [0]], [9.0]).tolist() == pytest.approx([3, 3, 3])


def test_a_chain_limited_elsewhere_leaves_its_share_to_the_others():
    # link 1 (cap 4) splits 2/2 between chains 1 and 2; chain 0 takes the rest of link 0
    assert rates([[0], [0, 1], [1]], [10.0, 4.0]).tolist() == pytest.approx([8, 2, 2])


def test_parking_lot():
    # a long chain over three unit links, one short chain on each: everyone gets 1/2
    assert rates([[0, 1, 2], [0], [1], [2]], [1.0, 1.0, 1.0]).tolist() == pytest.approx([0.5] * 4)


def test_a_chain_crossing_a_link_twice_pays_twice():
    # chain 0 uses link 0 twice: 2r + r = 6 -> r = 2
    assert rates([[0, 0], [0]], [6.0]).tolist() == pytest.approx([2, 2])


def test_sprayed_weights_load_each_path_partially():
    # chain 0 sprayed half/half over links 0 and 1; chain 1 alone on link 1 (cap 3)
    # link 1: r0/2 + r1 = 3, link 0: r0/2 <= 10 -> both freeze at 2 on link 1
    got = rates([[0, 1], [1]], [10.0, 3.0], weights=[[0.5, 0.5], [1.0]])
    assert got.tolist() == pytest.approx([2, 2])


def test_three_levels():
    # link 0 (cap 3) holds chains 0,1,2 -> 1 each; link 1 (cap 5) then gives chain 3 the rest
    assert rates([[0], [0], [0, 1], [1]], [3.0, 5.0]).tolist() == pytest.approx([1, 1, 1, 4])


def test_a_chain_without_links_gets_nothing():
    got = max_min_rates(np.array([0]), np.array([0]), 2, np.array([5.0]))
    assert got.tolist() == [5.0, 0.0]


# --- max_min_rates: properties -------------------------------------------------------

@st.composite
def flow_problems(draw):
    n_links = draw(st.integers(1, 6))
    caps = draw(st.lists(st.floats(0.1, 100), min_size=n_links, max_size=n_links))
    chains = draw(st.lists(st.lists(st.tuples(st.integers(0, n_links - 1), st.sampled_from([0.25, 0.5, 1.0])),
                                    min_size=1, max_size=4), min_size=1, max_size=8))
    return chains, caps


def link_loads(chains, caps, r):
    load = np.zeros(len(caps))
    for c, hops in enumerate(chains):
        for link, w in hops:
            load[link] += w * r[c]
    return load


@settings(max_examples=300, deadline=None)
@given(flow_problems())
def test_max_min_properties(problem):
    chains, caps = problem
    r = rates([[l for l, _ in h] for h in chains], caps, [[w for _, w in h] for h in chains])
    load = link_loads(chains, caps, r)
    assert (r >= 0).all()
    assert (load <= np.array(caps) * (1 + 1e-9)).all()  # no link over capacity
    saturated = load >= np.array(caps) * (1 - 1e-6)
    for c, hops in enumerate(chains):  # every chain has a bottleneck link
        assert any(saturated[l] and all(r[c] >= r[o] * (1 - 1e-6) for o, h in enumerate(chains)
                                        if l in {x for x, _ in h}) for l, _ in hops)


# --- contention through the engine ---------------------------------------------------

def run_engine(topo, programs):
    """Run programs; return {(rank, op name): (start, end)}."""
    engine = Engine(topo, programs)
    engine.run()
    spans = spans_frame(engine)
    return {(r, name): (a, b) for r, name, a, b in zip(spans["rank"], spans["name"], spans["start_s"], spans["end_s"])}


def send_recvs(topo, *flows):
    """Run (key, src, dst, bytes) transfers at once, each on its own stream; returns
    {key: end time at the receiver}."""
    programs: dict[int, RankProgram] = {}
    for key, src, dst, nbytes in flows:
        call = Collective((key,), SEND_RECV, (src, dst), nbytes, "direct")
        for rank in (src, dst):
            programs.setdefault(rank, RankProgram(rank)).add(Op(key, "pp", key, comm=call))
    times = run_engine(topo, list(programs.values()))
    return {key: times[(dst, key)][1] for key, _, dst, _ in flows}


def test_two_send_recvs_sharing_a_nic_uplink_each_get_half():
    # 0 -> 8 and 0 -> 16 (separate keys) both leave through GPU 0's PCIe link and NIC
    topo, nbytes = spec_topology(24), 1e9
    w = H100.nic_bw * EFF["ib"]
    latency = 2 * LAT["pcie"] + 2 * LAT["ib"]
    assert send_recvs(topo, ("a", 0, 8, nbytes))["a"] == pytest.approx(latency + nbytes / w, rel=1e-9)
    both = send_recvs(topo, ("a", 0, 8, nbytes), ("b", 0, 16, nbytes))
    assert both == {"a": pytest.approx(latency + nbytes / (w / 2), rel=1e-9),
                    "b": pytest.approx(latency + nbytes / (w / 2), rel=1e-9)}


def test_two_flows_on_an_oversubscribed_leaf_share_its_uplink():
    # 2 servers per scalable unit, one spine, 2:1 oversubscribed: the leaf's uplink
    # carries exactly one NIC's worth, so two NICs' flows to the other unit get half each
    topo, nbytes = spec_topology(32, nodes_per_su=2, spines=1, oversubscription=2), 1e9
    w = H100.nic_bw * EFF["ib"]
    latency = 2 * LAT["pcie"] + 4 * LAT["ib"]
    assert send_recvs(topo, ("a", 0, 16, nbytes))["a"] == pytest.approx(latency + nbytes / w, rel=1e-9)
    both = send_recvs(topo, ("a", 0, 16, nbytes), ("b", 8, 24, nbytes))
    assert both == {"a": pytest.approx(latency + nbytes / (w / 2), rel=1e-9),
                    "b": pytest.approx(latency + nbytes / (w / 2), rel=1e-9)}


def test_a_flow_ending_early_frees_its_share():
    topo, w = spec_topology(24), H100.nic_bw * EFF["ib"]
    latency = 2 * LAT["pcie"] + 2 * LAT["ib"]
    ends = send_recvs(topo, ("a", 0, 8, 1e9), ("b", 0, 16, 3e9))
    assert ends["a"] == pytest.approx(latency + 2e9 / w, rel=1e-9)  # 1 GB at half rate
    assert ends["b"] == pytest.approx(latency + 4e9 / w, rel=1e-9)  # then 2 GB alone


def test_nvlink_all_reduce_is_unaffected_by_ib_traffic():
    topo, nbytes = spec_topology(32), 2**28
    inside = Collective(("tp",), ALL_REDUCE, tuple(range(8)), nbytes, "ring")
    across = Collective(("dp",), ALL_REDUCE, (0, 8, 16, 24), 4 * nbytes, "ring")  # rail 0: no NVLink
    programs = [RankProgram(r, [Op("tp", "tp", "tp", comm=inside)]) for r in range(8)]
    programs[0].ops.append(Op("dp", "dp", "dp", comm=across))  # GPU 0 is in both, on two streams
    programs += [RankProgram(r, [Op("dp", "dp", "dp", comm=across)]) for r in (8, 16, 24)]
    times = run_engine(topo, programs)
    alone = time_collective(topo, "all_reduce", "ring", inside.group, nbytes)
    assert times[(0, "tp")] == (0.0, pytest.approx(alone, rel=1e-12))
    assert times[(0, "dp")][1] > 2 * alone  # the IB all-reduce ran all along, and longer


def test_bytes_by_link_adds_up_what_every_hop_carried():
    topo, nbytes, group = spec_topology(8), 2**20, tuple(range(8))
    calls = [Collective((i,), ALL_GATHER, group, nbytes, "ring") for i in range(2)]
    engine = Engine(topo, [RankProgram(r, [Op("ag", "dp", "comm", comm=c) for c in calls]) for r in group])
    engine.run()
    up = engine.net.bytes_by_link[[topo.link_id[(("gpu", r), ("nvsw", 0))] for r in group]]
    assert up.tolist() == pytest.approx([2 * nbytes * 7 / 8] * 8)  # two ring all-gathers
    assert engine.net.bytes_by_link.sum() == pytest.approx(2 * 2 * 8 * nbytes * 7 / 8)  # up + down


# --- engine basics -------------------------------------------------------------------

def test_dependency_across_streams_gives_exact_times():
    prog = RankProgram(0)
    a = prog.add(Op("a", "compute", "s1", duration=1.5))
    prog.add(Op("b", "compute", "s2", duration=2.0, deps=(a,)))
    prog.add(Op("c", "compute", "s1", duration=0.25))
    times = run_engine(spec_topology(8), [prog])
    assert times == {(0, "a"): (0.0, 1.5), (0, "b"): (1.5, 3.5), (0, "c"): (1.5, 1.75)}


def test_a_late_member_delays_the_collective_for_everyone():
    topo, nbytes = spec_topology(8), 1e8
    call = Collective(("ar",), ALL_REDUCE, (0, 1), nbytes, "ring")
    t = 2 * 2 * LAT["nvlink"] + nbytes / (H100.nvlink_bw * EFF["nvlink"])  # 2 steps; 2(N-1)/N = 1
    programs = []
    for rank, late in ((0, 1.0), (1, 3.0)):
        prog = RankProgram(rank)
        prog.add(Op("work", "compute", "compute", duration=late))
        prog.add(Op("ar", "dp", "comm", comm=call, deps=(0,)))
        programs.append(prog)
    times = run_engine(topo, programs)
    assert times[(0, "ar")] == (1.0, pytest.approx(3.0 + t, rel=1e-12))
    assert times[(1, "ar")] == (3.0, pytest.approx(3.0 + t, rel=1e-12))


def test_engine_raises_on_deadlock():
    x = Collective(("x",), ALL_REDUCE, (0, 1), 1e6, "ring")
    y = Collective(("y",), ALL_REDUCE, (0, 1), 1e6, "ring")
    programs = [RankProgram(0, [Op("x", "dp", "comm", comm=x), Op("y", "dp", "comm", comm=y)]),
                RankProgram(1, [Op("y", "dp", "comm", comm=y), Op("x", "dp", "comm", comm=x)])]
    with pytest.raises(RuntimeError, match="deadlock"):
        Engine(spec_topology(8), programs).run()


def test_engine_counts_events():
    prog = RankProgram(0, [Op(f"op{i}", "compute", "s", duration=1e-3) for i in range(100)])
    engine = Engine(spec_topology(8), [prog])
    engine.run()
    assert engine.env.now == pytest.approx(0.1)
    assert 100 <= engine.events < 1000
