"""Folding across partial and misaligned scalable units: a pipeline whose stages are 4
nodes apart on a fat tree of 5-node scalable units (the last one partial, 2 nodes) runs
some stage-to-stage sends inside a unit (NIC, rail leaf, NIC) and others across units
(through a spine: two more InfiniBand hops of latency, sim/hardware/paths.py). Which sends
cross depends on the data-parallel replica, so replicas fold only where their pipelines
cross units at the same stages (the shapes of sim/parallel/folding.py); GPT 530B on
2,520 A100 (pp 35 x dp 9 of tp 8, 72 GPUs a stage on 160-GPU units) is this case.

Checked: the census counts the ranks the run simulates (a golden count, from the layout
by hand); folded and every-rank simulations give the same summary and the same timeline
for every simulated rank; and the replicas folding keeps apart really do run different
timelines (so folding them would change the result).

Run: ``python -m pytest tests/test_folding_units.py``
"""

import numpy as np
import pytest

from sim.input.load import scenario_from_dict
from sim.parallel import census
from sim.step import simulate
from tests.test_folding import assert_fold_exact, timeline

MODEL = {"layers": 3, "hidden": 1024, "heads": 8, "kv_heads": 8, "vocab": 32000, "mlp": "swiglu", "ffn_hidden": 2816}
# tp 8 (one node), dp 4, pp 3: stage p of replica d on GPUs 32p + 8d ... + 7; units of 40 GPUs
# (5 nodes), 96 GPUs = 2 whole units and one of 2 nodes. Units of each replica's stages:
# d=0: 0,0,1; d=1: 0,1,1; d=2: 0,1,2; d=3: 0,1,2 -> 3 pipeline shapes, so 3 ranks a stage.
SIMULATED = 9


def scenario(fold: bool):
    return scenario_from_dict({"name": "partial-unit", "model": MODEL,
                               "training": {"seq_len": 1024, "global_batch": 8, "micro_batch": 1},
                               "cluster": {"gpu": "a100-80gb", "topology": "dgx-a100", "gpus": 96,
                                           "topology_overrides": {"nodes_per_su": 5}},
                               "parallel": {"tp": 8, "pp": 3, "dp": 4, "fold": fold}})


@pytest.fixture(scope="module")
def runs():
    return simulate(scenario(True)), simulate(scenario(False))


def test_census_counts_the_ranks_simulated(runs):
    folded, full = runs
    assert census.simulated_ranks(scenario(True)) == len(folded.facts.simulated_ranks) == SIMULATED
    assert len(full.facts.simulated_ranks) == 96


def test_folded_run_equals_every_rank_simulated(runs):
    assert_fold_exact(*runs)


def test_replicas_kept_apart_differ_and_folded_ones_agree(runs):
    _, full = runs
    for stage in range(3):
        first = [timeline(full, 32 * stage + 8 * d) for d in range(4)]  # tp position 0 of each replica
        assert np.array_equal(first[2], first[3])  # same units crossed: folded together
        assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
