"""The trainer pool: an RL training step is the simulator's training step on the trainer GPUs.

Run ``clustersim rl scenarios/rl-llama3-8b-h100.toml``.

How a step's variable-length responses map onto a training step: the step's B sequences
(prompt + response tokens each) are packed whole into rows of ``training.seq_len``
tokens, ``rows = ceil(tokens / seq_len)`` (sequence packing as RL trainers do it: verl's
``use_remove_padding`` with dynamic batch sizes, OpenRLHF's ``--packing_samples``). The
rows are split over the data-parallel ranks in micro-batches of ``training.micro_batch``
rows: ``m = ceil(rows / (dp * micro_batch))`` micro-batches per rank (a multiple of pp
for interleaved 1F1B, Megatron-LM's rule). A packed row costs what a full-length
sequence does (causal attention over the whole row; document masking would skip the
attention between packed documents).

The time of a step of m micro-batches is :func:`sim.step.simulate` of the trainer pool
(the scenario's ``[parallel]`` on its first ``trainer_gpus`` GPUs) with
``global_batch = m * dp * micro_batch``. For a fixed layout it is affine in m: every
micro-batch repeats the same ops, and the gradient sync, optimizer and pipeline fill and
drain are paid once (GPipe/1F1B: (m + p - 1) micro-batch slots). So two simulations, at
the micro-batch counts of the run's first and last steps' expected lengths, anchor the
line and every step reads its time off it; ``tests/test_rl.py`` checks a third m
against its own simulation.

With ``rl.weight_sync = "overlapped"`` the next step starts while the new weights leave
rank 0 (broadcast to the generators): :meth:`Trainer.with_transfer` simulates that step
with the broadcast added to rank 0's program on a stream of its own, on the whole
cluster's network, so the step's collectives and the transfer share links and slow each
other down in the engine itself. That returns both times, for each micro-batch count the
run needs (no line: the transfer is a fixed extra beside a growing step).
"""

from dataclasses import dataclass, field
from functools import lru_cache
import math

from ..collectives.kinds import BROADCAST, Algorithm
from ..engine.kinds import Category, Phase, StreamName
from ..input.choices import Schedule
from ..input.scenario import Scenario
from ..model import host
from ..model.transformer import dims, model_flops_per_token
from . import lengths as length_model


def pool_scenario(s: Scenario, micro: int, per_node: int) -> Scenario:
    """The trainer pool as a training scenario: its GPUs, its layout, ``micro``
    micro-batches per data-parallel rank, the link faults that touch its GPUs."""
    p, t, rl = s.parallel, s.training, s.rl
    faults = [f for f in s.cluster.faults
              if (f.gpu_nic is None or f.gpu_nic < rl.trainer_gpus)
              and (f.node_nics is None or f.node_nics * per_node < rl.trainer_gpus)]
    cluster = s.cluster.model_copy(update={"gpus": rl.trainer_gpus, "nodes": None, "faults": faults})
    training = t.model_copy(update={"global_batch": micro * p.dp * t.micro_batch})
    return s.model_copy(update={"name": f"{s.name}-trainer", "rl": None, "cluster": cluster, "training": training})


@dataclass
class Trainer:
    """Step times of the trainer pool, from two simulated anchors."""

    scenario: Scenario
    per_node: int
    anchors: dict = field(default_factory=dict)  # micro-batches -> Anchor
    overlapped: dict = field(default_factory=dict)  # micro-batches -> (step s, transfer s)

    @property
    def granule(self) -> int:
        """Micro-batch counts come in multiples of this (pp for interleaved 1F1B)."""
        p = self.scenario.parallel
        return p.pp if p.schedule is Schedule.INTERLEAVED else 1

    def micro_batches(self, tokens: int) -> int:
        """Micro-batches per data-parallel rank for a step of ``tokens`` packed tokens."""
        p, t = self.scenario.parallel, self.scenario.training
        rows = math.ceil(tokens / t.seq_len)
        m = math.ceil(rows / (p.dp * t.micro_batch))
        return max(1, math.ceil(m / self.granule)) * self.granule

    def expected_micro_batches(self, step: int) -> int:
        """Micro-batches of a step whose responses have the expected length."""
        rl = self.scenario.rl
        mean = length_model.expected(rl.lengths, step)
        return self.micro_batches(round(self.scenario.training.global_batch * (rl.prompt_tokens + mean)))

    def prepare(self) -> None:
        """Simulate the two anchors (first and last step's expected micro-batch counts)."""
        lo = self.expected_micro_batches(0)
        hi = max(self.expected_micro_batches(self.scenario.rl.steps - 1), lo + self.granule)
        for m in (lo, hi):
            self.simulate(m)

    def simulate(self, micro: int):
        """The training step of ``micro`` micro-batches per rank (cached here and, by
        scenario, across runs: a study's points share their trainer)."""
        if micro not in self.anchors:
            self.anchors[micro] = _simulate(pool_scenario(self.scenario, micro, self.per_node).model_dump_json())
        return self.anchors[micro]

    def step_time(self, micro: int) -> float:
        """Seconds of a training step of ``micro`` micro-batches per rank: exact at an
        anchor, else on the line through the two anchors."""
        if micro in self.anchors:
            return self.anchors[micro].summary["step_time_s"]
        (m0, r0), (m1, r1) = sorted(self.anchors.items())[:1] + sorted(self.anchors.items())[-1:]
        t0, t1 = r0.summary["step_time_s"], r1.summary["step_time_s"]
        return max(t0 + (micro - m0) * (t1 - t0) / (m1 - m0), 0.0)

    def with_transfer(self, micro: int, topo, group: tuple[int, ...], nbytes: float) -> tuple[float, float]:
        """(step s, transfer s): a step of ``micro`` micro-batches per rank while ``nbytes``
        broadcast from rank 0 to ``group`` on the same network (cached per ``micro``)."""
        if micro not in self.overlapped:
            self.overlapped[micro] = _step_with_transfer(pool_scenario(self.scenario, micro, self.per_node),
                                                         topo, group, nbytes)
        return self.overlapped[micro]

    def flops(self, tokens: int) -> float:
        """Model FLOPs of training ``tokens`` packed tokens (CONTRACT.md's convention)."""
        return model_flops_per_token(dims(self.scenario.model), self.scenario.training.seq_len) * tokens

    def phase_shares(self) -> tuple[float, float]:
        """(forward, backward) shares of an anchor step's compute on rank 0, for
        drawing a step as forward then backward work (the rest: the optimizer)."""
        return next(iter(self.anchors.values())).shares


@dataclass(frozen=True)
class Anchor:
    """What the loop keeps of a simulated training step: its summary (CONTRACT.md) and
    rank 0's (forward, backward) shares of compute (recomputation counts as backward)."""

    summary: dict
    shares: tuple[float, float]


def phase_shares(spans) -> tuple[float, float]:
    """(forward, backward) shares of rank 0's compute in ``spans``."""
    comp = spans[(spans["rank"] == 0) & (spans["category"] == Category.COMPUTE)]
    dur = comp["end_s"] - comp["start_s"]
    fwd = dur[comp["phase"] == Phase.FORWARD].sum()
    bwd = dur[comp["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE])].sum()
    total = dur.sum()
    return (fwd / total, bwd / total) if total > 0 else (0.0, 1.0)


@lru_cache(maxsize=16)
def _simulate(scenario_json: str) -> Anchor:
    """A trainer-pool step, by the scenario's content: a study's points share their trainer
    (only the summary and shares are kept, not the spans and programs)."""
    from ..step import simulate

    result = simulate(Scenario.model_validate_json(scenario_json))
    return Anchor(result.summary, phase_shares(result.spans))


def issued_first(program, op):
    """``program`` with ``op`` issued before its first op (a new program; every dependency
    index moves up by one). The host issues a rank's ops in program order
    (:meth:`sim.engine.ops.RankProgram.release`): an op appended last would leave only once
    the host had issued the whole step, not with the step's first ops."""
    from ..engine.ops import RankProgram

    ops = [op] + [o._replace(deps=tuple(d + 1 for d in o.deps)) if o.deps else o for o in program.ops]
    return RankProgram(program.rank, ops, holds_sms=program.holds_sms)


def _step_with_transfer(s: Scenario, topo, group: tuple[int, ...], nbytes: float) -> tuple[float, float]:
    """One training step of ``s`` on ``topo`` (the whole cluster) with a ring broadcast of
    ``nbytes`` from rank 0 to ``group`` starting with it (rank 0's host issues the broadcast
    first, a c10d call, then the step): (step end, broadcast duration)."""
    from ..engine.ops import Collective, Op
    from ..hardware.faults import compute_scale
    from ..step import build, execute

    ctx, programs = build(s, topo)
    i = next(i for i, p in enumerate(programs) if p.rank == 0)
    send = Op("send_weights", Category.WEIGHTS, StreamName.WEIGHTS,
              comm=Collective(("rl-weights",), BROADCAST, group, float(nbytes), Algorithm.RING),
              phase=Phase.WEIGHT_SYNC, issue=host.collective_issue_s(BROADCAST))
    programs[i] = issued_first(programs[i], send)
    _engine, spans, _wall = execute(s.name, topo, programs, compute_scale(s, topo), ctx.folding.arrivals)
    sent = spans["name"] == "send_weights"
    transfer = spans[sent].iloc[0]
    return float(spans.loc[~sent, "end_s"].max()), float(transfer.end_s - transfer.start_s)
