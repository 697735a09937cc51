"""Group tables (every group of one type, as arrays) and the ones built without calling a
layout function per group: the tp x pp groups and the optimizer instances of
sim/parallel/step_end.py, whose rows span the world (a million ranks at most: numpy, not
Python loops). :mod:`.folding` reads them.
"""

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..engine.kinds import Category

TP, CP, DP, PP = Category.TP, Category.CP, Category.DP, Category.PP


class GroupType(StrEnum):
    """The types of process group folding compares ranks under (:mod:`.folding`'s
    ``group_tables``; :mod:`.jitter` joins replicas by all but the gradient ones)."""

    TP = "tp"
    CP = "cp"
    DP = "dp"  # cp x dp: the gradient reduction's group
    DP_SHARD = "dps"  # HSDP's shard group
    DP_REPLICA = "dpr"  # HSDP's replica group
    EP = "ep"
    EDP = "edp"  # expert data parallel
    ETP = "etp"  # expert tensor parallel
    MP = "mp"  # tp x pp: DDP's gradient-norm group
    INST = "inst"  # an optimizer instance: every rank without HSDP (sim/parallel/step_end.py)
    PP = "pp"  # its sub-tuples are the send/recv pairs of a pipeline


@dataclass(frozen=True)
class GroupTable:
    """Every group of one type: ``rows[i]`` the members of group i in the layout's order,
    ``row_of[r]`` the group of rank r, ``pos[r]`` its position there."""

    name: GroupType
    rows: np.ndarray
    row_of: np.ndarray
    pos: np.ndarray


def model_parallel_table(layout) -> GroupTable | None:
    """The tp x pp groups (tp fastest, as ``layout.group(r, TP, PP)``), built as arrays."""
    z, st = layout.sizes, layout.strides
    if z[TP] * z[PP] < 2:
        return None
    bases = (np.arange(z[CP])[None, :] * st[CP] + np.arange(z[DP])[:, None] * st[DP]).reshape(-1)
    offsets = (np.arange(z[TP])[None, :] * st[TP] + np.arange(z[PP])[:, None] * st[PP]).reshape(-1)
    return _from_rows(GroupType.MP, bases[:, None] + offsets[None, :], layout.world)


def instance_table(layout) -> GroupTable | None:
    """The optimizer instances (``layout.instance_group``: ranks of one dp // dp_shard block,
    ascending; the whole world without HSDP), built as arrays."""
    if layout.world < 2:
        return None
    ranks = np.arange(layout.world, dtype=np.int64)
    block = ranks // layout.strides[DP] % layout.sizes[DP] // layout.shard
    order = np.lexsort((ranks, block))
    return _from_rows(GroupType.INST, ranks[order].reshape(layout.sizes[DP] // layout.shard, -1), layout.world)


def _from_rows(name: GroupType, rows: np.ndarray, world: int) -> GroupTable:
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    row_of, pos = np.empty(world, np.int64), np.empty(world, np.int64)
    row_of[rows] = np.arange(len(rows))[:, None]
    pos[rows] = np.arange(rows.shape[1])[None, :]
    return GroupTable(name, rows, row_of, pos)
