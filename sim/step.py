"""One training step: ``simulate(scenario) -> Result`` (exposed as ``sim.simulate``):
topology -> rank programs -> engine -> spans -> summary. :func:`build_topology`,
:func:`build` and :func:`execute` are that pipeline's stages; the shared fabric
(:mod:`sim.fabric.shared`) and the RL trainer (:mod:`sim.rl.trainer`) call them too, their
differences as parameters (NVLink domains of a job placed on other GPUs, an op added to a
program before it runs).

Run ``clustersim run scenarios/llama3-8b-fsdp-h100.toml`` to see it end to end.
"""

import ctypes
import time

import pandas as pd

from . import collectives
from . import work
from .hardware import topology
from .parallel import workload
from .engine.core import Engine, cycle_collector_paused
from .engine.ops import RankProgram
from .errors import InputError, SimulationError
from .hardware.gpus import gpu_preset
from .parallel.memory import peak_memory
from .outputs import invariants
from .outputs.metrics import summarize
from .outputs.result import Result, StepFacts, spans_frame
from .hardware.faults import compute_scale, perturbed, straggler_slowdowns
from .input.load import clean_copy, topology_spec
from .input.choices import JitterMode, MicroBatches
from .input.scenario import Scenario
from .parallel.steady import exact_copy
from .parallel.program import Context


def build_topology(s: Scenario) -> topology.Topology:
    """The cluster's graph with overrides and link faults applied."""
    spec = topology_spec(s)
    return topology.build(spec, s.cluster.gpus, gpu_preset(s.cluster.gpu or spec.gpu), "cluster", s.cluster.faults,
                          s.cluster.calibration)


def simulate(s: Scenario, baseline: bool = True, e_max: float | None = None,
             record_links: bool = False, force: bool = False, estimate: "work.Work | None" = None,
             topo: topology.Topology | None = None) -> Result:
    """Simulate one optimizer step. When stragglers, jitter or faults are configured and
    ``baseline`` is true, also simulate without them for ``straggler_cost_s``.
    ``record_links`` keeps every rate change of every transfer (``facts.link_log``, see
    ``Network.log``) for the link-utilization tracks of a trace; off by default (memory on
    huge runs). Unless ``force``, a scenario past the work budget is refused first
    (:func:`sim.work.check`: InputError naming the key that drives the cost) and a run
    past 20x its estimate of CPU is stopped (:func:`sim.work.watchdog`). The summary is
    checked (:mod:`sim.outputs.invariants`) before it is returned: an impossible one, or
    a simulation that stops making progress, is a SimulationError naming the scenario.
    Under ``[simulation] micro_batches = "steady"`` the step is extrapolated from a few
    micro-batch counts (:mod:`sim.steady`), or simulated exactly where it cannot be.
    ``topo``: :func:`build_topology`'s graph of this scenario's cluster, built before (the
    planner's workers reuse one across the candidates of a cluster: its caches of paths are
    pure functions of it, as the clean baseline's reuse below relies on)."""
    if s.rl is not None:
        raise InputError("rl", "an [rl] scenario runs with `clustersim rl` (its [parallel] is the trainer pool)")
    limit = None if force else work.watchdog_seconds(estimate or work.check(s))  # (estimate: checked by the caller)
    if s.simulation.micro_batches is not MicroBatches.STEADY:
        with work.watchdog(s.name, limit):
            return _simulate(s, baseline, e_max, record_links, topo)
    from . import steady  # a few micro-batch counts, extrapolated; the exact step if not linear

    if limit is not None:  # (the exact step may run after the steady runs: the watchdog allows for both)
        limit += work.watchdog_seconds(work.estimate(exact_copy(s)))
    with work.watchdog(s.name, limit):
        return steady.simulate(s, lambda each, clean: _simulate(each, clean, e_max, record_links, topo), baseline,
                               None if force else work.check)


def build(s: Scenario, topo: topology.Topology, e_max: float | None = None, domains: list[int] | None = None,
          check: bool = True) -> tuple[Context, list[RankProgram]]:
    """The context and the simulated ranks' programs of ``s`` on ``topo``. ``domains``:
    the NVLink domain of each of its ranks (default: rank i runs on GPU i). Unless
    ``check`` is off (a caller that moves the programs checks them where they land), a
    ``dp_algo`` that needs the fabric (NVLS, SHARP, PAT) must be one this cluster runs."""
    with cycle_collector_paused():  # (building a 131k-GPU graph and programs allocates millions of objects)
        ctx = workload.make_context(s, [int(d) for d in topo.domains] if domains is None else domains,
                                    s.cluster.gpu or topo.spec.gpu, e_max, topo.spec)
        programs = workload.build_programs(ctx)
    if check and s.parallel.dp_algo in collectives.NEEDS_FABRIC:
        collectives.check_programs(programs, topo, "parallel.dp_algo")
    return ctx, programs


def execute(name: str, topo: topology.Topology, programs: list[RankProgram], scale=None, arrivals=None,
            record_links: bool = False) -> tuple[Engine, pd.DataFrame, float]:
    """Run ``programs`` on ``topo``: (engine, spans, wall seconds). ``scale``: compute
    slowdowns (stragglers); ``arrivals``: when folded members of a group arrive (sampled
    jitter: ``Folding.arrivals``); ``record_links``: keep the network's rate log. A run that
    fails (a deadlock, a stalled transfer) is a SimulationError naming ``name``."""
    engine = Engine(topo, programs, scale, arrivals)
    if record_links:
        engine.net.log = []
    t0 = time.perf_counter()
    try:
        engine.run()
    except RuntimeError as exc:  # a deadlock, a stalled transfer (SimulationError), a recursion
        raise SimulationError(f"scenario {name!r}: {type(exc).__name__}: {exc}") from exc
    trim_freed_memory()  # (what the run freed goes back before the spans table is built)
    spans = spans_frame(engine, release=True)  # (the times go once the frame's columns hold them)
    return engine, spans, time.perf_counter() - t0


def trim_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim(0)``; nothing
    elsewhere). An engine run frees millions of small objects that the heap keeps; the spans
    table's large arrays are mapped apart from it. On bench/step.py's ``405b-1k`` case
    (``python bench/trim_memory.py trim skip skip trim trim``, 2 cores under load) this call
    takes the RSS from 1.105 to 1.035 GB (0.070 GB back), but the run's peak, reached later,
    is 1.439, 1.442 and 1.426 GB with it against 1.468 and 1.426 GB without: ~0.01 GB lower
    on average, inside the spread of runs."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc: its heap is left as it is
        pass


def _simulate(s: Scenario, baseline: bool, e_max: float | None, record_links: bool,
              topo: topology.Topology | None = None) -> Result:
    """:func:`simulate` with the cycle collector paused throughout: its full passes over the
    millions of ops built would find almost nothing (see ``cycle_collector_paused``) and
    took ~8% of a 16k-GPU interleaved run between the engine's own pauses (Engine setup,
    spans, the clean baseline)."""
    with cycle_collector_paused():
        return _simulate_paused(s, baseline, e_max, record_links, topo)


def _simulate_paused(s: Scenario, baseline: bool, e_max: float | None, record_links: bool,
                     topo: topology.Topology | None) -> Result:
    topo = build_topology(s) if topo is None else topo
    gpu_name = s.cluster.gpu or topo.spec.gpu
    gpu = gpu_preset(gpu_name)
    ctx, programs = build(s, topo, e_max)
    engine, spans, wall = execute(s.name, topo, programs, compute_scale(s, topo), ctx.folding.arrivals, record_links)
    memory = peak_memory(ctx)
    arrivals = ctx.folding.arrivals  # sampled jitter: the folded ranks' own end of step
    folded_end = arrivals.step_end(spans.groupby("rank").end_s.max()) if arrivals is not None else None
    summary = summarize(s, ctx, spans, memory, gpu.hbm_bytes, gpu.peak_flops, folded_end)
    summary.update(sim_events=engine.events, sim_wall_s=round(wall, 3))
    if s.jitter.sigma > 0:
        summary.update(jitter_summary(ctx))
    if s.variability.sigma > 0:  # the slowest GPU's factor on every FLOP (sim/hardware/variability.py)
        summary["gpu_variability_slowdown"] = ctx.compute.slowdown
    if baseline and perturbed(s):
        # the clean run on the same graph unless link faults changed it (stragglers and jitter
        # are compute: the spec, GPU count and calibration are the same, so is the graph; its
        # caches of paths are pure functions of it)
        clean = _simulate(clean_copy(s), False, e_max, False, None if s.cluster.faults else topo)
        summary["straggler_cost_s"] = summary["step_time_s"] - clean.summary["step_time_s"]
    slow = straggler_slowdowns(s, topo.spec.gpus_per_node, from_start=True)
    invariants.check(summary, invariants.compute_floor(programs, slow), s.name,
                     invariants.mfu_ceiling(gpu, s.training.precision))
    facts = StepFacts(topo, sorted(ctx.simulated), programs, ctx.layout, ctx.folding, gpu_name, ctx.micro_batches,
                      engine.net.bytes_by_link, engine.held_by, engine.arrived, engine.net.log)
    return Result(summary, spans, s, memory, facts)


def jitter_summary(ctx) -> dict:
    """Which jitter mode ran (sim/parallel/jitter.py): every rank exact, or a sample."""
    sample = ctx.folding.sample
    if sample is None:
        return {"jitter_mode": JitterMode.EXACT.value}  # (the summary holds plain values)
    return {"jitter_mode": JitterMode.SAMPLED.value, "jitter_sampled_replicas": sample["replicas"],
            "jitter_replicas": sample["of"], "jitter_sampled_ranks": sample["ranks"]}
