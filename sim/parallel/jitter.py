"""Jitter on every rank at scale: exact up to 1,024 GPUs, a sampled mode above.

Jitter (``[jitter]``) multiplies every compute op of every rank by its own seeded draw,
so no two ranks share a timeline and nothing folds. *Exact* mode simulates every rank:
one program is built per stage and copied to the others, each scaled by its own draws
(one vectorized call per rank, :mod:`sim.parallel.copies`). At 16,384 GPUs that is 59M
ops, out of reach; ``jitter.mode = "auto"`` (the default) switches to *sampled* mode
above :data:`EXACT_MAX_GPUS`, and ``jitter.mode`` can force either.

Sampled mode. Ranks that meet many times a step (tp, cp, pipeline and expert groups)
form *replicas*: the connected pieces of the cluster under those groups (a pipeline
with its TP groups on the Llama 3 layouts, one rank under pure data parallelism). Only
the gradient (data-parallel) groups join replicas, a few times per step. The run
simulates every replica holding a straggler or a faulty link, plus ``jitter.sample_ranks``
ranks' worth of the others (at least :data:`MIN_REPLICAS`, evenly spaced), each rank
exactly, with its own draws; the other replicas are folded. Where a group holds folded
members (a gradient sync) the collective starts no earlier than when the slowest of them
would be ready, estimated from the members simulated with it: ``mean + sd * E[max of m
standard normals]`` of when the sampled clean members' dependencies were done (not when
they arrived: a stream still busy with the previous bucket holds every member alike), m
the folded members (that time sums thousands of jittered ops, close to normal;
:func:`expected_max` integrates the order statistic). The end of the step is such a
meeting too: after its last collective each folded rank still runs its optimizer, and
the step lasts until the slowest of them is done (:meth:`FoldedArrivals.step_end`).

What it preserves: every meeting inside a sampled replica exactly (TP collectives wait
for the slowest of their members' true draws, pipeline sends for their stage, expert
all-to-alls for their group); at every gradient sync and at the step's end, the mean and
spread of the replicas and the expected maximum over the folded ones. What it does not:
which folded replica is slowest (its lateness is an expectation from a spread measured
on a few replicas, so step times scatter differently from seed to seed than exact runs
do: sd 0.007 vs 0.003 ms on a 0.14 ms jitter cost at 256 GPUs), and the folded replicas'
own traffic, which is not loaded:
their timing is not simulated, and carrying it at a sampled replica's times, as folding
does, changed no step time in the comparisons below while making the 16k-GPU run 3x
slower. tests/test_jitter_sampled.py compares sampled with exact runs (256 GPUs always,
1,024 with ``-m slow``): the mean jitter cost over seeds agrees within 10%. Where a data-
parallel ring is relayed by PXN through other GPUs' NVLink ports (tp 2 with four
data-parallel ranks per server), the folded replicas' own TP traffic would slow it and is
missing: there sampled mode's jitter cost was 25% below exact (0.35% of the step).
The summary says which mode ran (``jitter_mode``).
"""

import numpy as np

from ..hardware.variability import expected_max
from ..input.choices import JitterMode
from .folding import Folding, fold, link_codes, scale_codes
from .group_arrays import GroupTable, GroupType

EXACT_MAX_GPUS = 1024  # "auto" simulates every rank up to this many GPUs
MIN_REPLICAS = 4  # sampled clean replicas at least (the spread needs a few)
# the group types that join replicas (HSDP's shard and replica groups, the step-end gradient-norm instance)
GRADIENT_GROUPS = (GroupType.DP, GroupType.EDP, GroupType.DP_SHARD, GroupType.DP_REPLICA, GroupType.INST)


def mode(s, world: int) -> JitterMode:
    """EXACT or SAMPLED: what ``jitter.mode`` means for this many ranks."""
    if s.jitter.mode is not JitterMode.AUTO:
        return s.jitter.mode
    return JitterMode.EXACT if world <= EXACT_MAX_GPUS else JitterMode.SAMPLED


def replicas(tables: dict[GroupType, GroupTable], world: int) -> np.ndarray:
    """Per rank: the smallest rank of its replica (connected under every group type but
    the gradient ones), by propagating minima along the groups until nothing changes."""
    joined = {id(t): t for name, t in tables.items() if name not in GRADIENT_GROUPS}
    joined = [t for t in joined.values() if all(t is not tables.get(g) for g in GRADIENT_GROUPS)]
    label = np.arange(world)
    while True:
        before = label.copy()
        for t in joined:
            label = np.minimum(label, label[t.rows].min(axis=1)[t.row_of])
        if (label == before).all():
            return label


def sampled(s, layout, fabric, domains, uneven_experts: bool) -> Folding | None:
    """The folding of sampled mode (module docstring), or None when the cluster has too
    few replicas for it (every rank is then simulated)."""
    base = fold(s.model_copy(update={"jitter": s.jitter.model_copy(update={"sigma": 0.0})}), layout, fabric,
                domains, uneven_experts)
    world = layout.world
    replica = replicas(base.tables, world)
    heads = np.unique(replica)
    marked = (scale_codes(s, world, fabric.gpus_per_node) > 0) | \
        (link_codes(s, base.tables, world, fabric, np.asarray(domains)) > 0)
    perturbed = np.unique(replica[marked])
    clean = np.setdiff1d(heads, perturbed)
    size = world // len(heads)
    want = max(MIN_REPLICAS, s.jitter.sample_ranks // size)
    if len(clean) < 2 * want:
        return None
    chosen = clean[np.round(np.linspace(0, len(clean) - 1, want)).astype(np.int64)]
    simulated = np.isin(replica, np.concatenate([chosen, perturbed]))
    sample = {"replicas": len(chosen) + len(perturbed), "of": len(heads), "ranks": int(simulated.sum())}
    return Folding(base.classes, simulated, base.tables, uneven_experts,
                   FoldedArrivals(simulated, np.isin(replica, chosen), base.classes), sample, carry=False)


class FoldedArrivals:
    """The engine's hook at a meeting whose group holds folded members: when the slowest
    of them arrives, from the arrivals of the sampled clean members (``proxies``)."""

    def __init__(self, simulated: np.ndarray, proxies: np.ndarray, classes: np.ndarray):
        self.simulated, self.proxies, self.classes = simulated, proxies, classes
        self._groups: dict[tuple, tuple] = {}

    def step_end(self, ends) -> float | None:
        """When the last folded rank finishes, from when the sampled clean ranks of its class
        did (``ends``: rank -> end of its last op). The end of the step is a meeting of every
        rank too: after its last collective each rank still computes on its own (the
        optimizer), and the slowest of the folded ones may finish after every simulated one."""
        ranks = np.asarray(ends.index, dtype=np.int64)
        times = np.asarray(ends.to_numpy(), dtype=float)
        proxy = self.proxies[ranks]
        folded = np.bincount(self.classes[~self.simulated], minlength=int(self.classes.max()) + 1)
        best = None
        for c in np.unique(self.classes[ranks[proxy]]):
            t = times[proxy & (self.classes[ranks] == c)]
            if folded[c] and len(t) >= 2:
                end = float(np.mean(t) + np.std(t, ddof=1) * expected_max(int(folded[c])))
                best = end if best is None else max(best, end)
        return best

    def __call__(self, call, members: list, ready) -> float | None:
        """When the last folded member of ``call``'s group is ready, or None: its members
        arrive together when their stream is held up by the collective before (the
        simulated ones did, and so would the folded), so the estimate is from when the
        sampled members' dependencies were done (``ready(rank, op)``), not when they arrived.
        Class by class (a group may join ranks of unlike work, e.g. the step-end gradient-norm
        sync of every pipeline stage): each class's folded members from its sampled ones."""
        found = self._groups.get(call.group)
        if found is None:
            g = np.asarray(call.group)
            counts = np.bincount(self.classes[g[~self.simulated[g]]], minlength=int(self.classes.max()) + 1)
            found = self._groups[call.group] = {int(c): expected_max(int(n)) for c in np.flatnonzero(counts)
                                                 for n in (counts[c],)}
        if not found:
            return None
        by_class: dict[int, list] = {}
        for rank, index, _ in members:
            if self.proxies[rank]:
                by_class.setdefault(int(self.classes[rank]), []).append(ready(rank, index))
        ends = [float(np.mean(t) + np.std(t, ddof=1) * found[c]) for c, t in by_class.items()
                if c in found and len(t) >= 2]
        return max(ends) if ends else None
