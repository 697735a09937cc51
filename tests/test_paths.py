"""Batched routes (sim/hardware/paths.py) are Topology.route pair by pair, bit for bit:
the same links, weights and latencies, on clean fabrics and around failed or degraded
NICs and spines (where pairs fall back to the graph search).

Run: ``python -m pytest tests/test_paths.py``
"""

import dataclasses

import numpy as np
import pytest

from sim.hardware import topology
from sim.hardware.faults import apply_faults
from sim.hardware.gpus import gpu_preset
from sim.hardware.paths import routes
from sim.input.scenario import LinkFault

FAULTS = {"clean": [], "failed-nic": [LinkFault(gpu_nic=9, factor=0.0)], "degraded-nic": [LinkFault(gpu_nic=3)],
          "failed-spine": [LinkFault(spine=2, factor=0.0)]}


@pytest.mark.parametrize("fabric", ["dgx-h100", "gb200-nvl72", "ecmp"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_batched_routes_are_route_pair_by_pair(fabric, fault):
    spec = topology.load_spec("dgx-h100" if fabric == "ecmp" else fabric)
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
