"""Who waited in a collective, and since when, held as arrays (:class:`WaitLog`).

Every member of a meeting but the last to arrive waited for that last one: the engine records
``(rank, op) -> (rank, op)`` of the last (``held_by``) and ``(rank, op) -> when it arrived``
(``arrived``) as each meeting ends (sim/engine/core.py ``_end_meeting``). Read as two
read-only mappings (:class:`HeldBy`, :class:`Arrived`: ``in``, ``[]``, ``get``, ``items()``
in the order recorded, equal to the dicts they replace) by the critical path
(sim/outputs/attribution.py), the spans table's step-end synchronizations and the
timeline's waits. Held as five arrays in the order recorded (int32 ranks and op indices,
float64 times): 24 bytes per wait against ~340 as two dicts of tuples
(Qwen3-235B reduced to 128 GPUs, ``python bench/step.py --only qwen --set
training.global_batch=64 --set model.layers=32 --set cluster.gpus=128 --set parallel.dp=8
--set parallel.ep=16``: 44,372 waits, 15.3 MB as dicts; docs/scaling.md).

Run: ``python -m pytest -q tests/test_engine.py``
"""

from array import array
from collections.abc import Mapping

import numpy as np


class WaitLog:
    """The waits of one run: :meth:`record` appends one; :attr:`held_by`, :attr:`arrived` read them.
    Each (rank, op) is recorded at most once (an op arrives at one meeting, once)."""

    __slots__ = ("rank", "op", "last_rank", "last_op", "time", "held_by", "arrived", "_index")

    def __init__(self):
        self.rank, self.op, self.last_rank, self.last_op = array("i"), array("i"), array("i"), array("i")
        self.time = array("d")
        self.held_by, self.arrived = HeldBy(self), Arrived(self)
        self._index: tuple | None = None  # (sorted rank << 32 | op, their positions), made at the first read

    def record(self, rank: int, op: int, last_rank: int, last_op: int, t: float) -> None:
        """(rank, op) waited for (last_rank, last_op), from ``t``."""
        self.rank.append(rank)
        self.op.append(op)
        self.last_rank.append(last_rank)
        self.last_op.append(last_op)
        self.time.append(t)

    def position(self, key) -> int:
        """Where ``key`` = (rank, op) sits in the arrays, -1 if it never waited (a binary search
        of the waits sorted once by rank and op: 16 bytes per wait, made when first read)."""
        try:
            rank, op = (int(k) for k in key)
        except (TypeError, ValueError):
            return -1
        if self._index is None or len(self._index[0]) != len(self.time):
            flat = np.frombuffer(self.rank, np.int32).astype(np.int64) << 32 | np.frombuffer(self.op, np.int32)
            order = np.argsort(flat, kind="stable")
            self._index = (flat[order], order)
        keys, order = self._index
        want = rank << 32 | op
        i = int(np.searchsorted(keys, want))
        return int(order[i]) if i < len(keys) and keys[i] == want and op >= 0 else -1


class _View(Mapping):
    """A read-only mapping (rank, op) -> value over a :class:`WaitLog`."""

    __slots__ = ("log",)

    def __init__(self, log: WaitLog):
        self.log = log

    def value(self, at: int):
        raise NotImplementedError

    def __getitem__(self, key):
        at = self.log.position(key)
        if at < 0:
            raise KeyError(key)
        return self.value(at)

    def __contains__(self, key) -> bool:
        return self.log.position(key) >= 0

    def __len__(self) -> int:
        return len(self.log.time)

    def __iter__(self):
        return zip(self.log.rank, self.log.op)

    def items(self):
        log = self.log
        return list(zip(zip(log.rank, log.op), map(self.value, range(len(log.time)))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


class HeldBy(_View):
    """(rank, op) that waited -> (rank, op) of the member it waited for."""

    __slots__ = ()

    def value(self, at: int) -> tuple[int, int]:
        return self.log.last_rank[at], self.log.last_op[at]


class Arrived(_View):
    """(rank, op) that waited -> when it arrived, s."""

    __slots__ = ()

    def value(self, at: int) -> float:
        return self.log.time[at]
