"""The planner on the published runs: for each run shipped with ``clustersim validate``
(sim/studies/validation.py: Narayanan et al. 2021, the Megatron-LM README, NVIDIA's DGX
Cloud NeMo recipes), plan the same model, batch and cluster, simulate the published
layout as ``validate`` does, and say where it ranks among the layouts the planner
evaluated and whether the planner's best is at least as fast. The knobs of a published
run were those of its time (Narayanan et al. 2021 recompute every layer and shard no
optimizer state), so the rank among the layouts sharing its ZeRO stage, recompute and
micro-batch (``knob_rank``) says how good its mesh was with the knobs it chose.

Run ``python bench/plan_published.py`` (docs/plan.md has the measured table).
"""

from dataclasses import dataclass
import time

import numpy as np
import pandas as pd

from .. import work
from ..input.load import scenario_from_dict
from ..step import simulate
from .driver import search
from .estimate import COMPONENTS, Estimator
from .inputs import request_of
from .report import describe
from .space import COLUMNS, MEMORY_KNOBS, candidate_of
from .stages import Stages


@dataclass(frozen=True)
class Placement:
    """One published run against its plan."""

    id: str
    model: str
    gpus: int
    published_layout: str
    published_s: float  # the published layout, simulated (what validate predicts)
    best_s: float  # the planner's best (simulated unless no simulation fitted the budget)
    best_layout: str
    best_simulated: bool
    rank: int  # 1 + evaluated layouts faster than the published one
    evaluated: int
    knob_rank: int  # the same among the layouts with the published ZeRO stage, recompute and micro-batch
    knob_peers: int  # evaluated layouts with those knobs
    simulated: int
    rank_correlation: float | None
    wall_s: float
    published_estimate_s: float  # the planner's raw estimate of the published layout (its default layer split)
    estimate_scale: float  # the search's median simulated / estimated ratio (estimated rows are ranked at it)

    @property
    def percentile(self) -> float:
        """The published layout's rank as a share of the evaluated layouts (0.01: top 1%)."""
        return self.rank / self.evaluated

    @property
    def knob_percentile(self) -> float:
        """:attr:`percentile` among the layouts sharing the published knobs (the mesh's choice)."""
        return self.knob_rank / max(self.knob_peers, 1)

    @property
    def estimate_error(self) -> float:
        """The published layout's scaled estimate (as the table ranks an estimated row) over
        its simulation, less 1: > 0, the estimate ranks it lower than its simulation does."""
        return self.published_estimate_s * self.estimate_scale / self.published_s - 1.0

    @property
    def planner_wins(self) -> bool:
        return self.best_s <= self.published_s


def place(row, budget: float, workers=None) -> Placement:
    """Plan one published row (``validation.Row``) and place its layout; InputError when
    the published layout's own simulation is past the work budget (sim/work.py)."""
    t0 = time.perf_counter()
    s = scenario_from_dict(row.scenario)
    work.check(s)  # before the search: the published layout must be simulated to be placed
    req = request_of({k: v for k, v in row.scenario.items() if k != "name"} | {"name": row.id})
    plan = search(req, top=10, budget=budget, workers=workers, quiet=True)
    published = simulate(s).summary["step_time_s"]
    table = plan.table
    own = candidate_of(s)
    knobs = {k: own[k] for k in MEMORY_KNOBS}  # a published run's knobs were its time's (the module's docstring)
    peers = table[np.logical_and.reduce([table[k].to_numpy() == v for k, v in knobs.items()])]
    best = table.iloc[0]
    estimate = float(estimate_of(req, s)["estimate_s"].iat[0])
    return Placement(row.id, row.model, row.num_gpus, row.layout, published, float(best.step_time_s), describe(best),
                     bool(best.simulated), _rank(table, published), plan.evaluated, _rank(peers, published),
                     len(peers), plan.simulated, plan.rank_correlation, time.perf_counter() - t0, estimate,
                     plan.estimate_scale)


def estimate_of(req, s) -> "pd.DataFrame":
    """The planner's estimate of scenario ``s``'s own layout (one row: ``estimate_s`` and
    ``est_<component>_s``), on ``req``'s base as a search estimates its candidates, with
    its own ``stage_layers`` split where it has one and its own data-parallel knobs (a search
    runs the defaults: ``overlap_grad_reduce``, ``overlap_param_gather``, ``ddp_bucket_mb``)."""
    p = s.parallel
    row = pd.DataFrame([candidate_of(s)], columns=list(COLUMNS))
    base = req.scenario.model_copy(update={"parallel": p})  # (its DP knobs: overlap_grad_reduce, buckets, ...)
    return Estimator(base, Stages(base, p.stage_layers), req.spec, req.gpu).frame(row)[
        ["estimate_s"] + [f"est_{k}_s" for k in COMPONENTS]]


def _rank(table, seconds: float) -> int:
    """1 + the layouts of ``table`` faster than ``seconds``."""
    return 1 + int((table["step_time_s"].to_numpy() < seconds).sum())
