"""The data-parallel ends of a step for the fast estimate (:mod:`.estimate`): how long the
ZeRO-1/2 parameter all-gather delays the first forwards and how long the DDP / ZeRO gradient
reduction runs past the last backward, per pipeline stage and model chunk.

Nothing here restates the simulator's choices; it reads them:

- which chunk is split into buckets and their size: the builder's
  (``layer_program.grad_bucket_bytes``; Megatron: only the first chunk of the first pipeline
  stage is bucketed, every other chunk reduces as one bucket, issued after its last backward);
- when a chunk's last backward and its first forward come on a stage: the schedule's own
  step order (:func:`sim.parallel.pp.steps`, what the rank-program builder runs), counted in
  passes: the backward passes that still follow a chunk's last backward hide its reduction,
  the passes before a chunk's first forward hide its parameter gather;
- the gathers run on their own stream in chunk order from the start of the step, the
  reductions on theirs in the order the chunks finish (sim/parallel/zero.py, dp.py).

The counts depend on the micro-batches only through the warm-up and cool-down, so a long
schedule is counted at :func:`short_m` micro-batches (the same residue; tests/test_plan_dp_ends.py
checks the counts equal). Run by ``clustersim plan`` (its estimate phase).
"""

from functools import lru_cache

import numpy as np

from ..input.choices import Schedule
from ..parallel import pp as pipeline
from ..parallel.pp import Kind  # (pp re-exports the schedule items' kinds for the planner)

HALF = (Kind.I, Kind.W)  # a zero-bubble input-gradient or weight-gradient pass: half a backward


def short_m(schedule: str, p: int, m: int) -> int:
    """Micro-batches whose schedule ends like ``m``'s: ``m`` below 6p, else 4p plus m mod 2p."""
    return m if m < 6 * p else 4 * p + m % (2 * p)


def passes(schedule: str, p: int, v: int, m: int, stage: int) -> np.ndarray:
    """Per chunk (rows): forward and backward passes on ``stage`` before its first forward,
    and forward and backward passes after its last backward (columns), from the schedule's
    step order (a zero-bubble I or W pass counts half a backward)."""
    return _passes(schedule, p, v, short_m(schedule, p, m), stage)


@lru_cache(maxsize=4096)
def _passes(schedule: Schedule, p: int, v: int, m: int, stage: int) -> np.ndarray:
    items = [item for step in pipeline.steps(schedule, p, v, m, stage, False) for item in step]
    kinds = [Kind(k) for k, _, _ in items]
    weight_b = np.array([0.0 if k is Kind.F else 0.5 if k in HALF else 1.0 for k in kinds])
    weight_f = np.array([1.0 if k is Kind.F else 0.0 for k in kinds])
    chunks = 2 if schedule == Schedule.DUALPIPE else v
    out = np.zeros((chunks, 4))
    for c in range(chunks):
        mine = [i for i, (_, _, chunk) in enumerate(items) if chunk == c]
        first = next(i for i in mine if kinds[i] is Kind.F)
        last = max(i for i in mine if kinds[i] is not Kind.F)
        out[c] = (weight_f[:first].sum(), weight_b[:first].sum(), weight_f[last + 1:].sum(),
                  weight_b[last + 1:].sum())
    return out


def stages_to_price(p: int) -> tuple[int, ...]:
    """The stages whose ends can be the longest: the first (its first chunk bucketed), the
    second (its first forward earliest of the unbucketed), and the last (the output layer)."""
    return tuple(sorted({0, min(1, p - 1), p - 1}))


def start_delay(p: np.ndarray, f: np.ndarray, b: np.ndarray, gather: np.ndarray, nb: np.ndarray,
                bucketed: bool, stage: int) -> np.ndarray:
    """Seconds the overlapped parameter gather delays ``stage`` (n), its chunks' gathers
    ``gather`` (n x chunks) issued back to back at the step's start; chunk c's first forward
    comes after the upstream stages' first forwards and ``p`` (chunks x 4, :func:`passes`)
    passes of f and b seconds (n); a bucketed chunk waits for its first bucket only (1/nb)."""
    done, delay = np.zeros(len(f)), np.zeros(len(f))
    for c in range(gather.shape[1]):
        need = done + (gather[:, c] / nb if bucketed and c == 0 else gather[:, c])
        done = done + gather[:, c]
        ready = stage * f + p[c, 0] * f + p[c, 1] * b
        delay = np.maximum(delay, need - ready)
    return delay


def reduce_tail(p: np.ndarray, f: np.ndarray, b: np.ndarray, reduce: np.ndarray, nb: np.ndarray,
                bucketed: bool, offset: np.ndarray) -> np.ndarray:
    """When (n; from the first stage's last backward) the overlapped gradient reduction of a
    stage whose last backward ends at ``offset`` finishes: chunk c's (``reduce``, n x chunks)
    is issued after its last backward, with ``p``'s passes still to run, and queues behind the
    chunks issued before it; a bucketed chunk is reduced bucket by bucket during its last
    backward, the first when a 1/nb share of it has run (no sooner than its last bucket
    after it)."""
    after = p[:, 2] + p[:, 3]
    done = np.full(len(f), -np.inf)
    for c in np.argsort(-after, kind="stable"):
        issued = offset - p[c, 2] * f - p[c, 3] * b
        if bucketed and c == 0:
            done = np.maximum(np.maximum(done, issued - b + b / nb) + reduce[:, c], issued + reduce[:, c] / nb)
        else:
            done = np.maximum(done, issued) + reduce[:, c]
    return done
