"""Folding is exact: simulating one rank per class of identical ranks (the default) gives
the same step as simulating every rank (``parallel.fold = false``), and the same
summary apart from the engine's own counters (sim_events, sim_wall_s).

Run: ``python -m pytest tests/test_folding.py``
"""

import math

import pytest

from sim.input.load import scenario_from_dict
from sim.step import simulate

SMALL = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "vocab": 32000, "mlp": "swiglu",
         "ffn_hidden": 2816}
MIXTRAL_SMALL = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 1024, "mlp": "swiglu",
                 "ffn_hidden": 3584, "moe": {"experts": 8, "top_k": 2, "routing": "uniform"}}

CASES = {
    "ptd": (SMALL, 16, {"seq_len": 1024, "global_batch": 16}, {"tp": 2, "pp": 2, "dp": 4}),
    "ptd-zero1-sp": (SMALL, 32, {"seq_len": 1024, "global_batch": 32},
                     {"tp": 2, "pp": 2, "dp": 8, "zero": 1, "sequence_parallel": True}),
    "interleaved": (SMALL, 16, {"seq_len": 1024, "global_batch": 32},
                    {"tp": 2, "pp": 2, "dp": 4, "virtual_stages": 2, "schedule": "interleaved"}),
    "fsdp": (SMALL, 16, {"seq_len": 1024, "global_batch": 16}, {"dp": 16, "zero": 3}),
    "fsdp-prefetch-off": (SMALL, 16, {"seq_len": 1024, "global_batch": 32, "fsdp_prefetch": False},
                          {"dp": 16, "zero": 3}),
    "cp-tp": (SMALL, 32, {"seq_len": 4096, "global_batch": 8}, {"tp": 2, "cp": 2, "dp": 8}),
    "moe-ep": (MIXTRAL_SMALL, 16, {"seq_len": 1024, "global_batch": 16}, {"dp": 16, "ep": 8}),
    "moe-ep-tp": (MIXTRAL_SMALL, 32, {"seq_len": 1024, "global_batch": 16}, {"tp": 2, "dp": 16, "ep": 4}),
    # uneven routing: whole expert groups are simulated, several ranks per stage; the
    # folded groups' pipeline and all-to-all traffic must ride with exactly one copy each
    "moe-skewed-pp": ({**MIXTRAL_SMALL, "moe": {**MIXTRAL_SMALL["moe"], "routing": "token_choice", "skew": 0.5}},
                      16, {"seq_len": 1024, "global_batch": 16}, {"pp": 2, "dp": 8, "ep": 4}),
    # MoE parallel folding: skewed expert groups span tp ranks (expert_tp 1) or are split
    # over more ranks than tp (expert_tp 2 > tp 1)
    "moe-folded-skewed": ({**MIXTRAL_SMALL, "moe": {**MIXTRAL_SMALL["moe"], "routing": "token_choice", "skew": 0.5}},
                          32, {"seq_len": 1024, "global_batch": 16},
                          {"tp": 2, "dp": 16, "ep": 8, "expert_tp": 1, "sequence_parallel": True}),
    "moe-etp-skewed": ({**MIXTRAL_SMALL, "moe": {**MIXTRAL_SMALL["moe"], "routing": "token_choice", "skew": 0.5}},
                       16, {"seq_len": 1024, "global_batch": 16}, {"dp": 16, "ep": 4, "expert_tp": 2}),
    "tp-comm-overlap": (SMALL, 16, {"seq_len": 1024, "global_batch": 16},
                        {"tp": 2, "pp": 2, "dp": 4, "sequence_parallel": True, "tp_comm_overlap": True}),
    "moe-ep-comm-overlap": ({**MIXTRAL_SMALL, "moe": {**MIXTRAL_SMALL["moe"], "routing": "token_choice", "skew": 0.5}},
                            16, {"seq_len": 1024, "global_batch": 32},
                            {"pp": 2, "dp": 8, "ep": 4, "virtual_stages": 2, "schedule": "interleaved",
                             "stage_layers": [0, 1, 1, 0], "ep_comm_overlap": True}),
}
_cache: dict = {}


def pair(name):
    """(folded, unfolded) summaries of a case, simulated once per session."""
    if name not in _cache:
        model, gpus, training, parallel = CASES[name]
        runs = []
        for fold in (True, False):
            s = scenario_from_dict({"model": model, "training": training,
                                    "cluster": {"topology": "dgx-h100", "gpus": gpus},
                                    "parallel": {**parallel, "fold": fold}})
            result = simulate(s)
            runs.append((result.summary, result.facts))
        _cache[name] = runs
    return _cache[name]


def flat(summary: dict) -> dict:
    out = {}
    for k, v in summary.items():
        if k in ("sim_events", "sim_wall_s"):
            continue
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def timeline(result, rank: int):
    """One rank's spans (op, start, end) in op order: what two runs of that rank must share."""
    spans = result.spans
    return spans[spans["rank"] == rank].sort_values("op", kind="stable")[["op", "start_s", "end_s"]].to_numpy()


def assert_fold_exact(folded, full) -> None:
    """A folded run and the every-rank run of one scenario: the same summary, and every rank the
    folded run simulated runs the timeline it runs unfolded."""
    a, b = flat(folded.summary), flat(full.summary)
    assert a.keys() == b.keys()
    assert {k: (a[k], b[k]) for k in a if not same(a[k], b[k])} == {}
    for rank in folded.facts.simulated_ranks:
        assert (timeline(folded, rank) == timeline(full, rank)).all(), rank


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_step_time_equals_every_rank_simulated(name):
    (folded, info_f), (full, info_u) = pair(name)
    assert info_f.folded and not info_u.folded
    assert len(info_f.simulated_ranks) < len(info_u.simulated_ranks) == full["num_gpus"]
    assert folded["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("name", sorted(CASES))
def test_folded_summary_equals_every_rank_simulated(name):
    (folded, _), (full, _) = pair(name)
    a, b = flat(folded), flat(full)
    assert a.keys() == b.keys()
    differ = {k: (a[k], b[k]) for k in a if not same(a[k], b[k])}
    assert differ == {}

