"""``auto`` is NCCL's tuner: its cost model, and its picks where published runs show them.

Run ``python -m pytest -q tests/test_tuner.py``.
"""

import dataclasses

import pytest

from conftest import spec_topology
from sim.collectives import tuner
from sim.hardware import specs, topology
from sim.hardware.gpus import gpu_preset


def fabric(name: str, gpus: int, **changes):
    spec = dataclasses.replace(specs.load_spec(name), **changes)
    topo = topology.build(spec, gpus, gpu_preset(spec.gpu))
    return topo.fabric, tuple(int(d) for d in topo.domains)


def pick(op, nbytes, domains, f):
    return tuner.pick(op, nbytes, domains, f).name


# --- the cost model: NCCL's own numbers ------------------------------------------------

def test_latencies_are_nccls_for_one_h100_node():
    f, doms = fabric("dgx-h100", 8)
    c = tuner.comm_of("all_reduce", doms, f)
    assert tuner.latency(c, "ring", "ll") == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
    assert tuner.latency(c, "ring", "simple") == pytest.approx((8.4 + 14 * 3.4) * 1e-6)
    assert tuner.latency(c, "tree", "ll") == pytest.approx((6.8 + 2 * 7 * 0.6) * 1e-6)
    assert tuner.latency(c, "nvls", "simple") == pytest.approx(25e-6)


def test_bandwidths_follow_tuning_cc_for_one_h100_node():
    f, doms = fabric("dgx-h100", 8)
    c = tuner.comm_of("all_reduce", doms, f)
    w = 370e9
    assert tuner.algo_bandwidth(c, "ring", "simple") == pytest.approx(w * 8 / 14)
    assert tuner.algo_bandwidth(c, "ring", "ll") == pytest.approx(141e9 * 8 / 14)  # llMaxBw caps LL
    assert tuner.algo_bandwidth(c, "nvls", "simple") == pytest.approx(w * 0.85 * 15 / 16 * 2 * 8 / 14)


def test_ring_latency_counts_network_steps_across_nodes():
    f, doms = fabric("dgx-h100", 32)  # 4 nodes x 8
    c = tuner.comm_of("all_gather", doms, f)
    # 31 steps, 3 of them across the network; Simple pays max(3.4, 3 x 1.0 net overhead) inside
    assert tuner.latency(c, "ring", "simple") == pytest.approx((8.4 + 28 * 3.4 + 3 * 14) * 1e-6)


# --- what NCCL picks, where published runs show it ------------------------------------

@pytest.mark.parametrize("nbytes,expected", [(8, "ring:ll"), (65536, "ring:ll"), (2**20, "ring:ll"),
                                             (2**21, "nvls"), (2**30, "nvls"), (2**34, "nvls")])
def test_one_h100_node_all_reduce_ring_ll_then_nvls(nbytes, expected):
    """nccl-tests issue 309 (8 H100 + 8 NICs, NCCL_DEBUG_SUBSYS=TUNING): "8B~1MB uses
    Algo RING proto LL; 2MB~16GB uses Algo NVLS proto SIMPLE"."""
    f, doms = fabric("dgx-h100", 8)
    assert pick("all_reduce", nbytes, doms, f) == expected


def test_one_h100_node_keeps_rings_for_reduce_scatter():
    """NCCL issue 1083 (S. Jeaugey): NVLS reduce-scatter sends S and receives S/N, slower
    than a ring, so large reduce-scatters stay on rings."""
    f, doms = fabric("dgx-h100", 8)
    assert pick("reduce_scatter", 2**30, doms, f) == "ring"
    assert pick("all_gather", 2**30, doms, f) == "ring"


@pytest.mark.parametrize("name,expected", [("dgx-h100", "nvls_tree"), ("dgx-a100", "tree")])
def test_two_nodes_all_reduce_uses_trees(name, expected):
    """nccl-tests issue 196 (S. Jeaugey): "On two nodes, NCCL uses the tree (or nvlstree)
    algorithm which can indeed go beyond the network bottleneck"."""
    f, doms = fabric(name, 16)
    assert pick("all_reduce", 2**30, doms, f) == expected


def test_nvls_off_gb200_rack_runs_rings():
    """NCCL's model with NCCL_NVLS_ENABLE=0 (coreweave/nccl-tests' job script since its PR 47)
    on 72 and 144 GB200, 4-16 GiB: rings; with NVLS on (NCCL's default) the rack runs NVLS."""
    for gpus, nbytes in ((72, 2**32), (144, 2**34)):
        f, doms = fabric("gb200-nvl72", gpus, nvls=False)
        assert pick("all_reduce", nbytes, doms, f) == "ring"
    f, doms = fabric("gb200-nvl72", 72)
    assert pick("all_reduce", 2**32, doms, f) == "nvls"  # NCCL's default on the rack


W_NVLINK5 = 40.1e9 * 18  # NCCL topo.h SM100_NVLINK_BW x 18 links, every NVLink5 part's NVLink


def test_nvls_off_two_gb200_racks_run_trees_then_rings():
    """Two GB200 NVL72 racks, NVLS off, in NCCL's model (tuning.cc): the ring's algbw is
    W x 144/286 (nRanks/nSteps) with its latency x 1.4 (the plateau), the tree's 0.92 W / 2
    (its 16 x 42.8 GB/s cap is above 0.92 W = 664 GB/s); the tree wins below the size where
    latency + S / algbw cross, S* = (1.4 lat_ring - lat_tree) / (1/bw_tree - 1/bw_ring) ~2.9 GiB."""
    f, doms = fabric("gb200-nvl72", 144, nvls=False)
    c = tuner.comm_of("all_reduce", doms, f)
    ring, tree = W_NVLINK5 * 144 / 286, 0.92 * W_NVLINK5 / 2
    assert tuner.algo_bandwidth(c, "ring", "simple") == pytest.approx(ring)
    assert tuner.algo_bandwidth(c, "tree", "simple") == pytest.approx(tree)
    cross = (1.4 * tuner.latency(c, "ring", "simple") - tuner.latency(c, "tree", "simple")) / (1 / tree - 1 / ring)
    assert 2**31 < cross < 2**32
    assert [pick("all_reduce", 2**k, doms, f) for k in (29, 30, 31, 32, 33)] == ["tree"] * 3 + ["ring"] * 2


def test_tree_cap_binds_only_where_a_tree_channel_is_slower_than_the_links():
    """tuning.cc: a tree's bus bandwidth is at most nChannels x perChMaxTreeBws (16 x 42.8 GB/s
    on Blackwell across 2 nodes, 16 x 24 across more); the simulator's tree obeys the cap where
    it is below the link-limited rate (two GB200 racks: 684.8 of 721.8 GB/s), and nowhere else."""
    f, doms = fabric("gb200-nvl72", 144, nvls=False)
    c = tuner.comm_of("all_reduce", doms, f)
    assert tuner.tree_cap(c) == pytest.approx(16 * 42.8 / (40.1 * 18))
    assert tuner.tree_cap(c) < 0.95
    for name, gpus in (("gb200-nvl72", 72), ("dgx-h100", 16), ("dgx-h100", 64), ("dgx-a100", 64)):
        g, d = fabric(name, gpus)
        assert tuner.tree_cap(tuner.comm_of("all_reduce", d, g)) == 1.0, name


def test_simulated_tree_across_gb200_racks_runs_at_the_cap():
    """A 16 GiB tree all-reduce on two GB200 racks, simulated: its bus bandwidth is the cap,
    16 x 42.8 = 684.8 GB/s (latency < 0.3% at this size); at link rate it would be ~720."""
    from sim.studies.nccl_tests import time_collective

    spec = dataclasses.replace(specs.load_spec("gb200-nvl72"), nvls=False)
    topo = topology.build(spec, 144, gpu_preset(spec.gpu))
    nbytes = 2**34
    busbw = nbytes / time_collective(topo, "all_reduce", "tree", tuple(range(144)), nbytes) * 2 * 143 / 144
    assert busbw == pytest.approx(16 * 42.8e9, rel=0.01)


def test_pat_for_small_gathers_at_scale_with_one_gpu_per_node():
    """NCCL 2.23.4 release notes: PAT, "logarithmic number of network steps for small sizes
    at scale. Only supports one rank per node at the moment"."""
    topo = spec_topology(256 * 8)
    f = topo.fabric
    one_per_node = tuple(range(256))  # 256 nodes' rail-0 GPUs: domains 0..255
    assert pick("all_gather", 2**20, one_per_node, f) == "pat"
    assert pick("reduce_scatter", 2**20, one_per_node, f) == "pat"
    assert pick("all_gather", 2**28, tuple(range(16)), f) == "ring"  # large sizes: bandwidth wins
    eight_per_node = tuple(d for d in range(32) for _ in range(8))
    assert all(not c.algo == "pat" for c in tuner.candidates("all_gather", 2**20, eight_per_node, f))


def test_in_network_algorithms_only_where_the_switches_reduce():
    """CollNet and NVLS across nodes need SHARP (NCCL disables them when collnet is off)."""
    for sharp in (False, True):
        f, doms = fabric("dgx-h100", 64, sharp=sharp)
        names = {c.algo for c in tuner.candidates("all_reduce", 2**30, doms, f)}
        assert ("collnet" in names) is sharp and ("nvls" in names) is sharp
        assert "nvls_tree" in names
    f, doms = fabric("dgx-a100", 64, sharp=True)
    names = {c.algo for c in tuner.candidates("all_reduce", 2**30, doms, f)}
    assert "collnet" in names and not names & {"nvls", "nvls_tree"}  # A100 NVSwitches cannot reduce
