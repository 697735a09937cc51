"""RankBuilder: what every parallelism module uses to add ops to one rank's program.

It knows the rank's place (layout, stage), turns kernel lists into timed compute ops,
and turns collectives into ops with the right stream, key and, when ranks are folded,
the sibling groups whose traffic must still load the network. Every op carries its host
issue cost (``Op.issue``, :mod:`sim.model.host`): its kernel launches, or one NCCL call,
plus what the host spent since the last op (:meth:`RankBuilder.host`: the schedule loop, a
CUDA-graph launch); inside a captured region (:meth:`RankBuilder.graphed`) ops issue with
the region's one launch. ``training.compile`` fuses each op's elementwise chains first
(the model's, as torchtitan compiles each block; not the optimizer's).
"""

from contextlib import contextmanager
from dataclasses import dataclass, field

from ..collectives.kinds import Algorithm, CollectiveOp
from ..model.compute import ComputeModel, Kernel
from ..model import host
from ..engine.ops import Collective, Op, RankProgram
from ..engine.kinds import Category, Phase, StreamName
from ..model.transformer import Dims
from ..model.layers import Direction, Shard
from .folding import Folding
from .layout import Layout
from .tp import grad_parts
from ..input.scenario import Scenario


@dataclass(frozen=True)
class Context:
    """Everything shared by the builders of one scenario (frozen; ``_siblings`` memoizes
    :meth:`siblings`, a function of the fields)."""

    scenario: Scenario
    dims: Dims
    layout: Layout
    shard: Shard
    compute: ComputeModel
    domains: list[int]  # NVLink domain of every rank (rank i runs on GPU i)
    simulated: frozenset[int]
    micro_batches: int
    stage_layers: list[range]  # layers of each virtual stage
    expert_loads: dict = field(default_factory=dict)  # layer -> tokens per expert
    folding: Folding | None = None  # which ranks are simulated (None: memory accounting of the planner)
    _siblings: dict = field(default_factory=dict)
    memo: dict = field(default_factory=dict)  # builders' pure functions of the fields, by key (ep.shares)

    def siblings(self, axis: Category, group: tuple[int, ...], group_of) -> tuple[tuple[int, ...], ...]:
        """Groups that run the same collective at the same time on folded (not simulated)
        ranks, each riding with exactly one simulated copy (:mod:`sim.parallel.folding`).
        Only needed when the group leaves its NVLink domain: inside a domain, every
        GPU has its own NVSwitch link, so copies never share one."""
        key = (axis, group)
        found = self._siblings.get(key)
        if found is None:
            found = ()
            if len(self.simulated) < self.layout.world and len({self.domains[r] for r in group}) > 1:
                found = self.folding.siblings(group)
                if found is None:  # a group of no type the folding knows: search the stage
                    found = self._search_siblings(group, group_of)
            self._siblings[key] = found
        return found

    def _search_siblings(self, group: tuple[int, ...], group_of) -> tuple[tuple[int, ...], ...]:
        """The siblings of ``group`` found by asking ``group_of`` for every group of its stage."""
        classes, simulated = self.folding.classes, self.simulated
        want = [classes[r] for r in group]
        same_stage = self.layout.group(group[0], Category.TP, Category.CP, Category.DP)
        alike, covered = [], set(group)
        for r in same_stage:  # groups partition the stage: one group_of call per group
            if r not in covered:
                g = group_of(r)
                covered.update(g)
                if [classes[x] for x in g] == want:
                    alike.append(tuple(g))
        carriers = sorted([tuple(group)] + [g for g in alike if simulated.intersection(g)])
        if carriers[0] != tuple(group):
            return ()  # another simulated copy carries them
        return tuple(sorted(g for g in alike if not simulated.intersection(g)))

    def representative(self, rank: int) -> int:
        """The simulated rank whose timeline ``rank`` shares (itself when simulated)."""
        return int(self.folding.representative[rank])


def timed(ctx: Context, kernels, fuse: bool) -> tuple[float, float]:
    """(duration, own host issue seconds) of a compute op of ``kernels`` (``fuse``: as
    torch.compile issues them, :func:`sim.model.host.fused`)."""
    issued = host.fused(kernels) if fuse else kernels
    return ctx.compute.time(issued), host.issue_s(issued)


@dataclass(frozen=True)
class Varying:
    """An op whose kernels are the rank's local experts' (tokens per expert of its ep slice):
    all a copy for another slice retimes, with the host state it was issued in (seconds
    pending, inside a captured region, fused)."""

    index: int
    pending: float
    captured: bool
    fuse: bool
    layer: int
    direction: Direction

    def moved(self, shift: int) -> "Varying":
        """The same record ``shift`` ops on (a replayed step's: sim/parallel/replay.py); built
        directly, as ``dataclasses.replace`` reads the fields anew for each (~2% of the
        ``mz-q235-tp2pp32ep8`` row's CPU)."""
        return Varying(self.index + shift, self.pending, self.captured, self.fuse, self.layer, self.direction)

    def timed_op(self, base: Op, duration: float, own: float, host_issue: float = 1.0) -> Op:
        """``base`` with ``duration`` and, but inside a captured region, ``own`` issue seconds
        (:func:`timed`'s pair for this op's kernels: what :meth:`RankBuilder.compute` would
        have built; sim/parallel/copies.py ``retimed_ops``), at the host's ``host_issue`` (:meth:`RankBuilder._issue`)."""
        return base._replace(duration=duration, issue=(self.pending + (0.0 if self.captured else own)) * host_issue)


class RankBuilder:
    """Adds ops to one rank's program. Every op it adds is of the :class:`Phase` the
    code building it has entered (:meth:`phase_of`: a pass, a recomputation, the optimizer)."""

    def __init__(self, ctx: Context, rank: int):
        self.ctx, self.rank = ctx, rank
        self.coords = ctx.layout.coords(rank)
        self.stage = self.coords[Category.PP]
        self.program = RankProgram(rank)
        self.deferred: list | None = None  # weight gradients held for a later W pass (zero-bubble schedules)
        self.embedding_wgrads: list = []  # the output layer's, held for the pipeline flush (.wgrad_deferral)
        self.phase: Phase | None = None
        self.pending = 0.0  # host seconds spent since the last op (charged to the next op added)
        self.host_issue = ctx.compute.gpu.host_issue  # the host's issue time over the x86 costs measured (_issue)
        self.captured = False  # inside a CUDA-graph captured region
        self.compiled = ctx.scenario.training.compile
        self.varying: list[Varying] | None = []  # ops timed by this rank's expert loads (None: others vary too)
        self.fp8_gemms = 0  # FP8 GEMMs built in forward passes so far (sim/parallel/amax.py counts a chunk's)
        self.amax_gemms: dict[int, int] = {}  # model chunk -> its FP8 GEMMs (set by its first forward)
        self.paired = False  # inside a combined-1F1B layer pair (sim/parallel/ep_overlap.py)

    def group(self, *axes: str) -> tuple[int, ...]:
        """This rank's group along ``axes`` (:meth:`.layout.Layout.group`)."""
        return self.ctx.layout.group(self.rank, *axes)

    def group_of(self, *axes: str):
        """Any rank's group along ``axes``: a collective's ``group_of``."""
        layout = self.ctx.layout
        return lambda r: layout.group(r, *axes)

    def host(self, seconds: float) -> None:
        """The host spends ``seconds`` before it issues the next op (the schedule loop)."""
        self.pending += seconds

    @contextmanager
    def graphed(self, captured: bool = True):
        """Ops added inside the block replay as one CUDA graph (when ``captured`` and
        ``training.cuda_graphs``): one graph launch, then nothing per kernel or call."""
        if not captured or self.captured or not self.ctx.scenario.training.cuda_graphs:
            yield
            return
        self.pending += host.GRAPH_LAUNCH_S
        self.captured = True
        try:
            yield
        finally:
            self.captured = False

    def _issue(self, own: float) -> float:
        """Host seconds to charge the op being added: its own (none inside a graph) plus
        what the host spent since the last op, both at the GPU's host speed (``GPU.host_issue``:
        sim/model/host.py's x86 costs, 2.75x on a Grace host, :data:`sim.hardware.gpus.GRACE_HOST_ISSUE`)."""
        cost, self.pending = (self.pending + (0.0 if self.captured else own)) * self.host_issue, 0.0
        return cost

    @contextmanager
    def phase_of(self, phase: Phase):
        """Ops added inside the block are of ``phase`` (the outer phase is restored after)."""
        outer, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = outer

    def _phase(self) -> Phase:
        if self.phase is None:
            raise RuntimeError(f"rank {self.rank}: an op built outside any phase (use RankBuilder.phase_of)")
        return self.phase

    def compute(self, name: str, kernels: list[Kernel], deps=(), layer=-1, mb=-1, stream: str = StreamName.COMPUTE,
                weights: bool = True, loads: tuple | None = None, linears: bool = True,
                issue: float | None = None) -> int:
        """A compute op timed by the compute model, on ``stream`` (another than ``compute``
        when a framework issues kernels on its communication stream); returns its index.
        While a pass defers its weight gradients (:attr:`deferred` is a list), the
        weight-gradient half of the op's GEMMs (:func:`.tp.grad_parts`) is recorded there
        instead; ``weights=False``: the kernels are already one side of that split. ``loads``:
        (layer, direction) when the kernels are this rank's local experts' (:func:`.ep.expert_kernels`),
        recorded in :attr:`varying` so a copy for another expert slice retimes the op. A forward
        op's FP8 GEMMs count in :attr:`fp8_gemms` (``linears=False``: a later chunk of GEMMs
        already counted, TP-comm overlap's split). ``issue``: its own host seconds when a library call
        issues it, not an eager launch per kernel (sim/parallel/tp_overlap.py's later chunks)."""
        if linears and self.phase is Phase.FORWARD:
            self.fp8_gemms += sum(k.count for k in kernels if k.fp8)
        wgrad = ()
        if self.deferred is not None and weights:
            kernels, wgrad = grad_parts(kernels)
        fuse = self.compiled and self.phase is not Phase.OPTIMIZER
        duration, own = timed(self.ctx, kernels, fuse)  # (jitter scales a built program: sim.parallel.copies)
        own = own if issue is None else issue
        if loads is not None and self.varying is not None:
            if self.deferred is not None:
                self.varying = None  # (split for a zero-bubble W: such programs are built per rank)
            else:
                self.varying.append(Varying(len(self.program.ops), self.pending, self.captured, fuse, *loads))
        op = self.program.add(Op(name, Category.COMPUTE, stream, duration, None, _deps(deps),
                                 layer, mb, self.stage, self._phase(), self._issue(own)))
        if wgrad:
            self.deferred.append((name, wgrad, op, layer, mb))
        return op

    def weight_grad(self, name: str, kernels: tuple, deps, layer: int, mb: int):
        """An op of weight-gradient GEMMs: now, or recorded for the W pass while the
        weight gradients are deferred (then the pass goes on from ``deps``)."""
        if self.deferred is None:
            return self.compute(name, kernels, deps, layer, mb)
        self.deferred.append((name, kernels, deps, layer, mb))
        return deps

    def host_sync(self, name: str, deps, layer=-1, mb=-1, stream: str = StreamName.COMPUTE) -> int:
        """The host reading GPU values (:data:`sim.model.host.D2H_SYNC_S`): a copy of a few
        bytes on ``stream`` after ``deps`` (no GPU time to speak of), built with ``sync``, so
        the host issues nothing after it before it has ended (the engine's
        :meth:`~sim.engine.ops.RankProgram.anchors`)."""
        return self.program.add(Op(name, Category.COMPUTE, stream, 0.0, None, _deps(deps), layer, mb, self.stage,
                                   self._phase(), self._issue(host.D2H_SYNC_S), True))

    def collective(self, name: str, axis: Category, op: CollectiveOp, group: tuple[int, ...], nbytes: float,
                   deps=(), stream: str | None = None, algo: Algorithm | str = Algorithm.AUTO, layer=-1, mb=-1,
                   group_of=None, tag=(), key: str | None = None, shares: tuple | None = None,
                   sms: float = 0.0, issue: float | None = None) -> int:
        """A collective op on ``stream`` (default: the axis); returns its index. Every member
        of one call builds the same key from ``key`` (default ``name``), layer, mb, group, tag.
        ``shares``: uneven all-to-all weights (see :func:`sim.collectives.schedule`). ``algo``: a
        member (the scenario's ``parallel.dp_algo`` is one), or a member's text, which becomes it here.
        ``sms``: the share of the GPU's SMs its kernels hold while they run (``Collective.sms``). ``issue``: its
        host seconds when it is no c10d call (userbuffers' exchanges: sim/parallel/tp_overlap.py)."""
        siblings = self.ctx.siblings(axis, group, group_of) if group_of else ()
        call = Collective((key or name, layer, mb, group) + tuple(tag), op, group, float(nbytes), Algorithm(algo),
                          siblings, shares, sms)
        if sms:
            self.program.holds_sms = True
        return self.program.add(Op(name, axis, stream or axis, 0.0, call, _deps(deps), layer, mb, self.stage,
                                   self._phase(), self._issue(host.collective_issue_s(op) if issue is None else issue)))


def _deps(deps) -> tuple[int, ...]:
    """Flatten ints, None and nested tuples of them into op indices."""
    if deps is None:
        return ()
    if isinstance(deps, int):
        return (deps,) if deps >= 0 else ()
    return tuple(sorted({i for d in deps for i in _deps(d)}))
