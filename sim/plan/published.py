"""The planner on the published runs: for each run shipped with ``clustersim validate``
(sim/studies/validation.py: Narayanan et al. 2021, the Megatron-LM README, NVIDIA's DGX
Cloud NeMo recipes), plan the same model, batch and cluster, simulate the published
layout as ``validate`` does, and say where it ranks among the layouts the planner
evaluated and whether the planner's best is at least as fast.

Run ``python bench/plan_published.py`` (docs/plan.md has the measured table).
"""

from dataclasses import dataclass

from ..input.load import scenario_from_dict
from ..step import simulate
from .driver import search
from .inputs import request_of


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
    simulated: int
    rank_correlation: float | None
    wall_s: float

    @property
    def percentile(self) -> float:
        """The published layout's rank as a share of the evaluated layouts (0.01: top 1%)."""
        return self.rank / self.evaluated

    @property
    def planner_wins(self) -> bool:
        return self.best_s <= self.published_s


def place(row, budget: float, workers=None) -> Placement:
    """Plan one published row (``validation.Row``) and place its layout."""
    import time

    from .report import describe

    t0 = time.perf_counter()
    req = request_of({k: v for k, v in row.scenario.items() if k != "name"} | {"name": row.id})
    plan = search(req, top=10, budget=budget, workers=workers, quiet=True)
    published = simulate(scenario_from_dict(row.scenario)).summary["step_time_s"]
    table = plan.table
    best = table.iloc[0]
    return Placement(row.id, row.model, row.num_gpus, row.layout, published, float(best.step_time_s), describe(best),
                     bool(best.simulated), 1 + int((table.step_time_s < published).sum()), plan.evaluated,
                     plan.simulated, plan.rank_correlation, time.perf_counter() - t0)
