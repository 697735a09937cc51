"""Shared helpers for the network-core tests: topologies built once, one phase timed alone."""

from functools import lru_cache

import pytest
import simpy

from sim import topology
from sim.hardware import gpu_preset
from sim.network import Network


@lru_cache(maxsize=None)
def _preset_topology(name: str, gpus: int) -> topology.Topology:
    spec = topology.load_spec(name)
    return topology.build(spec, gpus, gpu_preset(spec.gpu))


@pytest.fixture
def preset_topology():
    """``preset_topology("dgx-h100", 16)``: a topology preset built once per session."""
    return _preset_topology


def spec_topology(gpus: int, **fields) -> topology.Topology:
    """A fat tree from a spec written inline, e.g. ``spec_topology(16, nic_gbps=5)``."""
    spec = topology.FatTreeSpec("test", **fields)
    return topology.build(spec, gpus, gpu_preset(spec.gpu))


def run_phase(topo: topology.Topology, phase) -> Network:
    """Run one phase alone on an idle network; the network keeps ``env.now`` and
    ``bytes_by_link``."""
    env = simpy.Environment()
    net = Network(env, topo)
    env.process(net.run(phase))
    env.run()
    return net


def time_phase(topo: topology.Topology, phase) -> float:
    """Simulated seconds of one phase running alone on an idle network."""
    return run_phase(topo, phase).env.now
