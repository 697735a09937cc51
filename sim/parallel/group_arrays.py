"""Group tables (every group of one type, as arrays) and the ones built without calling a
layout function per group: the tp x pp groups and the optimizer instances of
sim/parallel/step_end.py, whose rows span the world (a million ranks at most: numpy, not
Python loops). :mod:`.folding` reads them.
"""

from dataclasses import dataclass

import numpy as np

from ..engine.kinds import Category


@dataclass(frozen=True)
class GroupTable:
    """Every group of one type: ``rows[i]`` the members of group i in the layout's order,
    ``row_of[r]`` the group of rank r, ``pos[r]`` its position there."""

    name: str
    rows: np.ndarray
    row_of: np.ndarray
    pos: np.ndarray


def model_parallel_table(layout) -> GroupTable | None:
    """The tp x pp groups (tp fastest, as ``layout.group(r, Category.TP, Category.PP)``), built as arrays."""
    z, st = layout.sizes, layout.strides
    if z["tp"] * z["pp"] < 2:
        return None
    bases = (np.arange(z["cp"])[None, :] * st["cp"] + np.arange(z["dp"])[:, None] * st["dp"]).reshape(-1)
    offsets = (np.arange(z["tp"])[None, :] * st["tp"] + np.arange(z["pp"])[:, None] * st["pp"]).reshape(-1)
    return _from_rows("mp", bases[:, None] + offsets[None, :], layout.world)


def instance_table(layout) -> GroupTable | None:
    """The optimizer instances (``layout.instance_group``: ranks of one dp // dp_shard block,
    ascending; the whole world without HSDP), built as arrays."""
    if layout.world < 2:
        return None
    ranks = np.arange(layout.world, dtype=np.int64)
    block = ranks // layout.strides[Category.DP] % layout.sizes[Category.DP] // layout.shard
    order = np.lexsort((ranks, block))
    return _from_rows("inst", ranks[order].reshape(layout.sizes[Category.DP] // layout.shard, -1), layout.world)


def _from_rows(name: str, rows: np.ndarray, world: int) -> GroupTable:
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    row_of, pos = np.empty(world, np.int64), np.empty(world, np.int64)
    row_of[rows] = np.arange(len(rows))[:, None]
    pos[rows] = np.arange(rows.shape[1])[None, :]
    return GroupTable(name, rows, row_of, pos)
