"""A clean fat tree indexed as arrays (sim/hardware/tree_arrays.py) is the NetworkX graph's
index bit for bit: link ids, capacities, latencies, kinds, first and last hops, leaves,
the leaf x spine table and every route, on whole and partial scalable units, NVL72 domains,
one-GPU domains and ECMP; and ``build`` uses it only where nothing changed the graph.

Run: ``python -m pytest -q tests/test_tree_arrays.py``
"""

import dataclasses

import numpy as np
import pytest

from sim.errors import InputError
from sim.hardware import paths, specs, topology
from sim.hardware.gpus import gpu_preset
from sim.hardware.tree_arrays import TreeArrays
from sim.input.scenario import LinkFault

CASES = [("dgx-h100", 96, {}), ("dgx-h100", 100, {}), ("dgx-h100", 3, {}), ("dgx-a100", 40, {"spines": 3}),
         ("gb200-nvl72", 150, {}), ("dgx-h100", 52, {"gpus_per_domain": 4, "nodes_per_su": 3}),
         ("dgx-h100", 37, {"gpus_per_domain": 1, "gpus_per_node": 2, "nodes_per_su": 5, "spines": 2}),
         ("dgx-h100", 64, {"routing": "ecmp", "oversubscription": 2.0, "nic_gbps": 25}),
         ("dgx-b200", 80, {"nvlink_gbps": 300})]


def pair(name: str, n: int, fields: dict) -> tuple[topology.Topology, topology.Topology]:
    """(graph-indexed, array-indexed) topologies of one spec, small scalable units."""
    spec = dataclasses.replace(specs.load_spec(name), **{"nodes_per_su": 2, **fields})
    gpu = gpu_preset(spec.gpu)
    return topology.Topology(topology.fat_tree(n, spec, gpu), spec), topology.Topology(None, spec, TreeArrays(spec, n, gpu))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name, n, fields", CASES)
def test_arrays_are_the_graphs_index(name, n, fields):
    graph, arrays = pair(name, n, fields)
    assert arrays.num_gpus == graph.num_gpus == n
    for field in ("caps", "latency", "kinds", "domains"):
        assert same(getattr(arrays, field), getattr(graph, field)), field
    assert len(arrays.link_id) == len(graph.link_id)
    assert all(arrays.link_id[p] == lid for p, lid in graph.link_id.items())
    assert arrays.link_ends == graph.link_ends
    assert arrays.leaves == graph.leaves
    assert all(arrays.server(g) == graph.server(g) for g in range(n))
    for key in graph.endpoint_links:
        assert same(arrays.endpoint_links[key], graph.endpoint_links[key]), key
    assert same(paths.leaf_ids(arrays), paths.leaf_ids(graph)) and paths.leaf_nodes(arrays) == paths.leaf_nodes(graph)
    for a, b in zip(paths.spine_table(arrays), paths.spine_table(graph)):
        assert (a is None and b is None) or same(a, b)
    assert vars(arrays.fabric) == vars(graph.fabric) and "graph" not in arrays.__dict__  # none built the graph


@pytest.mark.parametrize("name, n, fields", CASES)
def test_routes_are_the_graphs_bit_for_bit(name, n, fields):
    graph, arrays = pair(name, n, fields)
    rng = np.random.default_rng(n)
    src, dst = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    src, dst = src[src != dst], dst[src != dst]
    for a, b in zip(paths.routes(arrays, src, dst), paths.routes(graph, src, dst)):
        assert same(a, b)
    for a, b in zip(src[:300].tolist(), dst[:300].tolist()):
        r, s = arrays.route(a, b), graph.route(a, b)
        assert same(r.links, s.links) and same(r.weights, s.weights) and r.latency == s.latency
    assert "graph" not in arrays.__dict__
    unit = arrays.spec.gpus_per_node * arrays.spec.nodes_per_su
    assert paths.translatable(arrays, unit) == paths.translatable(graph, unit)


def test_no_link_is_named_where_the_graph_has_none():
    graph, arrays = pair("dgx-h100", 100, {})
    nodes = list(graph.graph.nodes) + [("gpu", 100), ("nic", -1), ("spine", 16), ("leaf", 9, 0), ("gpu", True)]
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, len(nodes), (20000, 2)).tolist():
        u, v = nodes[i], nodes[j]
        assert arrays.link_id.get((u, v)) == graph.link_id.get((u, v)), (u, v)
        assert ((u, v) in arrays.link_id) == ((u, v) in graph.link_id)
    with pytest.raises(KeyError):
        arrays.link_id[(("gpu", 0), ("gpu", 1))]


def test_the_graph_is_built_when_read_and_holds_the_same_links():
    _, arrays = pair("dgx-h100", 48, {})
    g = arrays.graph
    assert g.number_of_edges() * 2 == len(arrays.caps) and arrays.intact
    assert all(arrays.link_id[(u, v)] in (2 * k, 2 * k + 1) for k, (u, v) in enumerate(g.edges()))


def test_build_indexes_by_arrays_only_a_fabric_nothing_changed():
    spec, gpu = specs.load_spec("dgx-h100"), gpu_preset("h100-sxm")
    assert topology.build(spec, 64, gpu).tree is not None
    assert topology.build(spec, 64, gpu, faults=[LinkFault(gpu_nic=3)]).tree is None
    assert topology.build(specs.load_spec("dgx-h100-rail-only"), 64, gpu).tree is None
    assert topology.build(dataclasses.replace(spec, planes=2), 64, gpu).tree is None
    with pytest.raises(InputError):  # the GPU check still runs
        topology.build(spec, 16, gpu_preset("mi300x"))
