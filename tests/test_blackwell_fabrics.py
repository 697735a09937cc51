"""The 2026 NVIDIA systems: DGX B200 (NVLink5 switches, NVLS), DGX H800 (NVLink cut to
400 GB/s bidirectional), GB300 NVL72 racks (ConnectX-8 800 Gb/s). Closed forms from the
datasheets and the efficiencies sim/hardware/gpus.py cites: NVLink5 at 721.8 GB/s on an 8-GPU
board and in an NVL72 rack alike (NCCL topo.h SM100_NVLINK_BW 40.1 x 18 links), NVLS eta 0.74
on Blackwell and 0.85 on Hopper (NCCL tuning.cc).

Run: ``python -m pytest tests/test_blackwell_fabrics.py``
"""

import pytest

from sim.collectives import nvls
from sim.studies.nccl_tests import algorithm, build_topology, bus_factor, time_collective

B = 2**34  # 16 GiB: latencies vanish


def busbw(topo, op: str, algo: str, n: int, size: int = B) -> float:
    group = tuple(range(n))
    t = time_collective(topo, op, algorithm(topo, op, algo, None, group, size), group, size)
    return size / t * bus_factor(op, n)


def test_dgx_b200_nvls_all_reduce_closed_form():
    """NVLS on an 8-GPU NVLink5 board: busbw = W eta 2(N-1)/(N+1) = 721.8 x 0.74 x 14/9 = 831
    GB/s (8x B300 measured 845, 8x B200 "830+": NCCL issues 2140, 1807); the tuner picks it over
    rings (721.8 GB/s; 695 measured on 8x B300) at large sizes."""
    topo = build_topology("dgx-b200", 8, None)
    w = 40.1e9 * 18
    assert busbw(topo, "all_reduce", "nvls", 8) == pytest.approx(w * 0.74 * 14 / 9, rel=2e-3)
    assert algorithm(topo, "all_reduce", "auto", None, tuple(range(8)), B).startswith("nvls")
    assert busbw(topo, "all_reduce", "ring", 8) == pytest.approx(w, rel=2e-3)


def test_dgx_h800_nvlink_is_200_gb_per_direction():
    """H800: ring busbw 200 x 0.822 = 164 GB/s, NVLS 164 x 0.85 x 14/9 = 217 (215 measured,
    NCCL issue 1374)."""
    topo = build_topology("dgx-h800", 8, None)
    w = 200e9 * 370 / 450
    assert busbw(topo, "all_reduce", "ring", 8) == pytest.approx(w, rel=2e-3)
    assert busbw(topo, "all_reduce", "nvls", 8) == pytest.approx(w * 0.85 * 14 / 9, rel=2e-3)
    assert nvls.NVLS_LATENCY > 0


def test_gb300_rack_rings_and_800g_nics():
    """One GB300 NVL72 rack: a 72-GPU ring runs at NCCL's NVLink5 figure, 40.1 x 18 = 721.8 GB/s
    busbw (latency: 0.3% at 16 GiB); across two racks each GPU's ConnectX-8 (100 GB/s, 95
    usable) carries one channel: 4 GPUs per tray x 95."""
    topo = build_topology("gb300-nvl72", 144, None)
    assert busbw(topo, "all_reduce", "ring", 72) == pytest.approx(40.1e9 * 18, rel=5e-3)
    cross = topo.route(0, 72)
    nic_links = [lid for lid in cross.links if topo.kinds[lid] == "ib"]
    assert nic_links and min(topo.caps[nic_links]) == pytest.approx(100e9 * 0.95)
    gb200 = build_topology("gb200-nvl72", 144, None)
    assert min(gb200.caps[[lid for lid in gb200.route(0, 72).links if gb200.kinds[lid] == "ib"]]) \
        == pytest.approx(50e9 * 0.95)


def test_nvl72_rings_all_to_all_and_nvls_share_nccls_nvlink_figure():
    """In an NVL72 rack rings and point-to-point run at NCCL's SM100 NVLink figure (40.1 x 18 =
    721.8 GB/s), as on the 8-GPU board, and NVLS takes eta 0.74 of it: 8 GB300 of one rack
    721.8 x 0.74 x 14/9 = 831 GB/s busbw (841.6 measured, OCI); a 4-GPU ring 721.8 (Azure 680),
    an 8-GPU all-to-all sends 7/8 of S at 721.8, busbw 721.8 (OCI 679.7 on GB300)."""
    topo = build_topology("gb300-nvl72", 72, None)
    w = 40.1e9 * 18
    assert busbw(topo, "all_reduce", "nvls", 8) == pytest.approx(w * 0.74 * 14 / 9, rel=2e-3)
    assert busbw(topo, "all_reduce", "nvls", 4) == pytest.approx(w * 0.74 * 6 / 5, rel=2e-3)
    assert busbw(topo, "all_reduce", "ring", 4) == pytest.approx(w, rel=2e-3)
    assert busbw(topo, "all_to_all", "direct", 8) == pytest.approx(w, rel=2e-3)
    assert busbw(topo, "all_reduce", "ring", 72) == pytest.approx(w, rel=5e-3)


@pytest.mark.parametrize("n, factor", [(4, 6 / 5), (8, 14 / 9)])
def test_gb200_rack_nvls_is_the_gb300_closed_form(n, factor):
    """GB200 and GB300 share NVLink5 and NCCL's SM100 figure, so NVLS on 4 and 8 GB200 of one
    rack is 721.8 x 0.74 x 2(N-1)/(N+1) = 641 / 831 GB/s busbw (OCI's GB200 runs, NCCL 2.27.3:
    657-663 on one tray, 856-892 on two trays; sim/data/collectives_measured.csv)."""
    topo = build_topology("gb200-nvl72", 72, None)
    assert algorithm(topo, "all_reduce", "auto", None, tuple(range(n)), B) == "nvls"
    assert busbw(topo, "all_reduce", "nvls", n) == pytest.approx(40.1e9 * 18 * 0.74 * factor, rel=2e-3)


def test_nvls_has_at_most_32_heads_per_domain():
    """NCCL_MAX_NVLS_ARITY = 32 heads: on 64 GPUs of a rack each of 32 heads' links carries
    B (1 + 1/32), so busbw = W eta 2(N-1)/N x 32/33 (not N/(N+1)); reduce-scatter and
    all-gather refuse NVLS above 32 GPUs of a domain, as NCCL's enqueue.cc does."""
    from sim.collectives import unsupported

    topo = build_topology("gb300-nvl72", 72, None)
    w = 40.1e9 * 18 * 0.74
    assert busbw(topo, "all_reduce", "nvls", 64) == pytest.approx(w * 2 * 63 / 64 * 32 / 33, rel=2e-3)
    assert busbw(topo, "all_reduce", "nvls", 32) == pytest.approx(w * 2 * 31 / 33, rel=2e-3)
    assert unsupported("all_gather", "nvls", (0,) * 64, topo.fabric)
    assert unsupported("all_gather", "nvls", (0,) * 32, topo.fabric) is None
    assert algorithm(topo, "reduce_scatter", "auto", None, tuple(range(64)), B) == "ring"


def test_nvls_tree_across_two_b300_nodes_is_nccls_per_head_cap():
    """NVLS_TREE on 2 nodes of 8 B300: NCCL's tuner holds its bus bandwidth at heads x
    perChMaxNVLSTreeBws[Blackwell][2 nodes] = 8 x 96 = 768 GB/s (tuning.cc; one head per NIC),
    below the links' 721.8 x 0.74 x 8/9 x 30/16 = 890; the simulated run obeys it (OCI's
    16-B300 run, NCCL 2.28.9: 766.8 at 16 GiB). In an NVL72 rack 32 heads make the cap
    3,072 GB/s, so two racks stay at the links' figure, 534 x 32/33 x 2(N-1)/N."""
    topo = build_topology("dgx-b200", 16, "b300")
    assert algorithm(topo, "all_reduce", "auto", None, tuple(range(16)), B) == "nvls_tree"
    assert busbw(topo, "all_reduce", "nvls_tree", 16) == pytest.approx(8 * 96e9, rel=2e-3)
    racks = build_topology("gb300-nvl72", 144, None)
    group = tuple(range(64)) + tuple(range(72, 136))
    t = time_collective(racks, "all_reduce", "nvls_tree", group, B)
    w = 40.1e9 * 18 * 0.74
    assert B / t * bus_factor("all_reduce", 128) == pytest.approx(w * 32 / 33 * 2 * 127 / 128, rel=2e-3)
