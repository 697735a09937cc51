"""Which candidates get the full simulation, within a budget, deterministically.

The budget is in predicted seconds of simulation on one core (``sim_cost_s`` of
:mod:`.estimate`), never in measured time, so the same search simulates the same layouts
on any machine and after any interruption. Three kinds of picks:

- the front: the caller's ``top_n`` best candidates by estimate predicted at most
  :data:`CHEAP` x the cheapest simulation among the near-best (:func:`cost_floor`), then, among the :data:`WIDEN` x
  :func:`front_size` best under that cap, the cheapest to simulate first, until
  :data:`FRONT_SHARE` of the budget is spent (at most :func:`front_size` picks: more as the
  budget grows; a candidate too costly to simulate is skipped, keeps its estimate, and is
  reported);
- the spread: one candidate near each estimate quantile of :data:`QUANTILES` (the
  cheapest to simulate within a window), so that the rank correlation between estimate
  and simulation is measured over the whole range, not only among near-ties;
- contenders (later rounds, :func:`contenders`): candidates not yet simulated whose
  estimate, scaled by the measured simulated / estimated ratio, beats the top of the
  simulated table, while budget remains.
"""

import numpy as np
import pandas as pd

FRONT_SHARE = 0.7
# A front pick is predicted at most this many times the near-best's cheapest simulation (cost_floor): one
# layout that costs as much as dozens of others (DeepSeek-V3's all-to-alls over 128-256
# expert ranks across NVLink domains, tens of times its in-node ep 8 layouts) is left to its
# estimate so that the budget simulates many of the next best instead (docs/plan.md).
CHEAP = 8.0
# Past the caller's top_n best estimates, the front takes the cheapest to simulate of the WIDEN x
# front_size best under the cap until the budget's front share is spent: the budget buys many
# near-best layouts rather than a few costly ones (issue 28: DeepSeek-V3's pp 8 pipelines cost
# 5x its pipeline-free layouts of about the same estimate, docs/plan.md).
WIDEN = 3
FRONT_PER_S = 0.4  # front picks per predicted second of budget (240 s: 96), never fewer than the caller's top_n
QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
WINDOW = 0.01  # of the candidates, each side of a spread position
# Why a layout was simulated (``clustersim plan``'s ``picked``: one of these, then its estimate's position)
WHY = {"best": "front: among the best estimates", "cheap": "front: cheapest to simulate of the near-best",
       "spread": "spread: cheapest near an estimate quantile", "contender": "contender: its scaled estimate beats "
       "the simulated ones"}


def front_size(budget: float, top_n: int) -> int:
    """How many front picks a budget allows: ``top_n``, or :data:`FRONT_PER_S` per second
    of budget where that is more (a 240 s budget: 96; 40 s or less: ``top_n``)."""
    return max(top_n, int(FRONT_PER_S * budget))


def cost_floor(cost: np.ndarray, size: int) -> float:
    """The cost the :data:`CHEAP` cap is measured against: the cheapest predicted simulation
    among the :data:`WIDEN` x ``size`` best estimates (``cost`` best estimate first), not the
    whole search's. Against the search's cheapest, one trivial layout far down the order (a dense
    H100 search's 0.14 s one) priced every near-best layout out of the front, and the planner
    simulated from the 3,398th best estimate on (dg-l70-64: best 14.967 s, slower than the
    published layout; with no cap 13.642 s; docs/plan.md "Published layouts placed again")."""
    return float(cost[:max(1, WIDEN * size)].min())


def front(ranked: pd.DataFrame, budget: float, top_n: int) -> tuple[list[int], list[int]]:
    """Positions (in ``ranked``, best estimate first) of the front picks, in that order: the
    ``top_n`` best estimates predicted at most :data:`CHEAP` x :func:`cost_floor`,
    then, of the :data:`WIDEN` x :func:`front_size` best under that cap, the cheapest to
    simulate (ties: the better estimate), all while they fit what is left of
    :data:`FRONT_SHARE` of the budget, at most :func:`front_size` in all; and the positions
    before the last pick left to their estimate (too costly, or priced out by cheaper ones)."""
    best, cheap = front_parts(ranked, budget, top_n)
    picked = sorted(best + cheap)
    taken = set(picked)
    return picked, [p for p in range(max(picked, default=-1)) if p not in taken]


def front_parts(ranked: pd.DataFrame, budget: float, top_n: int) -> tuple[list[int], list[int]]:
    """:func:`front`'s picks in two parts, why each was picked (:data:`WHY`): the best
    estimates under the cap (``best``), then the cheapest of the window (``cheap``)."""
    size, cost = front_size(budget, top_n), ranked["sim_cost_s"].to_numpy()
    if not len(cost):
        return [], []
    cheapest, limit = cost_floor(cost, size), budget * FRONT_SHARE
    eligible = np.flatnonzero(cost <= CHEAP * cheapest)
    best, spent = [], 0.0
    for pos in eligible:  # the best estimates, in order
        if len(best) >= min(top_n, size) or spent + cheapest > limit:
            break
        if spent + cost[pos] <= limit:
            best.append(int(pos))
            spent += cost[pos]
    window, cheap = np.setdiff1d(eligible[:WIDEN * size], best), []
    for pos in window[np.argsort(cost[window], kind="stable")]:  # then the cheapest to simulate
        if len(best) + len(cheap) >= size or spent + cost[pos] > limit:
            break
        cheap.append(int(pos))
        spent += cost[pos]
    return best, cheap


def spread(ranked: pd.DataFrame, budget: float, taken: set[int]) -> list[int]:
    """Positions of the spread picks: near each quantile, the cheapest untaken candidate,
    if it fits the rest of the budget."""
    n, cost = len(ranked), ranked["sim_cost_s"].to_numpy()
    spent = sum(cost[p] for p in taken)
    half = max(5, int(WINDOW * n))
    picked = []
    for q in QUANTILES:
        centre = int(q * (n - 1))
        window = [p for p in range(max(0, centre - half), min(n, centre + half + 1)) if p not in taken]
        if not window:
            continue
        best = min(window, key=lambda p: (cost[p], p))
        if spent + cost[best] <= budget:
            picked.append(best)
            taken = taken | {best}
            spent += cost[best]
    return picked


def contenders(ranked: pd.DataFrame, simulated: dict[int, float], budget: float, top_n: int) -> list[int]:
    """Positions not yet simulated whose scaled estimate beats the ``top_n``-th best
    simulated step time, best first, each at most :data:`CHEAP` x :func:`cost_floor` (as the
    front), while the budget lasts (empty when none)."""
    if not simulated:
        return []
    est = ranked["estimate_s"].to_numpy()
    ratio = float(np.median([t / est[p] for p, t in simulated.items()]))
    times = sorted(simulated.values())
    bar = times[min(top_n, len(times)) - 1]
    cost = ranked["sim_cost_s"].to_numpy()
    cap = CHEAP * cost_floor(cost, front_size(budget, top_n))
    spent = sum(cost[p] for p in simulated)
    picked = []
    for p in np.flatnonzero(est * ratio < bar):
        p = int(p)
        if p in simulated:
            continue
        if len(picked) >= top_n:
            break
        if spent + cost[p] > budget or cost[p] > cap:
            continue
        picked.append(p)
        spent += cost[p]
    return picked
