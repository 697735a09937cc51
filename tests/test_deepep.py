"""DeepEP's deduplicated all-to-all (``parallel.ep_dispatcher = "deepep"``, sim/collectives/direct.py).

Closed forms: a token's top-k experts drawn uniformly without replacement hit a set of m of
E experts with chance 1 - C(E-m, k)/C(E, k); a member sends, to each other member of its
NVLink domain, nodes x T x rank_hit (its own tokens and those it relays), and to its peer in
each other domain T x node_hit, T one rank's tokens once (tokens x hidden x 2 bytes).
The Qwen3-235B layout scaled down (ep 32 over tp 2 x dp 16 on 4 DGX H100, tests/test_moe_folding.py)
checks the builder, the simulator and the planner against them. Across nodes the exchange runs at
DeepEP's measured RDMA rate (docs/legacy.md's EP 32 row, read as logical bytes), not NCCL's.

Run: ``python -m pytest tests/test_deepep.py``
"""

from math import comb

import numpy as np
import pytest

from conftest import assert_input_error, clustersim, host_wait_share
from sim.collectives import schedule
from sim.collectives.direct import Dedup, dedup_wire, hit
from sim.hardware.specs import load_spec
from sim.input.load import scenario_from_dict
from sim.plan.comm import P2P_LATENCY_S, Comm
from sim.step import simulate

MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 1024, "mlp": "swiglu",
       "ffn_hidden": 2048, "moe": {"experts": 128, "top_k": 8, "routing": "uniform", "expert_ffn_hidden": 512}}
SEQ = 1024


def run(seq=SEQ, **parallel):
    return simulate(scenario_from_dict({
        "model": MOE, "training": {"seq_len": seq, "global_batch": 16},
        "cluster": {"topology": "dgx-h100", "gpus": 32},
        "parallel": {"tp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True, **parallel}}))


def test_hit_is_the_hypergeometric_complement():
    assert hit(128, 8, 4) == pytest.approx(1 - comb(124, 8) / comb(128, 8), rel=1e-15)
    assert hit(128, 8, 4) == pytest.approx(0.22998031496, rel=1e-9)  # Qwen3-235B on ep 32: 4 experts a rank
    assert hit(128, 8, 32) == pytest.approx(0.90725273111, rel=1e-9)  # ... 32 a node
    assert hit(64, 1, 8) == pytest.approx(8 / 64, rel=1e-15) and hit(128, 8, 128) == 1.0


def test_schedule_sends_each_token_once_per_rank_and_once_per_node():
    dedup = Dedup(0.25, 0.75)
    nbytes, domains = 1000.0, (0,) * 8 + (1,) * 8 + (2,) * 8
    (phase,) = schedule("all_to_all", "direct", tuple(range(24)), nbytes, domains, dedup).phases
    sent = {(int(s), int(d)): float(b) for s, d, b in zip(phase.src, phase.dst, phase.nbytes)}
    assert len(sent) == 24 * (7 + 2)  # 7 peers in the domain, 1 peer in each of the 2 others
    assert sent[(3, 5)] == pytest.approx(3 * nbytes * 0.25)  # own tokens + those relayed from 2 domains
    assert sent[(3, 11)] == sent[(3, 19)] == pytest.approx(nbytes * 0.75)  # the same position there
    assert (3, 12) not in sent  # no direct sends to another position of another domain
    with pytest.raises(ValueError, match="same number of members"):
        schedule("all_to_all", "direct", tuple(range(12)), nbytes, (0,) * 8 + (1,) * 4, dedup)


# tokens per sequence long enough that the host as modelled (sim/model/host.py, STEP_PYTHON_S per
# launch) issues ahead of the GPU: at SEQ both dispatchers' steps are the host's
GPU_BOUND_SEQ = 16384


def test_simulated_bytes_and_time_against_the_alltoall_dispatcher():
    deepep, alltoall = run(GPU_BOUND_SEQ, ep_dispatcher="deepep"), run(GPU_BOUND_SEQ)
    assert host_wait_share(deepep) < 0.05 and host_wait_share(alltoall) < 0.05  # (not host-bound)
    h, k, tp, E = MOE["hidden"], MOE["moe"]["top_k"], 2, MOE["moe"]["experts"]
    tokens = GPU_BOUND_SEQ / tp * h * 2  # one rank's sequence-parallel shard, once
    per_call = 7 * 4 * tokens * hit(E, k, 4) + 3 * tokens * hit(E, k, 32)
    a2a = deepep.spans[deepep.spans.name.str.startswith("a2a_")]
    assert len(a2a) and np.allclose(a2a.bytes, per_call, rtol=1e-12)
    plain = alltoall.spans[alltoall.spans.name.str.startswith("a2a_")]
    assert np.allclose(plain.bytes, tokens * k * 31 / 32, rtol=1e-12)
    counts = 8 * E * 31  # each forward's all-gather of the per-expert counts (both dispatchers)
    assert deepep.summary["comm_bytes_per_gpu"]["ep"] == pytest.approx(MOE["layers"] * (4 * per_call + counts), rel=1e-9)
    assert deepep.summary["step_time_s"] < alltoall.summary["step_time_s"]


# DeepEP's measured internode rate (deepseek-ai/DeepEP docs/legacy.md, normal kernels, EP 32 on H800 +
# CX7): 58 GB/s of *logical* RDMA bytes, each token counted once per node it goes to, its own included
# (tests/test_internode.py ``num_rdma_token_sent``)
README_EP32_LOGICAL_RDMA = 58e9


def test_internode_exchange_runs_at_deepeps_measured_logical_rdma_rate():
    """The simulated all-to-all over 4 nodes lasts the README's logical bytes (4 nodes x T x node_hit,
    own node included) over 58 GB/s, to the links' latencies; NCCL's 0.95 x 50 GB/s per NIC would
    give the remote bytes (3 x T x node_hit) over 47.5 GB/s, 8% less."""
    deepep = run(GPU_BOUND_SEQ, ep_dispatcher="deepep")
    assert host_wait_share(deepep) < 0.05
    tokens = GPU_BOUND_SEQ / 2 * MOE["hidden"] * 2
    logical = 4 * tokens * hit(MOE["moe"]["experts"], MOE["moe"]["top_k"], 32)
    a2a = deepep.spans[deepep.spans.name.str.startswith("a2a_")]
    assert np.allclose(a2a.end_s - a2a.start_s, logical / README_EP32_LOGICAL_RDMA, rtol=0, atol=5e-6)
    assert dedup_wire((0, 0, 1)) > 1.0 and dedup_wire((0,) * 8) == 1.0  # inside one node: the fabric's rates


@pytest.mark.parametrize("rank_hit, node_hit", [(0.25, 0.75), (1.0, 0.01)])  # NIC-bound, NVLink-bound
def test_planner_prices_the_same_sends(rank_hit, node_hit):
    comm = Comm(load_spec("dgx-h100"), "h100-sxm")
    nbytes, domains = 8e6, (0,) * 8 + (1,) * 8 + (2,) * 8 + (3,) * 8
    inside, outside = 7 * 4 * nbytes * rank_hit / comm.fabric.nvlink_w, 3 * nbytes * node_hit / comm.fabric.nic_w
    got = comm.all_to_all(nbytes, domains, Dedup(rank_hit, node_hit))
    assert got == pytest.approx(P2P_LATENCY_S + max(inside, outside) * dedup_wire(domains), rel=1e-12)
    one_node = (0,) * 8  # inside one NVLink domain: no stretch
    inside = 7 * nbytes * rank_hit / comm.fabric.nvlink_w
    assert comm.all_to_all(nbytes, one_node, Dedup(rank_hit, 1.0)) == pytest.approx(P2P_LATENCY_S + inside, rel=1e-12)


@pytest.mark.parametrize("overrides", [
    ["parallel.ep_dispatcher=nccl"],
    ["parallel.ep_dispatcher=deepep", "model.moe.routing=token_choice"],
    ["parallel.ep_dispatcher=deepep", "parallel.ep=1"],
    ["parallel.ep_dispatcher=deepep", "parallel.tp=2", "parallel.dp=8", "parallel.ep=8", "parallel.sequence_parallel=true"],
])
def test_bad_dispatcher_settings_exit_2(overrides):
    args = [a for o in overrides for a in ("--set", o)]
    assert_input_error(clustersim("run", "scenarios/mixtral-small-ep-h100.toml", *args), "parallel.ep_dispatcher")
