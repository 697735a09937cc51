"""Fit the sustained compute factor to measured step times, globally over every given run.

The simulator's large-GEMM efficiency is a kernel share times one sustained factor per GPU
type (sim/model/compute.py, ``SUSTAINED``); flash attention and FP8 GEMMs follow the same
factor. A run's step time is ``a + b / S`` in the factor S to within the overlap of compute and
communication (compute scales as 1/S, communication does not) -- the same model as
``clustersim validate --fit``. Each run is simulated at three factors around the current
guess, ``a + b / S`` fitted to them, and the mean squared log error over all runs minimised
on those curves; a second, narrower round around the first optimum makes the fit exact to
well under 1% (the round trip of tests/test_calibrate.py recovers a changed factor within 2%).

A run whose simulated step does not move with S carries no information on it: a host-bound step
(the GPU waits for its host to issue the next kernel, at the issue costs of sim/model/host.py that
the simulation charges; the verdict is ``--report``'s, :func:`sim.outputs.host.verdict`) or one
latency- or communication-bound. A run enters the fit only where its step's elasticity
``-d log step / d log S = (b/S) / (a + b/S)`` is at least :data:`MIN_ELASTICITY` at the current
guess; the report gives each run's elasticity and host verdict. When no run moves, the factor
keeps its preset and the report says why (before, such runs set S anywhere along their flat
curve: tests/test_calibrate.py's host-bound logs gave 1.1, past the GPU's peak).

Run ``clustersim calibrate megatron.log --scenario run.toml --out profile.toml``.
"""

from dataclasses import dataclass, replace
import math

import numpy as np

from ..hardware.calibration import Calibration
from ..model.compute import SUSTAINED
from ..outputs.host import verdict
from ..step import simulate
from ..studies.validation import golden_section

ROUNDS = (0.15, 0.03)  # relative half-widths of the two rounds of three simulations
# A run enters the fit when 10% more sustained factor shortens its simulated step by about 1% or
# more: a log's step (the median of its iterations) is good to about 1%, so a run below this
# cannot place the factor within 10% -- its step is set by the host, latency or communication.
MIN_ELASTICITY = 0.1


@dataclass(frozen=True)
class Run:
    """A measured run: the scenario that produced it and its measured step time."""

    label: str
    scenario: object
    measured_s: float


def result_of(run: Run, cal: Calibration):
    """``run``'s scenario simulated under ``cal`` (the simulator's :class:`~sim.step.Result`)."""
    s = run.scenario
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"calibration": cal})})
    return simulate(s, baseline=False, force=True)


def step_time(run: Run, cal: Calibration) -> float:
    """Simulated seconds per step of ``run`` under ``cal``."""
    return result_of(run, cal).summary["step_time_s"]


@dataclass(frozen=True)
class Fit:
    """The sustained fit: the preset, the fitted factor (None: no run's step moved with it, the
    preset stays), the simulated steps before and after, and per run its elasticity at the
    factor and the host verdict of its simulated step there (:func:`sim.outputs.host.verdict`)."""

    preset: float
    value: float | None
    before: list
    after: list
    elasticity: list
    host: list
    used: tuple = ()  # indices of the runs the last round fitted

    def informs(self, i: int) -> bool:
        """Whether run ``i`` entered the fit (its step moved with the factor)."""
        return i in self.used


def fit_sustained(runs: list[Run], base: Calibration, gpu_name: str) -> Fit:
    """The sustained factor over every run together whose step moves with it (:class:`Fit`)."""
    preset = base.sustained if base.sustained is not None else SUSTAINED[gpu_name]
    before = [step_time(r, base) for r in runs]
    guess = preset * math.exp(np.mean([math.log(b / r.measured_s) for b, r in zip(before, runs)]))
    value, at, used = None, preset, ()
    for width in ROUNDS:
        grid = [guess * (1 - width), guess, guess * (1 + width)]
        curves = [_curve(r, base, grid) for r in runs]
        used = tuple(i for i, c in enumerate(curves) if _elasticity(c, guess) >= MIN_ELASTICITY)
        at = guess
        if not used:
            value = None
            break
        value = at = guess = golden_section(lambda f: sum(math.log((a + b / f) / m) ** 2 for a, b, m in
                                                          (curves[i] for i in used)),
                                            grid[0] * 0.8, grid[2] * 1.2, tol=1e-6, relative=True)
    final = [result_of(r, replace(base, sustained=value) if value is not None else base) for r in runs]
    return Fit(preset, value, before, [f.summary["step_time_s"] for f in final],
               [_elasticity(c, at) for c in curves], [verdict(f) for f in final], used)


def _curve(run: Run, base: Calibration, grid: list[float]) -> tuple[float, float, float]:
    """``a``, ``b`` of ``a + b / S`` through ``run``'s steps simulated at the factors ``grid``, and its measured step."""
    steps = [step_time(run, replace(base, sustained=g)) for g in grid]
    a, b = np.linalg.lstsq(np.column_stack([np.ones(3), 1 / np.array(grid)]), np.array(steps), rcond=None)[0]
    return float(a), float(b), run.measured_s


def _elasticity(curve: tuple[float, float, float], s: float) -> float:
    """``-d log step / d log S`` of the curve at ``s``: the share of the step that scales as 1/S."""
    a, b, _ = curve
    return (b / s) / (a + b / s)
