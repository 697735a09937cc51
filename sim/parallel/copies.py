"""Program copies: ranks whose programs differ only in which groups they meet get copies.

Every rank of one pipeline stage builds the same ops in the same order with the same
dependencies and, but for its local experts' GEMMs when expert loads are uneven, the same
durations; only its groups differ, and each group a rank meets is its own group of
some type (tp, cp, dp, expert, expert-dp) or two positions of its pipeline
(:mod:`sim.parallel.folding`). So one program is built per such signature and the
others are copies with every group renamed to the copying rank's group of the same type
at the same positions (and the collective's key, which names the group, with it), and
with uneven expert loads the ops of its local experts retimed for its own expert slice
(the ops the builder recorded, :class:`.program.Varying`: duration and host issue cost as
the rank's own build computes them; the all-to-alls' shares are a function of the group's
positions, alike for every ep group). With
jitter, each rank's compute ops are then scaled by its own draws, one vectorized call
per rank (:func:`sim.hardware.faults.jitter_draws`). tests/test_copies.py checks a copy
equals the rank built op by op, for every rank of several layouts.
"""

from operator import attrgetter

import numpy as np

from ..engine.ops import Collective, Op, RankProgram, rekeyed
from ..hardware.faults import jitter_draws
from .folding import dense, positions
from ..input.choices import ZERO_BUBBLE_SCHEDULES
from .ep import expert_kernels
from .layout import Group
from .program import RankBuilder, Varying, timed


def programs(ctx, build) -> list[RankProgram]:
    """The program of every simulated rank (ascending): ``build(rank)`` (a
    :class:`~.program.RankBuilder` that has built it) for the first rank of each signature,
    copies for the rest; with jitter, each scaled by its own draws."""
    signature = signatures(ctx)
    bases: dict[int, RankBuilder | None] = {}  # signature -> the builder copies come from (None: build each)
    shared: dict = {}  # what copies of one base share (:func:`copy_program`), for this call only
    mates: dict[int, set] = {}  # signature -> its ranks (who may copy a call alike)
    for rank in ctx.simulated:
        mates.setdefault(signature[rank], set()).add(rank)
    out = []
    for rank in sorted(ctx.simulated):
        base = bases.get(signature[rank], False)
        if base is None or base is False:
            built = build(rank)
            prog = built.program
            if base is False:
                ok = copyable(ctx, prog) and (built.varying is not None or not retimed(ctx))
                bases[signature[rank]] = built if ok else None
        else:
            prog = copy_program(ctx, base.program, rank, base.varying, shared, mates[signature[rank]])
        out.append(jittered(ctx, prog) if ctx.scenario.jitter.sigma > 0 else prog)
    return out


def retimed(ctx) -> bool:
    """Whether copies retime the local experts' ops for their own expert slice (uneven
    expert loads), so one program per stage serves every slice: unless the expert-tp
    collectives around them carry the slice's own bytes too (MoE parallel folding with
    expert_tp > 1: :func:`.ep.compute_experts`), or a zero-bubble schedule splits them for
    its W passes: then one program per slice is built (a builder that meets a split expert
    op anyway says so: ``varying`` None, and each rank of its signature builds its own)."""
    layout = ctx.layout
    return (ctx.folding.uneven_experts and not (layout.folded_experts and layout.etp > 1)
            and ctx.scenario.parallel.schedule not in ZERO_BUBBLE_SCHEDULES)


def signatures(ctx) -> np.ndarray:
    """Per rank: an id of the program it builds up to its groups and its local experts'
    times (stage, and the position in its expert group when expert loads are uneven and
    a copy cannot retime them: :func:`retimed`)."""
    return dense(positions(ctx.folding.tables, ctx.layout.world, ctx.folding.uneven_experts and not retimed(ctx)))


def copyable(ctx, base: RankProgram) -> bool:
    """Whether every group ``base`` meets is of a type the folding knows (so it renames)."""
    groups = set(map(_GROUP, filter(None, map(_COMM, base.ops))))  # (in C: no Python step per op)
    return all(ctx.folding.locate(g) is not None for g in groups)


_COMM, _GROUP = attrgetter("comm"), attrgetter("group")


def renamed_call(c: Collective, g: tuple, group: tuple, siblings) -> Collective:
    """Collective ``c`` of base group ``g`` as its copy runs it on ``group`` with ``siblings``."""
    return rekeyed(c, renamed_key(c.key, g, group), group, siblings)


def copy_program(ctx, base: RankProgram, rank: int, varying: list[Varying] | None = None,
                 shared: dict | None = None, mates: set | None = None) -> RankProgram:
    """``base`` as rank ``rank`` runs it: each group renamed to ``rank``'s group of the same
    type at the same positions, with that group's siblings; the ``varying`` ops (its local
    experts', :attr:`.program.RankBuilder.varying`) timed for ``rank``'s own expert slice.
    (Renamed groups are kept per group object of ``base``; a steady-state program has few
    groups and many ops.) ``shared``: one dict across the copies of one call
    (:func:`programs`), in which equal renamed groups are one object and the copies of
    ``base``'s collective op with the same renamed group one ``Collective`` and one ``Op``
    (the members of one group, an expert group's 32 ranks, copy each of its calls alike:
    equal values, so what the engine reads is unchanged; ~250 bytes less per op shared), where
    the renamed group has another of ``mates`` (the ranks of ``base``'s signature) than
    ``base``'s rank and ``rank``: only they copy it alike (a pipeline send is one rank's)."""
    calls: dict[int, Collective] = {}  # id of a base call -> this copy's (its calls not shared)
    renamed: dict[tuple, tuple] = {}  # (id of a base group, category) -> (group, siblings, base group, shared)
    prog = RankProgram(rank, holds_sms=base.holds_sms)
    ops = base.ops
    if varying and ctx.layout.ep_index(rank) != ctx.layout.ep_index(base.rank):
        ops = retimed_ops(ctx, ops, rank, varying)
    out, make, folding = prog.ops, tuple.__new__, ctx.folding
    for op, own in zip(ops, base.ops):
        c = op.comm
        if c is None:
            out.append(op)
            continue
        g = c.group
        found = renamed.get((id(g), op.category))
        if found is None:
            group = rename(folding, g, rank)
            alike = shared is not None and sum(1 for r in group if r in mates and r != base.rank) > 1
            if alike:
                group = shared.setdefault(("group", group), group)  # (one object per value: ids below)
            found = renamed[id(g), op.category] = (group, ctx.siblings(op.category, group, None), g, alike)
        group, siblings, _g, alike = found
        if not alike:
            call = calls.get(id(c))
            if call is None:
                call = calls[id(c)] = renamed_call(c, g, group, siblings)
            out.append(make(Op, op[:4] + (call,) + op[5:]))  # (Op's own __new__ takes 3x as long)
            continue
        key = (id(op), id(group))  # (base's op and the group live as long as ``shared``: their ids are theirs)
        copied = shared.get(key) if op is own else None  # (a retimed op is this copy's own)
        if copied is None:
            call = shared.get((id(c), id(group)))
            if call is None:
                call = shared[id(c), id(group)] = renamed_call(c, g, group, siblings)
            copied = make(Op, op[:4] + (call,) + op[5:])
            if op is own:
                shared[key] = copied
        out.append(copied)
    if ops is base.ops:  # the same issue costs and syncs in the same order
        prog.share_host(base)
    return prog


def renamed_key(key: tuple, old: tuple, new: tuple) -> tuple:
    """A collective's key with ``old``, its group, replaced by ``new`` wherever it appears
    (:meth:`.program.RankBuilder.collective` puts it fourth)."""
    if len(key) > 3 and key[3] is old and old not in key[:3] and old not in key[4:]:
        return key[:3] + (new,) + key[4:]
    return tuple(new if k is old or k == old else k for k in key)


def retimed_ops(ctx, ops: list, rank: int, varying: list[Varying]) -> list:
    """``ops`` with the ``varying`` ones timed for ``rank``'s expert slice (each distinct
    (layer, direction, fused) timed once per slice: ``ctx.memo``)."""
    ops, j = list(ops), ctx.layout.ep_index(rank)
    for v in varying:
        key = ("expert_timed", v.layer, j, v.direction, v.fuse)
        times = ctx.memo.get(key)
        if times is None:
            times = ctx.memo[key] = timed(ctx, expert_kernels(ctx, rank, v.layer, v.direction), v.fuse)
        ops[v.index] = v.timed_op(ops[v.index], *times, ctx.compute.gpu.host_issue)
    return ops


def rename(folding, group: tuple, rank: int) -> tuple:
    """``rank``'s group of ``group``'s type, at ``group``'s positions."""
    table, cols = folding.locate(group)
    row = table.rows[table.row_of[rank]]
    return Group(int(r) for r in (row if cols is None else row[cols]))


def jittered(ctx, prog: RankProgram) -> RankProgram:
    """``prog`` with each compute op's duration multiplied by the rank's draw for that op."""
    draws = jitter_draws(ctx.scenario, prog.rank, len(prog.ops)).tolist()
    out = RankProgram(prog.rank, released=prog.release(), holds_sms=prog.holds_sms)  # (jitter: the GPU side only)
    out.ops = [op if op.comm is not None else
               Op(op.name, op.category, op.stream, op.duration * draws[i], None, op.deps, op.layer,
                  op.micro_batch, op.stage, op.phase, op.issue) for i, op in enumerate(prog.ops)]
    return out
