"""Folding across a partial NVLink domain (GB200 NVL72's racks, scaled down): a pipeline
whose stages are 8 GPUs apart on domains of 20 GPUs (5 trays of 4; the last domain partial,
4 GPUs) sends stage to stage over NVLink inside a domain and over InfiniBand between
domains. Which sends leave the domain depends on the data-parallel replica, so replicas fold
only where their pipelines cross domains at the same stages; the GB200/GB300 Llama 3.1 405B
rows of ``clustersim validate`` packed into whole 72-GPU racks (32 or 64 GPUs a stage) are
this case (docs/scaling.md, "What the slowest rows simulate more than once"); placed in
their launchers' Slurm segments of 16 trays they fold to one rank a stage (tests/test_segment.py).

Checked: the census names the reason (:func:`sim.parallel.fold_reasons.fold_reasons`: one rank a
stage without the domains, two with them, counted from the layout by hand), folded and
every-rank simulations give the same summary and the same timeline for every simulated rank,
and the replicas folding keeps apart run different timelines (so folding them would change
the result), on the same layout interleaved as the rows are.

Run: ``python -m pytest tests/test_folding_domains.py``
"""

import numpy as np
import pytest

from sim.input.load import scenario_from_dict
from sim.parallel import census
from sim.parallel.fold_reasons import fold_reasons
from sim.step import simulate
from sim.studies.validation import load_rows
from tests.test_folding import assert_fold_exact, timeline

MODEL = {"layers": 6, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 32000, "mlp": "swiglu", "ffn_hidden": 2816}
# tp 2, dp 4, pp 3 v 2: stage s of replica d on GPUs 8 s + 2 d, + 1; domains of 20 GPUs (the
# topology's 4-GPU trays, 5 a domain and a scalable unit), 24 GPUs = one whole domain and one of
# 4. Domains of each replica's stages: d = 0, 1: 0, 0, 0 (GPUs 16-19); d = 2, 3: 0, 0, 1 (GPUs
# 20-23) -> 2 pipeline shapes, so 2 ranks a stage.
SIMULATED = 6


def scenario(fold: bool):
    return scenario_from_dict({"name": "partial-domain", "model": MODEL,
                               "training": {"seq_len": 1024, "global_batch": 12, "micro_batch": 1},
                               "cluster": {"gpu": "gb200", "topology": "gb200-nvl72", "gpus": 24,
                                           "topology_overrides": {"gpus_per_domain": 20, "nodes_per_su": 5}},
                               "parallel": {"tp": 2, "pp": 3, "dp": 4, "virtual_stages": 2, "fold": fold}})


@pytest.fixture(scope="module")
def runs():
    return simulate(scenario(True)), simulate(scenario(False))


def test_census_names_the_domains_as_the_reason(runs):
    folded, full = runs
    assert census.simulated_ranks(scenario(True)) == len(folded.facts.simulated_ranks) == SIMULATED
    assert len(full.facts.simulated_ranks) == 24
    reasons = fold_reasons(scenario(True))
    assert reasons["stage"] == 3  # one rank a stage without the domains
    assert reasons["pp.domain"] == SIMULATED  # the pipelines' domains alone make the classes
    assert max(reasons.values()) == SIMULATED


def test_folded_run_equals_every_rank_simulated(runs):
    assert_fold_exact(*runs)


def test_replicas_kept_apart_differ_and_folded_ones_agree(runs):
    _, full = runs
    differ = 0
    for stage in range(3):
        first = [timeline(full, 8 * stage + 2 * d) for d in range(4)]  # tp position 0 of each replica
        assert np.array_equal(first[0], first[1]) and np.array_equal(first[2], first[3])  # same domains crossed
        differ += not np.array_equal(first[1], first[2])
    assert differ == 3  # every stage: the replicas crossing at stage 1 -> 2 run another timeline


# The rows themselves packed into whole racks (as the rows ran before their launchers' Slurm
# segments, ``cluster.segment``, were read: tests/test_segment.py), counted by hand: a stage is
# tp 4 x cp 2 x dp (4 or 8) GPUs = 32 or 64, so the 72-GPU domains' edges (72 k) fall inside
# stages at multiples of 8, the GPUs of one dp replica; every replica's pipeline crosses at its
# own set of stages: dp classes a stage.
@pytest.mark.parametrize("row, stage, simulated", [("nb_gb200_l405b_256g_bf16", 8, 32),
                                                   ("nb_gb200_l405b_512g_fp8", 8, 64)])
def test_census_of_the_gb200_rows(row, stage, simulated):
    packed = dict(next(r for r in load_rows() if r.id == row).scenario)
    packed["cluster"] = {k: v for k, v in packed["cluster"].items() if k != "segment"}
    s = scenario_from_dict(packed)
    reasons = fold_reasons(s)
    assert census.simulated_ranks(s) == simulated
    assert reasons["stage"] == stage and reasons["pp.domain"] == simulated


def test_census_of_the_530b_row_names_only_the_units():
    """GPT 530B (pp 35 x dp 9 of tp 8 on 20-node units): replica d of stage s is node 9 s + d,
    its send leaves the unit iff (9 s + d) mod 20 >= 11; 9 is prime to 20, so the 9 replicas
    cross at 9 different sets of stages and nothing else splits them (no domain, server or rail)."""
    s = scenario_from_dict(next(r for r in load_rows() if r.id == "N21-T1-529.6B-2520").scenario)
    crossings = {frozenset(st for st in range(34) if (9 * st + d) % 20 >= 11) for d in range(9)}
    assert len(crossings) == 9
    assert fold_reasons(s) == {"stage": 35, "pp.unit": 35 * 9, "mp.unit": 35 * 9}


def test_census_says_when_nothing_folds():
    s = scenario(False)
    assert fold_reasons(s) == {"stage": 3, "unfolded": 24, "pp.domain": 6, "pp.unit": 6,
                                      "mp.domain": 6, "mp.unit": 6}
