"""Transformer Engine delayed scaling's amax reduction (sim/parallel/amax.py,
sim/model/delayed_scaling.py): closed forms read off the spans.

- one reduction per model chunk, micro-batch and direction, over tp x cp x dp (every rank
  of the stage), carrying 3 fp32 amaxes per FP8 GEMM forward and 2 backward;
- the compute stream waits for it: the step is longer than with no collective
  (``training.tp_only_amax_red`` at tp = cp = 1: a group of one) by exactly the summed
  all-reduce spans;
- only FP8 with Transformer Engine's recipe: BF16, torchao and MXFP8 steps have none;
- bad values of ``training.tp_only_amax_red`` exit 2 naming it (CLI, through a subprocess).

Run: ``python -m pytest -q tests/test_amax.py``
"""


import pytest

from sim.collectives.kinds import ALL_REDUCE
from sim.input.load import scenario_from_dict
from sim.parallel import layer_program, workload
from sim.model.delayed_scaling import AMAX_HISTORY_LEN, amax_bytes, amax_kernels
from sim.step import simulate

from conftest import assert_refusals, fp8_flag_refusals

MODEL = {"layers": 2, "hidden": 4096, "heads": 32, "vocab": 32768}
GEMMS_PER_LAYER = 4  # QKV, output projection, FC1, FC2: each a TE FP8 GEMM


def scenario(gpus=8, training=None, model=None, **parallel):
    t = {"seq_len": 4096, "global_batch": 16, "precision": "fp8", **(training or {})}
    return scenario_from_dict({"model": {**MODEL, **(model or {})}, "training": t,
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": {"dp": gpus, "overlap_grad_reduce": False, **parallel}})


def named(result, name, rank=0):
    sp = result.spans
    return sp[(sp["rank"] == rank) & (sp.name == name)]


def amax_ops(s, rank=0):
    """The amax all-reduces of rank ``rank``'s program as the builder makes it."""
    ctx = layer_program.context(s, "h100-sxm")
    return [op for op in workload.build_rank(ctx, rank).program.ops if op.name == "fp8_amax_ar"]


def test_one_reduction_per_micro_batch_and_direction_with_its_amaxes():
    ops = amax_ops(scenario())
    micro_batches = 16 // 8
    assert len(ops) == 2 * micro_batches
    gemms = GEMMS_PER_LAYER * MODEL["layers"]
    fwd, bwd = [op for op in ops if op.phase == "forward"], [op for op in ops if op.phase == "backward"]
    assert [op.comm.nbytes for op in fwd] == [4.0 * 3 * gemms] * micro_batches  # input, weight, output amaxes
    assert [op.comm.nbytes for op in bwd] == [4.0 * 2 * gemms] * micro_batches  # output and input gradients
    assert {op.comm.group for op in ops} == {tuple(range(8))}  # tp x cp x dp: the whole stage
    assert amax_bytes(gemms, True) == 4.0 * 3 * gemms
    cat, update = amax_kernels(gemms, True)
    assert cat.bytes == 2 * 4 * 3 * gemms and update.bytes == 4 * 3 * gemms * (2 * AMAX_HISTORY_LEN + 3)


def test_the_step_pays_exactly_the_exposed_all_reduces():
    """The compute stream waits for each all-reduce (``async_op=False``): against a group of
    one (no collective, the same cat and update kernels) the step grows by their spans."""
    full = simulate(scenario())
    alone = simulate(scenario(training={"tp_only_amax_red": True}))
    assert len(named(alone, "fp8_amax_ar")) == 0 and len(named(alone, "fp8_amax_update")) == 4
    ar = named(full, "fp8_amax_ar")
    exposed = float((ar.end_s - ar.start_s).sum())
    assert exposed > 0
    assert full.summary["step_time_s"] - alone.summary["step_time_s"] == pytest.approx(exposed, rel=1e-9, abs=1e-12)


def test_interleaved_pipeline_reduces_per_chunk_over_the_stage():
    """pp 2 x 2 virtual stages: 2 chunks x 4 micro-batches x 2 directions per rank, each over
    the stage's dp ranks (4 of 8), one layer's amaxes per chunk."""
    s = scenario(model={"layers": 4}, pp=2, dp=4, virtual_stages=2, schedule="interleaved")
    ops = amax_ops(s)
    assert len(ops) == 2 * 4 * 2
    assert {op.comm.nbytes for op in ops} == {4.0 * 3 * GEMMS_PER_LAYER, 4.0 * 2 * GEMMS_PER_LAYER}
    assert {len(op.comm.group) for op in ops} == {4}
    assert len(named(simulate(s), "fp8_amax_ar")) == len(ops)  # every reduction met and ran


@pytest.mark.parametrize("training", [{"precision": "bf16"}, {"fp8_recipe": "torchao", "compile": True}])
def test_no_reduction_without_delayed_scaling(training):
    result = simulate(scenario(training=training))
    assert not result.spans.name.str.startswith("fp8_amax").any()


CLI_BAD = fp8_flag_refusals("training.tp_only_amax_red")


def test_bad_values_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\n')
    assert_refusals(path, CLI_BAD)


PLAN_BASE = """
[model]
layers = 2
hidden = 1024
heads = 8
vocab = 8192
[training]
seq_len = 1024
global_batch = 16
precision = "fp8"
{extra}
[cluster]
topology = "dgx-h100"
gpus = 8
"""


def test_the_planner_prices_the_same_reductions(tmp_path):
    """The planner's estimate (sim/plan/estimate.py) reads the builder's definition: for
    tp 1, pp 1, dp 8 its compute grows, against a group of one, by exactly the micro-batches
    x the forward (3 amaxes per GEMM) and backward (2) all-reduces over the 8 ranks, as its
    collective model times them."""
    from sim.plan import inputs, space
    from sim.plan.estimate import Estimator
    from sim.plan.stages import Stages

    def estimate(extra):
        path = tmp_path / "base.toml"
        path.write_text(PLAN_BASE.format(extra=extra))
        req = inputs.request(str(path), None, None, None, None, None, None, None)
        stages = Stages(req.scenario)
        c = space.enumerate_layouts(space.Space(req.gpus, req.spec.gpus_per_domain, stages.dims.layers,
                                                req.scenario.training.seq_len, stages.dims.experts))
        pick = c[(c.tp == 1) & (c.pp == 1) & (c.dp == 8) & (c.cp == 1) & (c.micro_batch == 1) & (c.zero == 0)
                 & (c.recompute == "none")].head(1)
        est = Estimator(req.scenario, stages, req.spec, req.gpu)
        return est.frame(pick).iloc[0], est

    full, est = estimate("")
    alone, _ = estimate("tp_only_amax_red = true")
    gemms = GEMMS_PER_LAYER * 2
    group = (0,) * 8  # one NVLink domain
    per_micro = sum(est.comm.reduce(ALL_REDUCE, amax_bytes(gemms, fwd), group) for fwd in (True, False))
    assert per_micro > 0
    micro = 16 // 8
    assert full.est_compute_s - alone.est_compute_s == pytest.approx(micro * per_micro, rel=1e-9)
