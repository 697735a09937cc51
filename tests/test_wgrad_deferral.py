"""The output layer's weight gradients deferred into the pipeline flush (Megatron-Core's
``defer_embedding_wgrad_compute`` / ``wgrad_deferral_limit``, sim/parallel/wgrad_deferral.py):
closed forms read off the built programs and their spans.

- the last stage's first ``limit`` output-layer backwards run only their input-gradient part
  (0: every one), each kept weight-gradient GEMM runs once after the rank's last backward, timed
  as the weight-gradient half of the output projection's backward, after a TP all-gather of its
  input (sequence parallel); no other op of any rank changes;
- the work is moved, not added: the last stage's compute seconds differ by exactly
  ``limit x (t(dgrad part) + t(wgrad part) - t(whole backward))``;
- a last stage that bounds the step gets it shorter;
- replayed steady steps (sim/parallel/replay.py) build the same programs as built ones;
- a limit makes the step unlike in its micro-batches: the steady mode runs it exactly;
- the shipped rows carry it where NeMo's recipe sets it; bad values exit 2 naming the key.

Run: ``python -m pytest -q tests/test_wgrad_deferral.py``
"""

import pytest

from sim.engine.kinds import Category
from sim.input.load import scenario_from_dict
from sim.model.layers import backward
from sim.model.vocab import logits
from sim.parallel import layer_program, replay, steady, workload
from sim.parallel.tp import grad_parts
from sim.step import simulate
from sim.studies.validation import load_rows

from conftest import assert_refusals

HIDDEN, SEQ, VOCAB, TP, PP, M = 4096, 2048, 131072, 2, 4, 16


def scenario(**parallel):
    """A pipeline whose last stage holds a large output layer (vocab 128k beside two layers):
    that stage bounds the step."""
    return scenario_from_dict({
        "model": {"layers": 2 * PP, "hidden": HIDDEN, "heads": 32, "vocab": VOCAB},
        "training": {"seq_len": SEQ, "global_batch": M},
        "cluster": {"topology": "dgx-h100", "gpus": TP * PP},
        "parallel": {"tp": TP, "pp": PP, "dp": 1, "sequence_parallel": True, **parallel}})


def deferring(limit: int, **parallel):
    return scenario(defer_embedding_wgrad_compute=True, wgrad_deferral_limit=limit, **parallel)


def program(s, rank: int):
    return workload.build_rank(layer_program.context(s, "h100-sxm"), rank).program.ops


def last_rank() -> int:
    return (PP - 1) * TP  # (tp innermost: the first rank of the last stage)


@pytest.mark.parametrize("limit, kept", [(3, 3), (0, M), (M + 5, M)])
def test_kept_wgrads_run_once_after_the_last_backward(limit, kept):
    s = deferring(limit)
    ctx = layer_program.context(s, "h100-sxm")
    ops = program(s, last_rank())
    dgrad, wgrad = grad_parts(backward(logits(ctx.dims, ctx.shard)))
    bwd = [op for op in ops if op.name == "logits_bwd"]
    drained = [i for i, op in enumerate(ops) if op.name == "logits_bwd_wgrad"]
    assert [op.micro_batch for op in bwd] == list(range(M))
    assert [op.duration for op in bwd] == [ctx.compute.time(dgrad)] * kept + \
        [ctx.compute.time(backward(logits(ctx.dims, ctx.shard)))] * (M - kept)
    assert [ops[i].micro_batch for i in drained] == list(range(kept))
    assert {ops[i].duration for i in drained} == {ctx.compute.time(wgrad)}
    last_bwd = max(i for i, op in enumerate(ops) if op.name.endswith("_bwd"))
    assert min(drained) > last_bwd
    gathers = [op for op in ops if op.name == "logits_wgrad_ag"]
    assert len(gathers) == kept and {op.comm.nbytes for op in gathers} == {ctx.shard.tokens * HIDDEN * 2}
    assert {op.category for op in gathers} == {Category.TP}


def test_no_other_op_changes():
    """The first stage holds no output layer: its program is the same op for op; so is the last
    stage's without the key, and with it but for the output layer's backward and the drain."""
    assert program(deferring(3), 0) == program(scenario(), 0)
    plain, moved = program(scenario(), last_rank()), program(deferring(3), last_rank())
    drop = ("logits_bwd", "logits_bwd_wgrad", "logits_wgrad_ag")
    strip = lambda ops: [(op.name, op.duration, op.micro_batch, op.comm and op.comm.nbytes)
                         for op in ops if op.name not in drop]
    assert strip(plain) == strip(moved)


@pytest.mark.parametrize("limit", [3, 0])
def test_the_census_counts_the_drain(limit):
    """sim/parallel/census.py counts programs without building them: the drain's ops too."""
    from sim.parallel import census

    s = deferring(limit)
    assert census.ops_per_rank(s) == max(len(program(s, r)) for r in range(0, TP * PP, TP))


def test_work_is_moved_not_added():
    limit = 5
    s = deferring(limit)
    ctx = layer_program.context(s, "h100-sxm")
    whole = backward(logits(ctx.dims, ctx.shard))
    dgrad, wgrad = grad_parts(whole)
    split = ctx.compute.time(dgrad) + ctx.compute.time(wgrad) - ctx.compute.time(whole)
    busy = lambda ops: sum(op.duration for op in ops if op.category is Category.COMPUTE)
    assert busy(program(s, last_rank())) - busy(program(scenario(), last_rank())) == \
        pytest.approx(limit * split, abs=1e-12)


def test_the_bounding_stage_gains_each_deferred_gemm_while_the_flush_holds_them():
    """While the flush has room for them, each further deferred micro-batch shortens the step
    by exactly its weight-gradient GEMM's time (the first one by less: the drain's first
    all-gather runs before any GEMM); deferring every micro-batch overflows the flush and gains
    less than all of them."""
    ctx = layer_program.context(scenario(), "h100-sxm")
    wgrad = ctx.compute.time(grad_parts(backward(logits(ctx.dims, ctx.shard)))[1])
    plain = simulate(scenario()).summary["step_time_s"]
    gain = {limit: plain - simulate(deferring(limit)).summary["step_time_s"] for limit in (1, 3, 0)}
    assert gain[3] - gain[1] == pytest.approx(2 * wgrad, rel=1e-9)
    assert 0 < gain[1] < wgrad
    assert gain[0] < M * wgrad - (wgrad - gain[1])
    spans = simulate(deferring(3)).spans
    drained = spans[spans.name == "logits_bwd_wgrad"]
    backwards = spans[(spans["rank"] == last_rank()) & (spans.name.str.endswith("_bwd"))]
    assert len(drained) == 3 and drained.start_s.min() >= backwards.end_s.max()


def test_replayed_steps_build_the_same_programs(monkeypatch):
    s = deferring(3, virtual_stages=2)
    built = program(s, last_rank())
    monkeypatch.setattr(replay, "ENABLED", False)
    assert program(s, last_rank()) == built


def test_a_limit_runs_the_steady_mode_exactly():
    s = deferring(3).model_copy(update={"training": scenario().training.model_copy(update={"global_batch": 64})})
    assert "wgrad_deferral_limit" in steady.counts(s).reason
    assert steady.counts(deferring(0).model_copy(update={"training": s.training})).eligible


def test_rows_carry_it_where_nemo_sets_it():
    rows = {r.id: r.scenario["parallel"] for r in load_rows()}
    deferred = {k: p["wgrad_deferral_limit"] for k, p in rows.items() if p.get("defer_embedding_wgrad_compute")}
    assert deferred == {"dg-l70-64": 22, "dg-l70-2048": 22, "dg-l70-fp8-64": 22,
                        "dg-l405-512": 50, "dg-l405-2048": 50, "dg-l405-fp8-1024": 50,
                        # dgxc-benchmarking v25.05's GB200 405B rows (frontier_runs.csv notes: NeMo's
                        # performance_mode, wgrad_deferral_limit 50)
                        **{f"nb_gb200_l405b_{n}g_{p}": 50 for n in (128, 256, 512) for p in ("bf16", "fp8")}}


def test_the_planner_drops_it_where_it_cannot_run():
    """A base row that defers (dg-l70-64) keeps it in the planner's pipelined 1F1B candidates; its
    candidates without a pipeline, or with a zero-bubble schedule, run without it (the rules would
    refuse them)."""
    from sim.input.load import check
    from sim.plan.space import candidate_of, overrides

    row = next(r for r in load_rows() if r.id == "dg-l70-64")
    base = scenario_from_dict(row.scenario)
    own = candidate_of(base)
    assert "parallel.defer_embedding_wgrad_compute" not in overrides(own)
    for change in ({"pp": 1, "dp": 8, "virtual_stages": 1, "schedule": "1f1b"},
                   {"virtual_stages": 1, "schedule": "zb-h1"}):
        s = scenario_from_dict(row.scenario, overrides({**own, **change}))
        assert not s.parallel.defer_embedding_wgrad_compute and s.parallel.wgrad_deferral_limit == 0
        check(s)


CLI_BAD = [
    (["parallel.wgrad_deferral_limit=4"], "parallel.wgrad_deferral_limit"),  # without the flag
    (["parallel.defer_embedding_wgrad_compute=true", "parallel.wgrad_deferral_limit=-1"],
     "parallel.wgrad_deferral_limit"),
    (["parallel.defer_embedding_wgrad_compute=true", "parallel.wgrad_deferral_limit=1e9"],
     "parallel.wgrad_deferral_limit"),
    (["parallel.defer_embedding_wgrad_compute=yes"], "parallel.defer_embedding_wgrad_compute"),
    (["parallel.defer_embedding_wgrad_compute=true", "parallel.pp=1", "parallel.dp=4"],
     "parallel.defer_embedding_wgrad_compute"),
    (["parallel.defer_embedding_wgrad_compute=true", "parallel.schedule=zb-h1"],
     "parallel.defer_embedding_wgrad_compute"),
]


def test_bad_values_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 4\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ntp = 2\npp = 2\n'
                    'dp = 2\nsequence_parallel = true\n')
    assert_refusals(path, CLI_BAD)
