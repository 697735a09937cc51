"""Jobs sharing one fabric: placement, relabelled programs in one engine, exact sharing.

Run ``python -m pytest -q tests/test_shared_fabric.py``.
"""

import json

import pytest

from conftest import assert_input_error, clustersim, spec_topology
from sim.collectives.kinds import ALL_REDUCE
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.errors import InputError
from sim.fabric import placement
from sim.fabric.shared import relabel
from sim.hardware.gpus import FABRIC_EFFICIENCY as EFF, LINK_LATENCY as LAT, gpu_preset
from sim.outputs.result import spans_frame

H100 = gpu_preset("h100-sxm")
B = 1e9


# --- placement -------------------------------------------------------------------------

def test_packed_spread_and_explicit_placements():
    assert placement.node_lists("packed", [2, 3], 5) == [[0, 1], [2, 3, 4]]
    assert placement.node_lists("spread", [2, 3], 5) == [[0, 2], [1, 3, 4]]
    assert placement.node_lists("nodes:4,0/1-3", [2, 3], 6) == [[4, 0], [1, 2, 3]]
    assert placement.gpu_map([2, 0], 4) == [8, 9, 10, 11, 0, 1, 2, 3]


@pytest.mark.parametrize("spec,needs,nodes,says", [
    ("nodes:0-2/2-3", [3, 2], 6, "overlap"),
    ("nodes:0-1/8-9", [2, 2], 4, "outside the cluster"),
    ("nodes:0-1/2", [2, 2], 4, "needs 2 nodes"),
    ("nodes:0-1", [2, 2], 4, "there are 2"),
    ("nodes:a-b/2-3", [2, 2], 4, "expected node numbers"),
    ("packed", [3, 3], 4, "need 6 nodes"),
    ("tight", [1, 1], 2, "expected packed, spread"),
])
def test_bad_placements_name_the_key(spec, needs, nodes, says):
    with pytest.raises(InputError, match=says) as err:
        placement.node_lists(spec, needs, nodes)
    assert err.value.key == "--placement"


# --- two jobs on one oversubscribed spine: exact max-min shares ------------------------

def one_all_reduce(job_ranks=(0, 1), nbytes=B):
    call = Collective(("ar",), ALL_REDUCE, job_ranks, nbytes, "ring")
    return [RankProgram(r, [Op("ar", "dp", "dp", comm=call)]) for r in job_ranks]


def test_two_jobs_on_one_oversubscribed_spine_each_get_half():
    """Four one-GPU nodes, two per leaf, one spine, 4:1: a leaf's uplink is 2 x 50 / 4 GB/s.
    Job A on nodes 0 and 2 and job B on nodes 1 and 3 both cross it: a two-rank ring
    all-reduce moves B each way per hop, alone at the uplink's rate, shared at half."""
    topo = spec_topology(4, gpus_per_domain=1, gpus_per_node=1, nodes_per_su=2, spines=1, oversubscription=4)
    uplink = 2 * H100.nic_bw / 4 * EFF["ib"]
    latency = 2 * (2 * LAT["pcie"] + 4 * LAT["ib"])  # two ring steps through the spine
    a = [relabel(p, [0, 2], 0) for p in one_all_reduce()]
    b = [relabel(p, [1, 3], 1) for p in one_all_reduce()]
    alone = Engine(topo, a)
    alone.run()
    assert alone.env.now == pytest.approx(latency + B / uplink, rel=1e-12)
    both = Engine(topo, a + b)
    both.run()
    ends = spans_frame(both).groupby("rank").end_s.max()
    assert ends.to_dict() == pytest.approx({g: latency + 2 * B / uplink for g in range(4)}, rel=1e-12)


def test_relabelled_calls_of_two_jobs_never_meet():
    a = relabel(one_all_reduce()[0], [0, 2], 0)
    b = relabel(one_all_reduce()[0], [1, 3], 1)
    assert a.rank == 0 and b.rank == 1
    assert a.ops[0].comm.group == (0, 2) and b.ops[0].comm.group == (1, 3)
    assert a.ops[0].comm.key != b.ops[0].comm.key


# --- through the command line ----------------------------------------------------------

SCENARIO = """
name = "{name}"
[model]
layers = 4
hidden = 1024
heads = 8
vocab = 32000
[training]
seq_len = 1024
global_batch = {batch}
[cluster]
topology = "{topology}"
nodes = {nodes}
[parallel]
dp = {dp}
"""
TOPOLOGY = """
gpu = "h100-sxm"
gpus_per_domain = 8
gpus_per_node = 8
nodes_per_su = 2
spines = 1
oversubscription = 8.0
"""


@pytest.fixture
def files(tmp_path):
    topo = tmp_path / "thin.toml"
    topo.write_text(TOPOLOGY)

    def scenario(name, nodes=2, topology=str(topo)):
        path = tmp_path / f"{name}.toml"
        path.write_text(SCENARIO.format(name=name, nodes=nodes, dp=8 * nodes, batch=16 * nodes, topology=topology))
        return str(path)
    return scenario


def test_spread_jobs_slow_each_other_packed_jobs_do_not(files):
    a, b = files("a"), files("b")
    runs = {}
    for spec in ("packed", "spread"):
        out = clustersim("run", a, b, "--shared-fabric", "--placement", spec, "--json")
        assert out.returncode == 0, out.stderr
        runs[spec] = json.loads(out.stdout)
    packed, spread = runs["packed"], runs["spread"]
    assert [j["nodes"] for j in spread["jobs"]] == [[0, 2], [1, 3]]
    assert all(j["slowdown"] == pytest.approx(1.0, abs=1e-12) for j in packed["jobs"])  # one leaf each
    assert all(j["slowdown"] > 1.05 for j in spread["jobs"])  # both cross the 8:1 spine
    for job in spread["jobs"]:
        assert job["summary"]["step_time_s"] == pytest.approx(job["alone_step_time_s"] * job["slowdown"])
        assert set(job["summary"]) >= {"step_time_s", "mfu", "exposed_comm_s", "comm_bytes_per_gpu"}


@pytest.mark.parametrize("extra,key", [
    ((), "--shared-fabric"),  # two scenarios without it
    (("--shared-fabric", "--placement", "nodes:0-1/1-2"), "--placement"),
    (("--shared-fabric", "--placement", "nodes:0-1/4-5"), "--placement"),
    (("--shared-fabric", "--trace", "t.json"), "--trace"),
])
def test_bad_shared_runs_exit_2(files, extra, key):
    assert_input_error(clustersim("run", files("a"), files("b"), *extra), key)


def test_jobs_must_share_one_cluster(files):
    out = clustersim("run", files("a"), files("b", topology="dgx-h100"), "--shared-fabric")
    assert_input_error(out, "cluster")


def with_fault(path: str, gpu_nic: int = 0, factor: float = 0.001) -> str:
    text = open(path).read() + f"\n[[cluster.faults]]\ngpu_nic = {gpu_nic}\nfactor = {factor}\n"
    open(path, "w").write(text)
    return path


@pytest.mark.parametrize("order", ["faulty first", "faulty second"])
def test_each_job_keeps_its_own_fault_in_either_order(files, order):
    """issue 30: faults came from the first scenario only, indexed by cluster GPU: job A with a
    NIC at 0.1% on nodes 2-3 reported a clean step and the clean job B took A's fault."""
    faulty, clean = with_fault(files("a")), files("b")
    alone = json.loads(clustersim("run", faulty, "--json").stdout)["step_time_s"]
    clean_alone = json.loads(clustersim("run", clean, "--json").stdout)["step_time_s"]
    first, second = (faulty, clean) if order == "faulty first" else (clean, faulty)
    out = clustersim("run", first, second, "--shared-fabric", "--placement", "nodes:2-3/0-1" if order ==
                     "faulty first" else "nodes:0-1/2-3", "--cluster-nodes", "4", "--json")
    assert out.returncode == 0, out.stderr
    jobs = {j["name"]: j for j in json.loads(out.stdout)["jobs"]}
    assert jobs["a"]["alone_step_time_s"] == pytest.approx(alone, rel=1e-9)  # its own fault, on its own GPUs
    assert jobs["b"]["alone_step_time_s"] == pytest.approx(clean_alone, rel=1e-9)  # none of A's
    assert jobs["a"]["summary"]["straggler_cost_s"] > 0.5 * alone  # a NIC at 0.1% is most of the step
    assert "straggler_cost_s" not in jobs["b"]["summary"]


def test_an_rl_scenario_is_refused_on_a_shared_fabric(files):
    out = clustersim("run", files("a"), "scenarios/rl-llama3-8b-h100.toml", "--shared-fabric")
    assert_input_error(out, "rl")


@pytest.mark.parametrize("extra, key", [
    (("--cluster-nodes", "1000000000"), "--cluster-nodes"),  # issue 30: hung
    (("--placement", "nodes:0-1/2-99999999999"), "--placement"),  # issue 30: an instant MemoryError
])
def test_shared_fabric_bounds_exit_2(files, extra, key):
    assert_input_error(clustersim("run", files("a"), files("b"), "--shared-fabric", *extra), key)


def test_shared_fabric_jobs_past_the_work_budget_are_refused():
    """issue 30: two 16k-GPU jobs ran 240 s to a MemoryError: every rank is simulated there."""
    big = "scenarios/llama3-405b-16k-h100.toml"
    out = clustersim("run", big, big, "--shared-fabric")
    assert_input_error(out, "cluster.gpus")
    assert "--force" in out.stderr
