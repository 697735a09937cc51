"""Steady-state mode (``[simulation] micro_batches = "steady"``, ``clustersim run --steady``):
simulate a step at three small micro-batch counts, check that it is linear in them, and
extrapolate to the scenario's own count.

A pipeline's micro-batches run identical work (sim/parallel/steady.py says which scenarios
qualify and which counts run), so once the pipeline has filled, each further micro-batch
adds the same time, bytes and idle to the step. Each additive quantity ``q`` of the summary
(step time, mean idle per rank, exposed communication of the critical rank, bytes sent per
GPU and axis, ``straggler_cost_s``, each simulated rank's compute time) is simulated at
``m0 < m0 + u < m0 + 2u`` micro-batches; its second difference ``q(m0) - 2 q(m0 + u) +
q(m0 + 2u)`` must be at most :data:`TOLERANCE` of the largest run's step time (bytes: of the
largest run's bytes on that axis), and ``q(M)`` is then the line through the last two (a
window that fails is followed by one twice as far in while the counts tried stay fewer than
the step's: :meth:`sim.parallel.steady.Counts.windows`). What
is not additive comes from the real scenario: FLOPs, tokens and MFU from the extrapolated
step time, peak memory from the real count (:func:`sim.parallel.memory.peak_memory`: the
schedule's micro-batches in flight). A step that is not linear, or a scenario that does not
qualify, runs exactly instead, and its summary says why (``steady_fallback``).

The summary adds ``micro_batches`` (the scenario's, per pipeline), ``micro_batches_simulated``
(the counts that ran), ``extrapolated`` and ``steady_residual`` (the largest second
difference found, relative as above); ``sim_events`` and ``sim_wall_s`` are the sums over the
runs made. Spans, trace and timeline are the largest simulated run's (``Result.shown``
carries its own summary, whose ``steady_shown`` says so): they never stand for the whole step.

Run: ``clustersim run scenarios/gpt3-175b-ptd.toml --steady --json``.
"""

import dataclasses
from dataclasses import dataclass

from .hardware.faults import straggler_slowdowns
from .hardware.gpus import gpu_preset
from .engine.kinds import COMM_AXES
from .model import transformer as model_costs
from .outputs import invariants
from .outputs.metrics import memory_fields, throughput
from .outputs.result import Result
from .parallel import layer_program
from .parallel.memory import peak_memory
from .parallel.steady import at, counts, exact_copy, micro_batches
from .errors import InputError
from .input.scenario import Scenario

# Largest second difference accepted, relative to the largest run's step time (bytes: to its
# bytes on that axis). Measured on the tests' scenarios (tests/test_steady.py prints it): exactly
# periodic steps give 0 to ~1e-13 (float rounding of event times); 1e-9 leaves four orders of
# magnitude of margin to it and refuses any real change of shape (a transient, a crossover).
TOLERANCE = 1e-9


@dataclass(frozen=True)
class _Run:
    """The additive quantities of one simulated count."""

    m: int
    values: dict  # name -> value (seconds or bytes)
    busy: dict  # simulated rank -> compute seconds (its ops back to back, times its slowdown)


def simulate(s: Scenario, run, baseline: bool = True, check=None) -> Result:
    """The steady-state result of ``s``. ``run(scenario, baseline) -> Result`` simulates one
    scenario exactly (sim/step.py's pipeline); it is called at each count of
    :func:`sim.parallel.steady.counts`, or once on ``s`` itself when the scenario does not
    qualify or its step is not linear. ``check(scenario)``: the work budget (sim/work.py
    ``check``), applied to the exact step before it runs after a failed linearity test."""
    plan = counts(s)
    if not plan.eligible:
        return _exact(s, run, baseline, plan.reason, [])
    cost, reasons = [0, 0.0], []
    for window in plan.windows():
        runs = []
        for m in window:  # (only the last run's spans and programs are kept)
            last = run(at(s, m), baseline)
            runs.append(_quantities(last, m))
            cost = [cost[0] + last.summary["sim_events"], cost[1] + last.summary["sim_wall_s"]]
        residual, worst = _residual(runs)
        if residual <= TOLERANCE:
            return _extrapolated(s, last, runs, plan.real, residual, cost)
        reasons.append(f"{worst}'s second difference over {list(window)} is {residual:.1e} of the step")
    if reasons:
        reason = f"not linear in micro-batches: {'; '.join(reasons)} (> {TOLERANCE:g})"
        if check is not None:
            try:
                check(exact_copy(s))
            except InputError as exc:
                raise InputError(exc.key, f"the steady state failed ({reason}) and the exact step is too "
                                          f"costly: {exc.reason}") from None
        return _exact(s, run, baseline, reason, cost)
    return _exact(s, run, baseline, "no window of counts is smaller than the step", cost)


def _exact(s: Scenario, run, baseline: bool, reason: str, cost: list) -> Result:
    """The exact step of ``s``, its summary saying why it was not extrapolated; ``cost``:
    events and seconds of the steady runs tried before it (empty: none)."""
    result, m = run(s, baseline), micro_batches(s)
    result.summary.update(micro_batches=m, micro_batches_simulated=[m], extrapolated=False,
                          steady_fallback=reason)
    if cost:  # the steady runs were paid for too
        result.summary["sim_events"] += cost[0]
        result.summary["sim_wall_s"] = round(result.summary["sim_wall_s"] + cost[1], 3)
    return result


def _quantities(r: Result, m: int) -> _Run:
    """What adds up per micro-batch in one run's summary and programs."""
    s = r.summary
    values = {"step_time_s": s["step_time_s"], "idle_s": s["bubble_fraction"] * s["step_time_s"],
              "exposed_comm_s": s["exposed_comm_s"]}
    values.update({f"comm_bytes_per_gpu.{a}": s["comm_bytes_per_gpu"][a] for a in COMM_AXES})
    if "straggler_cost_s" in s:
        values["straggler_cost_s"] = s["straggler_cost_s"]
    slow = straggler_slowdowns(r.scenario, r.facts.topology.spec.gpus_per_node, from_start=True)
    busy = {prog.rank: invariants.compute_floor([prog], slow) for prog in r.facts.programs}
    return _Run(m, values, busy)


def _residual(runs: list[_Run]) -> tuple[float, str]:
    """The largest relative second difference over the quantities, and its name."""
    a, b, c = runs
    step = c.values["step_time_s"]
    worst, name = 0.0, ""
    pairs = [(k, a.values[k], b.values[k], c.values[k], c.values[k] if k.startswith("comm_bytes") else step)
             for k in c.values]
    pairs += [(f"rank {k} compute", a.busy[k], b.busy[k], c.busy[k], step) for k in c.busy]
    for key, qa, qb, qc, scale in pairs:
        d2 = abs(qa - 2 * qb + qc)
        rel = d2 / scale if scale > 0 else (0.0 if d2 == 0 else float("inf"))
        if rel > worst:
            worst, name = rel, key
    return worst, name


def _line(qb: float, qc: float, mb: int, mc: int, m: int) -> float:
    """The line through (mb, qb) and (mc, qc), at m."""
    return qc + (qc - qb) * (m - mc) / (mc - mb)


def _extrapolated(s: Scenario, last: Result, runs: list[_Run], real: int, residual: float, cost: list) -> Result:
    """The summary at ``real`` micro-batches from the last two runs; spans and facts of the last."""
    b, c = runs[1:]
    q = {k: _line(b.values[k], c.values[k], b.m, c.m, real) for k in c.values}
    step = q["step_time_s"]
    gpu = gpu_preset(last.facts.gpu)
    ctx = layer_program.context(s, last.facts.gpu, loads={})  # (memory reads no expert loads)
    memory = peak_memory(ctx)
    summary = dict(last.summary)
    summary.update(step_time_s=step, **throughput(s, model_costs.dims(s.model), step, gpu.peak_flops),
                   bubble_fraction=q["idle_s"] / step if s.parallel.pp > 1 else 0.0,
                   exposed_comm_s=q["exposed_comm_s"],
                   comm_bytes_per_gpu={a: q[f"comm_bytes_per_gpu.{a}"] for a in COMM_AXES},
                   **memory_fields(memory, gpu.hbm_bytes))
    if "straggler_cost_s" in q:
        summary["straggler_cost_s"] = q["straggler_cost_s"]
    summary.update(sim_events=cost[0], sim_wall_s=round(cost[1], 3),
                   micro_batches=real, micro_batches_simulated=[r.m for r in runs], extrapolated=True,
                   steady_residual=residual)
    floor = max(_line(b.busy[k], c.busy[k], b.m, c.m, real) for k in c.busy)
    invariants.check(summary, floor, s.name, invariants.mfu_ceiling(gpu, s.training.precision))
    shown = dataclasses.replace(last, summary={**last.summary, "steady_shown": shown_note(c.m, real)})
    return Result(summary, last.spans, s, memory, last.facts, shown=shown)


def shown_note(simulated: int, real: int) -> str:
    """What a trace or timeline of a steady run shows: one simulated run, not the whole step."""
    return (f"the {simulated}-micro-batch run of a steady-state estimate (the step has {real} "
            "micro-batches per pipeline; its summary is extrapolated)")
