"""ETTR against the checkpoint interval, simulated, beside Young's and Daly's optimum.

Run ``clustersim campaign SCENARIO --tokens 15e12 --plot-interval plots/ettr-vs-interval.png``.

Every interval replays the same seed (common random numbers: the same failure draws), so
the curve's differences are not drowned by trial-to-trial noise.
"""

import dataclasses

import numpy as np
import pandas as pd

from .trials import Campaign, run


def interval_grid(center_steps: int, points: int = 15, span: float = 10.0) -> list[int]:
    """Whole-step intervals spaced geometrically from center/span to center x span."""
    grid = np.geomspace(max(1.0, center_steps / span), center_steps * span, points)
    return sorted({max(1, int(round(k))) for k in grid} | {center_steps})


def interval_curve(c: Campaign, intervals: list[int], trials: int, seed: int) -> pd.DataFrame:
    """Mean, P10 and P90 of ETTR over ``trials`` at every interval (in steps)."""
    rows = []
    for k in intervals:
        o = run(dataclasses.replace(c, interval=min(k, c.steps)), trials, seed)
        ettr = c.steps * c.step_s / o.wall_s
        rows.append({"interval_steps": k, "interval_s": k * c.step_s, "ettr": float(ettr.mean()),
                     "ettr_p10": float(np.percentile(ettr, 10)), "ettr_p90": float(np.percentile(ettr, 90))})
    return pd.DataFrame(rows)


def best(curve: pd.DataFrame) -> pd.Series:
    """The row of the highest mean ETTR."""
    return curve.loc[curve["ettr"].idxmax()]
