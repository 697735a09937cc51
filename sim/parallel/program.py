"""RankBuilder: what every parallelism module uses to add ops to one rank's program.

It knows the rank's place (layout, stage), turns kernel lists into timed compute ops,
and turns collectives into ops with the right stream, key and, when ranks are folded,
the sibling groups whose traffic must still load the network.
"""

from dataclasses import dataclass, field
from functools import cached_property

from ..model.compute import ComputeModel, Kernel
from ..engine.core import Collective, Op, RankProgram
from ..model.transformer import Dims
from ..model.layers import Shard
from .layout import Layout
from ..input.scenario import Scenario


@dataclass
class Context:
    """Everything shared by the builders of one scenario (read-only)."""

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
    jitter: object = None  # callable(rank, index) -> multiplier, or None
    _siblings: dict = field(default_factory=dict)

    def siblings(self, axis: str, group: tuple[int, ...], group_of) -> tuple[tuple[int, ...], ...]:
        """Groups that run the same collective at the same time on folded (not simulated)
        ranks. Only needed when the group leaves its NVLink domain: inside a domain, every
        GPU has its own NVSwitch link, so copies never share one."""
        key = (axis, group)
        found = self._siblings.get(key)
        if found is None:
            found = ()
            if len(self.simulated) < self.layout.world and len({self.domains[r] for r in group}) > 1:
                same_stage = self.layout.group(group[0], "tp", "cp", "dp")
                others, covered = [], set(group)
                for r in same_stage:  # groups partition the stage: one group_of call per group
                    if r not in covered:
                        g = group_of(r)
                        covered.update(g)
                        if not self.simulated.intersection(g):
                            others.append(g)
                # each folded group rides with the one simulated copy of it
                others = [g for g in others if self.representative(g[0]) == group[0]]
                found = tuple(sorted(others))
            self._siblings[key] = found
        return found

    @cached_property
    def _stage_simulated(self) -> dict[int, list[int]]:
        return simulated_by_stage(self.layout, self.simulated)

    def representative(self, rank: int) -> int:
        """The simulated rank doing ``rank``'s work (see :func:`representative`)."""
        found = representative(self.layout, self.simulated, self._stage_simulated, rank)
        return rank if found is None else found


def simulated_by_stage(layout: Layout, simulated) -> dict[int, list[int]]:
    """Pipeline stage -> its simulated ranks, ascending."""
    out: dict[int, list[int]] = {}
    for r in sorted(simulated):
        out.setdefault(layout.coords(r)["pp"], []).append(r)
    return out


def representative(layout: Layout, simulated, by_stage: dict[int, list[int]], rank: int) -> int | None:
    """The simulated rank doing ``rank``'s work: itself when simulated, else the simulated
    rank of its stage at the same expert-group position (uneven routing simulates whole
    expert groups) or the stage's one simulated rank; None if its stage has none."""
    if rank in simulated:
        return rank
    same = by_stage.get(layout.coords(rank)["pp"], [])
    if len(same) > 1 and layout.ep > 1:
        slot = layout.ep_index(rank)
        same = [r for r in same if layout.ep_index(r) == slot] or same
    return same[0] if same else None


class RankBuilder:
    """Adds ops to one rank's program."""

    def __init__(self, ctx: Context, rank: int):
        self.ctx, self.rank = ctx, rank
        self.coords = ctx.layout.coords(rank)
        self.stage = self.coords["pp"]
        self.program = RankProgram(rank)

    def compute(self, name: str, kernels: list[Kernel], deps=(), layer=-1, mb=-1) -> int:
        """A compute op timed by the compute model; returns its index."""
        duration = self.ctx.compute.time(kernels)
        if self.ctx.jitter is not None:
            duration *= self.ctx.jitter(self.rank, len(self.program.ops))
        return self.program.add(Op(name, "compute", "compute", duration, None, _deps(deps),
                                   layer, mb, self.stage))

    def collective(self, name: str, axis: str, op: str, group: tuple[int, ...], nbytes: float,
                   deps=(), stream: str | None = None, algo: str = "auto", layer=-1, mb=-1,
                   group_of=None, tag=(), key: str | None = None, shares: tuple | None = None) -> int:
        """A collective op on ``stream`` (default: the axis); returns its index. Every member
        of one call builds the same key from ``key`` (default ``name``), layer, mb, group, tag.
        ``shares``: uneven all-to-all weights (see :func:`sim.collectives.schedule`)."""
        siblings = self.ctx.siblings(axis, group, group_of) if group_of else ()
        call = Collective((key or name, layer, mb, group) + tuple(tag), op, group, float(nbytes), algo, siblings,
                          shares)
        return self.program.add(Op(name, axis, stream or axis, 0.0, call, _deps(deps), layer, mb, self.stage))


def _deps(deps) -> tuple[int, ...]:
    """Flatten ints, None and nested tuples of them into op indices."""
    if deps is None:
        return ()
    if isinstance(deps, int):
        return (deps,) if deps >= 0 else ()
    return tuple(sorted({i for d in deps for i in _deps(d)}))
