"""Switches that compute (NVLS, SHARP/CollNet), PAT and the protocols, against closed forms.

Expected times come from first principles: W per GPU from the GPU preset's line rates times
the fabric efficiencies, eta_nvls from sim/hardware/gpus.py, latencies from the per-link
latencies and the fixed in-switch latencies the modules cite (NCCL's tuning.cc).
Run ``python -m pytest -q tests/test_in_network.py``.
"""

import math

import numpy as np
import pytest

from conftest import run_phase, spec_topology
from sim import collectives
from sim.collectives import collnet, nvls
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, LINK_LATENCY as LAT, NVLS_EFFICIENCY, gpu_preset
from sim.studies.nccl_tests import bus_factor, time_collective

H100 = gpu_preset("h100-sxm")
W_NV = H100.nvlink_bw * EFF["nvlink"]  # 370 GB/s
W_NIC = min(H100.pcie_bw * EFF["pcie"], H100.nic_bw * EFF["ib"])  # 47.5 GB/s
ETA = NVLS_EFFICIENCY["hopper"]
B = 2**30
NV_HOP = LAT["nvlink"]  # GPU -> NVSwitch
NIC_STEP = 2 * LAT["pcie"] + 2 * LAT["ib"]  # GPU -> NIC -> leaf -> NIC -> GPU


def domains_of(topo, group):
    return tuple(int(d) for d in topo.domains[list(group)])


def bandwidth_term(topo, op, algo, group, nbytes=B):
    """T(nbytes) - T(8 bytes): rates never depend on bytes, so the latency cancels."""
    return time_collective(topo, op, algo, group, nbytes) - time_collective(topo, op, algo, group, 8)


SHARP_HOP = LAT["pcie"] + LAT["ib"]  # GPU -> NIC -> leaf


# --- NVLS inside one NVLink domain -----------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8])
def test_nvls_all_reduce_is_b_over_w_nvls(preset_topology, n):
    """T = B (1 + 1/N) / (W eta) + the NVLS latency: each GPU's link carries its whole
    buffer up plus its reduced shard, and the multicast brings N shards down."""
    latency = nvls.NVLS_LATENCY + 4 * NV_HOP
    got = time_collective(preset_topology("dgx-h100", 8), "all_reduce", "nvls", tuple(range(n)), B)
    assert got - latency == pytest.approx(B * (1 + 1 / n) / (W_NV * ETA), rel=1e-9)


def test_nvls_8x_h100_busbw_is_eta_times_the_ring_factor(preset_topology):
    """busbw = W eta 2(N-1)/(N+1): 370 x 0.85 x 14/9 = 489 GB/s (~480 measured)."""
    t = time_collective(preset_topology("dgx-h100", 8), "all_reduce", "nvls", tuple(range(8)), 2**34)
    busbw = 2**34 / t * bus_factor("all_reduce", 8)
    assert busbw == pytest.approx(W_NV * ETA * 14 / 9, rel=1e-3)
    assert busbw / 1e9 == pytest.approx(489.2, abs=0.5)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_nvls_gather_and_scatter_take_s_over_w_nvls(preset_topology, op):
    """Reduce-scatter sends S and receives S/N; all-gather the reverse: T = S/(W eta)."""
    latency = nvls.NVLS_LATENCY + 2 * NV_HOP
    got = time_collective(preset_topology("dgx-h100", 8), op, "nvls", tuple(range(8)), B)
    assert got - latency == pytest.approx(B / (W_NV * ETA), rel=1e-9)
    ring = time_collective(preset_topology("dgx-h100", 8), op, "ring", tuple(range(8)), B)
    assert ring < got  # why NCCL keeps rings for them (NCCL issue 1083)


def test_nvls_loads_each_nvlink_with_its_bytes_over_eta(preset_topology):
    topo, n = preset_topology("dgx-h100", 8), 8
    (phase,) = collectives.schedule("all_reduce", "nvls", tuple(range(n)), B, (0,) * n, None, topo.fabric).phases
    net = run_phase(topo, phase)
    up = [topo.link_id[(("gpu", g), ("nvsw", 0))] for g in range(n)]
    assert net.bytes_by_link[up] == pytest.approx([B * (1 + 1 / n) / ETA] * n, rel=1e-12)


# --- NVLS across domains: NVLS_TREE and NVLS + SHARP -----------------------------------

def test_nvls_tree_two_nodes_links_carry_b_over_k_per_nic_and_b_1_plus_1_over_k_per_nvlink():
    """Two DGX H100 nodes, k = 8, the schedule's hops alone (nvls.tree_all_reduce): each NIC
    carries B/k each way (a ring: ~2B/k), each NVLink B(1 + 1/k)/eta, so the links alone
    would take T = B (1 + 1/k) / (W eta) plus latencies (nvls.endpoint_time: that bound)."""
    topo, k = spec_topology(16), 8
    group = tuple(range(16))
    (phase,) = nvls.tree_all_reduce(group, domains_of(topo, group), B, topo.fabric)
    net = run_phase(topo, phase)
    nic_up = [topo.link_id[(("nic", g), ("leaf", 0, g % 8))] for g in group]
    assert net.bytes_by_link[nic_up] == pytest.approx([B / k] * 16, rel=1e-12)
    latency = nvls.NVLS_LATENCY + phase.steps * (2 * LAT["pcie"] + 2 * LAT["ib"])
    assert net.env.now - latency == pytest.approx(B * (1 + 1 / k) / (W_NV * ETA), rel=1e-9)
    assert nvls.endpoint_time(phase, group, domains_of(topo, group), topo.fabric) == pytest.approx(
        B * (1 + 1 / k) / (W_NV * ETA), rel=1e-12)


def test_nvls_tree_two_h100_nodes_is_held_at_nccls_per_head_cap():
    """NCCL's NVLS_TREE bus bandwidth is at most heads x perChMaxNVLSTreeBw (tuning.cc: 57.7
    GB/s per head on Hopper across 2 nodes, 8 heads, one per NIC): 461.6 GB/s, below the links'
    W eta k/(k+1) 2(N-1)/N = 524. So T = B 2(N-1)/N / (8 x 57.7 GB/s) plus latencies, and the
    tuner's NVLS_TREE algbw is that cap times N / 2(N-1)."""
    from sim.collectives import tuner

    topo, n = spec_topology(16), 16
    group = tuple(range(n))
    (phase,) = collectives.schedule("all_reduce", "nvls_tree", group, B, domains_of(topo, group), None,
                                    topo.fabric).phases
    net = run_phase(topo, phase)
    latency = nvls.NVLS_LATENCY + phase.steps * (2 * LAT["pcie"] + 2 * LAT["ib"])
    assert net.env.now - latency == pytest.approx(B * 2 * (n - 1) / n / (8 * 57.7e9), rel=1e-9)
    assert W_NV * ETA * 8 / 9 * 2 * (n - 1) / n > 8 * 57.7e9  # the links alone would be faster
    c = tuner.comm_of("all_reduce", domains_of(topo, group), topo.fabric)
    assert tuner.algo_bandwidth(c, "nvls_tree", "simple") == pytest.approx(8 * 57.7e9 * n / (2 * (n - 1)))


def test_nvls_with_sharp_reduces_across_nodes_in_the_switches():
    topo = spec_topology(32, sharp=True)
    group = tuple(range(32))
    (phase,) = collectives.schedule("all_reduce", "nvls", group, B, domains_of(topo, group), None,
                                    topo.fabric).phases
    net = run_phase(topo, phase)
    nic_up = [topo.link_id[(("nic", g), ("leaf", 0, g % 8))] for g in group]
    assert net.bytes_by_link[nic_up] == pytest.approx([B / 8] * 32, rel=1e-12)  # B/k, not ~2B/k
    latency = nvls.NVLS_LATENCY + nvls.SHARP_NVLS_LATENCY + phase.steps * SHARP_HOP
    assert net.env.now - latency == pytest.approx(B * (1 + 1 / 8) / (W_NV * ETA), rel=1e-9)


# --- CollNet (SHARP) -------------------------------------------------------------------

def test_collnet_one_gpu_per_node_sends_b_per_nic_not_2b():
    """Rail 0 of 8 nodes: the switches reduce, so each NIC carries B up and B down:
    T = B / W_nic (a ring: 2B(N-1)/(N W_nic))."""
    topo = spec_topology(64, sharp=True)
    group = tuple(range(0, 64, 8))
    got = time_collective(topo, "all_reduce", "collnet", group, B)
    assert got - collnet.SHARP_LATENCY - 4 * SHARP_HOP == pytest.approx(B / W_NIC, rel=1e-9)
    ring = time_collective(topo, "all_reduce", "ring", group, B)
    assert ring / got == pytest.approx(2 * 7 / 8, rel=0.01)


def test_collnet_aggregates_at_the_leaf_before_the_spines():
    """Two scalable units of two nodes, 4:1 oversubscribed, two spines: each leaf reduces
    its two nodes' streams, so the spines carry one stream per leaf (B up, B down, over
    two uplinks of 2 x 50 / 4 / 2 GB/s) and set the pace: T = B / (2 x 11.9 GB/s).
    Without the leaf's reduction they would carry two streams and take twice as long."""
    topo = spec_topology(32, nodes_per_su=2, spines=2, oversubscription=4, sharp=True)
    uplinks = 2 * 2 * H100.nic_bw / 4 / 2 * EFF["ib"]
    got = bandwidth_term(topo, "all_reduce", "collnet", (0, 8, 16, 24))
    assert got == pytest.approx((B - 8) / uplinks, rel=1e-9)


def test_collnet_several_gpus_per_node_is_nvlink_bound():
    """k = 8: reduce to the shard owner and broadcast back over NVLink, 2B(k-1)/k per GPU."""
    topo = spec_topology(64, sharp=True)
    got = bandwidth_term(topo, "all_reduce", "collnet", tuple(range(64)))
    assert got == pytest.approx(2 * (B - 8) * 7 / 8 / W_NV, rel=1e-9)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_collnet_gather_and_scatter_move_b_over_k_per_nic_in_a_few_steps(op):
    """8 DGX H100 nodes with SHARP: shard j crosses GPU j's NIC once (B/k one way), so
    T = B / (k W_nic) in 3 steps plus the SHARP latency (a ring: 63 steps)."""
    topo = spec_topology(64, sharp=True)
    group = tuple(range(64))
    assert bandwidth_term(topo, op, "collnet", group) == pytest.approx((B - 8) / (8 * W_NIC), rel=1e-9)
    tiny = time_collective(topo, op, "collnet", group, 8)
    assert tiny == pytest.approx(collnet.SHARP_LATENCY + 3 * SHARP_HOP, rel=1e-3)  # GPU -> NIC -> leaf


# --- PAT -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 5, 8, 16, 64])
def test_pat_takes_log2_n_steps(n):
    topo = spec_topology(64 * 8, nodes_per_su=64)  # one leaf per rail: every step is NIC to NIC
    group = tuple(range(0, 8 * n, 8))  # one GPU per node, one rail
    for op in ("all_gather", "reduce_scatter"):
        phases = collectives.schedule(op, "pat", group, B, domains_of(topo, group), None, topo.fabric).phases
        assert len(phases) == math.ceil(math.log2(n))
        assert sum(p.nbytes.sum() for p in phases) == pytest.approx(n * B * (n - 1) / n, rel=1e-12)
    tiny = time_collective(topo, "all_gather", "pat", group, 8)
    ring = time_collective(topo, "all_gather", "ring", group, 8)
    assert tiny == pytest.approx(math.ceil(math.log2(n)) * NIC_STEP, rel=1e-3)
    assert ring == pytest.approx((n - 1) * NIC_STEP, rel=1e-3)


def test_pat_bandwidth_term_is_the_rings():
    topo, n = spec_topology(16 * 8), 16
    group = tuple(range(0, 8 * n, 8))
    got = time_collective(topo, "all_gather", "pat", group, B)
    assert got - 4 * NIC_STEP == pytest.approx(B * (n - 1) / (n * W_NIC), rel=1e-9)


# --- protocols -------------------------------------------------------------------------

def tiny_time(topo, algo):
    return time_collective(topo, "all_gather", algo, tuple(range(8)), 8)


def test_ll_puts_twice_the_bytes_on_the_wire_and_scales_the_latency():
    topo, group = spec_topology(8), tuple(range(8))
    doms = (0,) * 8
    (simple,) = collectives.schedule("all_gather", "ring", group, B, doms, None, topo.fabric).phases
    (ll,) = collectives.schedule("all_gather", "ring:ll", group, B, doms, None, topo.fabric).phases
    (ll128,) = collectives.schedule("all_gather", "ring:ll128", group, B, doms, None, topo.fabric).phases
    assert (ll.nbytes == simple.nbytes).all() and (ll.wire, ll128.wire) == (2.0, 1 / 0.92)  # payload kept
    wire = {p: run_phase(topo, ph).bytes_by_link.sum() for p, ph in (("s", simple), ("ll", ll), ("ll128", ll128))}
    assert wire["ll"] == pytest.approx(2 * wire["s"], rel=1e-12)
    assert wire["ll128"] == pytest.approx(wire["s"] / 0.92, rel=1e-12)
    big = {p: time_collective(topo, "all_gather", p, group, B) for p in ("ring", "ring:ll")}
    assert big["ring:ll"] - tiny_time(topo, "ring:ll") == pytest.approx(2 * (big["ring"] - tiny_time(topo, "ring")),
                                                                        rel=1e-6)
    # NCCL's latency ratio for an 8-GPU ring all-gather: (6.6 + 7 x 0.6) / (8.4 + 7 x 3.4)
    assert ll.latency_scale == pytest.approx((6.6 + 7 * 0.6) / (8.4 + 7 * 3.4), rel=1e-12)
    tiny = {p: time_collective(topo, "all_gather", p, group, 8) for p in ("ring", "ring:ll", "ring:ll128")}
    assert tiny["ring:ll"] == pytest.approx(7 * 2 * NV_HOP * ll.latency_scale, rel=1e-3)
    assert tiny["ring:ll"] < tiny["ring:ll128"] < tiny["ring"]


def test_protocols_only_for_ring_and_tree():
    from sim.errors import InputError

    with pytest.raises(InputError, match="--algo"):
        collectives.check("all_reduce", "nvls:ll", (0, 0), None)
    with pytest.raises(InputError, match="--algo"):
        collectives.check("all_reduce", "ring:fast", (0, 0), None)
    assert np.isclose(collectives.protocols.bandwidth_fraction("tree", "ll", True), 1 / 3.8)
