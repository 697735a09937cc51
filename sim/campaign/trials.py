"""A training campaign over days, as a discrete-event simulation vectorised across trials.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12 --trials 1000``.

Events are failures, not steps. Between two failures a trial's state moves arithmetically:
from a durable checkpoint at step ``s`` training runs cycles of ``k`` steps (``k x step``
seconds) followed by a checkpoint (``stall`` seconds; an asynchronous one becomes durable
``write`` seconds after its stall, and the next snapshot waits for it), so a cycle lasts
``L = stall + max(k x step, write)``. Failures arrive as a Poisson process in wall time at
the summed rate of every class (:mod:`sim.campaign.failures`), while the job runs and while
it restarts; the class of each one is drawn in proportion to its rate. A failure while
running rolls progress back to the last durable checkpoint (a planned stop saves one
first); any failure then costs detection (none for a planned stop), a healthy node for a
hardware failure (a spare if one is free, else the wait until a failed node is repaired),
the restart and the checkpoint load. A failure during a restart starts the restart again.

Each round draws one failure gap and one class for every trial at once (numpy), so 1,000
trials of a 54-day run take ~500 rounds of array arithmetic. Same seed, same draws, same
result. ``tests/test_campaign.py`` replays the same draws through an event-by-event SimPy
oracle and checks the closed forms (Young/Daly; expected lost work).
"""

from dataclasses import dataclass, field
import math

import numpy as np

from ..errors import InputError
from .checkpoint import CheckpointCost
from .failures import HARDWARE, PLANNED

MAX_EXPECTED_INTERRUPTIONS = 2_000_000  # per trial: beyond this the run practically never ends


@dataclass(frozen=True)
class Campaign:
    """Everything one campaign needs, in SI units."""

    step_s: float  # one optimizer step
    steps: int  # steps to train
    interval: int  # steps between checkpoints
    ckpt: CheckpointCost
    rates: np.ndarray  # failures per second of each class, whole job
    kinds: np.ndarray  # KINDS index of each class
    detect_s: float  # from a failure to knowing it (not for planned stops)
    restart_s: float  # reschedule, launch, initialise (excludes the checkpoint load)
    spares: int | None = None  # spare nodes; None: a healthy node is always at hand
    repair_s: float = 0.0  # how long a failed node is away (only with a finite pool)
    deadline_s: float | None = None  # ``--days``: every trial stops here (``steps`` is then past reach)

    @property
    def cycle_s(self) -> float:
        """Wall seconds of ``interval`` steps and their checkpoint."""
        return self.ckpt.stall_s + max(self.interval * self.step_s, self.ckpt.write_s)

    @property
    def restart_cost_s(self) -> float:
        """Downtime of a software failure: detection, restart, checkpoint load."""
        return self.detect_s + self.restart_s + self.ckpt.load_s

    def finish_s(self, done: np.ndarray) -> np.ndarray:
        """Wall seconds to train the remaining steps from ``done`` with no failure (no
        checkpoint after the last step)."""
        left = self.steps - done
        return left * self.step_s + ((left - 1) // self.interval) * (self.cycle_s - self.interval * self.step_s)


@dataclass
class Outcome:
    """Per-trial results (arrays over trials) and, when recorded, trial 0's history."""

    wall_s: np.ndarray
    interruptions: np.ndarray
    by_cause: np.ndarray  # trials x classes
    lost_s: np.ndarray  # running time rolled back by failures
    down_s: np.ndarray  # time not running: first launch, detections, waits, restarts, loads
    waits: np.ndarray  # hardware failures that found no spare node
    during_restart: np.ndarray  # failures that struck while the job was down
    history: list = field(default_factory=list)  # (start, end, from_step, reached, kept, cause or -1)
    steps_done: np.ndarray | None = None  # with a deadline: steps each trial trained by then


class _State:
    """Arrays over trials; ``t`` is each trial's last event, ``up_at`` when it runs again."""

    def __init__(self, c: Campaign, n: int):
        self.t = np.zeros(n)
        self.up_at = np.full(n, c.restart_s)  # the first launch: no detection, nothing to load
        self.hw_ready = np.zeros(n)
        self.done_steps = np.zeros(n, dtype=np.int64)
        self.finished = np.zeros(n, dtype=bool)
        self.out = Outcome(np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros((n, len(c.rates)), dtype=np.int64),
                           np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))
        self.slots = None if c.spares is None else np.zeros((n, c.spares))  # when each spare is free


# The CPU a run of trials costs: every round advances every unfinished trial to its next
# failure, so the rounds are the most failures any trial sees (mean x ~1.25: the wall time
# also holds the downtime, during which failures still arrive, and the slowest of many trials)
# and a round costs a fixed part plus a part per trial. Measured on the 2-core VM (Llama 3 405B
# on 16,384 GPUs, 15e12 tokens, ~1,100 rounds): 100 trials 0.20 s, 3,000 0.73 s, 30,000 11.0 s,
# 100,000 41.9 s of CPU; 10x the tokens at 100 trials 1.10 s.
ROUND_S = 2e-4  # seconds of CPU per round, whatever the trials
TRIAL_ROUND_S = 4e-7  # seconds of CPU per trial and round
ROUNDS_PER_FAILURE = 1.25


def rounds_expected(c: Campaign) -> float:
    """Rounds until every trial has finished: failures in the productive time, x 1.25."""
    return ROUNDS_PER_FAILURE * float(np.sum(c.rates)) * c.steps * c.step_s + 16


def cpu_seconds(c: Campaign, trials: int) -> float:
    """Estimated CPU seconds of :func:`run` over ``trials`` trials."""
    return rounds_expected(c) * (ROUND_S + TRIAL_ROUND_S * trials)


def run(c: Campaign, trials: int, seed: int, record: bool = False, draws=None) -> Outcome:
    """Simulate ``trials`` campaigns. ``draws(rng, trials) -> (gaps_s, classes)`` replaces
    the default draw (tests replay draws through the oracle)."""
    check_finishes(c)
    rng = np.random.default_rng(seed)
    draws = draws or default_draws(c)
    st = _State(c, trials)
    limit = _round_limit(c)
    rounds = 0
    while not st.finished.all():
        rounds += 1
        if rounds > limit:
            raise _never_finishes(c, st)
        gaps, classes = draws(rng, trials)
        if c.deadline_s is not None:
            _stop_at_deadline(c, st, st.t + gaps)
        _round(c, st, gaps, classes, record)
    if c.deadline_s is not None:
        st.out.steps_done = st.done_steps.copy()
    return st.out


def _stop_at_deadline(c: Campaign, st: _State, tf: np.ndarray) -> None:
    """Trials whose next failure comes after the deadline stop at it (``--days``), keeping
    every step finished by then (the run ends as a planned stop does: it saves first); a
    trial down at the deadline keeps its last checkpoint. (``steps`` is set past what the
    deadline allows, so no trial finishes before it.)"""
    end = c.deadline_s
    idx = np.flatnonzero(~st.finished & (tf >= end))
    if not len(idx):
        return
    running = st.up_at[idx] < end
    ran = np.where(running, end - st.up_at[idx], 0.0)
    kept = progress(c, ran, planned=np.ones(len(idx), dtype=bool))[0]
    st.done_steps[idx] = np.minimum(st.done_steps[idx] + np.where(running, kept, 0), c.steps)
    st.out.down_s[idx] += np.minimum(st.up_at[idx], end) - st.t[idx]
    st.out.wall_s[idx] = end
    st.finished[idx] = True


def default_draws(c: Campaign):
    """Exponential gaps at the total rate; classes in proportion to their rates."""
    total = float(np.sum(c.rates))
    cum = np.cumsum(c.rates) / total if total > 0 else None

    def draw(rng, n):
        if cum is None:
            return np.full(n, np.inf), np.zeros(n, dtype=np.int64)
        gaps = rng.exponential(1.0 / total, n)
        return gaps, np.minimum(np.searchsorted(cum, rng.random(n), side="right"), len(cum) - 1)

    return draw


def _round(c: Campaign, st: _State, gaps: np.ndarray, classes: np.ndarray, record: bool) -> None:
    """Every unfinished trial advances to its next failure or to the end."""
    active = ~st.finished
    if not active.any():
        return
    tf = st.t + gaps
    down = active & (tf < st.up_at)
    up = active & ~down
    ran = tf - st.up_at
    need = c.finish_s(st.done_steps)
    ends = up & (ran >= need)
    hit = up & ~ends
    out = st.out
    out.down_s[up] += (st.up_at - st.t)[up]
    out.down_s[down] += (tf - st.t)[down]
    out.during_restart[down] += 1
    if record:
        _record(c, st, tf, classes, ends, hit)
    out.wall_s[ends] = (st.up_at + need)[ends]
    st.finished |= ends
    _roll_back(c, st, np.flatnonzero(hit), ran, classes)
    _restart(c, st, np.flatnonzero(down | hit), tf, classes, hit)


def _roll_back(c: Campaign, st: _State, idx: np.ndarray, ran: np.ndarray, classes: np.ndarray) -> None:
    """Trials hit while running keep their last durable checkpoint (a planned stop keeps
    every finished step: it saves first); the rest of the run is lost work."""
    kept_steps, kept_s = progress(c, ran[idx], planned=c.kinds[classes[idx]] == PLANNED)
    st.out.lost_s[idx] += ran[idx] - kept_s
    st.done_steps[idx] += kept_steps


def progress(c: Campaign, ran: np.ndarray, planned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps kept, running seconds they account for) after ``ran`` seconds from a checkpoint:
    durable cycles, or for a planned stop every finished step."""
    k, L = c.interval, c.cycle_s
    cycles = np.floor(ran / L).astype(np.int64)
    steps_in = np.minimum(k, np.floor((ran - cycles * L) / c.step_s).astype(np.int64))
    durable = np.maximum(0, np.floor((ran - c.ckpt.write_s) / L).astype(np.int64))
    kept = np.where(planned, cycles * k + steps_in, durable * k)
    kept_s = np.where(planned, cycles * L + steps_in * c.step_s, durable * L)
    return kept, kept_s


def _restart(c: Campaign, st: _State, idx: np.ndarray, tf: np.ndarray, classes: np.ndarray,
             running: np.ndarray) -> None:
    """Count each failure and schedule the trial's next start."""
    cls = classes[idx]
    kind = c.kinds[cls]
    st.out.interruptions[idx] += 1
    np.add.at(st.out.by_cause, (idx, cls), 1)
    lead = np.where(kind == PLANNED, np.where(running[idx], c.ckpt.save_s, 0.0), c.detect_s)
    hw = idx[kind == HARDWARE]
    if len(hw):
        node_at = _take_node(c, st, hw, tf[hw])
        st.out.waits[hw] += node_at > tf[hw]
        st.hw_ready[hw] = np.maximum(st.hw_ready[hw], node_at)
    st.up_at[idx] = np.maximum(tf[idx] + lead, st.hw_ready[idx]) + c.restart_s + c.ckpt.load_s
    st.t[idx] = tf[idx]


def _take_node(c: Campaign, st: _State, idx: np.ndarray, tf: np.ndarray) -> np.ndarray:
    """When a healthy node replaces the failed one: now with an unbounded pool; else the
    earliest free spare, the failed node going to repair (``repair_s``) as a future spare."""
    if st.slots is None:
        return tf
    pool = np.concatenate([st.slots[idx], (tf + c.repair_s)[:, None]], axis=1)
    pick = np.argmin(pool, axis=1)
    rows = np.arange(len(idx))
    node_at = pool[rows, pick]
    pool[rows, pick] = pool[:, -1]
    st.slots[idx] = pool[:, :-1]
    return node_at


def _record(c: Campaign, st: _State, tf, classes, ends, hit) -> None:
    """Trial 0's segments: (start, end, from_step, reached, kept, cause or -1)."""
    if st.finished[0]:
        return
    start, s0 = float(st.up_at[0]), int(st.done_steps[0])
    if ends[0]:
        st.out.history.append((start, start + float(c.finish_s(st.done_steps[:1])[0]), s0, c.steps, c.steps, -1))
    elif hit[0]:
        ran = np.array([tf[0] - start])
        reached = progress(c, ran, np.array([True]))[0][0]
        kept = progress(c, ran, np.array([c.kinds[classes[0]] == PLANNED]))[0][0]
        st.out.history.append((start, float(tf[0]), s0, s0 + int(reached), s0 + int(kept), int(classes[0])))
    else:
        st.out.history.append((float(tf[0]), float(tf[0]), s0, s0, s0, int(classes[0])))


def expected_wall_s(c: Campaign) -> float:
    """Closed form for exponential failures with every class costing ``restart_cost_s`` and
    losing work (Daly 2006, eq. 13, failures during restarts included): each cycle of L
    seconds takes (e^(lam L) - 1) e^(lam R) / lam on average."""
    lam = float(np.sum(c.rates))
    cycles = c.steps / c.interval
    if lam == 0:
        return c.restart_s + cycles * c.cycle_s
    return c.restart_s + cycles * math.expm1(lam * c.cycle_s) * math.exp(lam * c.restart_cost_s) / lam


def check_finishes(c: Campaign) -> None:
    """Refuse a campaign whose expected interruptions per trial are astronomical, naming the
    setting that makes it so: the restart, or the checkpoint cycle (its interval or its write)."""
    lam = float(np.sum(c.rates))
    if lam * max(c.cycle_s, c.restart_cost_s) > 30 or lam * expected_wall_s(c) > MAX_EXPECTED_INTERRUPTIONS:
        if c.restart_cost_s > c.cycle_s:
            key = "--restart-min"
        else:
            key = "--storage-gbps" if c.cycle_s - c.interval * c.step_s > c.interval * c.step_s else "--checkpoint-every"
        raise InputError(key, f"a failure every {1 / lam / 60:.3g} min against checkpoint cycles of "
                              f"{c.cycle_s / 60:.3g} min and restarts of {c.restart_cost_s / 60:.3g} min: the run "
                              f"would practically never finish")


def _round_limit(c: Campaign) -> int:
    """Rounds after which a run is declared unfinishable (20x its expected interruptions)."""
    lam = float(np.sum(c.rates))
    return int(20 * lam * expected_wall_s(c)) + 1000


def _never_finishes(c: Campaign, st: _State) -> InputError:
    done = float(np.mean(st.done_steps / c.steps))
    pool = "a healthy node is always at hand" if c.spares is None else \
        f"{c.spares} spare nodes, each failed node away {c.repair_s / 3600:.3g} h"
    return InputError("--spares" if c.spares is not None else "--failures",
                      f"the run does not finish: after {int(np.max(st.out.interruptions)):,} interruptions per "
                      f"trial it has trained {done:.1%} ({pool}); more spares or faster repairs")
