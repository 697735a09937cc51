"""The bookkeeping of a joint re-solve (:meth:`sim.engine.network.Network._solve_many`), kept
to a few whole-array operations per re-solve whatever the transfers in flight.

A joint re-solve brings every transfer in flight up to now (``remaining - rates * dt`` per
chain), reads which chains still move, finds the rates of the set in flight (memoized) and
plans each transfer's wake-up. On MegaScale's ECMP fabric (``ms-g175-3072`` of ``clustersim
validate``) a hashed spine uplink shared by three flows slows one chain of a phase, so the
phase's chains end at different times and every such end re-solves the ~6 transfers (~500
chains) in flight: 100,771 joint re-solves, each paying numpy's per-call overhead on small
arrays, not arithmetic (docs/scaling.md, "ECMP's many re-solves"). Here each array a re-solve
needs is made by one numpy call, from what repeats between re-solves:

- :class:`Bounds`: the chains' offsets per act, by the acts' chain counts (the same few sets of
  transfers recur all step long), instead of a cumulative sum of a Python list;
- :func:`bring_up_to_now`: the acts that moved since their last update almost always share one
  ``dt`` (all were re-planned together at the last re-solve), so the bytes are brought up to
  now by one scalar multiply; an act that did not move contributes zeros (``x - 0.0`` is ``x``
  as ``x - x * 0.0`` was: byte counts are never -0.0);
- :class:`Ordered`: the rates of a set in flight in the acts' own order, already concatenated,
  by the unsorted key, so a set found again needs no sort and no concatenation.

Every float is the one the element-by-element formula gives (the same IEEE operation on the
same operands): ``python -m pytest -q tests/test_network_solve.py`` compares every rate change
and end time with the act-by-act solve, bit for bit.
"""

import numpy as np

from .maxmin import ARRAY_OVERHEAD, GROUP_BYTES, KEY_ITEM_BYTES, POSITION_BYTES, MEMO_BYTES, Memo

_count = np.count_nonzero  # (a C call: ndarray.all() and .any() go through a Python frame of numpy's)
BOUNDS_KEPT = 4096  # distinct chain-count tuples whose offsets are kept (then started over: the same offsets)


class Bounds:
    """Offsets of each act's chains in the concatenation, by the tuple of chain counts."""

    __slots__ = ("_kept",)

    def __init__(self):
        self._kept: dict[tuple, tuple] = {}

    def get(self, sizes: tuple) -> tuple[np.ndarray, list[int], np.ndarray]:
        """(starts as an array, ends as a list with 0 first, sizes as an array)."""
        found = self._kept.get(sizes)
        if found is None:
            if len(self._kept) >= BOUNDS_KEPT:
                self._kept.clear()
            ends = [0]
            for n in sizes:
                ends.append(ends[-1] + n)
            found = self._kept[sizes] = (np.array(ends[:-1], dtype=np.int64), ends, np.array(sizes, dtype=np.int64))
        return found


def bring_up_to_now(acts: list, now: float, bounds: Bounds, zeros: np.ndarray) -> tuple:
    """Acts' bytes up to ``now`` and live masks: (bytes left, live, acts' first chains, all live,
    keys). The same floats as ``remaining - rates * dt`` act by act (``dt`` 0 for an act that has
    not moved: new, or brought up to now already); ``zeros``: a read-only array of zeros at least
    as long as any act's chains."""
    remaining, rates, dts = [], [], []
    common, uniform = None, True
    for act in acts:
        dt = now - act.updated
        act.updated = now
        left = act.remaining
        remaining.append(left)
        if dt > 0 and act.rates is not None:
            rates.append(act.rates)
            dts.append(dt)
            if common is None:
                common = dt
            elif dt != common:
                uniform = False
        else:
            rates.append(zeros[:len(left)])
            dts.append(0.0)
    starts, ends, sizes = bounds.get(tuple(map(len, remaining)))
    if common is None:
        left = np.concatenate(remaining)
    elif uniform:
        left = np.concatenate(remaining) - np.concatenate(rates) * common
    else:
        left = np.concatenate(remaining) - np.concatenate(rates) * np.repeat(np.array(dts), sizes)
    live = left > 0
    keys = []
    if _count(live) == len(live):  # (live.all() without numpy's Python wrapper: the same answer)
        for k, act in enumerate(acts):
            act.remaining = left[ends[k]:ends[k + 1]]
            act.mask = b""
            keys.append((act.phase.key, b""))
        return left, live, starts, True, keys
    every = np.logical_and.reduceat(live, starts).tolist()
    for k, act in enumerate(acts):
        a, b = ends[k], ends[k + 1]
        act.remaining = left[a:b]
        act.mask = mask = b"" if every[k] else live[a:b].tobytes()  # (as network._mask_key)
        keys.append((act.phase.key, mask))
    return left, live, starts, False, keys


def _ordered_bytes(key: tuple, found: tuple) -> int:
    """What one entry of :class:`Ordered` holds: its key, the order, the concatenated rates."""
    return KEY_ITEM_BYTES * len(key) + 2 * (GROUP_BYTES + POSITION_BYTES * len(key)) + found[2].nbytes + ARRAY_OVERHEAD


class Ordered(Memo):
    """Rates of a set in flight by its key in the acts' own order: (the order sorted by key, each
    act's rates in the acts' order, those rates concatenated), least recently used out past
    :data:`~sim.engine.maxmin.MEMO_BYTES` (a dropped entry is made again from the sorted memo)."""

    def __init__(self):
        super().__init__(MEMO_BYTES, _ordered_bytes)
