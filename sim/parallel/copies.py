"""Program copies: ranks whose programs differ only in which groups they meet get copies.

Every rank of one pipeline stage (and, with uneven expert loads, one expert-group
position) builds the same ops in the same order with the same durations and
dependencies; only its groups differ, and each group a rank meets is its own group of
some type (tp, cp, dp, expert, expert-dp) or two positions of its pipeline
(:mod:`sim.parallel.folding`). So one program is built per such signature and the
others are copies with every group renamed to the copying rank's group of the same type
at the same positions (and the collective's key, which names the group, with it). With
jitter, each rank's compute ops are then scaled by its own draws, one vectorized call
per rank (:func:`sim.hardware.faults.jitter_draws`). tests/test_copies.py checks a copy
equals the rank built op by op, for every rank of several layouts.
"""

import numpy as np

from ..engine.core import Collective, Op, RankProgram
from ..hardware.faults import jitter_draws
from .folding import dense
from .layout import Group


def programs(ctx, build) -> list[RankProgram]:
    """The program of every simulated rank (ascending): ``build(rank)`` for the first rank
    of each signature, copies for the rest; with jitter, each scaled by its own draws."""
    signature = signatures(ctx)
    bases: dict[int, RankProgram | None] = {}  # signature -> the program copies come from (None: build each)
    out = []
    for rank in sorted(ctx.simulated):
        base = bases.get(signature[rank], False)
        if base is None or base is False:
            prog = build(rank)
            if base is False:
                bases[signature[rank]] = prog if copyable(ctx, prog) else None
        else:
            prog = copy_program(ctx, base, rank)
        out.append(jittered(ctx, prog) if ctx.scenario.jitter.sigma > 0 else prog)
    return out


def signatures(ctx) -> np.ndarray:
    """Per rank: an id of the program it builds up to its groups (stage, and the position
    in its expert group when expert loads are uneven)."""
    tables = ctx.folding.tables
    cols = [tables["pp"].pos if "pp" in tables else np.zeros(ctx.layout.world, np.int64)]
    if ctx.folding.uneven_experts and "ep" in tables:
        cols.append(tables["ep"].pos)
    return dense(cols)


def copyable(ctx, base: RankProgram) -> bool:
    """Whether every group ``base`` meets is of a type the folding knows (so it renames)."""
    return all(ctx.folding.locate(g) is not None for g in {op.comm.group for op in base.ops if op.comm})


def copy_program(ctx, base: RankProgram, rank: int) -> RankProgram:
    """``base`` as rank ``rank`` runs it: each group renamed to ``rank``'s group of the same
    type at the same positions, with that group's siblings."""
    renamed: dict[tuple, tuple] = {}
    calls: dict[int, Collective] = {}
    prog = RankProgram(rank)
    for op in base.ops:
        c = op.comm
        if c is not None:
            call = calls.get(id(c))
            if call is None:
                group = renamed.get(c.group)
                if group is None:
                    group = renamed[c.group] = rename(ctx.folding, c.group, rank)
                key = tuple(group if k is c.group or k == c.group else k for k in c.key)
                call = calls[id(c)] = Collective(key, c.op, group, c.nbytes, c.algo,
                                                 ctx.siblings(op.category, group, None), c.shares)
            op = Op(op.name, op.category, op.stream, op.duration, call, op.deps, op.layer, op.micro_batch, op.stage,
                    op.phase, op.issue)
        prog.ops.append(op)
    prog.released = base.release()  # (the same issue costs in the same order)
    return prog


def rename(folding, group: tuple, rank: int) -> tuple:
    """``rank``'s group of ``group``'s type, at ``group``'s positions."""
    table, cols = folding.locate(group)
    row = table.rows[table.row_of[rank]]
    return Group(int(r) for r in (row if cols is None else row[cols]))


def jittered(ctx, prog: RankProgram) -> RankProgram:
    """``prog`` with each compute op's duration multiplied by the rank's draw for that op."""
    draws = jitter_draws(ctx.scenario, prog.rank, len(prog.ops)).tolist()
    out = RankProgram(prog.rank, released=prog.release())  # (jitter scales the GPU side only)
    out.ops = [op if op.comm is not None else
               Op(op.name, op.category, op.stream, op.duration * draws[i], None, op.deps, op.layer,
                  op.micro_batch, op.stage, op.phase, op.issue) for i, op in enumerate(prog.ops)]
    return out
