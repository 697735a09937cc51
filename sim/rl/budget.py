"""The work of one RL run, estimated before anything is built (``clustersim rl``).

What drives it, measured with ``clustersim rl rl-llama3-8b-h100`` and ``--set`` on the
2-core VM (user CPU less the ~1.5 s of imports; peak RSS):

- every sequence trained goes through a generator and the trainer's batch: steps x
  global_batch sequences, ~120 us and ~1 KB each (rl.steps 20 -> 80 at 816 sequences:
  +4.6 s, +42 MB; global_batch 816 -> 3,264 at 20 steps: +6.9 s, +64 MB);
- every engine is built once (its cost model, its SimPy process: 1,024 -> 4,096 engines
  at 2 steps, +1.1 s, +27 MB: ~0.4 ms, ~9 KB an engine) and wakes every step (4,096
  engines, 2 -> 8 steps: +1.3 s past the sequences' share, ~50 us an engine-step);
- the cluster's GPUs, priced as :mod:`sim.work` prices them.

The constants below round those up by ~1.3x. :func:`check` refuses a run past
:data:`sim.work.BUDGET_S` / :data:`sim.work.BUDGET_BYTES` naming the key that drives the
cost (``--force`` runs it); :func:`watchdog_seconds` is the CPU limit of the watchdog (20x).
"""

from dataclasses import dataclass

from ..work import (BASE_BYTES, BUDGET_BYTES, BUDGET_S, GPU_BYTES, GPU_S, WATCHDOG_FACTOR, WATCHDOG_MIN_S, cost_text,
                    refuse_past_budget)

SEQ_S, SEQ_BYTES = 150e-6, 1.5e3  # per sequence trained (steps x global_batch)
ENGINE_S, ENGINE_BYTES = 500e-6, 12e3  # per generator engine, built once
ENGINE_STEP_S = 70e-6  # per engine and training step


@dataclass(frozen=True)
class RLWork:
    """The estimate: CPU seconds, peak bytes, and the key behind the larger share."""

    sequences: int
    engines: int
    seconds: float
    bytes: float
    driver: str

    def describe(self) -> str:
        return cost_text(self.seconds, self.bytes, f"{self.sequences:,} sequences, {self.engines:,} generator engines")


def estimate(s) -> RLWork:
    """The work of ``simulate_rl(s)`` for a checked scenario with an ``[rl]`` section."""
    rl = s.rl
    engines = max(1, rl.generator_gpus // max(rl.generator_tp, 1))
    sequences = rl.steps * s.training.global_batch
    parts = {"sequences": (sequences * SEQ_S, sequences * SEQ_BYTES),
             "engines": (engines * ENGINE_S + rl.steps * engines * ENGINE_STEP_S, engines * ENGINE_BYTES),
             "gpus": (s.cluster.gpus * GPU_S, s.cluster.gpus * GPU_BYTES)}
    seconds = sum(t for t, _ in parts.values())
    nbytes = BASE_BYTES + sum(b for _, b in parts.values())
    share = {k: t / BUDGET_S + b / BUDGET_BYTES for k, (t, b) in parts.items()}
    part = max(share, key=share.get)
    if part == "sequences":
        driver = "rl.steps" if rl.steps / 20 >= s.training.global_batch / 1024 else "training.global_batch"
    elif part == "engines":
        driver = "rl.steps" if rl.steps * ENGINE_STEP_S > ENGINE_S and rl.steps > 1000 else "rl.generator_gpus"
    else:
        driver = "cluster.nodes" if s.cluster.nodes else "cluster.gpus"
    return RLWork(sequences, engines, seconds, nbytes, driver)


def check(s) -> RLWork:
    """The estimate, or InputError naming the key that drives the cost past the budget."""
    work = estimate(s)
    refuse_past_budget(work, "this RL run would need", work.describe())
    return work


def watchdog_seconds(work: RLWork) -> float:
    """CPU seconds after which an RL run estimated at ``work`` counts as stuck."""
    return max(WATCHDOG_MIN_S, WATCHDOG_FACTOR * work.seconds)
