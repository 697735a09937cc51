"""The planner's estimate against the simulator: its per-layer compute is the builder's
(sim/parallel/layer_program.py) and equals that layer's spans in a one-rank simulation,
and on a handful of small layouts its step time is within 3% of the simulated one and
ranks them in the simulation's order.

Run: ``python -m pytest tests/test_plan_accuracy.py``
"""

import numpy as np
import pytest

import sim
from sim.input.load import scenario_from_dict
from sim.parallel import amax, layer_program
from sim.plan import inputs, rules, space
from sim.plan.estimate import COUNTS_AT, FIELDS, Estimator
from sim.plan.layers import KINDS
from sim.plan.published import estimate_of
from sim.plan.stages import Stages

ONE_GPU_MOE = """
name = "one-gpu-moe"
[model]
layers = 3
hidden = 512
heads = 8
kv_heads = 4
vocab = 2000
mlp = "swiglu"
mtp_layers = 1
[model.moe]
experts = 4
top_k = 2
shared_experts = 1
dense_layers = 1
[training]
seq_len = 1024
global_batch = 2
recompute = "{recompute}"
precision = "{precision}"
[cluster]
topology = "dgx-h100"
gpus = 1
"""
DENSE = """
name = "accuracy-dense"
[model]
layers = 8
hidden = 2048
heads = 16
kv_heads = 4
vocab = 32000
mlp = "swiglu"
[training]
seq_len = 4096
global_batch = 16
[cluster]
topology = "dgx-h100"
gpus = 8
"""
MOE_MTP = """
name = "accuracy-moe-mtp"
[model]
layers = 4
hidden = 2048
heads = 16
kv_heads = 4
ffn_hidden = 5632
vocab = 32000
mlp = "swiglu"
mtp_layers = 1
[model.moe]
experts = 8
top_k = 2
[training]
seq_len = 4096
global_batch = 32
[cluster]
topology = "dgx-h100"
nodes = 2
"""
# (tp, pp, dp, cp, recompute, micro_batch, tp_comm_overlap): simulated steps 0.078-0.162 s, at
# least 3% apart, every recompute mode, TP overlap, CP and pipelines of 2, 4 and 8 stages
DENSE_KEYS = ["tp", "pp", "dp", "cp", "recompute", "micro_batch", "tp_comm_overlap"]
DENSE_LAYOUTS = [(2, 1, 4, 1, "selective", 4, True), (1, 1, 8, 1, "full", 1, False),
                 (1, 2, 2, 2, "none", 2, False), (2, 1, 1, 4, "none", 1, False), (4, 2, 1, 1, "selective", 4, False),
                 (2, 4, 1, 1, "none", 2, False), (1, 2, 4, 1, "full", 2, False), (1, 4, 1, 2, "full", 2, False),
                 (1, 8, 1, 1, "none", 1, False)]
# MoE with an MTP depth on 16 GPUs, (tp, pp, dp, cp, ep, expert_tp, zero, recompute, micro_batch,
# tp_comm_overlap, ep_comm_overlap): 0.078-0.196 s simulated; every ZeRO stage, EP overlap,
# expert tp 1 and 4. (Before the estimate read the layer programs it left out the MTP
# depth's own head: 13% low on average, 23% at worst over 24 such layouts.)
MOE_KEYS = ["tp", "pp", "dp", "cp", "ep", "expert_tp", "zero", "recompute", "micro_batch", "tp_comm_overlap",
            "ep_comm_overlap"]
MOE_LAYOUTS = [(1, 1, 8, 2, 4, 1, 1, "selective", 2, False, True), (4, 1, 4, 1, 4, 1, 2, "selective", 4, True, False),
               (1, 1, 8, 2, 4, 1, 0, "full", 4, False, False), (4, 1, 4, 1, 4, 4, 3, "none", 4, True, False),
               (1, 2, 4, 2, 2, 1, 2, "none", 4, False, False), (4, 2, 2, 1, 1, 4, 2, "none", 1, True, False),
               (4, 2, 1, 2, 2, 4, 3, "full", 2, False, False)]
TOLERANCE = 0.15
# The sixteen layouts above were within 1.3% of their simulation after the estimate charged the
# schedule's host work (issue 27, 2026-11-27: -1.3..+0.1% dense, -1.1..+0.4% MoE); 15% was the
# bound before the estimate read the layer programs
STEP_TOLERANCE = 0.03
# Host-bound interleaved pipelines of the dense model, (tp, pp, dp, cp, v, zero, recompute,
# micro_batch): the schedule's Python per pass and the send/recv calls are 3-6% of their
# simulated step each; without them the estimate was 5.3% and 10.9% low
HOST_BOUND_KEYS = ["tp", "pp", "dp", "cp", "virtual_stages", "zero", "recompute", "micro_batch"]
HOST_BOUND = [(4, 2, 1, 1, 2, 1, "none", 1), (1, 2, 1, 4, 4, 2, "selective", 1)]


def _request(tmp_path, text: str):
    path = tmp_path / "base.toml"
    path.write_text(text)
    return inputs.request(str(path), None, None, None, None, None, None, None)


@pytest.mark.parametrize("recompute, precision", [("none", "bf16"), ("full", "bf16"), ("selective", "fp8")])
def test_planner_layer_compute_equals_the_layers_spans_on_one_rank(tmp_path, recompute, precision):
    """Each kind's forward + backward + recompute seconds in the planner (and in its layer
    program) equal the compute spans of that layer's first micro-batch when one GPU runs
    the whole model (embedding, a dense and an MoE layer, an MTP depth, the output)."""
    req = _request(tmp_path, ONE_GPU_MOE.format(recompute=recompute, precision=precision))
    est = Estimator(req.scenario, Stages(req.scenario), req.spec, req.gpu)
    planned = est._layer_costs(1, 1, 1, recompute, False, 1, 1)[:, :len(FIELDS)]
    spans = sim.simulate(sim.load_scenario(tmp_path / "base.toml")).spans  # (the request drops recompute)
    spans = spans[(spans.category == "compute") & (spans.micro_batch == 0)]
    # Transformer Engine's amax reduction closes a model chunk, not a layer: its kernels carry the
    # chunk's first layer as their key, and the planner prices them per chunk (tests/test_amax.py)
    spans = spans[~spans.name.isin((amax.CAT, amax.UPDATE))]
    d = est.d
    for kind, layer in zip(KINDS, (0, d.dense_layers, -1, d.layers, d.layers + 1)):
        simulated = float((spans.end_s - spans.start_s)[spans.layer == layer].sum())
        row = planned[KINDS.index(kind)]
        assert simulated > 0 and row[:3].sum() == pytest.approx(simulated, rel=1e-9), kind
    assert planned[KINDS.index("mtp"), 0] > planned[KINDS.index("moe"), 0]  # the MTP head's own work


@pytest.mark.parametrize("text, keys, layouts", [(DENSE, DENSE_KEYS, DENSE_LAYOUTS),
                                                  (MOE_MTP, MOE_KEYS, MOE_LAYOUTS)], ids=["dense", "moe-mtp"])
def test_planner_estimate_is_within_15_percent_and_ranks_as_the_simulation(tmp_path, text, keys, layouts):
    """Small layouts on 8 and 16 GPUs, within :data:`STEP_TOLERANCE`. Fails if a cost is lost or
    inflated: e.g. recompute x 9 in sim/plan/layers.py ``cost`` (full-recompute layouts 2.4-2.6x
    the simulated step)."""
    req = _request(tmp_path, text)
    stages = Stages(req.scenario)
    c = space.enumerate_layouts(space.Space(req.gpus, req.spec.gpus_per_domain, stages.dims.layers,
                                            req.scenario.training.seq_len, stages.dims.experts))
    c = c[rules.codes(c, rules.fixed_of(req.scenario)) == 0]
    plain = c[(c.virtual_stages == 1) & (c.schedule == "1f1b")]
    if "ep_comm_overlap" not in keys:
        plain = plain[(plain.zero == 0) & ~plain.ep_comm_overlap.astype(bool)]
    pick = plain.set_index(keys).loc[layouts].reset_index()
    estimate = Estimator(req.scenario, stages, req.spec, req.gpu).frame(pick)["estimate_s"].to_numpy()
    simulated = np.array([sim.simulate(scenario_from_dict(req.data, space.overrides(row))).summary["step_time_s"]
                          for row in pick.to_dict("records")])
    error = estimate / simulated - 1
    assert np.abs(error).max() <= STEP_TOLERANCE, dict(zip(layouts, error.round(3)))
    assert list(np.argsort(estimate)) == list(np.argsort(simulated)), (estimate, simulated)


def test_host_bound_pipelines_pay_the_schedules_host_work(tmp_path):
    """Interleaved pipelines whose hosts are behind their GPUs: the estimate charges each
    stage's host the schedule's Python per pass and the pipeline's send/recv calls
    (``layer_program.schedule_host_s``) and is within 3% of the simulation; leaving them out
    (``Estimator._schedule_host`` returning zeros) puts it 5-11% low."""
    req = _request(tmp_path, DENSE)
    stages = Stages(req.scenario)
    c = space.enumerate_layouts(space.Space.of(req, stages.dims))
    c = c[(rules.codes(c, rules.fixed_of(req.scenario)) == 0) & (c.schedule == "interleaved") & ~c.tp_comm_overlap]
    pick = c.set_index(HOST_BOUND_KEYS).loc[HOST_BOUND].reset_index()
    frame = Estimator(req.scenario, stages, req.spec, req.gpu).frame(pick)
    simulated = np.array([sim.simulate(scenario_from_dict(req.data, space.overrides(row))).summary["step_time_s"]
                          for row in pick.to_dict("records")])
    assert (frame["est_host_s"].to_numpy() > 0.1 * simulated).all()  # host-bound
    error = frame["estimate_s"].to_numpy() / simulated - 1
    assert np.abs(error).max() <= STEP_TOLERANCE, error


def test_layers_without_experts_build_the_same_program_without_the_expert_mesh(tmp_path):
    """The planner builds dense, embedding, output layers with ep = 1 (sim/plan/estimate.py
    ``_programs``): their programs do not depend on the expert mesh."""
    req = _request(tmp_path, ONE_GPU_MOE.format(recompute="selective", precision="bf16").replace("gpus = 1", "gpus = 8"))
    s = req.scenario
    one, two = (s.model_copy(update={"parallel": s.parallel.model_copy(update=dict(tp=2, dp=4, ep=ep,
                                                                                   sequence_parallel=True))})
                for ep in (1, 4))
    kinds = (layer_program.Kind.DENSE, layer_program.Kind.EMBEDDING, layer_program.Kind.OUTPUT)
    a, b = (layer_program.programs(x, req.gpu, kinds=kinds) for x in (one, two))
    assert a == b and set(a) == set(kinds)


def test_an_op_added_to_the_builder_reaches_the_census_the_estimate_and_the_cost(tmp_path, monkeypatch):
    """One definition: a host-side op (~0.3 ms) added before every attention in the builder
    alone shows up in the census's op count (still equal to the built programs'), in the
    planner's per-layer forward compute and in its cost predictor's op counts."""
    from collections import OrderedDict

    from sim.model.compute import elementwise
    from sim.parallel import census, passes, workload

    req = _request(tmp_path, ONE_GPU_MOE.format(recompute="none", precision="bf16"))
    s = sim.load_scenario(tmp_path / "base.toml")

    def measure():
        monkeypatch.setattr(layer_program, "_CACHE", OrderedDict())  # (cached by content, not by code)
        est = Estimator(req.scenario, Stages(req.scenario), req.spec, req.gpu)
        row = est._layer_costs(1, 1, 1, "none", False, 1, 1)
        built = len(workload.build_rank(layer_program.context(s, req.gpu), 0).program.ops)
        return census.ops_per_rank(s), built, row[KINDS.index("dense")], est.compute

    ops, built, dense, compute = measure()
    real = passes.attention_forward
    host = elementwise(1e9)
    monkeypatch.setattr(passes, "attention_forward",
                        lambda b, layer, mb, x, tag: real(b, layer, mb, b.compute("host", [host], x, layer, mb), tag))
    ops2, built2, dense2, _ = measure()
    blocks, micro = 4, 2  # 3 layers and 1 MTP depth; 2 micro-batches
    assert ops == built and ops2 == built2 == ops + blocks * micro
    assert dense2[0] == pytest.approx(dense[0] + compute.time([host]), rel=1e-12)  # forward compute
    assert dense2[COUNTS_AT] == dense[COUNTS_AT] + 1  # the cost predictor's op count


def test_a_published_layouts_own_layer_split_is_estimated(tmp_path):
    """``sim.plan.published.estimate_of`` prices a scenario's own ``stage_layers`` (the
    published DeepSeek-V3 layout moves a layer off its last stage, which also holds the
    output and MTP layers): pp 4 with 1/5/1/1 layers is estimated within 15% of its
    simulation; the default 2/2/2/2 split, which :class:`Stages` gave it before, misses it."""
    text = DENSE + "[parallel]\npp = 4\ndp = 2\nstage_layers = [1, 5, 1, 1]\n"
    req = _request(tmp_path, text)
    s = sim.load_scenario(tmp_path / "base.toml")
    simulated = sim.simulate(s).summary["step_time_s"]
    estimate = float(estimate_of(req, s)["estimate_s"].iat[0])
    assert estimate / simulated - 1 == pytest.approx(0.0, abs=TOLERANCE), (estimate, simulated)
    default = s.model_copy(update={"parallel": s.parallel.model_copy(update={"stage_layers": None})})
    assert float(estimate_of(req, default)["estimate_s"].iat[0]) / simulated - 1 < -TOLERANCE


def _host_cycle(sync: bool) -> tuple[float, float]:
    """A stage of a dense layer (a 100 us op issued in 10 us: it gives the host a 90 us lead)
    and an MoE layer (5 us issued in 20, a read of GPU values issued in 1, 5 us issued in 30),
    forward only: (the engine's step per micro-batch in a steady state, the planner's: the GPU's
    time plus :func:`sim.plan.layers.stage_waits`)."""
    from sim.engine.core import Engine
    from sim.engine.ops import Op, RankProgram
    from sim.parallel.layer_program import Kind, LayerOp, LayerProgram, Phase
    from sim.plan.layers import PASS_FIELDS, passes, stage_waits
    from tests.conftest import spec_topology

    us = 1e-6
    layers = {Kind.DENSE: [(100 * us, 10 * us, False)],
              Kind.MOE: [(5 * us, 20 * us, False), (0.0, 1 * us, sync), (5 * us, 30 * us, False)]}
    cycles, ops = 6, []
    for _ in range(cycles):
        for kind in (Kind.DENSE, Kind.MOE):
            ops += [Op("op", "compute", "compute", d, None, (len(ops) - 1,) if ops else (), issue=i, sync=y)
                    for d, i, y in layers[kind]]
    engine = Engine(spec_topology(8), [RankProgram(0, ops)])
    engine.run()
    ends = engine.times[0].end
    per = len(ops) // cycles
    simulated = ends[-1] - ends[-1 - per]
    parts = {f: np.zeros((1, len(KINDS))) for f in PASS_FIELDS}
    for kind, spec in layers.items():
        lp = LayerProgram(kind, 0, 0, tuple(LayerOp("compute", "compute", d, (j - 1,) if j else (), Phase.FORWARD,
                                                    issue=i, sync=y) for j, (d, i, y) in enumerate(spec)))
        for f, v in passes(lp, lambda c: 0.0).items():
            parts[f][0, KINDS.index(kind.value)] = v
    counts = np.array([[1 if k in ("dense", "moe") else 0 for k in KINDS]])
    gpu = sum(d for spec in layers.values() for d, _i, _y in spec)
    return simulated, gpu + stage_waits(counts, parts, np.zeros(1))[0, 0]


def test_a_sync_op_costs_the_host_its_lead_as_in_the_engine():
    """The host waits at a sync op for the GPU, so the lead the dense layer gave it is lost:
    after the read it issues the last op (30 us) and the next dense op (10 us) with the GPU
    idle, 100 + 5 + 30 + 10 = 145 us a micro-batch. Without the sync the host (61 us) runs
    ahead and the GPU's 110 us is the step. (A per-layer sum of issue less GPU time says 110
    for both: it let the dense layer's lead pay for the MoE layer's issue.)"""
    us = 1e-6
    simulated, planned = _host_cycle(sync=True)
    assert simulated == pytest.approx(145 * us, rel=1e-9) and planned == pytest.approx(simulated, rel=1e-9)
    simulated, planned = _host_cycle(sync=False)
    assert simulated == pytest.approx(110 * us, rel=1e-9) and planned == pytest.approx(simulated, rel=1e-9)


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1), ("dualpipe", 1),
                                         ("dualpipev", 2)])
def test_the_schedules_host_work_the_planner_reads_is_the_builders(tmp_path, monkeypatch, schedule, v):
    """``layer_program.schedule_host_s`` (what the estimate charges each stage's host per
    micro-batch beside its layers) counts the passes and pipeline calls the builder issues on
    every stage of pp 4: the send/recv ops of each stage's built program, each issued at a c10d
    call (DualPipe's once-a-step gradient all-reduce of its two copies is left out), and one
    SCHEDULE_PASS_S per pass (set to 1 s here, so the program's issue grows by 1 s
    a pass)."""
    from sim.collectives.kinds import SEND_RECV
    from sim.engine.kinds import Category
    from sim.model import host
    from sim.parallel import pp as pipeline, workload

    (tmp_path / "base.toml").write_text(DENSE + f'[parallel]\npp = 4\ndp = 2\nschedule = "{schedule}"\n'
                                                f"virtual_stages = {v}\n")
    s = sim.load_scenario(tmp_path / "base.toml")
    m = s.training.global_batch // s.parallel.dp

    def built(stage: int, pass_s: float):
        monkeypatch.setattr(host, "SCHEDULE_PASS_S", pass_s)
        ctx = layer_program.context(s, "h100-sxm")
        return workload.build_rank(ctx, ctx.layout.rank(tp=0, cp=0, dp=0, pp=stage)).program.ops

    for stage in range(4):
        plain, marked = built(stage, 0.0), built(stage, 1.0)
        passes = round(sum(op.issue for op in marked) - sum(op.issue for op in plain))
        sends = [op for op in plain if op.category == Category.PP and op.name.startswith(("send_", "recv_"))]
        assert all(op.issue == host.collective_issue_s(SEND_RECV) for op in sends)
        assert pipeline.issued(s.parallel.schedule, 4, v, m, stage) == (passes, len(sends)), stage
        monkeypatch.setattr(host, "SCHEDULE_PASS_S", 80e-6)
        seconds = layer_program.schedule_host_s(s.parallel.schedule, 4, v, m, stage)
        assert seconds * m == pytest.approx(passes * 80e-6 + len(sends) * host.collective_issue_s(SEND_RECV), rel=1e-12)
        assert seconds <= layer_program.schedule_host_bound_s(4, v)  # (the estimate skips stages it cannot reach)
