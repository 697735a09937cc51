"""Collective schedules against their closed forms, their latency terms, and nccl-tests.

Expected times are computed here from first principles: per-rank egress W from the GPU
preset's line rates times the fabric efficiency (sim/hardware/gpus.py), latency from the
per-link latencies. The simulated alpha term is subtracted before comparing the
bandwidth term with the seeds' formulas (within 0.5%).
Run ``python -m pytest -q tests/test_collectives.py``.
"""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import spec_topology, time_phase
from sim import collectives
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, LINK_LATENCY as LAT, gpu_preset
from sim.studies.nccl_tests import bus_factor, time_collective

H100, A100 = gpu_preset("h100-sxm"), gpu_preset("a100-80gb")
B = 2**30  # bytes: large enough to be bandwidth-dominated
NV_STEP = 2 * LAT["nvlink"]  # GPU -> NVSwitch -> GPU
NIC_STEP = 2 * LAT["pcie"] + 2 * LAT["ib"]  # GPU -> NIC -> rail leaf -> NIC -> GPU
CLOSE = 5e-3  # 0.5%


def nvlink_w(gpu):
    """Per-rank egress inside an NVLink domain, bytes/s."""
    return gpu.nvlink_bw * EFF["nvlink"]


def nic_w(gpu):
    """Per-rank egress of a GPU alone on its node: the slower of PCIe and its NIC."""
    return min(gpu.pcie_bw * EFF["pcie"], gpu.nic_bw * EFF["ib"])


def one_per_node(n, per_node=8):
    """n GPUs with the same local index on n servers: every hop crosses IB on one rail."""
    return tuple(range(0, n * per_node, per_node))


def ring_bw_term(topo, op, group, nbytes, step):
    steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[op] * (len(group) - 1)
    return time_collective(topo, op, "ring", group, nbytes) - steps * step


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_gather_scatter_in_nvlink_domain(preset_topology, op, n):
    expected = B * (n - 1) / (nvlink_w(H100) * n)
    got = ring_bw_term(preset_topology("dgx-h100", 8), op, tuple(range(n)), B, NV_STEP)
    assert got == pytest.approx(expected, rel=CLOSE)


@pytest.mark.parametrize("n", [2, 8])
def test_ring_all_reduce_in_nvlink_domain(preset_topology, n):
    expected = 2 * B * (n - 1) / (nvlink_w(H100) * n)
    got = ring_bw_term(preset_topology("dgx-h100", 8), "all_reduce", tuple(range(n)), B, NV_STEP)
    assert got == pytest.approx(expected, rel=CLOSE)


@pytest.mark.parametrize("op,factor", [("all_gather", 1), ("reduce_scatter", 1), ("all_reduce", 2)])
@pytest.mark.parametrize("name,gpu", [("dgx-a100", A100), ("dgx-h100", H100)])
def test_ring_nic_bound_one_gpu_per_node(preset_topology, op, factor, name, gpu):
    n = 8
    expected = factor * B * (n - 1) / (nic_w(gpu) * n)
    got = ring_bw_term(preset_topology(name, 64), op, one_per_node(n), B, NIC_STEP)
    assert got == pytest.approx(expected, rel=CLOSE)


def test_all_to_all_in_nvlink_domain(preset_topology):
    n, per_rank = 8, B // 8
    total = n * per_rank  # nccl-tests' all_to_all size is per rank
    expected = total * (n - 1) / (nvlink_w(H100) * n**2)
    got = time_collective(preset_topology("dgx-h100", 8), "all_to_all", "direct", tuple(range(n)), per_rank)
    assert got - NV_STEP == pytest.approx(expected, rel=CLOSE)


@pytest.mark.parametrize("combine", [False, True])
def test_uneven_all_to_all_is_held_by_the_hot_member(preset_topology, combine):
    """MoE dispatch to a hot rank (30% of the tokens) and the combine back: the hot GPU's
    NVLink port carries (N-1) * nbytes * 0.3 and sets the time; the cold pairs finish first."""
    n, per_rank, hot = 8, B // 8, 0.3
    f = (hot,) + ((1 - hot) / (n - 1),) * (n - 1)
    shares = (tuple(n * x for x in f), (1 / n,) * n) if combine else ((1.0,) * n, f)
    sched = collectives.schedule("all_to_all", "direct", tuple(range(n)), per_rank, (0,) * n, shares)
    (phase,) = sched.phases
    assert phase.nbytes.sum() == pytest.approx(per_rank * (n - 1), rel=1e-12)  # as many bytes as even
    got = time_phase(preset_topology("dgx-h100", 8), phase)
    assert got - NV_STEP == pytest.approx((n - 1) * per_rank * hot / nvlink_w(H100), rel=CLOSE)
    even = collectives.schedule("all_to_all", "direct", tuple(range(n)), per_rank, (0,) * n)
    uniform = ((1.0,) * n, (1 / n,) * n)
    assert np.allclose(collectives.schedule("all_to_all", "direct", tuple(range(n)), per_rank, (0,) * n,
                                            uniform).phases[0].nbytes, even.phases[0].nbytes, rtol=1e-12)


def test_all_to_all_nic_bound(preset_topology):
    n, per_rank = 8, B // 8
    expected = n * per_rank * (n - 1) / (nic_w(A100) * n**2)
    got = time_collective(preset_topology("dgx-a100", 64), "all_to_all", "direct", one_per_node(n), per_rank)
    assert got - NIC_STEP == pytest.approx(expected, rel=CLOSE)


def test_broadcast_pipelined_chain_takes_b_over_w(preset_topology):
    n = 8
    got = time_collective(preset_topology("dgx-h100", 8), "broadcast", "ring", tuple(range(n)), B)
    assert got - (n - 1) * NV_STEP == pytest.approx(B / nvlink_w(H100), rel=CLOSE)


# --- the latency (alpha) term --------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8])
def test_tiny_ring_all_gather_pays_one_step_per_rank(preset_topology, n):
    got = time_collective(preset_topology("dgx-h100", 8), "all_gather", "ring", tuple(range(n)), 8)
    assert got == pytest.approx((n - 1) * NV_STEP, rel=1e-3)


def test_tiny_ring_across_nodes_pays_the_ib_step(preset_topology):
    n = 8
    got = time_collective(preset_topology("dgx-h100", 64), "all_gather", "ring", one_per_node(n), 8)
    assert got == pytest.approx((n - 1) * NIC_STEP, rel=1e-3)


IB_STEP = 2 * LAT["pcie"] + 2 * LAT["ib"]  # GPU -> NIC -> leaf -> NIC -> GPU


@pytest.mark.parametrize("n", [4, 8, 16, 32, 64])
def test_tiny_tree_all_reduce_grows_with_log2_n(n):
    """One GPU per server (one leaf): the trees span the servers, 2*ceil(log2 n) steps."""
    topo = spec_topology(64, gpus_per_domain=1, gpus_per_node=1, nodes_per_su=64)
    got = time_collective(topo, "all_reduce", "tree", tuple(range(n)), 8)
    assert got == pytest.approx(2 * math.ceil(math.log2(n)) * IB_STEP, rel=1e-3)


def test_tree_inside_a_domain_is_a_chain_to_the_leader():
    """NCCL's intra-node tree is a chain: k-1 NVLink steps up, k-1 down."""
    topo = spec_topology(8)
    got = time_collective(topo, "all_reduce", "tree", tuple(range(8)), 8)
    assert got == pytest.approx(2 * 7 * NV_STEP, rel=1e-3)


def test_tiny_tree_beats_tiny_ring_at_64():
    topo = spec_topology(64, gpus_per_domain=1, gpus_per_node=1, nodes_per_su=64)
    group = tuple(range(64))
    assert time_collective(topo, "all_reduce", "tree", group, 8) < \
        time_collective(topo, "all_reduce", "ring", group, 8) / 5


@pytest.mark.parametrize("domains, k", [(1, 8), (2, 1), (5, 3), (16, 8), (33, 4)])
def test_tree_built_as_arrays_is_the_listed_tree_hop_for_hop(domains, k):
    """The world-wide tree of a step's end is built as arrays when every domain is full:
    the same hops, chains, bytes, steps and labels as the lists (shuffled member ids)."""
    from sim.collectives.tree import all_reduce_arrays, all_reduce_lists

    members = np.random.default_rng(domains * k).permutation(domains * k * 3)[:domains * k].reshape(domains, k)
    for a, b in zip(all_reduce_arrays(members, 3e8), all_reduce_lists(members.tolist(), 3e8)):
        for field in ("src", "dst", "chain", "nbytes"):
            x, y = getattr(a, field), getattr(b, field)
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), field
        assert (a.steps, a.label, a.latency_scale, a.overhead, a.wire) == (b.steps, b.label, b.latency_scale,
                                                                         b.overhead, b.wire)


def test_tree_across_dgx_nodes_uses_every_nic_for_large_messages():
    """Eight channels, each led by a different GPU, so busbw is close to the ring's."""
    topo = spec_topology(64)
    group, nbytes = tuple(range(64)), 2**30
    tree = time_collective(topo, "all_reduce", "tree", group, nbytes)
    ring = time_collective(topo, "all_reduce", "ring", group, nbytes)
    assert tree < 1.2 * ring


# --- hierarchical all-reduce ---------------------------------------------------------

def hier_phases(topo, group, nbytes):
    domains = tuple(int(d) for d in topo.domains[list(group)])
    return collectives.schedule("all_reduce", "hierarchical", group, nbytes, domains).phases


def test_partial_domains_keep_every_member_and_every_nic_busy():
    """12 GPUs on dgx-h100: a full server of 8 and a partial one of 4."""
    topo, group = spec_topology(16, nic_gbps=50), tuple(range(12))
    domains = tuple(int(d) for d in topo.domains[list(group)])
    rs, across, ag = collectives.schedule("all_reduce", "hierarchical", group, B, domains).phases
    assert set(across.src.tolist()) == set(group)  # every GPU's shard crosses (none dropped)
    for a, b in zip(across.src.tolist(), across.dst.tolist()):
        assert (a < 8) != (b < 8)  # the across rings only cross domains
    # 8 rings of two, one per shard of B/8: each ring's chain carries 2 x (1/2) x B/8
    assert across.nbytes.sum() == pytest.approx(8 * B / 8, rel=1e-12)
    (ring_phase,) = collectives.schedule("all_reduce", "ring", group, B, domains).phases
    leaving = {a for a, b in zip(ring_phase.src.tolist(), ring_phase.dst.tolist()) if a < 8 <= b}
    assert leaving == set(range(8))  # eight channels leave the full server through eight NICs


def test_hierarchical_is_the_sum_of_its_three_phases():
    topo, group = spec_topology(32, nic_gbps=5), tuple(range(32))  # 4 domains of 8
    phases = hier_phases(topo, group, B)
    assert len(phases) == 3
    alone = sum(time_phase(topo, ph) for ph in phases)
    assert time_collective(topo, "all_reduce", "hierarchical", group, B) == pytest.approx(alone, rel=1e-9)


def test_hierarchical_phases_match_their_closed_forms():
    k, m = 8, 4  # GPUs per domain, domains
    topo = spec_topology(k * m, nic_gbps=5)
    w_nic = min(H100.pcie_bw * EFF["pcie"], 5e9 * EFF["ib"])
    times = [time_phase(topo, ph) for ph in hier_phases(topo, tuple(range(k * m)), B)]
    inside = B * (k - 1) / (nvlink_w(H100) * k) + (k - 1) * NV_STEP
    across = 2 * (B / k) * (m - 1) / (w_nic * m) + 2 * (m - 1) * NIC_STEP
    assert times == pytest.approx([inside, across, inside], rel=CLOSE)


@pytest.mark.parametrize("fields", [{"nic_gbps": 5}, {"nodes_per_su": 1, "oversubscription": 8}])
def test_hierarchical_beats_flat_ring_when_inter_domain_links_bottleneck(fields):
    topo, group = spec_topology(16, **fields), tuple(range(16))
    hier = time_collective(topo, "all_reduce", "hierarchical", group, B)
    flat = time_collective(topo, "all_reduce", "ring", group, B)
    assert hier < 0.7 * flat


def test_simulating_one_member_equals_simulating_all(preset_topology):
    topo, group = preset_topology("dgx-a100", 64), tuple(range(64))
    for op in ("all_reduce", "all_gather"):
        assert time_collective(topo, op, "ring", group, 2**24) == \
            time_collective(topo, op, "ring", group, 2**24, simulate_all=True)


# --- against reality -----------------------------------------------------------------

MEASURED = Path(__file__).resolve().parent.parent / "sim" / "data" / "collectives_measured.csv"


def measured_rows():
    return list(csv.DictReader(MEASURED.open()))


def measured_group(row):
    """The row's topology and the ranks nccl-tests ran on: the first num_gpus GPUs when they
    fill ``nodes`` NVLink domains (send_recv: first and last of them), else num_gpus / nodes
    GPUs at the head of each of ``nodes`` domains (hosts in distinct NVLink domains)."""
    from sim.studies.nccl_tests import build_topology, group_of

    n, nodes = int(row["num_gpus"]), int(row["nodes"])
    topo = build_topology(row["topology"], n, row["gpu"])
    if len(set(topo.domains[:n].tolist())) >= nodes:
        return topo, group_of(row["op"], n)
    domain = int(np.count_nonzero(topo.domains == topo.domains[0]))
    topo = build_topology(row["topology"], nodes * domain, row["gpu"])
    return topo, tuple(d * domain + i for d in range(nodes) for i in range(n // nodes))


@pytest.mark.parametrize("row", measured_rows(), ids=lambda r: f"{r['gpu']}-{r['num_gpus']}-{r['op']}-"
                                                               f"{r['algorithm']}-{r['message_bytes']}")
def test_every_measured_row_within_10_percent(preset_topology, row):
    """Each row of sim/data/collectives_measured.csv, simulated as nccl-tests runs it
    (the row's topology, GPU, group of num_gpus GPUs spread evenly over ``nodes`` NVLink
    domains, size, algorithm), gives the published bus bandwidth within 10%."""
    from sim.studies.nccl_tests import algorithm

    size = int(row["message_bytes"])
    topo, group = measured_group(row)
    algo = algorithm(topo, row["op"], row["algorithm"], None, group, size)
    t = time_collective(topo, row["op"], algo, group, size)
    busbw = size / t / 1e9 * bus_factor(row["op"], len(group))
    assert busbw == pytest.approx(float(row["busbw_GBps"]), rel=0.10)
    assert topo.domains[group[0]] != topo.domains[group[-1]] or int(row["nodes"]) == 1


# --- schedule entry point ------------------------------------------------------------

def test_unknown_op_or_algorithm_is_an_input_error():
    from sim.errors import InputError

    with pytest.raises(InputError, match="--op"):
        collectives.schedule("all_sum", "ring", (0, 1), 8.0, (0, 0))
    with pytest.raises(InputError, match="--algo"):
        collectives.schedule("all_gather", "tree", (0, 1), 8.0, (0, 0))


def test_auto_is_direct_for_exchanges_and_the_tuner_otherwise():
    """(What the tuner picks in the published cases: tests/test_tuner.py.)"""
    assert collectives.pick_algorithm("all_to_all", (0, 1), 1024, (0, 0)) == "direct"
    assert collectives.pick_algorithm("all_reduce", (0, 1, 8, 9), 2**30, (0, 0, 1, 1)) in ("ring", "tree")
