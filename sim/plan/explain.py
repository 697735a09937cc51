"""What limits a layout: the largest loss of its step, from the simulated spans when the
layout was simulated, else from the estimate's components.

A simulated layout's critical rank (:func:`sim.outputs.metrics.critical_rank`: the rank
held longest by its own compute and exposed communication) is broken down by
:func:`sim.outputs.metrics.rank_breakdown`: compute by phase, communication exposed per
axis (not under any compute), idle time (the pipeline bubble and waits). Its losses are
everything but forward and backward compute: idle ("bubble"), exposed TP / CP / EP / PP
/ DP communication, recomputation and the optimizer. The largest is what limits the
layout; under :data:`COMPUTE_BOUND` of the step it is "compute".

:func:`simulate_point` is what the sweep's workers run for the planner: the work budget's
check (:func:`sim.work.check`, once: its estimate is handed to the simulation, which would
otherwise count the ops again), the step, its summary and this breakdown as columns
(``crit.*``), so nothing but numbers crosses between processes. A point the work budget
refuses is an error row starting with :data:`REFUSED` (the driver counts it as a rejection); a
simulated row carries the CPU seconds the worker spent on it (:data:`CPU`), which
``clustersim plan --out``'s ``sim_cpu_s`` sets beside the predicted ``sim_cost_s``.
A worker keeps the last cluster's topology (:func:`sim.step.build_topology`: every candidate
of a search runs on the same cluster) and simulates the next point on it; its route caches
are pure functions of the graph (tests/test_plan_speed.py: the same rows as a fresh build).
"""

import time

from .. import work
from ..errors import InputError
from ..outputs.metrics import critical_rank, rank_breakdown, rank_times
from ..sweeps.pool import TIMEOUT_PREFIX, flatten, one_line

COMPUTE_BOUND = 0.05  # a loss below this share of the step does not limit it
LOSSES = (("bubble", "idle"), ("TP", "exposed_tp"), ("CP", "exposed_cp"), ("EP", "exposed_ep"),
          ("PP", "exposed_pp"), ("DP", "exposed_dp"), ("recompute", "compute_recompute"),
          ("optimizer", "compute_optimizer"))
_TOPOLOGY: dict = {}  # the cluster section's JSON -> its topology (one entry: this worker's last cluster)
# A point is stopped past this many seconds of its own CPU (it keeps its estimate): CPU, not wall, so a
# loaded machine does not stop points the cost predictor priced right (issue 28: at load 5-14, when the
# limit was the sweep's 60 s of wall, 10 of DeepSeek-V3's 32 picks stopped with ~10 s of CPU each, docs/plan.md).
POINT_CPU_S = 60.0
CPU = "plan.cpu_s"  # a simulated row's CPU seconds in its worker: the check, the step, this breakdown (what cost.py predicts)
REFUSED = "work budget: "  # an error row's prefix when sim.work.check refuses the point (not simulated)
ESTIMATED = {"bubble": "est_bubble_s", "TP": "est_tp_s", "CP": "est_cp_s", "EP": "est_ep_s", "PP": "est_pp_s",
             "DP": "est_dp_s", "recompute": "est_recompute_s", "optimizer": "est_optimizer_s"}


def simulate_point(scenario) -> tuple[dict | None, str | None]:
    """Simulate one layout: (summary + ``crit.*`` breakdown columns, None) or (None, error);
    a refusal of the work budget is (None, :data:`REFUSED` + why); a point past
    :data:`POINT_CPU_S` of CPU is stopped (None, the sweep's ``point-timeout:`` error: it keeps
    its estimate, and a resumed search runs it again)."""
    from .. import step

    start = time.process_time()
    try:
        estimate = work.check(scenario)
    except InputError as exc:
        return None, REFUSED + one_line(str(exc))
    try:
        with cpu_limit(POINT_CPU_S):
            result = step.simulate(scenario, estimate=estimate, topo=topology_of(scenario))
    except CpuLimit:
        _TOPOLOGY.clear()  # (stopped anywhere: the next point builds its cluster afresh)
        return None, f"{TIMEOUT_PREFIX} past {POINT_CPU_S:g} s of CPU; stopped"
    except InputError as exc:
        return None, one_line(str(exc))
    except Exception as exc:  # a failed point is a row, not the end of the search
        return None, one_line(f"internal error: {type(exc).__name__}: {exc}")
    row = flatten(result.summary)
    row.update({f"crit.{k}": v for k, v in step_breakdown(result).items()})
    row[CPU] = round(time.process_time() - start, 3)
    return row, None


class CpuLimit(Exception):
    """A planner point ran past its CPU seconds (:func:`cpu_limit`)."""


def cpu_limit(seconds: float):
    """Raise :class:`CpuLimit` in the block once this process has spent ``seconds`` more of CPU
    (:func:`sim.work.cpu_deadline`: nested with the simulation's own watchdog, the earlier
    fires; off where it cannot be set: off the main thread (a Dask worker's), not POSIX)."""
    return work.cpu_deadline(seconds, CpuLimit)


def topology_of(scenario):
    """The topology of ``scenario``'s cluster, built once per worker and cluster."""
    from .. import step

    key = scenario.cluster.model_dump_json()
    if key not in _TOPOLOGY:
        _TOPOLOGY.clear()
        _TOPOLOGY[key] = step.build_topology(scenario)
    return _TOPOLOGY[key]


def breakdown(spans, step: float) -> dict:
    """The critical rank's step in seconds (``rank_breakdown``'s keys) and its id."""
    crit = critical_rank(rank_times(spans, step))
    return {"rank": int(crit["rank"]), **rank_breakdown(spans, int(crit["rank"]), step)}


def step_breakdown(result) -> dict:
    """:func:`breakdown` of a result's step. A steady-state result (sim/steady.py) keeps only its
    largest simulated run's spans (``result.shown``): that run's breakdown, its seconds scaled to
    the extrapolated step (each loss keeps its share of the largest run: the bubble's share is a
    few micro-batches', so larger than the whole step's)."""
    shown = result.shown or result
    crit = breakdown(shown.spans, shown.summary["step_time_s"])
    if shown is result:
        return crit
    factor = result.summary["step_time_s"] / shown.summary["step_time_s"]
    return {k: v if k == "rank" else v * factor for k, v in crit.items()}


def limit(losses: dict, step: float) -> str:
    """``"bubble 18%"``: the largest loss (the first of :data:`LOSSES` on a tie) and its share
    of the step, or ``"compute"``."""
    name, value = max(losses.items(), key=lambda kv: kv[1])
    if step <= 0 or value < COMPUTE_BOUND * step:
        return "compute"
    return f"{name} {value / step:.0%}"


def estimated_limits(frame, scale: float = 1.0) -> list[str]:
    """:func:`limit` of every row of a frame of estimate columns (``est_*_s``, ``estimate_s``)."""
    names = [name for name, _ in LOSSES]
    losses = frame[[ESTIMATED[n] for n in names]].to_numpy()
    steps = frame["estimate_s"].to_numpy()
    return [limit(dict(zip(names, row)), step) for row, step in zip(losses, steps)]


def simulated_losses(row) -> dict:
    """Loss name -> seconds from a simulated row's ``crit.*`` columns."""
    return {name: float(row[f"crit.{key}"]) for name, key in LOSSES}
