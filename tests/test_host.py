"""The host (sim/model/host.py, sim/engine/core.py release times): closed forms of a chain of
ops issued by one host thread, CUDA graphs and torch.compile changing what is issued, the
host track of the outputs, the planner's host term, bad values of the new keys.

A chain of N ops on one stream, op i taking d seconds of GPU time and h of host time to issue,
ends at max(end_(i-1), (i + 1) h) + d: host-bound (h >= d) the step is N h + d, GPU-bound
(d >= h) it is h + N d -- the host costs only the first op's issue.
Run ``python -m pytest -q tests/test_host.py``.
"""

import json

import pytest

from conftest import REPO, spec_topology
from forked_cli import run_cli
from sim.engine.core import Engine
from sim.engine.ops import Op, RankProgram
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.model.compute import LAUNCH_S, ComputeModel, Kernel, elementwise, gemm
from sim.hardware.gpus import gpu_preset
from sim.step import build, build_topology, simulate

TOPO = spec_topology(8)
MODEL = ComputeModel(gpu_preset("h100-sxm"))
N = 12  # ops in the chain


def _chain(kernels: list[Kernel], n: int = N, issued: bool = True) -> float:
    """Step time of ``n`` ops of ``kernels`` on one stream of one rank, issued by the host
    (``issued``) or released at t = 0."""
    op = Op("op", "compute", "compute", MODEL.time(kernels), issue=host.issue_s(kernels) if issued else 0.0)
    engine = Engine(TOPO, [RankProgram(0, [op] * n)])
    engine.run()
    return engine.times[0].end[-1]


def _layout(flops: float, pieces: int) -> list[Kernel]:
    """The same FLOPs as ``pieces`` GEMM kernels (large: no size effect on efficiency)."""
    return [Kernel(flops / pieces, 1e9)] * pieces


def test_four_times_the_kernels_host_bound_costs_exactly_its_issue_time():
    """Host-bound (tiny GEMMs): step = N h + d, so the layout with 4x the kernels is slower
    by exactly N (h4 - h1) plus its last op's extra GPU launches."""
    one, four = _layout(1e9, 1), _layout(1e9, 4)
    h1, h4, d1, d4 = host.issue_s(one), host.issue_s(four), MODEL.time(one), MODEL.time(four)
    assert h4 == pytest.approx(4 * h1) and h1 > d1 and h4 > d4  # host-bound
    assert _chain(one) == pytest.approx(N * h1 + d1, abs=1e-15)
    assert _chain(four) == pytest.approx(N * h4 + d4, abs=1e-15)
    assert _chain(four) - _chain(one) == pytest.approx(N * (h4 - h1) + 3 * LAUNCH_S, abs=1e-15)


def test_four_times_the_kernels_gpu_bound_unchanged_by_the_host():
    """GPU-bound (large GEMMs): the host adds only the first op's issue; the 4x layout
    differs from the 1x one by its GPU-side launches alone, as without any host."""
    one, four = _layout(1e13, 1), _layout(1e13, 4)
    for kernels in (one, four):
        assert MODEL.time(kernels) > host.issue_s(kernels)  # GPU-bound
        assert _chain(kernels) == pytest.approx(host.issue_s(kernels) + _chain(kernels, issued=False), abs=1e-15)
    assert _chain(four, issued=False) - _chain(one, issued=False) == pytest.approx(N * 3 * LAUNCH_S, rel=1e-9)


def test_compile_fuses_runs_of_memory_bound_kernels():
    """Each run of consecutive memory-bound kernels becomes one launch: 6 launches (the
    count-2 kernel counts twice) -> 4; GPU time down by exactly the 2 launches saved."""
    g = gemm(4096, 4096, 4096)
    kernels = [g, elementwise(1e6), elementwise(2e6, count=2), g, elementwise(3e6)]
    fused = host.fused(kernels)
    assert host.launches(kernels) == 6 and host.launches(fused) == 4
    assert fused[1].bytes == 3e6 and fused[3] == elementwise(3e6)
    assert MODEL.time(kernels) - MODEL.time(fused) == pytest.approx(2 * LAUNCH_S, rel=1e-9)
    assert host.issue_s(kernels) - host.issue_s(fused) == pytest.approx(
        2 * (host.KERNEL_ISSUE_S + host.STEP_PYTHON_S), rel=1e-12)


PROBE = {"name": "host-probe", "model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 32000},
         "training": {"seq_len": 512, "global_batch": 16, "micro_batch": 1},
         "cluster": {"gpus": 8, "topology": "dgx-h100"}, "parallel": {"tp": 1, "pp": 1, "dp": 8}}


def _probe(**training):
    d = json.loads(json.dumps(PROBE))
    d["training"].update(training)
    return scenario_from_dict(d)


def _program(s) -> RankProgram:
    return build(s, build_topology(s))[1][0]


def test_cuda_graphs_remove_the_per_kernel_issue_of_captured_layers():
    """Every op of a dense transformer layer's pieces issues with its region's one graph
    launch: the program's host time drops by exactly the captured ops' issue less one
    GRAPH_LAUNCH_S per region (2 pieces x 2 directions x 4 layers x 2 micro-batches)."""
    eager, graphed = _program(_probe()), _program(_probe(cuda_graphs=True))
    blocks = set(range(4))  # the transformer layers' ids (-1: the embedding, 4: the output)
    captured = [i for i, op in enumerate(eager.ops) if op.layer in blocks and op.comm is None]
    assert [op.duration for op in eager.ops] == [op.duration for op in graphed.ops]  # the GPU side is the same
    regions = 2 * 2 * 4 * 2
    saved = sum(eager.ops[i].issue for i in captured) - regions * host.GRAPH_LAUNCH_S
    assert sum(op.issue for op in eager.ops) - sum(op.issue for op in graphed.ops) == pytest.approx(saved, rel=1e-12)
    assert sum(1 for i in captured if graphed.ops[i].issue > 0) == regions
    assert graphed.release()[-1] < eager.release()[-1]


def test_host_spans_and_waits_and_deterministic():
    """The host-bound probe: host spans cover the issue of every pass in order, the report
    says host-bound, the summary is byte-identical twice, and no metric counts the host."""
    from sim.outputs.host import report_lines, spans, waits

    a, b = simulate(_probe()), simulate(_probe())
    same = lambda r: json.dumps({k: v for k, v in r.summary.items() if k != "sim_wall_s"}, sort_keys=True)
    assert same(a) == same(b)
    prog = a.facts.programs[0]
    hs = spans(a.facts.programs)
    assert hs.start_s.iloc[0] == 0.0 and hs.end_s.iloc[-1] == pytest.approx(prog.release()[-1])
    assert (hs.start_s.to_numpy()[1:] >= hs.end_s.to_numpy()[:-1] - 1e-15).all()
    assert "host" not in set(a.spans.category)
    assert waits(a.spans, a.facts.programs)[0] > 0
    assert report_lines(a)[0].startswith("host: host-bound")


def test_planner_layer_cost_includes_the_host():
    """The planner's layer cost (sim/plan/layers.py) reads the builder's issue costs: the
    probe's dense layer, host-bound, costs exactly its issue time per micro-batch (the host
    runs ahead across layers, so a layer's last op runs while the next one is issued)."""
    from sim.parallel import layer_program
    from sim.plan.layers import cost

    lp = layer_program.programs(_probe(), "h100-sxm")[layer_program.Kind.DENSE]
    c = cost(lp, lambda coll: 0.0)
    assert lp.issue_s > c.forward + c.backward
    assert c.forward + c.backward + c.host == pytest.approx(lp.issue_s, rel=1e-9)


@pytest.mark.parametrize("key", ["training.cuda_graphs", "training.compile"])
def test_bad_values_exit_2_naming_the_key(key):
    """``clustersim run`` in a forked child (tests/forked_cli.py): exit 2, one line naming the key."""
    out = run_cli(["run", str(REPO / "scenarios/llama3-8b-fsdp-h100.toml"), "--set", f"{key}=3"])
    assert out.code == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert key in out.stderr and "Traceback" not in out.stderr


def test_compile_saves_the_same_launches_on_host_and_gpu():
    """torch.compile on the probe: every launch fused away saves exactly KERNEL_ISSUE_S (and
    the step's Python around it, STEP_PYTHON_S) of host time and LAUNCH_S of GPU time; the
    optimizer (not compiled) is unchanged."""
    eager, compiled = _program(_probe()), _program(_probe(compile=True))
    saved = (sum(op.issue for op in eager.ops) - sum(op.issue for op in compiled.ops)) / (
        host.KERNEL_ISSUE_S + host.STEP_PYTHON_S)
    assert saved > 10 and saved == pytest.approx(round(saved), abs=1e-6)
    gpu = sum(op.duration for op in eager.ops) - sum(op.duration for op in compiled.ops)
    assert gpu == pytest.approx(round(saved) * LAUNCH_S, rel=1e-6)
    optimizer = [[op for op in prog.ops if op.name == "optimizer"] for prog in (eager, compiled)]
    assert len(optimizer[0]) == 1 and optimizer[0] == optimizer[1]
