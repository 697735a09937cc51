"""Op phases and categories are set where ops are built and read by the outputs
(sim/engine/kinds.py): a recomputation is exactly a rerun of the forward of each
transformer layer, and the summary's breakdown and the timeline read those phases."""

import pytest

from sim.engine.kinds import Category, Phase, StreamName
from sim.input.load import scenario_from_dict
from sim.model.layer_ids import LayerKind, is_block, kind
from sim.model.transformer import dims
from sim.outputs.metrics import rank_breakdown
from sim.outputs.timeline import drawn_phase
from sim.step import simulate

DENSE = {"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000, "mlp": "swiglu"}


def run(recompute: str, **parallel):
    par = {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, **parallel}
    return simulate(scenario_from_dict({"model": DENSE, "parallel": par,
                                        "training": {"seq_len": 512, "global_batch": 8, "recompute": recompute},
                                        "cluster": {"topology": "dgx-h100", "gpus": 8}}))


def _compute(result, rank: int, phase: Phase, blocks_only: bool = False) -> float:
    d = dims(result.scenario.model)
    prog = next(p for p in result.facts.programs if p.rank == rank)
    return sum(op.duration for op in prog.ops if op.category == Category.COMPUTE and op.phase == phase
               and (not blocks_only or is_block(d, op.layer)))


@pytest.mark.parametrize("which", [0, -1])  # first and last pipeline stage (embedding, output layer)
def test_full_recompute_reruns_exactly_the_forward_of_the_transformer_layers(which):
    r = run("full")
    rank = r.facts.simulated_ranks[which]
    assert r.facts.layout.coords(rank)["pp"] == (0 if which == 0 else 1)
    forward = _compute(r, rank, Phase.FORWARD, blocks_only=True)
    assert forward > 0
    assert _compute(r, rank, Phase.RECOMPUTE) == pytest.approx(forward, rel=1e-12)
    assert _compute(run("none"), rank, Phase.RECOMPUTE) == 0.0


def test_selective_recompute_reruns_only_attention_cores_and_the_breakdown_reads_the_phase():
    r = run("selective")
    ops = [op for p in r.facts.programs for op in p.ops if op.phase == Phase.RECOMPUTE]
    assert ops and {op.name for op in ops} == {"attn_core_fwd_recompute"}
    parts = rank_breakdown(r.spans, 0, r.summary["step_time_s"])
    spans = r.spans[(r.spans["rank"] == 0) & (r.spans.name == "attn_core_fwd_recompute")]
    assert parts["compute_recompute"] == pytest.approx(float((spans.end_s - spans.start_s).sum()), rel=1e-12)
    assert parts["compute_optimizer"] == pytest.approx(float(
        (lambda s: (s.end_s - s.start_s).sum())(r.spans[(r.spans["rank"] == 0) & r.spans.name.isin(
            ["zero_grad", "grad_norm", "optimizer"])])))  # the per-step compute of sim/parallel/step_end.py


def test_every_op_has_a_typed_phase_and_category_and_spans_carry_them():
    r = run("none", zero=1)
    for p in r.facts.programs:
        for op in p.ops:
            assert isinstance(op.phase, Phase) and isinstance(op.category, Category), op
    gathers = r.spans[r.spans.name == "zero_param_ag"]
    assert len(gathers) and set(gathers.phase) == {Phase.OPTIMIZER} and set(gathers.category) == {Category.DP}
    grads = r.spans[r.spans.name.str.endswith("_grad_rs")]
    assert len(grads) and set(grads.phase) == {Phase.BACKWARD}


def test_fixed_streams_are_named_by_members_and_print_as_before():
    """Compute ops and the data-parallel streams carry StreamName members (what the outputs
    find a rank's compute stream by), written in the spans and the trace as the plain strings."""
    r = run("none", zero=1)
    streams = {op.stream for p in r.facts.programs for op in p.ops}
    assert {StreamName.COMPUTE, StreamName.DP, StreamName.DP_AG} <= streams
    computes = {op.stream for p in r.facts.programs for op in p.ops if op.category is Category.COMPUTE}
    assert computes == {StreamName.COMPUTE} and all(type(s) is StreamName for s in computes)
    gathers = {op.stream for p in r.facts.programs for op in p.ops if op.name == "zero_param_ag"}
    assert gathers == {StreamName.DP_AG} and all(type(s) is StreamName for s in gathers)
    assert sorted(set(map(str, r.spans.stream))) == sorted(map(str, streams)) and "compute" in set(map(str, r.spans.stream))


def test_timeline_draws_recompute_with_the_backward_and_the_optimizer_as_other_compute():
    assert [drawn_phase(p) for p in Phase] == ["forward", "backward", "backward", "compute", "compute"]


def test_layer_ids_say_what_they_are():
    d = dims(scenario_from_dict({"model": {**DENSE, "mtp_layers": 1}, "training": {"seq_len": 512, "global_batch": 8},
                                 "cluster": {"topology": "dgx-h100", "gpus": 1}}).model)
    assert [kind(d, i) for i in (-1, 0, 3, 4, 5)] == [LayerKind.EMBEDDING, LayerKind.BLOCK, LayerKind.BLOCK,
                                                     LayerKind.OUTPUT, LayerKind.MTP]
