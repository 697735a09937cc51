"""What every summary must satisfy before anyone sees it.

A result that breaks one of these cannot be true: ``check`` raises
:class:`~sim.errors.SimulationError` (an internal error, exit 1, naming the scenario and
the broken rule) instead of letting it be printed. ``sim.step.simulate`` calls it on
every result; ``clustersim run`` therefore never prints an impossible one.

- step time finite and at least the compute-only floor: the busiest simulated rank's
  compute ops, one after another on its compute stream, with its straggler slowdown
  (stragglers only slow a rank; jitter is already in each op's duration);
- 0 < MFU <= the run's own dense peak over the BF16 peak (MFU is relative to the BF16 peak
  under FP8 too: 1 for BF16, 2 on H100 FP8, whose 1,979 TFLOP/s are twice its 989),
  throughput and TFLOP/s finite and positive;
- pipeline bubble in [0, 1], exposed communication in [0, step time];
- bytes sent per axis finite and >= 0, memory per GPU finite and positive;
- straggler cost, when present, finite.
"""

import math

from ..errors import SimulationError
from ..hardware.gpus import low_peak
from ..engine.kinds import StreamName

_ROUNDING = 1e-9  # relative: sums of op times in another order differ in the last bits


def compute_floor(programs, slowdowns: dict[int, float]) -> float:
    """Seconds the busiest simulated rank spends computing, ops back to back (each op's
    duration as built, times the rank's slowdown from t = 0)."""
    floor = 0.0
    for prog in programs:
        busy = math.fsum(op.duration for op in prog.ops if op.comm is None and op.stream == StreamName.COMPUTE)
        floor = max(floor, busy * slowdowns.get(prog.rank, 1.0))
    return floor


def violations(summary: dict, floor_s: float, mfu_max: float = 1.0) -> list[str]:
    """Every rule ``summary`` breaks (empty when it is a possible result); ``mfu_max``:
    the run's dense peak over the BF16 peak."""
    step = summary["step_time_s"]
    if not (math.isfinite(step) and step > 0):
        return [f"step_time_s = {step} is not a finite positive time"]
    found = []
    if step < floor_s * (1 - _ROUNDING):
        found.append(f"step_time_s = {step!r} is shorter than the compute-only floor {floor_s!r} s")
    if not 0 < summary["mfu"] <= mfu_max:
        found.append(f"mfu = {summary['mfu']!r} is outside (0, {mfu_max:g}]")
    for key in ("tokens_per_s", "tflops_per_gpu", "memory_per_gpu_bytes"):
        if not (math.isfinite(summary[key]) and summary[key] > 0):
            found.append(f"{key} = {summary[key]!r} is not finite and positive")
    if not 0 <= summary["bubble_fraction"] <= 1:
        found.append(f"bubble_fraction = {summary['bubble_fraction']!r} is outside [0, 1]")
    if not 0 <= summary["exposed_comm_s"] <= step * (1 + _ROUNDING):
        found.append(f"exposed_comm_s = {summary['exposed_comm_s']!r} is outside [0, step_time_s]")
    bad = {k: v for k, v in summary["comm_bytes_per_gpu"].items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        found.append(f"comm_bytes_per_gpu {bad} not finite and >= 0")
    cost = summary.get("straggler_cost_s")
    if cost is not None and not math.isfinite(cost):
        found.append(f"straggler_cost_s = {cost!r} is not finite")
    return found


def mfu_ceiling(gpu, precision: str) -> float:
    """The highest MFU a step can show: the precision's dense peak (FP8, MXFP8, NVFP4) over
    the BF16 peak that MFU is quoted against (1 in BF16)."""
    return (low_peak(gpu, precision) or gpu.peak_flops) / gpu.peak_flops


def check(summary: dict, floor_s: float, scenario: str, mfu_max: float = 1.0) -> None:
    """SimulationError listing what ``summary`` breaks, if anything."""
    found = violations(summary, floor_s, mfu_max)
    if found:
        raise SimulationError(f"scenario {scenario!r} gave an impossible result: {'; '.join(found)}")
