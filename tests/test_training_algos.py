"""Training steps run the new algorithms through ``parallel.dp_algo`` (or ``auto``), and a
cluster that cannot run the one asked for is an input error naming the key.

Run ``python -m pytest -q tests/test_training_algos.py``.
"""

import pytest

from conftest import assert_input_error, clustersim
from sim.input.load import scenario_from_dict
from sim.step import simulate

MODEL = {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000}


def run(gpus=16, topology="dgx-h100", overrides=None, **parallel):
    cluster = {"topology": topology, "gpus": gpus, **({"topology_overrides": overrides} if overrides else {})}
    return simulate(scenario_from_dict({"model": MODEL, "training": {"seq_len": 1024, "global_batch": gpus},
                                        "cluster": cluster, "parallel": {"dp": gpus, **parallel}}))


def dp_calls(result):
    spans = result.spans
    return spans[(spans["category"] == "dp") & (spans["rank"] == 0)]


def test_auto_on_two_h100_nodes_runs_what_dp_algo_nvls_tree_runs():
    """DDP buckets on 2 DGX H100 nodes: NCCL's tuner picks NVLS_TREE (nccl-tests issue 196)."""
    auto, pinned, ring = run(), run(dp_algo="nvls_tree"), run(dp_algo="ring")
    assert auto.summary == {**pinned.summary, "sim_wall_s": auto.summary["sim_wall_s"]}
    assert auto.summary["step_time_s"] != ring.summary["step_time_s"]
    # NVLS_TREE: each GPU sends its buffer to the switch plus its shard; a ring 2B(N-1)/N
    assert dp_calls(pinned)["bytes"].sum() < dp_calls(ring)["bytes"].sum()


def test_collnet_on_a_sharp_fabric_halves_the_nic_traffic_of_one_gpu_per_node():
    """TP 8 inside each node leaves one GPU per node in each DP group: SHARP sends B per NIC
    where a ring sends 2B(N-1)/N, so the DP all-reduces end sooner."""
    sharp = {"sharp": True}
    ring = run(gpus=32, overrides=sharp, tp=8, dp=4, dp_algo="ring")
    collnet = run(gpus=32, overrides=sharp, tp=8, dp=4, dp_algo="collnet")
    spent = {name: (r := dp_calls(res)).end_s.max() - r.start_s.min() for name, res in
             (("ring", ring), ("collnet", collnet))}
    assert spent["collnet"] < spent["ring"]


def test_pat_runs_fsdp_groups_of_one_gpu_per_node():
    pat = run(gpus=32, tp=8, dp=4, zero=3, dp_algo="pat")
    ring = run(gpus=32, tp=8, dp=4, zero=3, dp_algo="ring")
    assert dp_calls(pat)["bytes"].sum() == pytest.approx(dp_calls(ring)["bytes"].sum(), rel=1e-12)


SCENARIO = "scenarios/llama3-8b-fsdp-h100.toml"  # FSDP over 8 DGX H100 nodes


@pytest.mark.parametrize("sets,says", [
    (["parallel.dp_algo=nvls", "cluster.topology=dgx-a100", "cluster.gpu=a100-80gb"], "NVSwitches that reduce"),
    (["parallel.dp_algo=nvls"], "SHARP"),  # across nodes without SHARP
    (["parallel.dp_algo=pat"], "one GPU per node"),  # FSDP groups hold 8 GPUs per node
    (["parallel.dp_algo=collnet"], "SHARP"),
    (["parallel.dp_algo=nvls_tree"], "only all-reduce"),  # FSDP reduce-scatters
    (["parallel.dp_algo=pat", "parallel.zero=0"], "all-gather and reduce-scatter"),
])
def test_an_algorithm_the_cluster_cannot_run_exits_2_naming_dp_algo(sets, says):
    out = clustersim("run", SCENARIO, *[x for s in sets for x in ("--set", s)])
    assert_input_error(out, "parallel.dp_algo")
    assert says in out.stderr
