"""Rail-only and multi-plane fabrics: their graphs, their routes, their costs in closed form.

Run ``python -m pytest -q tests/test_fabrics.py``.
"""

import pytest

from conftest import spec_topology
from sim.hardware import specs, topology
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, LINK_LATENCY as LAT, gpu_preset
from sim.studies.nccl_tests import time_collective

H100 = gpu_preset("h100-sxm")
W_NV, W_PCIE, W_NIC = H100.nvlink_bw * EFF["nvlink"], H100.pcie_bw * EFF["pcie"], H100.nic_bw * EFF["ib"]
B = 1e9


def hops(topo, route):
    by_id = {i: pair for pair, i in topo.link_id.items()}
    return [by_id[int(l)] for l in route.links]


def rails_of_spine(graph, spine):
    return {n[2] for n in graph.neighbors(spine) if n[0] == "leaf"}


# --- rail-only -------------------------------------------------------------------------

def test_rail_only_no_switch_joins_two_rails():
    topo = spec_topology(512, builder="rail_only", spines=4)  # 2 scalable units
    spines = [n for n in topo.graph if n[0] == "spine"]
    assert len(spines) == 8 * 4  # four per rail
    assert all(len(rails_of_spine(topo.graph, s)) == 1 for s in spines)
    fat = spec_topology(512, spines=4)
    assert all(len(rails_of_spine(fat.graph, s)) == 8 for s in fat.graph if s[0] == "spine")


def test_rail_only_cross_rail_goes_over_nvlink_at_the_source():
    """GPU 1 (rail 1) to GPU 269 (rail 5, other unit): NVLink to GPU 5, then rail 5 only."""
    topo = spec_topology(512, builder="rail_only", spines=4)
    path = hops(topo, topo.route(1, 269))
    assert path[:3] == [(("gpu", 1), ("nvsw", 0)), (("nvsw", 0), ("gpu", 5)), (("gpu", 5), ("nic", 5))]
    assert all(n[2] == 5 for pair in path for n in pair if n[0] == "leaf")
    expected = sum(LAT[k] for k in ("nvlink", "nvlink", "pcie", "ib", "ib", "ib", "ib", "pcie"))
    got = time_collective(topo, "send_recv", "direct", (1, 269), B)
    assert got == pytest.approx(expected + B / min(W_NV, W_PCIE, W_NIC), rel=1e-12)


def test_rail_only_relays_at_the_destination_when_the_source_has_no_gpu_on_its_rail():
    """12 GPUs: the second node has rails 0-3 only. GPU 9 (rail 1) to GPU 6 (rail 6): no
    GPU beside 9 sits on rail 6, so the flow takes rail 1 to GPU 1 and NVLink to GPU 6; a
    fat tree takes rail 1 to a spine and down rail 6 instead."""
    topo = spec_topology(12, builder="rail_only", nodes_per_su=1, spines=2)
    path = hops(topo, topo.route(9, 6))
    assert path[-3:] == [(("nic", 1), ("gpu", 1)), (("gpu", 1), ("nvsw", 0)), (("nvsw", 0), ("gpu", 6))]
    kinds = list(topo.kinds[topo.route(9, 6).links])
    assert kinds[:2] == ["pcie", "ib"] and kinds[-3:] == ["pcie", "nvlink", "nvlink"]
    fat = spec_topology(12, nodes_per_su=1, spines=2)
    assert ("nvsw", 0) not in {n for pair in hops(fat, fat.route(9, 6)) for n in pair}
    assert ("leaf", 0, 6) in {n for pair in hops(fat, fat.route(9, 6)) for n in pair}
    uplink = H100.nic_bw / 2 * EFF["ib"]  # one node per unit, two spines: each half a NIC
    got = time_collective(topo, "send_recv", "direct", (9, 6), B)
    latency = 2 * LAT["pcie"] + 4 * LAT["ib"] + 2 * LAT["nvlink"]
    assert got == pytest.approx(latency + B / min(W_NV, W_PCIE, W_NIC, 2 * uplink), rel=1e-12)


def test_rail_only_ring_costs_what_the_fat_tree_ring_costs():
    """Rings are rail-aligned (one channel per NIC, PXN): a rail-only fabric loses nothing."""
    group = tuple(range(64))
    rail = time_collective(spec_topology(64, builder="rail_only"), "all_reduce", "ring", group, 2**28)
    fat = time_collective(spec_topology(64), "all_reduce", "ring", group, 2**28)
    assert rail == pytest.approx(fat, rel=1e-12)


def test_rail_only_preset_builds():
    spec = specs.load_spec("dgx-h100-rail-only")
    topo = topology.build(spec, 512, H100)
    assert spec.builder == "rail_only" and topo.route(3, 300) is not None


# --- multi-plane -----------------------------------------------------------------------

def test_multi_plane_nics_split_over_independent_planes():
    topo = spec_topology(512, planes=2, spines=4)
    leaves = [n for n in topo.graph.neighbors(("nic", 0)) if n[0] == "leaf"]
    assert sorted(leaves) == [("leaf", 0, 0, 0), ("leaf", 0, 0, 1)]
    for leaf in leaves:
        assert topo.caps[topo.link_id[(("nic", 0), leaf)]] == pytest.approx(W_NIC / 2)
    for s in (n for n in topo.graph if n[0] == "spine"):  # a spine serves one plane only
        assert len({topo.graph.nodes[n]["plane"] for n in topo.graph.neighbors(s)}) == 1


def test_multi_plane_flow_is_sprayed_evenly_over_the_planes():
    topo = spec_topology(512, planes=2, spines=4)
    route = topo.route(0, 256)  # other scalable unit, same rail
    into = {0: 0.0, 1: 0.0}  # weight of the hops into the destination's leaf, per plane
    out = {0: 0.0, 1: 0.0}  # and out of the source NIC
    for (u, v), w in zip(hops(topo, route), route.weights):
        if u == ("nic", 0):
            out[topo.graph.nodes[v]["plane"]] += w
        if v[0] == "leaf" and v[1] == 1:
            into[topo.graph.nodes[v]["plane"]] += w
    assert out == pytest.approx({0: 0.5, 1: 0.5}) and into == pytest.approx({0: 0.5, 1: 0.5})


@pytest.mark.parametrize("planes", [1, 2, 4])
def test_multi_plane_oversubscribed_cost_equals_one_plane_of_the_same_total(planes):
    """Each plane's leaf has nodes x port / oversubscription of uplink; a flow sprayed over
    P planes gets P x that: the same closed form as one plane, B / (W_nic / 2) at 2:1."""
    topo = spec_topology(16, planes=planes, nodes_per_su=1, spines=1, oversubscription=2)
    got = time_collective(topo, "send_recv", "direct", (0, 8), B)
    latency = 2 * LAT["pcie"] + 4 * LAT["ib"]
    assert got == pytest.approx(latency + B / (W_NIC / 2), rel=1e-9)


def test_bad_builder_and_plane_values_name_the_key(tmp_path):
    from sim.errors import InputError

    for text, key in (("builder = 'torus'", "builder"), ("planes = 0", "planes"), ("sharp = 1", "sharp")):
        path = tmp_path / "t.toml"
        path.write_text(text + "\n")
        with pytest.raises(InputError) as err:
            specs.load_spec(str(path))
        assert err.value.key == f"cluster.topology.{key}"
