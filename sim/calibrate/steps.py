"""Fit the sustained compute factor to measured step times, globally over every given run.

The simulator's large-GEMM efficiency is a kernel share times one sustained factor per GPU
type (sim/model/compute.py, ``SUSTAINED``); flash attention and FP8 GEMMs follow the same
factor. A run's step time is ``a + b / S`` in the factor S to within the overlap of compute and
communication (compute scales as 1/S, communication does not) -- the same model as
``clustersim validate --fit``. Each run is simulated at three factors around the current
guess, ``a + b / S`` fitted to them, and the mean squared log error over all runs minimised
on those curves; a second, narrower round around the first optimum makes the fit exact to
well under 1% (the round trip of tests/test_calibrate.py recovers a changed factor within 2%).

Run ``clustersim calibrate megatron.log --scenario run.toml --out profile.toml``.
"""

from dataclasses import dataclass, replace
import math

import numpy as np

from ..hardware.calibration import Calibration
from ..model.compute import SUSTAINED
from ..step import simulate
from ..studies.validation import golden_section

ROUNDS = (0.15, 0.03)  # relative half-widths of the two rounds of three simulations


@dataclass(frozen=True)
class Run:
    """A measured run: the scenario that produced it and its measured step time."""

    label: str
    scenario: object
    measured_s: float


def step_time(run: Run, cal: Calibration) -> float:
    """Simulated seconds per step of ``run`` under ``cal``."""
    s = run.scenario
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"calibration": cal})})
    return simulate(s, baseline=False, force=True).summary["step_time_s"]


def fit_sustained(runs: list[Run], base: Calibration, gpu_name: str) -> tuple[float, float, list[float], list[float]]:
    """(preset factor, fitted factor, simulated steps before, after) over every run together."""
    preset = base.sustained if base.sustained is not None else SUSTAINED[gpu_name]
    before = [step_time(r, base) for r in runs]
    guess = preset * math.exp(np.mean([math.log(b / r.measured_s) for b, r in zip(before, runs)]))
    for width in ROUNDS:
        grid = [guess * (1 - width), guess, guess * (1 + width)]
        curves = []
        for r in runs:
            steps = [step_time(r, replace(base, sustained=g)) for g in grid]
            a, b = np.linalg.lstsq(np.column_stack([np.ones(3), 1 / np.array(grid)]), np.array(steps), rcond=None)[0]
            curves.append((a, b, r.measured_s))
        guess = golden_section(lambda f: sum(math.log((a + b / f) / m) ** 2 for a, b, m in curves), grid[0] * 0.8,
                               grid[2] * 1.2, tol=1e-6, relative=True)
    after = [step_time(r, replace(base, sustained=guess)) for r in runs]
    return preset, guess, before, after


