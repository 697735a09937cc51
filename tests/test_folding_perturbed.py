"""Folding under perturbations is exact: with a straggler, a thermal straggler, a slow
node, a degraded or failed NIC, a degraded spine or skewed experts, simulating one rank
per class (sim/parallel/folding.py) gives the same step, the same timeline for every
rank (each rank's is its representative's) and the same bytes on every link that
carries traffic between NVLink domains as simulating every rank (``parallel.fold = false``).

Run: ``python -m pytest tests/test_folding_perturbed.py``
"""

import numpy as np
import pytest

from conftest import zero_host

from test_folding import flat, same
from sim.input.load import scenario_from_dict
from sim.parallel.step_end import STEP_SYNCS
from sim.step import simulate

SMALL = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "vocab": 32000, "mlp": "swiglu",
         "ffn_hidden": 2816}
MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 1024, "mlp": "swiglu", "ffn_hidden": 3584,
       "moe": {"experts": 8, "top_k": 2, "routing": "token_choice", "skew": 0.5}}
# 32 GPUs on 4 servers in 2 scalable units, so data-parallel and pipeline traffic crosses
# NICs, leaves and spines
CLUSTER = {"topology": "dgx-h100", "gpus": 32, "topology_overrides": {"nodes_per_su": 2}}
PTD = {"tp": 2, "pp": 2, "dp": 8, "zero": 1, "sequence_parallel": True}
TRAIN = {"seq_len": 1024, "global_batch": 32, "grad_bucket_mb": 8}

CASES = {
    "straggler": {"stragglers": [{"ranks": [5], "slowdown": 1.3}]},
    "thermal": {"stragglers": [{"ranks": [21], "slowdown": 1.5, "start_s": 0.02}]},
    "node": {"stragglers": [{"nodes": [1], "slowdown": 1.2}]},
    "two-entries": {"stragglers": [{"ranks": [3], "slowdown": 1.2}, {"nodes": [0], "slowdown": 1.1}]},
    "degraded-nic": {"cluster": {**CLUSTER, "faults": [{"gpu_nic": 9, "factor": 0.25}]}},
    # a failed NIC reroutes through its server's other leaves: its scalable unit (2
    # servers here) splits off, so this case needs 4 units to fold at all
    "failed-nic": {"cluster": {**CLUSTER, "gpus": 64, "faults": [{"gpu_nic": 9, "factor": 0.0}]},
                   "parallel": {**PTD, "dp": 16}, "training": {**TRAIN, "global_batch": 64}},
    # the same on a last-stage rank: its detours load rail-1 leaves of other units, and
    # (without the cluster-wide rail labels, sim/parallel/folding.py) 20 ranks on rail 1
    # ran apart from their class mates on rails 3, 5 and 7
    "failed-nic-last-stage": {"cluster": {**CLUSTER, "gpus": 64, "faults": [{"gpu_nic": 41, "factor": 0.0}]},
                              "parallel": {**PTD, "dp": 16}, "training": {**TRAIN, "global_batch": 64}},
    "degraded-node-nics": {"cluster": {**CLUSTER, "faults": [{"node_nics": 2, "factor": 0.5}]}},
    "degraded-spine": {"cluster": {**CLUSTER, "faults": [{"spine": 3, "factor": 0.1}]}},
    "failed-spine": {"cluster": {**CLUSTER, "faults": [{"spine": 0, "factor": 0.0}]}},
    "moe-skew-straggler": {"model": MOE, "parallel": {"pp": 2, "dp": 16, "ep": 4},
                           "training": {"seq_len": 1024, "global_batch": 16},
                           "stragglers": [{"ranks": [6], "slowdown": 1.25}]},
    "interleaved-straggler": {"parallel": {**PTD, "virtual_stages": 2, "schedule": "interleaved"},
                              "stragglers": [{"ranks": [30], "slowdown": 1.4}]},
    # pure data parallelism: every GPU's ring reaches every rail, so server mates relay
    # through the degraded NIC (PXN) and split off too
    "fsdp-degraded-nic": {"parallel": {"dp": 32, "zero": 3}, "cluster": {**CLUSTER, "faults": [{"gpu_nic": 12}]}},
    # 4 stages of 4 GPUs, two per server: rank 4 (stage 1) sends to rank 8 (rail 0 of the
    # next server), relayed through GPU 0's degraded NIC, so rank 4 splits from ranks
    # 5-7 although neither it nor its groups hold a perturbed rank
    "relayed-degraded-nic": {"parallel": {"dp": 4, "pp": 4}, "training": {**TRAIN, "global_batch": 16},
                             "cluster": {**CLUSTER, "gpus": 16, "faults": [{"gpu_nic": 0, "factor": 0.2}]}},
    "fsdp-straggler": {"parallel": {"dp": 32, "zero": 3}, "stragglers": [{"ranks": [17], "slowdown": 1.3}]},
    # the expert mesh of its own (expert_tp 1 under tp 2: ep groups span tp ranks) with
    # skewed loads, a straggler and a degraded NIC
    "expert-tp-skew": {"model": MOE, "parallel": {"tp": 2, "dp": 16, "ep": 4, "expert_tp": 1,
                                                  "sequence_parallel": True},
                       "training": {"seq_len": 1024, "global_batch": 16},
                       "cluster": {**CLUSTER, "faults": [{"gpu_nic": 26, "factor": 0.5}]},
                       "stragglers": [{"ranks": [6], "slowdown": 1.25}]},
}
_runs: dict = {}


def scenario(name: str, fold: bool):
    extra = CASES[name]
    training = extra.get("training", TRAIN)
    if extra.get("parallel", PTD).get("zero") == 3:  # FSDP has no gradient buckets (a bucket size is exit 2)
        training = {k: v for k, v in training.items() if k != "grad_bucket_mb"}
    data = {"model": extra.get("model", SMALL), "training": training,
            "cluster": extra.get("cluster", CLUSTER),
            "parallel": {**extra.get("parallel", PTD), "fold": fold}}
    if "stragglers" in extra:
        data["stragglers"] = extra["stragglers"]
    return scenario_from_dict(data)


def pair(name: str):
    """(folded, unfolded) results of a case, simulated once per session."""
    if name not in _runs:
        _runs[name] = tuple(simulate(scenario(name, fold)) for fold in (True, False))
    return _runs[name]


def timeline(result, rank: int) -> np.ndarray:
    """When each op ran and the bytes it sent; but the bytes of the step-end syncs over every
    rank (sim/parallel/step_end.py STEP_SYNCS): one instance holding every class at many
    positions, where a tree's members send unlike amounts (their times are compared)."""
    sp = result.spans[result.spans["rank"] == rank].sort_values("op")
    return sp[["start_s", "end_s"]].assign(bytes=sp.bytes.where(~sp.name.isin(STEP_SYNCS), 0.0)).to_numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_equals_unfolded_under_perturbation(name):
    folded, full = pair(name)
    world = full.summary["num_gpus"]
    assert folded.facts.folded and len(folded.facts.simulated_ranks) < world
    a, b = flat(folded.summary), flat(full.summary)
    assert a.keys() == b.keys()
    assert {k: (a[k], b[k]) for k in a if not same(a[k], b[k])} == {}
    rep = folded.facts.folding.representative
    for rank in range(world):  # every rank's timeline is its representative's
        np.testing.assert_allclose(timeline(folded, int(rep[rank])), timeline(full, rank), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_links_carry_the_unfolded_bytes(name):
    """Every link leaving an NVLink domain (NIC, leaf, spine) carries the same bytes; an
    NVLink port carries no more (collectives inside a domain are not copied: they share
    no link with other domains)."""
    folded, full = pair(name)
    kinds = full.facts.topology.kinds
    a, b = folded.facts.link_bytes, full.facts.link_bytes
    off_domain = kinds != "nvlink"
    np.testing.assert_allclose(a[off_domain], b[off_domain], rtol=1e-9, atol=1e-3)
    assert (a[~off_domain] <= b[~off_domain] * (1 + 1e-9) + 1e-3).all()
    assert b[off_domain].sum() > 0


def test_one_straggler_splits_each_stage_in_four():
    """Straggler (tp 1, dp 2, stage 0): its TP peers, its DP peers and everyone else
    differ, and the pipelines carry the split to stage 1: 4 classes per stage."""
    folded, _ = pair("straggler")
    classes = folded.facts.folding.classes
    assert len(set(classes.tolist())) == 8
    assert len(folded.facts.simulated_ranks) == 8


def test_spine_fault_folds_like_a_clean_run():
    folded, _ = pair("degraded-spine")
    assert len(folded.facts.simulated_ranks) == 2  # one rank per stage


def test_every_collective_runs_over_a_known_group_type():
    """The refinement only looks at the group types of folding.GROUP_TYPES: every group a
    program meets must be one of them (or a pipeline pair), or folding could be wrong."""
    for name in ("straggler", "moe-skew-straggler", "fsdp-straggler", "interleaved-straggler"):
        folded, _ = pair(name)
        folding = folded.facts.folding
        groups = {op.comm.group for p in folded.facts.programs for op in p.ops if op.comm is not None}
        assert all(folding.locate(g) is not None for g in groups), name


def test_a_rank_relaying_through_a_degraded_nic_is_labelled():
    """Stages of 12 GPUs: rank 0 sends to rank 12 (rail 4 of the next server), which PXN
    relays through GPU 4's NIC; ranks 1-3 send to rails 5-7. A degraded NIC on GPU 4 must
    label GPU 4 and rank 0, and no one else."""
    from sim.hardware.specs import load_spec
    from sim.parallel.folding import group_tables, link_codes
    from sim.parallel.layout import Layout

    s = scenario_from_dict({"model": SMALL, "training": {"seq_len": 1024, "global_batch": 24},
                            "cluster": {**CLUSTER, "gpus": 24, "faults": [{"gpu_nic": 4, "factor": 0.5}]},
                            "parallel": {"dp": 12, "pp": 2}})
    layout = Layout.from_parallel(s.parallel)
    codes = link_codes(s, group_tables(layout), 24, load_spec("dgx-h100"), np.arange(24) // 8)
    assert set(np.flatnonzero(codes).tolist()) == {0, 4}
    assert codes[0] != codes[4]


TINY = {"layers": 2, "hidden": 512, "heads": 8, "vocab": 512}


def pure_dp(gpus: int, stragglers: list) -> object:
    """Pure data parallelism, one sequence per GPU, one gradient bucket (nothing overlaps
    the all-reduce), on ``gpus`` H100s."""
    return scenario_from_dict({"name": f"pure-dp-{gpus}", "model": TINY, "stragglers": stragglers,
                               "training": {"seq_len": 512, "global_batch": gpus, "grad_bucket_mb": 1000},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus}, "parallel": {"dp": gpus}})


@pytest.fixture(scope="module")
def straggler_at_16k():
    with pytest.MonkeyPatch.context() as mp:  # a free host, as in free_host (conftest.py)
        zero_host(mp)
        return simulate(pure_dp(16384, [{"ranks": [12345], "slowdown": 1.5}]))


def test_a_straggler_costs_its_extra_compute_at_128_and_at_16k_gpus(straggler_at_16k, free_host):
    """Pure DP, one bucket: everyone waits in the all-reduce for the slow rank, which then
    runs its optimizer last, so the step grows by exactly its extra compute, 0.5x its
    compute ops, whatever the cluster's size (the ring's own time is the clean run's)."""
    costs = {}
    for gpus, result in ((128, simulate(pure_dp(128, [{"ranks": [77], "slowdown": 1.5}]))),
                         (16384, straggler_at_16k)):
        slow = {p.rank: p for p in result.facts.programs}[77 if gpus == 128 else 12345]
        extra = 0.5 * sum(op.duration for op in slow.ops if op.comm is None)
        assert result.summary["straggler_cost_s"] == pytest.approx(extra, rel=1e-9)
        assert len(result.facts.simulated_ranks) == 2  # the straggler and one for everyone else
        costs[gpus] = result.summary["straggler_cost_s"]
    assert costs[16384] == pytest.approx(costs[128], rel=1e-9)


def test_report_and_timeline_name_the_straggler_of_a_folded_16k_run(straggler_at_16k):
    """``--report`` names the slow rank as what held the step; the timeline's default
    ranks show it, labelled SLOW, though one simulated rank stands for the 16,383 others."""
    from sim.outputs.attribution import report
    from sim.outputs.rank_selection import default_ranks
    from sim.outputs.timeline import _fit_ranks, _layout_rows

    text = report(straggler_at_16k)
    assert "rank 12345" in text.splitlines()[1] and "(straggler, 1.5x compute)" in text
    shown = _fit_ranks(straggler_at_16k, default_ranks(straggler_at_16k))
    assert 12345 in shown
    labels = _layout_rows(straggler_at_16k, shown)[1]
    assert labels[(12345, "compute", 0)].endswith("SLOW  compute")


@pytest.mark.parametrize("sizes, order, ep", [({"tp": 2, "cp": 2, "dp": 4, "pp": 2}, "tp-cp-dp-pp", 1),
                                              ({"tp": 4, "cp": 1, "dp": 4, "pp": 2}, "tp-dp-cp-pp", 1),
                                              ({"tp": 2, "cp": 1, "dp": 8, "pp": 2}, "dp-tp-cp-pp", 4)])
def test_expert_tables_shared_without_building_are_the_layouts_groups(sizes, order, ep):
    """expert-dp = dp (ep 1) and expert-tp = tp (expert_tp = tp) share a table unbuilt (a
    10^6-GPU census would build a million-member group rank by rank): they must be the
    layout's own expert groups, row for row."""
    from sim.parallel.folding import _table, group_tables
    from sim.parallel.layout import Layout

    layout = Layout(sizes, tuple(order.split("-")), ep)
    tables = group_tables(layout)
    for name, fn in (("edp", layout.expert_dp_group), ("etp", layout.expert_tp_group)):
        if name in tables:
            np.testing.assert_array_equal(tables[name].rows, _table(name, fn, layout.world).rows)
        else:
            assert len(fn(0)) == 1

