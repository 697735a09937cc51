"""Topologies: builder counts, link capacities, routes, faults and topology-file errors.

Run ``python -m pytest -q tests/test_topology.py``.
"""

import networkx as nx
import numpy as np
import pytest

from conftest import run_phase, spec_topology
from sim.hardware import specs, topology
from sim.collectives.schedule import chains_phase
from sim.errors import InputError
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, gpu_preset

H100 = gpu_preset("h100-sxm")


def count(graph, prefix):
    return sum(1 for n in graph if n[0] == prefix)


def edge_kinds(graph):
    kinds = {}
    for _, _, d in graph.edges(data=True):
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    return kinds


def hops(topo, route):
    """The (u, v) node pairs of a route's links."""
    by_id = {i: pair for pair, i in topo.link_id.items()}
    return [by_id[int(l)] for l in route.links]


# --- builders ------------------------------------------------------------------------

def test_dgx_h100_two_scalable_units_counts():
    g = topology.fat_tree(512, specs.load_spec("dgx-h100"), H100)  # 64 servers, 32 per SU
    assert (count(g, "gpu"), count(g, "nic"), count(g, "nvsw")) == (512, 512, 64)
    assert (count(g, "leaf"), count(g, "spine")) == (2 * 8, 16)  # one leaf per rail per SU
    assert edge_kinds(g) == {"nvlink": 512, "pcie": 512, "ib": 512 + 16 * 16}


def test_gb200_nvl72_counts():
    spec = specs.load_spec("gb200-nvl72")
    g = topology.fat_tree(144, spec, gpu_preset(spec.gpu))  # 2 racks, 4 GPUs per tray
    assert (count(g, "gpu"), count(g, "nvsw"), count(g, "leaf")) == (144, 2, 2 * 4)
    assert {d["domain"] for n, d in g.nodes(data=True) if n[0] == "gpu"} == {0, 1}


@pytest.mark.parametrize("name", sorted(p.stem for p in specs.TOPOLOGY_DIR.glob("*.toml")))
def test_every_preset_builds(name):
    spec = specs.load_spec(name)
    n = 2 * max(spec.gpus_per_domain, spec.gpus_per_node)
    topo = topology.build(spec, n, gpu_preset(spec.gpu))
    assert topo.num_gpus == n and nx.is_connected(topo.graph)


def test_capacities_are_line_rate_times_fabric_efficiency():
    topo = spec_topology(16, nodes_per_su=1, spines=4, oversubscription=2)
    cap = lambda u, v: topo.caps[topo.link_id[(u, v)]]
    assert cap(("gpu", 3), ("nvsw", 0)) == pytest.approx(H100.nvlink_bw * EFF["nvlink"])
    assert cap(("gpu", 3), ("nic", 3)) == pytest.approx(H100.pcie_bw * EFF["pcie"])
    assert cap(("nic", 3), ("leaf", 0, 3)) == pytest.approx(H100.nic_bw * EFF["ib"])
    # one server per unit, 2:1, four spines: each uplink is an eighth of a NIC
    assert cap(("leaf", 0, 3), ("spine", 2)) == pytest.approx(H100.nic_bw / 2 / 4 * EFF["ib"])
    assert len(topo.caps) == 2 * topo.graph.number_of_edges()  # both directions of each link


def test_fixed_size_system_refuses_more_gpus():
    spec = specs.load_spec("dgx-h100-superpod")
    with pytest.raises(InputError, match="1016"):
        topology.build(spec, spec.max_gpus + 8, H100)


# --- routes --------------------------------------------------------------------------

def test_same_domain_goes_through_the_nvswitch():
    topo = spec_topology(16)
    route = topo.route(1, 6)
    assert hops(topo, route) == [(("gpu", 1), ("nvsw", 0)), (("nvsw", 0), ("gpu", 6))]
    assert list(topo.kinds[route.links]) == ["nvlink", "nvlink"]


def test_cross_node_same_rail_goes_nic_leaf_nic():
    topo = spec_topology(16)
    assert hops(topo, topo.route(2, 10)) == [(("gpu", 2), ("nic", 2)), (("nic", 2), ("leaf", 0, 2)),
                                             (("leaf", 0, 2), ("nic", 10)), (("nic", 10), ("gpu", 10))]


def test_cross_node_other_rail_relays_over_nvlink_to_the_destination_rail():
    topo = spec_topology(16)
    route = topo.route(1, 13)  # rail 5: relay through GPU 5 of the sender's server (PXN)
    assert hops(topo, route)[:3] == [(("gpu", 1), ("nvsw", 0)), (("nvsw", 0), ("gpu", 5)), (("gpu", 5), ("nic", 5))]
    assert list(topo.kinds[route.links]) == ["nvlink", "nvlink", "pcie", "ib", "ib", "pcie"]


def test_cross_unit_traffic_is_sprayed_over_every_spine():
    topo = spec_topology(16, nodes_per_su=1, spines=4)
    route = topo.route(0, 8)
    spine_hops = [(h, w) for h, w in zip(hops(topo, route), route.weights) if "spine" in (h[0][0], h[1][0])]
    assert sorted(spine_hops) == sorted([((("leaf", 0, 0), ("spine", s)), 0.25) for s in range(4)]
                                        + [((("spine", s), ("leaf", 1, 0)), 0.25) for s in range(4)])


def test_ecmp_hashes_each_flow_onto_one_spine():
    topo = spec_topology(16, nodes_per_su=1, spines=4, routing="ecmp")
    route = topo.route(0, 8)
    assert (route.weights == 1).all()
    assert sum(1 for u, v in hops(topo, route) if u[0] == "spine" or v[0] == "spine") == 2


# --- faults and connectivity ---------------------------------------------------------

def test_disconnected_graph_is_an_input_error():
    spec = specs.FatTreeSpec("t", nodes_per_su=1, spines=2)
    g = topology.fat_tree(16, spec, H100)
    g.remove_edges_from([e for e in list(g.edges) if "spine" in (e[0][0], e[1][0])])
    with pytest.raises(InputError, match="disconnected"):
        topology.Topology(g, spec)


def test_a_spine_without_links_isolates_no_gpu():
    spec = specs.FatTreeSpec("t", nodes_per_su=1, spines=4)
    g = topology.fat_tree(16, spec, H100)
    g.remove_edges_from(list(g.edges(("spine", 1))))  # a failed spine: its node stays behind
    topo = topology.Topology(g, spec)
    assert ("spine", 1) not in {n for pair in hops(topo, topo.route(0, 8)) for n in pair}


def spine_uplink_bytes(topo, nbytes):
    net = run_phase(topo, chains_phase([[(0, 8)]], [nbytes], 1))
    return net, {s: net.bytes_by_link[topo.link_id[(("leaf", 0, 0), ("spine", s))]]
                 for s in range(4) if (("leaf", 0, 0), ("spine", s)) in topo.link_id}


def test_failing_a_spine_link_shifts_its_traffic_to_the_other_spines():
    spec = specs.FatTreeSpec("t", nodes_per_su=1, spines=4, oversubscription=4)  # spines bottleneck
    nbytes = 1e9
    healthy, before = spine_uplink_bytes(topology.Topology(topology.fat_tree(16, spec, H100), spec), nbytes)
    g = topology.fat_tree(16, spec, H100)
    g.remove_edge(("leaf", 0, 0), ("spine", 1))
    faulty, after = spine_uplink_bytes(topology.Topology(g, spec), nbytes)
    assert before == pytest.approx({s: nbytes / 4 for s in range(4)})
    assert after == pytest.approx({0: nbytes / 3, 2: nbytes / 3, 3: nbytes / 3})
    uplink = H100.nic_bw / 4 / 4 * EFF["ib"]  # one server per unit, 4:1, four spines
    latency = healthy.env.now - nbytes / (4 * uplink)
    assert faulty.env.now == pytest.approx(latency + nbytes / (3 * uplink), rel=1e-9)


# --- topology files ------------------------------------------------------------------

def test_unknown_preset_names_the_key_and_the_presets():
    with pytest.raises(InputError, match="dgx-h100") as err:
        specs.load_spec("dgx-z900")
    assert err.value.key == "cluster.topology"


def write(tmp_path, text):
    path = tmp_path / "t.toml"
    path.write_text(text)
    return str(path)


def test_malformed_toml_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="malformed TOML") as err:
        specs.load_spec(write(tmp_path, "spines = = 4\n"))
    assert err.value.key == "cluster.topology"


@pytest.mark.parametrize("text,key", [
    ("spine = 4", "cluster.topology.spine"),  # unknown key
    ("spines = -4", "cluster.topology.spines"),
    ("spines = 2.5", "cluster.topology.spines"),  # a count must be whole
    ("spines = true", "cluster.topology.spines"),
    ("nic_gbps = 'fast'", "cluster.topology.nic_gbps"),
    ("gpu = 8", "cluster.topology.gpu"),
    ("routing = 'random'", "cluster.topology.routing"),
    ("gpus_per_domain = 3", "cluster.topology.gpus_per_domain"),
    ("builder = 'torus'", "cluster.topology.builder"),
])
def test_bad_key_or_value_names_the_key(tmp_path, text, key):
    with pytest.raises(InputError) as err:
        specs.load_spec(write(tmp_path, text + "\n"))
    assert err.value.key == key and key in str(err.value)


def test_fractional_bandwidths_are_fine(tmp_path):
    spec = specs.load_spec(write(tmp_path, "nic_gbps = 12.5\noversubscription = 1.5\n"))
    assert (spec.nic_gbps, spec.oversubscription, spec.name) == (12.5, 1.5, "t")
    topo = topology.build(spec, 16, H100)
    assert np.isclose(topo.caps[topo.link_id[(("nic", 0), ("leaf", 0, 0))]], 12.5e9 * EFF["ib"])
