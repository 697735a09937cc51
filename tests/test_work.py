"""The work estimate (sim/work.py, sim/parallel/census.py), the result invariants
(sim/outputs/invariants.py) and the network's progress guard.

Run: ``python -m pytest tests/test_work.py``
"""

import json
import signal

import numpy as np
import pytest
import simpy

import sim
from conftest import REPO, spec_topology
from forked_cli import run_cli
from sim import work
from sim.collectives.schedule import chains_phase
from sim.engine import maxmin, network
from sim.errors import InputError, SimulationError
from sim.studies import gallery
from sim.outputs import invariants
from sim.parallel import census, workload
from sim.step import build_topology, simulate

SMALL = ["gallery/fsdp-prefetch", "gallery/pipeline", "gpt-1.7b-ptd-interleaved-a100", "llama3-8b-fsdp-h100",
         "mixtral-small-ep-h100", "straggler-dp", "llama3-8b-cp-128k-h100"]
VARIANTS = [[], ["parallel.tp=2", "parallel.dp=32", "parallel.sequence_parallel=true"],
            ["training.recompute='selective'", "parallel.cp=4", "parallel.dp=16"],
            ["parallel.cp=4", "parallel.dp=16", "parallel.cp_impl='all_gather'"],
            ["training.recompute='full'", "parallel.zero=1"], ["parallel.pp=4", "parallel.dp=16"],
            ["parallel.tp=2", "parallel.dp=32", "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true"],
            ["parallel.tp=8", "parallel.dp=8", "parallel.sequence_parallel=true", "parallel.tp_comm_overlap=true"],
            ["parallel.tp=2", "parallel.dp=32", "parallel.sequence_parallel=true", "training.precision='fp8'"]]


def _path(name):
    if name.startswith("gallery/"):
        return gallery.SCENARIOS / f"{name[len('gallery/'):]}.toml"
    return REPO / "scenarios" / f"{name}.toml"


def _load(name, overrides=()):
    return sim.load_scenario(_path(name), list(overrides))


def _programs(s):
    topo = build_topology(s)
    ctx = workload.make_context(s, [int(d) for d in topo.domains], s.cluster.gpu or topo.spec.gpu, None, topo.spec)
    return workload.build_programs(ctx)


@pytest.mark.parametrize("name", SMALL)
def test_census_counts_the_ranks_and_exactly_the_ops_of_built_programs(name):
    for overrides in VARIANTS if name == "llama3-8b-fsdp-h100" else [[]]:
        s = _load(name, overrides)
        programs = _programs(s)
        assert census.simulated_ranks(s) == len(programs)
        assert census.ops_per_rank(s) == max(len(p.ops) for p in programs), overrides


MTP = ["model.mtp_layers=2"]
MOE_VARIANTS = [  # the MTP census bug (bound 305, built 353) and what layer programs must follow
    ("gallery/pipeline", MTP), ("gallery/pipeline", MTP + ["training.recompute='full'"]),
    ("gallery/pipeline", ["model.tied_embeddings=true"]),  # the first and last stages' embedding_grad_ar
    ("gallery/pipeline", ["parallel.defer_embedding_wgrad_compute=true", "parallel.wgrad_deferral_limit=3"]),
    ("gallery/pipeline", ["parallel.defer_embedding_wgrad_compute=true"]),  # (the drain: sim/parallel/wgrad_deferral.py)
    ("mixtral-small-ep-h100", MTP), ("mixtral-small-ep-h100", MTP + ["training.precision='fp8'"]),
    ("mixtral-small-ep-h100", ["model.moe.routing='token_choice'", "model.moe.skew=0.5"]),
    ("mixtral-small-ep-h100", ["parallel.tp=2", "parallel.dp=8", "parallel.sequence_parallel=true",
                               "parallel.expert_tp=1", "parallel.tp_comm_overlap=true"]),
    ("mixtral-small-ep-h100", MTP + ["parallel.ep_comm_overlap=true", "parallel.zero=3"]),
    ("mixtral-small-ep-h100", MTP + ["parallel.pp=2", "parallel.dp=8", "parallel.ep=4", "parallel.virtual_stages=2",
                                     "training.recompute='selective'"]),
    ("llama3-8b-fsdp-h100", ["training.precision='fp8'", "training.recompute='full'"]),
]


@pytest.mark.parametrize("name, overrides", MOE_VARIANTS)
def test_census_equals_built_programs_with_mtp_fp8_and_moe(name, overrides):
    s = _load(name, overrides)
    assert census.ops_per_rank(s) == _built_ops(s), overrides


@pytest.mark.parametrize("name, overrides", [v for v in MOE_VARIANTS if v[0] == "mixtral-small-ep-h100"])
def test_census_counts_the_all_to_alls_of_built_programs(name, overrides):
    """The work estimate's all-to-alls per rank: the busiest stage's expert-parallel
    all-to-alls, as built (MTP depths, EP overlap and interleaving included)."""
    s = _load(name, overrides)
    assert census.alltoalls(s) == max(sum(1 for op in p.ops if op.comm is not None and op.comm.op == "all_to_all")
                                      for p in _stage_programs(s)) > 0, overrides


def _stage_programs(s) -> list:
    """The builder's program of every stage's first rank (built without folding)."""
    from sim.parallel import layer_program

    ctx = layer_program.context(s, census.gpu_of(s))
    ranks = [ctx.layout.rank(tp=0, cp=0, dp=0, pp=stage) for stage in range(ctx.layout.sizes["pp"])]
    return [workload.build_rank(ctx, r).program for r in ranks]


def _built_ops(s) -> int:
    """Ops of the busiest rank: the builder's program of every stage's first rank (a layer's
    ops are the same on every rank of a stage; built without folding, which copies them)."""
    from sim.parallel import layer_program

    ctx = layer_program.context(s, census.gpu_of(s))
    ranks = [ctx.layout.rank(tp=0, cp=0, dp=0, pp=stage) for stage in range(ctx.layout.sizes["pp"])]
    return max(len(workload.build_rank(ctx, r).program.ops) for r in ranks)


BUNDLED = sorted(p for p in [*(REPO / "scenarios").glob("*.toml"), *gallery.SCENARIOS.glob("*.toml"),
                             *(REPO / "sim" / "studies" / "scenarios").glob("*.toml")] if "rl" not in p.stem)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem == "gpt3-175b-ptd" else p
                                  for p in BUNDLED], ids=lambda p: p.stem)  # (175B: 73k ops x 8 stages, 30 s)
def test_census_equals_built_programs_for_every_bundled_scenario(path):
    s = sim.load_scenario(path)
    assert census.ops_per_rank(s) == _built_ops(s)


@pytest.mark.parametrize("name, overrides", [
    ("llama3-8b-fsdp-h100", ["stragglers=[{ranks = [5], slowdown = 1.3}]"]),
    ("gpt-1.7b-ptd-interleaved-a100", ["stragglers=[{nodes = [1], slowdown = 1.2, start_s = 0.01}]"]),
    ("gpt-1.7b-ptd-interleaved-a100", ["cluster.faults=[{gpu_nic = 9, factor = 0.5}]"]),
    ("llama3-8b-fsdp-h100", ["cluster.faults=[{gpu_nic = 3, factor = 0.0}]"]),
    ("mixtral-small-ep-h100", ["model.moe.routing='token_choice'", "model.moe.skew=0.5"]),
    ("llama3-8b-fsdp-h100", ["jitter.sigma=0.05", "jitter.mode='sampled'", "jitter.sample_ranks=8"]),
])
def test_census_folds_perturbed_scenarios_as_the_run_does(name, overrides):
    """The census asks the workload's own folding (sim/parallel/folding.py, sim/parallel/
    jitter.py) on the topology spec, before anything is built: as many ranks as the run."""
    s = _load(name, overrides)
    assert census.simulated_ranks(s) == len(_programs(s)) < s.cluster.gpus


@pytest.mark.parametrize("overrides, key", [
    (["training.global_batch=10000000"], "training.global_batch"),
    (["cluster.nodes=125000", "parallel.dp=1000000", "training.global_batch=1000000"], "cluster.nodes"),
    (["cluster.topology='generic'", "cluster.topology_overrides.spines=2048", "cluster.topology_overrides.nodes_per_su=1",
      "cluster.nodes=1024", "parallel.dp=8192", "training.global_batch=8192"], "cluster.topology_overrides.spines"),
    (["model.moe={experts = 16384, top_k = 2, routing = 'expert_choice'}", "training.seq_len=1000000"],
     "training.seq_len"),
    (["model.layers=1024", "training.global_batch=65536"], "model.layers"),  # 32x typical depth, 16x batches
])
def test_past_the_budget_is_an_input_error_naming_the_key_that_drives_the_cost(overrides, key):
    s = _load("llama3-8b-fsdp-h100", overrides)
    with pytest.raises(InputError) as info:
        work.check(s)
    assert info.value.key == key and "--force" in info.value.reason


def test_a_refusal_the_other_parts_decide_counts_no_ops(monkeypatch):
    """1M tokens over 16k experts: the router scores alone are ~2,800 s, so the ops (whose
    count builds a rank's program of 3M expert kernels) are not counted; the same scenario
    with a budget the rest fits in counts them and refuses on the whole."""
    s = _load("llama3-8b-fsdp-h100", ["model.moe={experts = 16384, top_k = 2, routing = 'expert_choice'}",
                                       "training.seq_len=1000000"])
    rest = work.estimate(s, count_ops=False)
    assert not rest.counted and rest.ops == 0 and rest.seconds > work.BUDGET_S
    with monkeypatch.context() as m:
        m.setattr(census, "ops_per_rank", lambda _s: pytest.fail("ops counted"))
        with pytest.raises(InputError) as info:
            work.check(s)
    assert "ops not counted" in info.value.reason and info.value.key == "training.seq_len"
    whole = work.estimate(s)
    assert whole.counted and whole.ops > 0 and whole.seconds > rest.seconds
    with pytest.raises(InputError) as info:  # the rest fits; with the ops it does not
        work.check(s, budget_s=(rest.seconds + whole.seconds) / 2, budget_bytes=2 * whole.bytes)
    assert f"x {whole.ops:,} ops" in info.value.reason


def test_the_all_to_alls_memory_is_the_bounded_rate_memos_and_the_router_scores_a_peak_apart(monkeypatch):
    """Uneven all-to-alls cost CPU each, but their memory is the network's least recently used
    rate memos (sim/engine/maxmin.py), at most three of MEMO_BYTES; the router scores are held
    while the context is made, before the programs: the larger of the two peaks, not the sum."""
    few, many = work.alltoall_part(1_000, 256), work.alltoall_part(10_000_000, 256)
    assert many[0] == pytest.approx(10_000 * few[0]) and few[1] < many[1] == 3 * maxmin.MEMO_BYTES
    s = _load("mixtral-8x7b-ep-h100", ["model.moe.routing='token_choice'", "model.moe.experts=32",
                                        "parallel.ep=32"])
    assert census.routed_scores(s)[1] > 0 and census.alltoalls(s) > 0
    rest = work.estimate(s).bytes - work.BASE_BYTES  # the scores' peak is the smaller one here
    monkeypatch.setattr(work, "SCORE_BYTES", 0.0)
    assert work.estimate(s).bytes - work.BASE_BYTES == rest
    monkeypatch.setattr(work, "SCORE_BYTES", 10 * rest / census.routed_scores(s)[1])
    assert work.estimate(s).bytes - work.BASE_BYTES == pytest.approx(10 * rest)


def test_force_runs_past_the_budget(monkeypatch):
    s = _load("gallery/fsdp-prefetch")
    monkeypatch.setattr(work, "BUDGET_S", 1e-6)
    with pytest.raises(InputError):
        simulate(s)
    assert simulate(s, force=True).summary["step_time_s"] > 0


def test_bundled_scenarios_are_within_the_budget_and_estimated_above_their_ops():
    paths = [*(REPO / "scenarios").glob("*.toml"), *(REPO / "sim" / "studies").rglob("*.toml")]
    for path in sorted(p for p in paths if "rl" not in p.stem):
        w = work.check(sim.load_scenario(path))
        assert w.seconds < work.BUDGET_S / 4 and w.ops >= w.ranks


GOOD = {"step_time_s": 1.0, "mfu": 0.4, "tokens_per_s": 1e5, "tflops_per_gpu": 400.0, "memory_per_gpu_bytes": 5e10,
        "bubble_fraction": 0.1, "exposed_comm_s": 0.2, "comm_bytes_per_gpu": {"dp": 1e9, "tp": 0.0}}


@pytest.mark.parametrize("change, words", [
    ({"mfu": 2.28}, "mfu"), ({"mfu": 0.0}, "mfu"), ({"step_time_s": 1.7e100 * float("inf")}, "step_time_s"),
    ({"step_time_s": float("nan")}, "step_time_s"), ({"step_time_s": 0.5}, "compute-only floor"),
    ({"bubble_fraction": 1.5}, "bubble"), ({"exposed_comm_s": 2.0}, "exposed"),
    ({"comm_bytes_per_gpu": {"dp": -1.0}}, "comm_bytes"), ({"memory_per_gpu_bytes": float("inf")}, "memory"),
    ({"straggler_cost_s": float("nan")}, "straggler_cost"),
])
def test_impossible_summaries_are_caught(change, words):
    assert invariants.violations(GOOD, 0.9) == []
    found = invariants.violations({**GOOD, **change}, 0.9)
    assert found and words in found[0]


def test_mfu_bound_is_the_runs_own_peak():
    """MFU is relative to the BF16 peak under FP8 too, so an FP8 run may pass 1 (H100: up to
    1,979 / 989) but never its own peak; `validate --fit` simulates FP8 rows that high."""
    assert invariants.violations({**GOOD, "mfu": 1.05}, 0.9, mfu_max=1979 / 989) == []
    found = invariants.violations({**GOOD, "mfu": 2.01}, 0.9, mfu_max=1979 / 989)
    assert found and "mfu" in found[0]
    assert invariants.violations({**GOOD, "mfu": 1.05}, 0.9)  # BF16: bound 1


def test_compute_floor_counts_the_straggler_slowdown_and_the_step_respects_it():
    s = _load("straggler-dp")
    r = simulate(s)
    slow = invariants.compute_floor(r.facts.programs, {3: 1.5})
    assert slow > invariants.compute_floor(r.facts.programs, {}) and r.summary["step_time_s"] >= slow


def test_compute_floor_is_the_per_op_sum_of_compute_stream_compute_ops():
    """``invariants.compute_floor`` as a closed form, on programs with a collective on the compute
    stream, a compute op on another stream and a str stream name equal to the enum's: only
    compute ops on the compute stream count, each rank's sum exactly rounded, times its slowdown."""
    import math
    from sim.collectives.kinds import CollectiveOp
    from sim.engine.kinds import Category, StreamName
    from sim.engine.ops import Collective, Op, RankProgram
    call = Collective(("x", 0, 0), CollectiveOp.ALL_REDUCE, (0, 1), 8.0)
    one = RankProgram(0, [Op("a", Category.COMPUTE, StreamName.COMPUTE, 0.1), Op("b", Category.COMPUTE, "compute", 0.2),
                          Op("c", Category.TP, StreamName.COMPUTE, 5.0, call), Op("d", Category.COMPUTE, "other", 7.0),
                          Op("e", Category.COMPUTE, StreamName.COMPUTE, 1e-17)])
    two = RankProgram(1, [Op("a", Category.COMPUTE, StreamName.COMPUTE, 0.25)])
    per_op = {p.rank: math.fsum(op.duration for op in p.ops if op.comm is None and op.stream == StreamName.COMPUTE)
              for p in (one, two)}
    assert per_op[0] == math.fsum([0.1, 0.2, 1e-17])
    assert invariants.compute_floor([one, two], {}) == max(per_op.values())
    assert invariants.compute_floor([one, two], {1: 2.0}) == per_op[1] * 2.0
    assert invariants.compute_floor([], {}) == 0.0


def test_an_impossible_result_is_exit_1_and_never_printed(monkeypatch):
    import sim.step

    real = sim.step.summarize
    monkeypatch.setattr(sim.step, "summarize", lambda *a: {**real(*a), "mfu": 2.28})
    got = run_cli(["run", str(_path("gallery/fsdp-prefetch")), "--json"], timeout=120)
    assert got.code == 1 and got.stdout == ""
    assert "internal error" in got.stderr and "gallery-fsdp-prefetch" in got.stderr and "mfu = 2.28" in got.stderr
    monkeypatch.undo()
    assert json.loads(run_cli(["run", str(_path("gallery/fsdp-prefetch")), "--json"]).stdout)


def _alarm(seconds):
    def fail(*_):
        raise TimeoutError("the network spun instead of raising")
    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


def _big_transfers(start_s: float, nbytes: float):
    """Two overlapping ring phases on 8 GPUs, started late in simulated time."""
    topo = spec_topology(8)
    env = simpy.Environment(initial_time=start_s)
    net = network.Network(env, topo)
    ring = [[(i, (i + 1) % 8) for i in range(8)]]
    env.process(net.run(chains_phase(ring, np.array([nbytes]), 7)))
    env.process(net.run(chains_phase([[(0, 4), (4, 0)]], np.array([nbytes / 3]), 1)))
    return env, net


def test_huge_transfers_late_in_time_finish():
    """seq_len = 1e7 livelocked here: residues the float clock cannot resolve."""
    _alarm(60)
    try:
        for start in (0.0, 2.0**20 + 0.1234567, 3.3e6):
            env, _ = _big_transfers(start, 1e15)
            env.run()
            assert env.now > start
    finally:
        signal.alarm(0)


def test_a_network_that_makes_no_progress_raises_instead_of_spinning(monkeypatch):
    monkeypatch.setattr(network.Network, "_horizon", staticmethod(lambda act: 0.0))  # wake-ups never advance
    env, _ = _big_transfers(0.0, 1e12)
    _alarm(60)
    try:
        with pytest.raises(SimulationError, match="no progress"):
            env.run()
    finally:
        signal.alarm(0)


def test_a_run_far_past_its_estimate_is_stopped_as_an_internal_error(monkeypatch):
    """The watchdog: whatever keeps a run from ending, it ends as a SimulationError."""
    monkeypatch.setattr(work, "WATCHDOG_MIN_S", 0.05)
    monkeypatch.setattr(work, "WATCHDOG_FACTOR", 0.0)
    s = _load("gpt-1.7b-ptd-interleaved-a100")
    with pytest.raises(SimulationError, match="still simulating after"):
        simulate(s)
    assert simulate(s, force=True).summary["step_time_s"] > 0  # --force: no watchdog
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)  # the CPU deadline's timer is cleared (sim/work.py cpu_deadline)
