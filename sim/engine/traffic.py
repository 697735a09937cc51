"""What one collective call puts on the network: its schedule (:mod:`sim.collectives`),
run by its own group and at once by every sibling group of folded ranks that makes the
same call, merged phase by phase into one :class:`~sim.collectives.schedule.Schedule`
(what :meth:`sim.engine.core.Engine.schedule_of` hands the network).

Tested by ``python -m pytest tests/test_merged_schedule.py``.
"""

import numpy as np

from .. import collectives
from ..collectives.schedule import Phase as SchedulePhase, Schedule, merge
from ..hardware.topology import Topology


class SiblingGroups:
    """Groups of folded ranks whose copy of a collective rides with a simulated one: an
    array of rows (one group each, sorted), compared and hashed by identity (the workload
    hands out one object per simulated group, so schedule caches key on it cheaply)."""

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return (tuple(int(r) for r in row) for row in self.rows)


def merged_schedule(op: collectives.CollectiveOp, algo: str, group: tuple, siblings, nbytes: float, topo: Topology,
                    shares: tuple | None = None) -> Schedule:
    """One schedule running the same collective on ``group`` and each of ``siblings`` at
    once, phase by phase, groups in that order. Siblings whose members share NVLink
    domains as ``group``'s do (the same pattern, position by position) get ``group``'s
    schedule with the members renamed: every algorithm depends on the group only through
    its order and that pattern (tests/test_merged_schedule.py checks it); a schedule with
    hops to or from a switch (in-switch reduction: switch ids are the group's own) is
    built group by group."""
    rows = np.vstack([np.asarray(group, dtype=np.int64)[None, :]]
                     + ([siblings.rows] if isinstance(siblings, SiblingGroups) else
                        [np.asarray(siblings, dtype=np.int64).reshape(-1, len(group))]))
    doms = topo.domains[rows]
    first = collectives.schedule(op, algo, tuple(group), nbytes, tuple(int(d) for d in doms[0]), shares,
                                 topo.fabric)
    if len(rows) == 1:  # (merge([p]) would copy the cached schedule's arrays: 2M hops a phase at 131k GPUs)
        return Schedule(first.op, first.algo, tuple(_unmerged(p) for p in first.phases))
    switched = any((p.src < 0).any() or (p.dst < 0).any() for p in first.phases)
    if switched or not same_domain_pattern(doms).all():
        parts = [collectives.schedule(op, algo, tuple(int(r) for r in g), nbytes, tuple(int(d) for d in d_),
                                      shares, topo.fabric) for g, d_ in zip(rows, doms)]
        phases = tuple(merge([p.phases[i] for p in parts]) for i in range(len(parts[0].phases)))
        return Schedule(first.op, first.algo, phases)
    return Schedule(first.op, first.algo, tuple(_renamed(p, group, rows) for p in first.phases))


def _unmerged(phase: SchedulePhase) -> SchedulePhase:
    """``merge([phase])`` sharing ``phase``'s arrays (a Phase's arrays are never written):
    the same values, label and factors, without a copy of the hops."""
    chain = phase.chain if phase.chain.dtype == np.int64 else phase.chain + np.cumsum([0])[0]  # (merge's dtype)
    return SchedulePhase(phase.src, phase.dst, chain, phase.nbytes, phase.steps, "", phase.latency_scale,
                         phase.overhead, phase.wire)


def same_domain_pattern(doms: np.ndarray) -> np.ndarray:
    """Per row of ``doms`` (the NVLink domain of each member of a group): whether its
    members share domains exactly as the first row's do, position by position."""
    _, firsts, inverse = np.unique(doms[0], return_index=True, return_inverse=True)
    ok = (doms == doms[:, firsts[inverse.reshape(-1)]]).all(axis=1)
    distinct = np.sort(doms[:, firsts], axis=1)
    return ok & (np.diff(distinct, axis=1) != 0).all(axis=1)


def _renamed(phase: SchedulePhase, group: tuple, rows: np.ndarray) -> SchedulePhase:
    """``phase`` of ``group`` run by every row of ``rows`` (the first is ``group``)."""
    where = {int(r): i for i, r in enumerate(group)}
    src = np.array([where[int(r)] for r in phase.src], dtype=np.int64)
    dst = np.array([where[int(r)] for r in phase.dst], dtype=np.int64)
    k, n = len(rows), phase.n_chains
    chain = (phase.chain[None, :] + (np.arange(k, dtype=np.int64) * n)[:, None]).reshape(-1)
    return SchedulePhase(rows[:, src].reshape(-1), rows[:, dst].reshape(-1), chain, np.tile(phase.nbytes, k),
                 phase.steps, phase.label, phase.latency_scale, phase.overhead, phase.wire)
