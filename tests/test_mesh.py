"""AMD Instinct nodes: 8 GPUs fully meshed by xGMI links, no switch (topology amd-xgmi).

Closed forms from the datasheets (MI300X: 7 links of 64 GB/s per direction) and the usable
share of a link (45.5 of 64 GB/s, fitted to the measurements of the ROCm blog "Understanding RCCL Bandwidth and xGMI Performance
on AMD Instinct MI300X"): a ring channel is one link per hop, so RCCL-style rings reach the
sum of the links only when the channels take different links; an all-to-all sends each
peer's bytes over that peer's own link.

Run: ``python -m pytest tests/test_mesh.py``
"""

import itertools

import pytest

from conftest import assert_input_error, clustersim
from sim.collectives import ring
from sim.hardware import specs, topology
from sim.hardware.gpus import gpu_preset
from sim.studies import nccl_tests

LINK = 45.5e9  # usable bytes/s per direction of one MI300X xGMI link (the blog's 45-48, fitted)
GIB = 2**30


def arcs_of(walks, closed: bool) -> list[tuple[int, int]]:
    return [a for w in walks for a in zip(w, w[1:] + ((w[0],) if closed else ()))]


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8])
def test_mesh_rings_use_every_directed_link_once(n):
    rings = ring.mesh_rings(n)
    assert all(sorted(r) == list(range(n)) for r in rings)  # Hamiltonian
    arcs = arcs_of(rings, closed=True)
    assert len(rings) == n - 1 and sorted(arcs) == sorted(itertools.permutations(range(n), 2))


def test_mesh_rings_where_no_decomposition_exists():
    """K*_4 and K*_6 have no Hamiltonian decomposition (Tillson 1980): the most disjoint rings."""
    for n, most in ((4, 2), (6, 4)):
        rings = ring.mesh_rings(n)
        arcs = arcs_of(rings, closed=True)
        assert len(rings) == most and len(set(arcs)) == len(arcs)


def test_mesh_paths_start_at_each_member_and_cover_every_link():
    paths = ring.mesh_paths(8)
    assert [p[0] for p in paths] == list(range(8)) and sorted(p[-1] for p in paths) == list(range(8))
    assert sorted(arcs_of(paths, closed=False)) == sorted(itertools.permutations(range(8), 2))


def test_kept_decompositions_are_what_the_search_finds():
    assert ring._search(8, True) == ring._MESH_RINGS[8]
    assert ring._search(8, False) == ring._MESH_PATHS[8]


def topo(gpus: int = 8, gpu: str = "mi300x"):
    return nccl_tests.build_topology("amd-xgmi", gpus, gpu)


def test_peer_route_is_its_own_link():
    t = topo()
    for b in range(1, 8):
        r = t.route(0, b)
        assert len(r.links) == 1 and t.link_ends[r.links[0]] == (("gpu", 0), ("gpu", b))
        assert t.caps[r.links[0]] == pytest.approx(LINK)


@pytest.mark.parametrize("op, passes", [("all_reduce", 2), ("all_gather", 1), ("reduce_scatter", 1)])
def test_ring_over_eight_meshed_gpus_closed_form(op, passes):
    """T = passes * B (N-1)/N / ((N-1) * w_link): the 7 channels share no link."""
    t = nccl_tests.time_collective(topo(), op, "ring", tuple(range(8)), GIB)
    bandwidth_time = passes * GIB * 7 / 8 / (7 * LINK)
    assert t == pytest.approx(bandwidth_time, rel=2e-3)  # (+ 7 or 14 steps of 0.5 us)
    assert t > bandwidth_time


def test_all_to_all_sends_each_peers_bytes_over_its_own_link():
    """Each of 8 ranks holds S; S/8 to each peer, all 7 links at once: T = (S/8) / w_link."""
    t = nccl_tests.time_collective(topo(), "all_to_all", "direct", tuple(range(8)), GIB)
    assert t == pytest.approx(GIB / 8 / LINK, rel=1e-3)


def test_ring_across_meshed_nodes_gives_each_channel_one_link_and_one_nic():
    """16 GPUs on 2 nodes: 8 channels, each crossing a node on its own Hamiltonian path (no
    xGMI link carries two) and leaving through its own NIC (47.5 GB/s usable of 50): each
    channel runs at the slower of one link and one NIC."""
    t = topo(16)
    nic = gpu_preset("mi300x").nic_bw * 0.95
    time = nccl_tests.time_collective(t, "all_reduce", "ring", tuple(range(16)), 4 * GIB)
    per_channel = 2 * 4 * GIB * 15 / 16 / 8
    assert time == pytest.approx(per_channel / min(nic, LINK), rel=0.01)


def test_tree_in_one_meshed_node_matches_the_ring_closed_form():
    """NCCL's tree in one node is channel c's chain along the in-node path its search found
    (connect.cc ``treeIntra``): on the mesh the 8 chains follow the 8 Hamiltonian paths, so
    each directed link carries 2 chains x B/16 = B/8 up and B/8 down:
    T = 2 (B/8) / w_link = 2B/(N w_link), the ring's time (before: the rotated chains all
    queued on the links i+1 -> i, about 7x slower)."""
    from sim import collectives
    t = topo()
    sched = collectives.schedule("all_reduce", "tree", tuple(range(8)), GIB, (0,) * 8, fabric=t.fabric)
    for phase in sched.phases:
        per_link = {}
        for s, d, c in zip(phase.src, phase.dst, phase.chain):
            per_link[(s, d)] = per_link.get((s, d), 0.0) + phase.nbytes[c]
        assert len(per_link) == 56 and max(per_link.values()) == pytest.approx(GIB / 8)
    time = nccl_tests.time_collective(t, "all_reduce", "tree", tuple(range(8)), GIB)
    assert time == pytest.approx(2 * GIB / (8 * LINK), rel=2e-3) and time > 2 * GIB / (8 * LINK)


def test_tree_across_meshed_nodes_chains_on_disjoint_links():
    """16 GPUs on 2 nodes: channel c's chain crosses each node on path c, so no xGMI link
    carries more than its 2 chains (the two trees of one channel); the arrays and the lists
    build the same hops."""
    from sim.collectives import tree
    members = [list(range(8)), list(range(8, 16))]
    for phase in tree.all_reduce_lists(members, GIB, mesh=True):
        hops = [(s, d) for s, d in zip(phase.src, phase.dst) if s // 8 == d // 8]
        assert max(hops.count(h) for h in set(hops)) == 2 and len(set(hops)) == 2 * 56
    import numpy as np
    lists = tree.all_reduce_lists(members, GIB, mesh=True)
    arrays = tree.all_reduce_arrays(np.array(members), GIB, mesh=True)
    for a, b in zip(lists, arrays):
        assert (a.src == b.src).all() and (a.dst == b.dst).all() and (a.chain == b.chain).all()


def test_mesh_cli_busbw_and_wrong_vendor_exits_2():
    proc = clustersim("collective", "--op", "all_reduce", "--algo", "ring", "--gpus", "8", "--topology",
                      "amd-xgmi", "--gpu", "mi300x", "--sizes", "1G", "--json")
    assert proc.returncode == 0, proc.stderr
    import json

    row = json.loads(proc.stdout)[0]
    assert row["busbw_GBps"] == pytest.approx(7 * LINK / 1e9, rel=3e-3)
    assert_input_error(clustersim("collective", "--op", "all_reduce", "--gpus", "8", "--topology", "amd-xgmi",
                                  "--gpu", "h100-sxm"), "--gpu")
    assert_input_error(clustersim("collective", "--op", "all_reduce", "--gpus", "8", "--topology", "dgx-b200",
                                  "--gpu", "mi355x"), "--gpu")


def test_scenario_with_amd_gpu_on_nvswitch_topology_exits_2(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[cluster]\ntopology = "dgx-h100"\ngpu = "mi325x"\ngpus = 8\n'
                    '[parallel]\ndp = 8\n[training]\nglobal_batch = 8\nseq_len = 2048\n')
    assert_input_error(clustersim("run", str(path)), "cluster.gpu")
    assert_input_error(clustersim("run", str(path), "--set", "cluster.topology=amd-xgmi",
                                  "--set", "cluster.gpu=b200"), "cluster.gpu")


def test_mesh_spec_rules():
    spec = specs.load_spec("amd-xgmi")
    assert spec.builder == "xgmi_mesh" and not spec.nvls and spec.gpus_per_node == 8
    g = topology.fat_tree(16, spec, gpu_preset("mi355x"))
    xgmi = [d for _, _, d in g.edges(data=True) if d["kind"] == "xgmi"]
    assert len(xgmi) == 2 * 28 and all(d["bw"] == pytest.approx(76.8e9) for d in xgmi)  # 153.6 GB/s bidir
    assert not any(d["kind"] == "nvswitch" for _, d in g.nodes(data=True))


def test_plan_runs_on_mi355x_meshed_nodes():
    """A CI-sized search on amd-xgmi: every reported layout simulated or estimated, sorted, and
    fitting the MI355X's 288 GB."""
    import json

    proc = clustersim("plan", "llama3.1-8b", "--gpus", "8", "--topology", "amd-xgmi", "--gpu", "mi355x",
                      "--seq-len", "4096", "--global-batch-tokens", "65536", "--top", "3", "--budget", "5",
                      "--workers", "1", "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    layouts = json.loads(proc.stdout)["layouts"]
    assert len(layouts) == 3 and layouts[0]["simulated"]
    assert all(x["fits_in_memory"] and x["memory_per_gpu_bytes"] <= 288e9 for x in layouts)
    assert [x["step_time_s"] for x in layouts] == sorted(x["step_time_s"] for x in layouts)
    assert_input_error(clustersim("plan", "llama3.1-8b", "--gpus", "8", "--topology", "dgx-h100", "--gpu", "mi355x",
                                  "--seq-len", "4096", "--global-batch-tokens", "65536", "--budget", "0"), "--gpu")
