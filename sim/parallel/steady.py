"""Which micro-batch counts a steady-state run simulates (``[simulation] micro_batches =
"steady"``, run by sim/steady.py), and whether a scenario's micro-batches are identical
enough to try.

A pipeline schedule repeats the same work once per micro-batch: in 1F1B, interleaved 1F1B,
GPipe, the zero-bubble and DualPipe schedules every micro-batch of a stage runs the same
kernels and collectives (expert loads are drawn per layer, not per micro-batch:
:func:`sim.parallel.workload.expert_loads`), so past the pipeline's fill the step grows by
the same time per micro-batch. The step is therefore simulated at three counts
``m0 < m0 + u < m0 + 2u`` whose per-micro-batch work is the scenario's own (only
``training.global_batch`` changes): ``u`` is the step the schedule's rule allows
(interleaved: a multiple of pp, Megatron-LM's rule; DualPipe: an even count), ``m0`` the
smallest count past its rules and fill (DualPipe: 2 pp, its assertion; interleaved: 2 pp,
so every rank runs a steady phase; other pipelines: pp; without a pipeline: 2, so gradient
accumulation runs at least once beside the last micro-batch's reduction). A window whose
step is not yet linear (a straggler's transient outlasts the fill) is followed by windows
starting twice as far in, while all the counts tried stay at most half the step's own.

Not tried (the exact step runs): seeded jitter draws a different slowdown for every op, so
no two micro-batches are alike; a straggler that starts slowing at ``start_s`` > 0 changes
the step's shape with its length; a deferral limit of the output layer's weight gradients
(``parallel.wgrad_deferral_limit``) treats the first micro-batches unlike the rest; a step of
fewer than twice the micro-batches of the three runs together (:data:`SHARE`: too little to save).

Run: ``python -c "import sim; from sim.parallel import steady; print(steady.counts(sim.load_scenario('scenarios/gpt3-175b-ptd.toml')))"``.
"""

from dataclasses import dataclass

from ..input.choices import V_SCHEDULES, Schedule
from ..input.scenario import Scenario, Simulation

COUNTS = 3  # the fewest counts that test linearity (a second difference) besides fitting it
# At most this share of the step's micro-batches simulated by the steady runs: past it they save
# too little to risk paying for the exact step too (a straggler's transient at 16,384 GPUs: the
# window 16, 17, 18 of 64 micro-batches was not linear, and steady mode cost 1.9x the exact CPU).
SHARE = 0.5


@dataclass(frozen=True)
class Counts:
    """The micro-batch counts (per pipeline) a steady run simulates, or why it cannot."""

    real: int  # the scenario's own micro-batches per pipeline
    simulated: tuple[int, ...] = ()  # ascending, equally spaced; empty when not eligible
    reason: str = ""  # why the exact step runs instead (empty when eligible)

    step: int = 1  # the spacing of the counts

    @property
    def eligible(self) -> bool:
        return bool(self.simulated)

    def windows(self):
        """The counts to try, first ``simulated``, then (if its step was not yet linear: a
        transient longer than the fill, such as a straggler's) windows starting twice as far
        in, as long as all the counts tried add up to at most half the step's micro-batches
        (:data:`SHARE`)."""
        start, spent = self.simulated[0] if self.simulated else 0, 0
        while self.simulated:
            window = tuple(start + i * self.step for i in range(COUNTS))
            spent += sum(window)
            if not within_share(spent, self.real):
                return
            yield window
            start *= 2


def within_share(simulated, real):
    """Whether steady runs simulating ``simulated`` micro-batches in all are worth it for a step of
    ``real``: at most :data:`SHARE` of them (ints, or numpy arrays elementwise: the planner
    prices whole tables, sim/plan/cost.py)."""
    return simulated <= SHARE * real


def micro_batches(s: Scenario) -> int:
    """Micro-batches per pipeline per step (global_batch / (dp * micro_batch))."""
    return s.training.global_batch // (s.parallel.dp * s.training.micro_batch)


def window(schedule: Schedule, pp: int) -> tuple[tuple[int, ...], int]:
    """The first counts a steady run of ``schedule`` on ``pp`` stages simulates, and their
    spacing (the module docstring's ``m0``, ``u``); the planner prices them too
    (sim/plan/cost.py)."""
    step = pp if schedule == Schedule.INTERLEAVED else 2 if schedule == Schedule.DUALPIPE else 1
    if pp == 1:
        first = 2
    elif schedule in (Schedule.INTERLEAVED, Schedule.DUALPIPE) or schedule in V_SCHEDULES:
        first = 2 * pp
    else:
        first = pp
    first = -(-first // step) * step
    return tuple(first + i * step for i in range(COUNTS)), step


def counts(s: Scenario) -> Counts:
    """What a steady run of ``s`` simulates (see the module docstring)."""
    real, p = micro_batches(s), s.parallel
    if s.jitter.sigma > 0:
        return Counts(real, reason="jitter draws a slowdown per op: no two micro-batches are alike")
    late = [i for i, st in enumerate(s.stragglers) if st.start_s > 0]
    if late:
        return Counts(real, reason=f"stragglers[{late[0]}] starts at start_s > 0: the step's shape changes with its length")
    if p.defer_embedding_wgrad_compute and p.wgrad_deferral_limit:
        return Counts(real, reason=f"wgrad_deferral_limit = {p.wgrad_deferral_limit}: the first micro-batches' output-"
                                   "layer weight gradients wait for the flush, the rest do not (not linear in the count)")
    simulated, step = window(p.schedule, p.pp)
    if not within_share(sum(simulated), real):
        return Counts(real, reason=f"{real} micro-batches per pipeline: fewer than twice the {sum(simulated)} a "
                                   f"steady run would simulate ({' + '.join(map(str, simulated))})")
    return Counts(real, simulated, step=step)


def at(s: Scenario, m: int) -> Scenario:
    """``s`` with ``m`` micro-batches per pipeline (only ``training.global_batch`` changes) and
    its micro-batches simulated exactly."""
    batch = m * s.parallel.dp * s.training.micro_batch
    return s.model_copy(update={"training": s.training.model_copy(update={"global_batch": batch}),
                                "simulation": Simulation()})


def exact_copy(s: Scenario) -> Scenario:
    """``s`` with every micro-batch simulated (``[simulation] micro_batches = "all"``)."""
    return at(s, micro_batches(s))
