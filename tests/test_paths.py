"""Batched routes (sim/hardware/paths.py) are Topology.route pair by pair, bit for bit:
the same links, weights and latencies, on clean fabrics and around failed or degraded
NICs and spines (where pairs fall back to the graph search).

Run: ``python -m pytest tests/test_paths.py``
"""

import dataclasses

import numpy as np
import pytest

from sim.hardware import specs, topology
from sim.hardware.faults import apply_faults
from sim.hardware.gpus import gpu_preset
from sim.hardware.paths import routes
from sim.input.scenario import LinkFault

FAULTS = {"clean": [], "failed-nic": [LinkFault(gpu_nic=9, factor=0.0)], "degraded-nic": [LinkFault(gpu_nic=3)],
          "failed-spine": [LinkFault(spine=2, factor=0.0)]}


@pytest.mark.parametrize("fabric", ["dgx-h100", "gb200-nvl72", "ecmp"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_batched_routes_are_route_pair_by_pair(fabric, fault):
    spec = specs.load_spec("dgx-h100" if fabric == "ecmp" else fabric)
    spec = dataclasses.replace(spec, nodes_per_su=2, routing="ecmp" if fabric == "ecmp" else spec.routing)
    graph = topology.fat_tree(96, spec, gpu_preset("h100-sxm"))
    apply_faults(graph, FAULTS[fault], spec)
    topo = topology.Topology(graph, spec)
    rng = np.random.default_rng(len(fault))
    src, dst = rng.integers(0, 96, 2000), rng.integers(0, 96, 2000)
    src, dst = src[src != dst], dst[src != dst]
    links, weights, lengths, latency = routes(topo, src, dst)
    one = [topo.route(int(a), int(b)) for a, b in zip(src, dst)]
    assert lengths.tolist() == [len(r.links) for r in one]
    assert links.tolist() == np.concatenate([r.links for r in one]).tolist()
    assert weights.tolist() == np.concatenate([r.weights for r in one]).tolist()
    assert latency.tolist() == [r.latency for r in one]


def _phase(src, dst):
    from sim.collectives.schedule import Phase

    n = len(src)
    return Phase(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), np.arange(n), np.ones(n), 1)


def _fields(c):
    return (c.links.tolist(), c.link_index.tolist(), c.entry_chain.tolist(), c.entry_weight.tolist(),
            c.step_latency, c.n_chains)


@pytest.mark.parametrize("fabric, units", [("dgx-h100", 4), ("gb200-nvl72", 4)])
def test_a_phase_whole_units_away_compiles_to_its_own_routes(fabric, units):
    """The network routes a hop pattern once and moves its links for the same pattern a
    whole scalable unit (and NVLink domain) away: exactly what routing it would give."""
    import math

    import simpy

    from sim.engine.network import Network

    spec = specs.load_spec(fabric)
    spec = dataclasses.replace(spec, nodes_per_su=spec.gpus_per_domain // spec.gpus_per_node or 1)
    unit = math.lcm(spec.gpus_per_node * spec.nodes_per_su, spec.gpus_per_domain)
    topo = topology.Topology(topology.fat_tree(units * unit, spec, gpu_preset("h100-sxm")), spec)
    rng = np.random.default_rng(units)
    src, dst = rng.integers(0, 2 * unit, 300), rng.integers(0, 2 * unit, 300)
    src, dst = src[src != dst], dst[src != dst]
    net = Network(simpy.Environment(), topo)
    first = net.compile(_phase(src, dst))
    for k in range(1, units - 1):
        moved = net.compile(_phase(src + k * unit, dst + k * unit))
        assert moved.entry_chain is first.entry_chain  # moved, not routed again
        assert _fields(moved) == _fields(Network(simpy.Environment(), topo).compile(_phase(src + k * unit,
                                                                                          dst + k * unit)))
    half = net.compile(_phase(src + unit // 2, dst + unit // 2))  # not a whole unit: routed
    assert half.entry_chain is not first.entry_chain


@pytest.mark.parametrize("fault", ["failed-nic", "ecmp"])
def test_no_translation_where_routes_do_not_move_alike(fault):
    import simpy

    from sim.engine.network import Network

    spec = dataclasses.replace(specs.load_spec("dgx-h100"), nodes_per_su=2,
                               routing="ecmp" if fault == "ecmp" else "spray")
    graph = topology.fat_tree(64, spec, gpu_preset("h100-sxm"))
    apply_faults(graph, FAULTS.get(fault, []), spec)
    topo = topology.Topology(graph, spec)
    net = Network(simpy.Environment(), topo)
    first = net.compile(_phase([0, 1, 2], [17, 9, 30]))
    moved = net.compile(_phase([32, 33, 34], [49, 41, 62]))
    assert moved.entry_chain is not first.entry_chain
    assert _fields(moved) == _fields(Network(simpy.Environment(), topo).compile(_phase([32, 33, 34], [49, 41, 62])))
