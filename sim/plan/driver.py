"""The planner's driver: enumerate, apply the rules, estimate, simulate the best, rank.

``search(request)`` is ``clustersim plan``'s whole search (sim/commands/plan.py prints it):

1. every layout of the space (:mod:`.space`) is checked against the loader's rules
   (:mod:`.rules`) and the memory rule (:mod:`.fit`); each rejection is counted once, under
   its first broken rule;
2. the valid layouts are estimated (:mod:`.estimate`) and ordered by estimate;
3. the best by estimate, a spread across the range, and later any contender the measured
   estimate error says could win, are simulated in full (:mod:`.select`) through the sweep
   machinery (:func:`sim.sweeps.grid.sweep`: worker processes or Dask, a time limit per
   point, every finished simulation kept in ``OUT.sims.csv`` so an interrupted search
   resumes where it stopped);
4. the table (:mod:`.rank`) and the estimate's rank correlation with the simulations.
"""

from dataclasses import dataclass, field
from pathlib import Path
import sys
import time

import numpy as np
import pandas as pd

from .. import work
from ..errors import InputError
from ..hardware.gpus import gpu_preset
from ..outputs.progress import status
from ..sweeps.grid import point_key, sweep
from ..sweeps.pool import TIMEOUT_PREFIX
from . import fit, rank, rules, select
from .estimate import Estimator
from .explain import REFUSED, simulate_point
from .space import Space, enumerate_layouts, overrides
from .stages import Stages

BUDGET_S = 240.0  # predicted seconds of full simulation on one core (2 workers: ~2 minutes)
# A simulation stops and keeps its estimate (the predictor underrated it) past explain.POINT_CPU_S of its
# CPU; this much wall is the backstop where that limit cannot be set (off POSIX), 10x it for a loaded machine.
POINT_TIMEOUT_S = 600.0
TOP = 10
FRONT = 16  # the first round's front takes this many of the best estimates, more as the budget grows (select.front_size)
ROUNDS = 2  # rounds of contenders after the first


@dataclass
class Plan:
    """The outcome of a search (``clustersim plan --json`` is :func:`sim.plan.report.summary` of it)."""

    candidates: int
    rejected: dict
    table: pd.DataFrame
    budget_s: float
    headroom: float
    spent_s: float = 0.0  # predicted seconds of the simulations run
    rank_correlation: float | None = None
    rank_correlation_front: float | None = None
    estimate_scale: float = 1.0
    failures: dict = field(default_factory=dict)  # position -> error of a simulation that failed
    refused: dict = field(default_factory=dict)  # position -> sim.work.check's refusal (rejected, not in the table)
    picked: dict = field(default_factory=dict)  # position -> why it was simulated (a key of select.WHY)
    stats: dict = field(default_factory=dict)  # sweep counts summed over rounds (resumed, simulated, ...)
    seconds: dict = field(default_factory=dict)  # wall seconds per phase

    @property
    def evaluated(self) -> int:
        return len(self.table)

    @property
    def simulated(self) -> int:
        return int(self.table["simulated"].sum())

    @property
    def stopped(self) -> int:
        """Picks stopped at the point limit (they keep their estimate and are listed in ``failures``)."""
        return sum(str(e).startswith(TIMEOUT_PREFIX) for e in self.failures.values())


def search(req, top: int = TOP, budget: float = BUDGET_S, headroom: float = fit.HEADROOM, workers=None,
           dask=None, out=None, point_timeout: float | None = POINT_TIMEOUT_S, quiet: bool = False,
           watchdog_s: float | None = None) -> Plan:
    """Plan the layout of ``req`` (:class:`~.inputs.Request`): see the module docstring.
    ``watchdog_s``: CPU seconds the analytic phase may take (:func:`sim.work.watchdog`; the
    command passes 20x :mod:`.budget`'s estimate), None for no limit."""
    clock, seconds = time.perf_counter(), {}
    stages = Stages(req.scenario)
    with work.watchdog(f"plan of {req.scenario.name}", watchdog_s):
        with status("plan: enumerating layouts and checking the rules and memory", quiet):
            candidates, rejected, evaluated = _valid(req, stages, headroom)
        seconds["rules"] = _lap(clock)
        if evaluated.empty:
            raise InputError("--gpus", f"no layout of {len(candidates):,} fits {req.gpus} x {req.gpu}: "
                                       + ", ".join(f"{k} {v:,}" for k, v in rejected.items()))
        _say(quiet, f"plan: {len(candidates):,} layouts, {sum(rejected.values()):,} rejected "
                    f"({', '.join(f'{k} {v:,}' for k, v in rejected.items())}); estimating {len(evaluated):,}")
        with status(f"plan: estimating {len(evaluated):,} layouts", quiet):
            ranked = pd.concat([evaluated, Estimator(req.scenario, stages, req.spec, req.gpu).frame(evaluated)],
                               axis=1)
    ranked = ranked.iloc[np.lexsort((ranked.index.to_numpy(), ranked["estimate_s"].to_numpy()))]
    ranked = ranked.reset_index(drop=True)
    seconds["estimate"] = round(_lap(clock) - seconds["rules"], 3)
    plan = Plan(len(candidates), rejected, pd.DataFrame(), budget, headroom, seconds=seconds)
    sims = _simulate_rounds(req, ranked, plan, top,
                            dict(workers=workers, dask=dask, out=sims_path(out), point_timeout=point_timeout,
                                 quiet=quiet))
    seconds["simulate"] = round(_lap(clock) - seconds["rules"] - seconds["estimate"], 3)
    table = rank.table(ranked, sims, req.scenario, gpu_preset(req.gpu).peak_flops, plan.picked)
    plan.table = rank.without(table, plan.refused)
    if plan.refused:
        plan.rejected[rules.WORK.id] = len(plan.refused)
    plan.estimate_scale = rank.scale(ranked, sims)
    plan.rank_correlation = rank.spearman(*_pairs(ranked, sims, sims))
    plan.rank_correlation_front = rank.spearman(*_pairs(ranked, sims, plan.stats.get("front", [])))
    return plan


def _valid(req, stages, headroom: float) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Every candidate, the rejection counts, and the valid ones that fit (with ``memory_bytes``)."""
    candidates = enumerate_layouts(Space.of(req, stages.dims))
    code = rules.codes(candidates, rules.fixed_of(req.scenario))
    rejected = rules.counts(code)
    valid = candidates[code == 0]  # the index is the enumeration order: ties break on it
    memory = fit.peak(valid, stages, req.scenario)
    fits = memory <= fit.capacity(gpu_preset(req.gpu).hbm_bytes, headroom)
    if (~fits).any():
        rejected["memory"] = int((~fits).sum())
    return candidates, rejected, valid[fits].assign(memory_bytes=memory[fits])


def _simulate_rounds(req, ranked: pd.DataFrame, plan: Plan, top: int, kwargs: dict) -> dict:
    """Round 1: the front and the spread; then contenders while they appear."""
    best, cheap = select.front_parts(ranked, plan.budget_s, max(FRONT, top))
    front, skipped = select.front(ranked, plan.budget_s, max(FRONT, top))
    spread = select.spread(ranked, plan.budget_s, set(front))
    picks = front + spread
    plan.picked.update({p: "best" for p in best} | {p: "cheap" for p in cheap} | {p: "spread" for p in spread})
    plan.stats.update(front=front, too_costly=[p for p in skipped if p < max(front, default=-1)])
    sims: dict[int, dict] = {}
    for _ in range(1 + ROUNDS):
        if not picks:
            break
        cost = float(ranked["sim_cost_s"].to_numpy()[picks].sum())
        _say(kwargs["quiet"], f"plan: simulating {len(picks)} layouts (predicted {cost:.0f} s of simulation; "
                              f"budget {plan.budget_s:.0f} s, {plan.spent_s:.0f} s spent)")
        sims.update(_run(req, ranked, picks, plan, kwargs))
        plan.spent_s += cost
        done = {p: float(s["step_time_s"]) for p, s in sims.items()}
        picks = [p for p in select.contenders(ranked, done, plan.budget_s, top)
                 if p not in plan.failures and p not in plan.refused]
        plan.picked.update({p: "contender" for p in picks})
    return sims


def _run(req, ranked: pd.DataFrame, picks: list[int], plan: Plan, kwargs: dict) -> dict[int, dict]:
    """Simulate ``picks`` through the sweep machinery; position -> row (failures kept aside,
    picks the work budget refuses counted in ``plan.refused``: the workers check each point
    once, :func:`.explain.simulate_point`, so the checks run in parallel and the simulation
    reuses the check's estimate)."""
    grid = [overrides(ranked.iloc[p]) for p in picks]
    if not grid:
        return {}
    stats: dict = {}
    frame = sweep(req.data, grid, workers=kwargs["workers"], out=kwargs["out"], dask=kwargs["dask"],
                  quiet=kwargs["quiet"], stats=stats, point_timeout=kwargs["point_timeout"],
                  point_fn=simulate_point, label="plan: simulating")
    for k in ("resumed", "simulated", "failed", "timed_out", "invalid"):
        plan.stats[k] = plan.stats.get(k, 0) + stats.get(k, 0)
    where = {point_key(g): p for g, p in zip(grid, picks)}
    out = {}
    for row in frame.to_dict("records"):
        p = where[row["point"]]
        error = row.get("error")
        if isinstance(error, str) and error.startswith(REFUSED):
            plan.refused[p] = error[len(REFUSED):]
        elif isinstance(error, str) and error:
            plan.failures[p] = error
        else:
            out[p] = row
    return out


def _pairs(ranked: pd.DataFrame, sims: dict, positions) -> tuple[list, list]:
    ps = [p for p in sorted(positions) if p in sims]
    return [float(ranked["estimate_s"].iat[p]) for p in ps], [float(sims[p]["step_time_s"]) for p in ps]


def sims_path(out) -> str | None:
    """Where the simulations are kept: ``plan.csv`` -> ``plan.sims.csv`` (same format)."""
    if out is None:
        return None
    p = Path(out)
    return str(p.with_name(f"{p.stem}.sims{p.suffix}"))


def _lap(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


