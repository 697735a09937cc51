"""The RL loop as a SimPy discrete-event simulation: generator engines and the trainer.

Run ``clustersim rl scenarios/rl-llama3-8b-h100.toml``; docs/rl.md derives what it shows.

Prompts form one stream; sequence i belongs to batch ``j = i // B`` (B =
``training.global_batch`` responses per step) and goes to engine ``i mod E``, round
robin (lengths are unknown when a prompt is sent; verl splits a batch evenly over its
rollout workers). An engine starts its next prompt whenever it has a free slot and the
**staleness gate** lets it: with weights of version v (v optimizer steps done) it may
start sequence i only if ``j <= v + k``, k = ``rl.max_staleness`` (0 in sync). That is PipelineRL's ``max_lag``
admission (pipelinerl/actor.py: ``can_submit_before_update`` grows by one batch per
weight update), in steps instead of samples. The modes differ in when weights change and
which sequences a step trains on:

- ``sync``: the trainer trains step n on batch n once all of it is done, then broadcasts
  version n + 1; generators idle meanwhile (k = 0: nothing else is admissible).
- ``async`` (k-step off-policy): the trainer trains step n on batch n. Weights stream
  into host memory of the generator nodes while the engines generate; an engine swaps to
  the newest staged version (a host-to-GPU copy of its shard over PCIe) only between
  sequences, when it has drained (its gate blocked), so a sequence keeps the weights it
  started with and every token lags at most k steps.
- ``pipeline`` (in-flight updates): the trainer trains step n on the first B sequences
  to finish, whatever their batch. After each step every engine pauses at its next
  decode-step boundary, receives the new weights (PipelineRL's
  ``pause_generation(mode="keep")``: the KV cache is kept) and resumes its running
  sequences with them, so one sequence's tokens come from several versions.

Between events an engine's batch is fixed, so it jumps over decode steps in closed form
(:meth:`~sim.rl.inference.EngineCost.decode_span`); only a pause request (pipeline) cuts
a jump, at the next step boundary.
"""

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import simpy

from ..input.choices import RLMode, WeightSync
from . import lengths as length_model
from .transfer import run as run_transfer



class Segment(StrEnum):
    """What a generator engine does over one segment of its time (:attr:`Generator.segments`,
    read by :mod:`.summary` and :mod:`.exports`)."""

    GENERATE = "generate"  # prefill or decode steps (``running`` of its slots busy)
    IDLE = "idle"  # nothing admissible
    WEIGHTS = "weights"  # paused for, or loading, new weights


@dataclass(eq=False)
class Seq:
    """One prompt's response. ``versions``: weights version -> tokens generated with it."""

    index: int
    batch: int
    prompt: int
    length: int
    engine: int
    emitted: int = 0
    versions: dict = field(default_factory=dict)
    done_at: float = -1.0
    trained_at: int = -1  # the training step that consumed it

    def emit(self, n: int, version: int) -> None:
        """``n`` more tokens with weights ``version``."""
        self.emitted += n
        self.versions[version] = self.versions.get(version, 0) + n


class Prompts:
    """The prompt stream, the staleness gate, and finished sequences on their way to the trainer."""

    def __init__(self, env, s, batch: int, k: int, fifo: bool, engines: int):
        self.env, self.s, self.batch, self.k, self.fifo = env, s, batch, k, fifo
        self.engines = engines
        self.next = list(range(engines))  # each engine's next sequence index
        self.lengths: dict[int, np.ndarray] = {}
        self.all: list[Seq] = []
        self.finished: list[Seq] = []  # pipeline: in order of completion
        self.batches: dict[int, list[Seq]] = {}
        self.consumed = 0
        self.ready: simpy.Event | None = None
        self.need = 0

    def admissible(self, engine: int, version: int) -> bool:
        """May ``engine``, holding weights ``version``, start its next sequence?"""
        return self.next[engine] // self.batch <= version + self.k

    def take(self, engine: int) -> Seq:
        """``engine``'s next prompt, with its response length."""
        i = self.next[engine]
        j = i // self.batch
        self.next[engine] += self.engines
        if j not in self.lengths:
            self.lengths[j] = length_model.draw(self.s.rl.lengths, self.s.seed, j, self.batch)
        seq = Seq(i, j, self.s.rl.prompt_tokens, int(self.lengths[j][i % self.batch]), engine)
        self.all.append(seq)
        return seq

    def finish(self, seq: Seq) -> None:
        """A sequence is complete: queue it for the trainer."""
        seq.done_at = self.env.now
        (self.finished if self.fifo else self.batches.setdefault(seq.batch, [])).append(seq)
        if self.ready is not None and self._available() >= self.need:
            self.ready.succeed()
            self.ready = None

    def _available(self) -> int:
        return len(self.finished) - self.consumed if self.fifo else len(self.batches.get(self.need_batch, []))

    def peek(self, n: int) -> list[Seq] | None:
        """The sequences step ``n`` would train on, if all are done already."""
        if self.fifo:
            return self.finished[self.consumed:self.consumed + self.batch] \
                if len(self.finished) - self.consumed >= self.batch else None
        done = self.batches.get(n, [])
        return done if len(done) == self.batch else None

    def for_step(self, n: int):
        """SimPy generator: the B sequences step ``n`` trains on."""
        self.need, self.need_batch = self.batch, n
        if self._available() < self.batch:
            self.ready = self.env.event()
            yield self.ready
        if self.fifo:
            out = self.finished[self.consumed:self.consumed + self.batch]
            self.consumed += self.batch
            return out
        return self.batches.pop(n)


class Generator:
    """One inference engine (``cost.tp`` GPUs) running sequences in continuous batches."""

    def __init__(self, env, index: int, gpus: tuple[int, ...], cost, prompts: Prompts, mode: str):
        self.env, self.index, self.gpus, self.cost, self.prompts, self.mode = env, index, gpus, cost, prompts, mode
        self.running: list[Seq] = []
        self.version = self.staged = 0
        self.segments: list[list] = []  # [start, end (None: open), Segment, running, weights version]
        self.wake = env.event()
        self.pause_pending = False
        self.paused = self.resume = None

    def run(self):
        """SimPy process: pause, swap, admit, prefill, decode, forever."""
        while True:
            if self.pause_pending:
                yield from self._pause()
            if self.mode is RLMode.ASYNC and not self.running and self.staged > self.version:
                yield from self._swap()
            new = self._admit()
            if new:
                yield from self._prefill(new)
            elif not self.running:
                yield from self._idle()
            else:
                yield from self._decode()

    def _segment(self, kind: "Segment", end=None, running: int = 0) -> list:
        seg = [self.env.now, end, kind, running, self.version]
        self.segments.append(seg)
        return seg

    def _admit(self) -> list[Seq]:
        new = []
        while len(self.running) + len(new) < self.cost.slots and self.prompts.admissible(self.index, self.version):
            new.append(self.prompts.take(self.index))
        return new

    def _prefill(self, new: list[Seq]):
        dt = self.cost.prefill([q.prompt for q in new])
        self._segment(Segment.GENERATE, self.env.now + dt, len(self.running) + len(new))
        yield self.env.timeout(dt)
        for q in new:
            q.emit(1, self.version)  # the prefill step samples each prompt's first token
        self.running += new
        self._retire()

    def _idle(self):
        seg = self._segment(Segment.IDLE)
        if not self.wake.triggered:
            yield self.wake
        self.wake = self.env.event()
        seg[1] = self.env.now

    def _decode(self):
        b = len(self.running)
        context = sum(q.prompt + q.emitted for q in self.running)
        k = min(q.length - q.emitted for q in self.running)
        start = self.env.now
        seg = self._segment(Segment.GENERATE, start + self.cost.decode_span(b, context, k), b)
        timer = self.env.timeout(seg[1] - start)
        fired = yield (timer | self.wake) if self.mode is RLMode.PIPELINE else timer
        n = k
        if self.mode is RLMode.PIPELINE and timer not in fired:  # a pause request: finish the step in flight
            self.wake = self.env.event()
            n = min(k, self.cost.steps_within(b, context, self.env.now - start, k) + 1)
            seg[1] = start + self.cost.decode_span(b, context, n)
            if seg[1] > self.env.now:
                yield self.env.timeout(seg[1] - self.env.now)
        for q in self.running:
            q.emit(n, self.version)
        self._retire()

    def _retire(self) -> None:
        done = [q for q in self.running if q.emitted >= q.length]
        if done:
            self.running = [q for q in self.running if q.emitted < q.length]
            for q in done:
                self.prompts.finish(q)

    def _pause(self):
        seg = self._segment(Segment.WEIGHTS, running=len(self.running))
        self.paused.succeed()
        version = yield self.resume
        self.version, self.pause_pending = version, False
        self.wake = self.env.event()  # the request that woke it is served
        seg[1] = self.env.now

    def _swap(self):
        dt = self.cost.load_weights()
        self._segment(Segment.WEIGHTS, self.env.now + dt)
        yield self.env.timeout(dt)
        self.version = self.staged


@dataclass
class StepRecord:
    """One training step: when, how long, what it trained on, how stale."""

    step: int
    start: float
    end: float
    micro_batches: int
    tokens: int  # packed tokens (prompts + responses)
    response_tokens: int
    max_length: int
    lag_tokens: dict  # lag in steps -> tokens
    seq_lags: list  # per sequence: step - its oldest token's version
    transfer: tuple | None = None  # (start, end) of the weight transfer that follows


class Loop:
    """Wires generators, trainer and network, and runs ``rl.steps`` training steps.

    ``rl.weight_sync = "blocking"``: after a step the trainer sends the weights and waits
    (PipelineRL). ``"overlapped"``: it sends them from a copy and trains the next step at
    once if that step's sequences are ready: the step and the transfer then run together
    on the network (:meth:`~sim.rl.trainer.Trainer.with_transfer`); if they are not, the
    transfer runs alone while the trainer waits for data. One transfer at a time."""

    def __init__(self, env, s, generators: list[Generator], prompts: Prompts, trainer, net, transfer_phases,
                 group: tuple[int, ...] = (), weight_bytes: float = 0.0):
        self.env, self.s, self.generators, self.prompts = env, s, generators, prompts
        self.trainer, self.net, self.transfer_phases = trainer, net, transfer_phases
        self.group, self.weight_bytes = group, weight_bytes
        self.steps: list[StepRecord] = []

    def run(self) -> float:
        """Simulate; returns the wall time (end of the last training step)."""
        for g in self.generators:
            self.env.process(g.run())
        done = self.env.process(self._train())
        self.env.run(until=done)
        return self.env.now

    def _train(self):
        overlapped = self.s.rl.weight_sync is WeightSync.OVERLAPPED
        previous, joint = None, None
        for n in range(self.s.rl.steps):
            seqs = yield from self.prompts.for_step(n)
            yield from self._step(n, seqs, joint[0] if joint else None)
            if n == self.s.rl.steps - 1:
                break
            if not overlapped:
                yield from self._sync_weights(n + 1)
                continue
            if previous is not None and not previous.triggered:
                yield previous
            ready = self.prompts.peek(n + 1)
            joint = None if ready is None else self.trainer.with_transfer(
                self.trainer.micro_batches(sum(q.prompt + q.length for q in ready)), self.net.topo, self.group,
                self.weight_bytes)
            previous = self.env.process(self._sync_weights(n + 1, joint[1] if joint else None))

    def _step(self, n: int, seqs: list[Seq], seconds: float | None = None):
        tokens = sum(q.prompt + q.length for q in seqs)
        m = self.trainer.micro_batches(tokens)
        start = self.env.now
        yield self.env.timeout(self.trainer.step_time(m) if seconds is None else seconds)
        lags: dict[int, int] = {}
        for q in seqs:
            q.trained_at = n
            for v, c in q.versions.items():
                lags[n - v] = lags.get(n - v, 0) + c
        self.steps.append(StepRecord(n, start, self.env.now, m, tokens, sum(q.length for q in seqs),
                                     max(q.length for q in seqs), lags, [n - min(q.versions) for q in seqs]))

    def _sync_weights(self, version: int, seconds: float | None = None):
        """Send weights ``version``: on the network alone, or for ``seconds`` (overlapped
        with a training step, timed by the trainer's joint simulation)."""
        mode = self.s.rl.mode
        if mode is RLMode.PIPELINE:  # every engine stops at a step boundary, then receives
            for g in self.generators:
                g.pause_pending, g.paused, g.resume = True, self.env.event(), self.env.event()
                if not g.wake.triggered:
                    g.wake.succeed()
            yield self.env.all_of([g.paused for g in self.generators])
        start = self.env.now
        if seconds is None:
            yield from run_transfer(self.net, self.transfer_phases)
        else:
            yield self.env.timeout(seconds)
        self.steps[version - 1].transfer = (start, self.env.now)
        for g in self.generators:
            if mode is RLMode.PIPELINE:
                g.resume.succeed(version)
            elif mode is RLMode.SYNC:
                g.version = version
            else:
                g.staged = version
            if mode is not RLMode.PIPELINE and not g.wake.triggered:
                g.wake.succeed()


def lag_array(steps: list[StepRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(lags, tokens at that lag) over every trained token."""
    merged: dict[int, int] = {}
    for st in steps:
        for lag, c in st.lag_tokens.items():
            merged[lag] = merged.get(lag, 0) + c
    keys = np.array(sorted(merged), dtype=np.int64)
    return keys, np.array([merged[k] for k in keys], dtype=np.int64)
