"""Folding: which ranks share one timeline, also under stragglers, link faults and MoE skew.

A rank's timeline (when each of its ops starts and ends) is fixed by three things:

1. its program: ops, durations, dependencies. Ranks of one pipeline stage build the same
   program up to which groups they meet; with uneven expert loads a rank's position in
   its expert group (which experts it holds) changes its compute and its all-to-all shares;
2. its compute scale over time: the ``[[stragglers]]`` entries naming it (slowdown, start_s);
3. every collective it joins, which starts when the last member arrives and ends for
   every member at once, after a time the network sets: the links of the schedule, their
   condition (faults) and the traffic sharing them.

So ranks x and y are interchangeable when their programs, compute scales and link
conditions agree (their *label*) and, in every group type, x's group and y's group hold
interchangeable ranks position by position. That is a fixed point: start from the labels
and split a class whenever two members' groups of some type differ in the class at some
position; repeat until nothing splits (colour refinement, as in DFA minimisation). Every
split is forced, so what is left is the coarsest partition the argument allows: one slow
rank makes its TP group, its pipeline, and through them its data-parallel peers differ,
and every other rank still falls into a handful of classes (4 per stage for one straggler
on the 16k-GPU Llama 3 405B layout).

Labels (what the perturbations change):

- program: pipeline stage (position in the pipeline group); with uneven expert loads the
  position in the expert group;
- compute scale: the (start_s, slowdown) pairs of the straggler entries naming the rank;
- link conditions: a degraded NIC of GPU g carries only flows into g and flows of g's
  server relayed through g by PXN (to GPUs on g's rail in another NVLink domain:
  :func:`sim.hardware.rails.nics_carrying`); so g is labelled, and so is each server mate
  whose groups reach g's rail across domains. A failed NIC (factor 0) reroutes g's traffic
  over the other NICs of its server (:func:`sim.hardware.rails.failed_nic_reach`): every
  GPU of the server is labelled (the server's NIC factors, its own position), every
  other GPU of its scalable unit by rail, and every GPU of the cluster by rail too: a
  detour takes one spine (not sprayed), loading one uplink of its peer's rail leaf in the
  peer's unit, and max-min passes that on along NCCL's ring channels (one rate, one rail
  through every server of a group) to flows of that rail in every unit (docs/scaling.md,
  "Folding under a failed NIC"; tests/test_folding_perturbed.py's failed-nic cases). A
  spine fault loads every leaf's uplink into it alike: it labels no one;
- jitter draws every rank's op times on its own: each rank is its own class (``exact``
  jitter mode; see :mod:`sim.parallel.jitter` for the sampled mode).

Group types (:func:`group_tables`): tp, cp, dp (cp x dp), the pipeline (pp), the expert
group, the expert-data-parallel group and the expert-tensor-parallel group (the expert
mesh of ``parallel.expert_tp``, :mod:`sim.parallel.layout`), each read from the layout's
own functions.
Every collective of a program runs over one of them or over a sub-tuple of one (a
send/recv pair of a pipeline); tests/test_folding.py checks it for every collective.

Which ranks are simulated (:func:`closure`): the smallest rank of each class, then, until
nothing changes, for every simulated rank and every group of it that holds a class with
no simulated member *in that group*, that group's smallest member of the class. So every
collective a simulated rank takes part in has, for each class among its members, a
simulated member of that class, which arrives when the unsimulated ones of its class
would: the engine's meeting (start when every simulated member has arrived) is exact.

Which traffic rides with whom (:meth:`Folding.siblings`): a group holding no simulated
rank runs its collective when, and as fast as, a simulated group of the same type whose
classes agree position by position; its traffic is merged into the schedule of exactly
one of them (the first), so the network carries every group's bytes. Only groups that
leave their NVLink domain need this: inside one, every GPU has its own NVSwitch port.

Network assumption: groups whose classes agree position by position see the same
network (the clean fold's assumption: a rail-optimised fat tree looks the same from
every rail and scalable unit), and a flow slowed by a fault or a late start never slows
flows of other classes on links they share: true of the non-blocking trees shipped
(oversubscription 1: a leaf's uplinks carry at most what its NICs do).
tests/test_folding.py checks folded == unfolded (step, spans of every simulated rank,
link bytes) for every perturbation kind.
"""

from dataclasses import dataclass, field

import numpy as np

from ..hardware.faults import nic_factors, straggler_ranks
from ..hardware.rails import failed_nic_reach, nics_carrying, placement
from ..engine.traffic import SiblingGroups
from ..engine.kinds import Category
from .group_arrays import GroupTable, GroupType, instance_table, model_parallel_table

G = GroupType
GROUP_TYPES = (G.TP, G.CP, G.DP, G.DP_SHARD, G.DP_REPLICA, G.EP, G.EDP, G.ETP, G.MP, G.INST, G.PP)  # pp last: its
#   sub-tuples are send/recv pairs


def group_tables(layout) -> dict[GroupType, GroupTable]:
    """The group types of :data:`GROUP_TYPES` that have more than one member, as arrays,
    built through the layout's own group functions (one call per group); a type whose
    groups another type already has shares its table (expert-dp = dp when ep = 1 and
    expert-tp = tp when expert_tp = tp, by the layout's construction: not built again)."""
    fns = {G.TP: lambda r: layout.group(r, Category.TP), G.CP: lambda r: layout.group(r, Category.CP),
           G.DP: lambda r: layout.group(r, Category.CP, Category.DP), G.PP: lambda r: layout.group(r, Category.PP),
           G.DP_SHARD: layout.shard_group, G.DP_REPLICA: layout.replica_group,
           G.EP: layout.ep_group, G.EDP: layout.expert_dp_group, G.ETP: layout.expert_tp_group}
    built = {G.MP: lambda: model_parallel_table(layout), G.INST: lambda: instance_table(layout)}
    alias = {} if layout.folded_experts else {G.ETP: G.TP, **({G.EDP: G.DP} if layout.ep == 1 else {})}
    if layout.etp == layout.sizes[Category.TP]:  # expert tp q % etp at stage position q = tp + tp_size * (cp, dp):
        alias[G.ETP] = G.TP  # the tp group, in order (16,384 groups not built again at 131k GPUs)
    if layout.dp_shard is None:
        alias[G.DP_SHARD] = G.DP
    out: dict[GroupType, GroupTable] = {}
    for name in GROUP_TYPES:
        if name in alias:
            if alias[name] in out:
                out[name] = out[alias[name]]
            continue
        if name in built:
            table = built[name]()
            if table is None:
                continue
            out[name] = next((t for t in out.values() if np.array_equal(t.rows, table.rows)), table)
            continue
        if len(fns[name](0)) < 2:
            continue  # singletons never meet
        table = _table(name, fns[name], layout.world)
        out[name] = next((t for t in out.values() if np.array_equal(t.rows, table.rows)), table)
    return out


def _table(name: GroupType, fn, world: int) -> GroupTable:
    covered = bytearray(world)
    mark = np.frombuffer(covered, dtype=np.uint8)
    rows = []
    r = covered.find(0)
    while r >= 0:
        g = fn(r)
        rows.append(g)
        mark[list(g)] = 1
        r = covered.find(0, r + 1)
    rows = np.array(rows, dtype=np.int64)
    row_of, pos = np.empty(world, np.int64), np.empty(world, np.int64)
    row_of[rows] = np.arange(len(rows))[:, None]
    pos[rows] = np.arange(rows.shape[1])[None, :]
    return GroupTable(name, rows, row_of, pos)


def dense(columns: list[np.ndarray]) -> np.ndarray:
    """Class ids 0..k-1 of the distinct rows of the stacked columns (sorted order)."""
    return row_ids(np.column_stack(columns))


def row_ids(rows: np.ndarray) -> np.ndarray:
    """Ids 0..k-1 of the distinct rows of a non-negative integer matrix, equal rows equal
    ids. Columns are packed into exact int64 keys a chunk at a time (np.unique over rows
    sorts structured records, seconds at 131k ranks)."""
    rows = np.asarray(rows, dtype=np.int64)
    radix = int(rows.max()) + 1 if rows.size else 1
    chunk = max(1, int(62 // max(np.log2(radix), 1)))
    if rows.shape[1] > 16 * chunk and len(rows) <= rows.shape[1]:  # few wide rows (one group of 10^6 ranks)
        keys = [row.astype(">i8").tobytes() for row in rows]  # big-endian: bytes order = lexicographic order
        order = {k: i for i, k in enumerate(sorted(set(keys)))}
        return np.array([order[k] for k in keys], dtype=np.int64)
    ids = np.zeros(len(rows), dtype=np.int64)
    for start in range(0, rows.shape[1], chunk):
        part = rows[:, start:start + chunk]
        key = part @ (radix ** np.arange(part.shape[1] - 1, -1, -1, dtype=np.int64))
        ids = ids * len(rows) + np.unique(key, return_inverse=True)[1].reshape(-1)  # both < len(rows)
        ids = np.unique(ids, return_inverse=True)[1].reshape(-1)
    return ids.astype(np.int64)


def refine(classes: np.ndarray, tables: dict[GroupType, GroupTable]) -> np.ndarray:
    """Split classes until every member of a class has, in every group type, a group
    holding the same classes position by position (the coarsest stable refinement)."""
    count = int(classes.max()) + 1
    while True:
        cols = [classes]
        for t in distinct(tables):
            cols.append(row_ids(classes[t.rows])[t.row_of])
        classes = dense(cols)
        if int(classes.max()) + 1 == count:
            return classes
        count = int(classes.max()) + 1


def distinct(tables: dict[GroupType, GroupTable]) -> list[GroupTable]:
    seen, out = set(), []
    for t in tables.values():
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def closure(classes: np.ndarray, tables: dict[GroupType, GroupTable]) -> np.ndarray:
    """Simulated ranks (a mask): the smallest rank of each class, then, for every group
    holding a simulated rank, the smallest member of each class it holds no simulated
    member of, until nothing changes (see the module docstring)."""
    sim = np.zeros(len(classes), dtype=bool)
    sim[np.unique(classes, return_index=True)[1]] = True
    n_classes = int(classes.max()) + 1
    changed = True
    while changed:
        changed = False
        for t in distinct(tables):
            rows = t.rows[sim[t.rows].any(axis=1)]
            keys = (np.arange(len(rows))[:, None] * n_classes + classes[rows]).reshape(-1)
            covered = np.unique(keys[sim[rows].reshape(-1)])
            missing = ~np.isin(keys, covered)
            if missing.any():
                members, mkeys = rows.reshape(-1)[missing], keys[missing]
                order = np.lexsort((members, mkeys))
                first = np.unique(mkeys[order], return_index=True)[1]
                sim[members[order][first]] = True
                changed = True
    return sim


@dataclass
class Folding:
    """The classes of a scenario's ranks and which of them are simulated."""

    classes: np.ndarray  # class id of every rank
    simulated: np.ndarray  # bool mask
    tables: dict[GroupType, GroupTable]
    uneven_experts: bool = False  # expert loads differ, so expert-group positions build different programs
    arrivals: object = None  # sampled jitter: the engine's hook for folded members' arrivals (sim.parallel.jitter)
    sample: dict | None = None  # sampled jitter: replicas simulated, of how many, ranks simulated
    carry: bool = True  # unsimulated groups' traffic rides with simulated ones (not in sampled jitter)
    _siblings: dict = field(default_factory=dict)

    @property
    def representative(self) -> np.ndarray:
        """Per rank: the smallest simulated rank of its class (itself when simulated)."""
        found = self.__dict__.get("_rep")
        if found is None:
            sim = np.flatnonzero(self.simulated)
            first = np.full(int(self.classes.max()) + 1, -1, np.int64)
            first[self.classes[sim[::-1]]] = sim[::-1]  # the smallest wins (written last)
            found = self.__dict__["_rep"] = np.where(self.simulated, np.arange(len(self.classes)),
                                                     first[self.classes])
        return found

    def weight(self, rank: int) -> float:
        """How many ranks a simulated rank stands for: its class's size over the class's
        simulated members."""
        size = np.bincount(self.classes)
        sims = np.bincount(self.classes[self.simulated], minlength=len(size))
        c = self.classes[rank]
        return float(size[c] / sims[c])

    def weights(self, ranks) -> np.ndarray:
        """:meth:`weight` of each of ``ranks``."""
        size = np.bincount(self.classes)
        sims = np.bincount(self.classes[self.simulated], minlength=len(size))
        c = self.classes[np.asarray(ranks, dtype=np.int64)]
        return size[c] / sims[c]

    def siblings(self, group: tuple[int, ...]):
        """The unsimulated groups whose traffic rides with ``group``'s collective (see the
        module docstring), or None when ``group`` is of no known type."""
        found = self._siblings.get(group, False)
        if found is False:
            found = self._siblings[group] = self._find_siblings(group)
        return found

    def _find_siblings(self, group):
        if not self.carry:
            return ()
        located = self.locate(group)
        if located is None:
            return None
        table, cols = located
        rows = table.rows if cols is None else table.rows[:, cols]
        want = self.classes[np.asarray(group)]
        match = (self.classes[rows] == want).all(axis=1)
        has_sim = self.simulated[rows].any(axis=1)
        sims = rows[match & has_sim]
        first = sims[np.lexsort(sims.T[::-1])[0]]
        if tuple(first) != tuple(group):
            return ()  # another simulated copy carries them
        others = rows[match & ~has_sim]
        return SiblingGroups(others[np.lexsort(others.T[::-1])]) if len(others) else ()

    def locate(self, group):
        """(table, columns) with ``group`` = a row of table (columns None) or those columns
        of a row."""
        head = group[0]
        for t in self.tables.values():
            row = t.rows[t.row_of[head]]
            if len(row) == len(group) and tuple(row) == tuple(group):
                return t, None
        t = self.tables.get(G.PP)  # a send/recv pair: two positions of a pipeline
        members = np.asarray(group)
        if t is not None and (t.row_of[members] == t.row_of[head]).all():
            return t, t.pos[members]
        return None


def positions(tables: dict[GroupType, GroupTable], world: int, experts: bool) -> list[np.ndarray]:
    """Per rank: its position in its pipeline (its stage) and, with ``experts``, in its
    expert group (whose experts' loads it then has): the columns every label starts with."""
    cols = [tables[G.PP].pos if G.PP in tables else np.zeros(world, np.int64)]
    if experts and G.EP in tables:
        cols.append(tables[G.EP].pos)
    return cols


def labels(s, tables: dict[GroupType, GroupTable], world: int, fabric, domains: np.ndarray,
           uneven_experts: bool) -> np.ndarray:
    """The label classes of every rank (see the module docstring)."""
    cols = positions(tables, world, uneven_experts)
    for codes in (scale_codes(s, world, fabric.gpus_per_node), link_codes(s, tables, world, fabric, domains)):
        if codes.any():
            cols.append(codes)
    cols += [shape_ids(t, placement(fabric, domains, world))[t.row_of] for t in distinct(tables)]
    return dense(cols)


def shape_ids(table: GroupTable, where: np.ndarray) -> np.ndarray:
    """Per group of ``table``: an id of its shape on the fabric, which members share a
    domain, a server, a scalable unit, a rail (position by position). Groups of one shape
    route their collectives alike; a clean run on a cluster built of whole units has one
    shape per type, a layout that straddles units unevenly has several."""
    patterns = [first_appearance(where[:, k][table.rows]) for k in range(where.shape[1])]
    return row_ids(np.hstack(patterns))


def first_appearance(values: np.ndarray) -> np.ndarray:
    """Per row: each entry replaced by the position of the first entry equal to it."""
    order = np.argsort(values, axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    starts = np.ones(ranked.shape, dtype=bool)
    starts[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    cols = np.where(starts, np.arange(values.shape[1])[None, :], 0)
    head = np.take_along_axis(order, np.maximum.accumulate(cols, axis=1), axis=1)
    out = np.empty_like(order)
    np.put_along_axis(out, order, head, axis=1)
    return out


def scale_codes(s, world: int, per_node: int) -> np.ndarray:
    """Per rank: 0, or a code of its compute scale (the straggler entries naming it)."""
    entries: dict[int, list] = {}
    for st in s.stragglers:
        for r in straggler_ranks(st, per_node):
            if r < world:
                entries.setdefault(r, []).append((st.start_s, st.slowdown))
    return _codes(world, {r: tuple(sorted(e)) for r, e in entries.items()})


def link_codes(s, tables: dict[GroupType, GroupTable], world: int, fabric, domains: np.ndarray) -> np.ndarray:
    """Per rank: 0, or a code of the faulty NICs its traffic can cross (module docstring)."""
    per = fabric.gpus_per_node
    factors = nic_factors(s.cluster.faults, per, world)  # GPU -> NIC bandwidth factor (< 1)
    found: dict[int, tuple] = {}
    for server in sorted({g // per for g in factors}):
        gpus = range(server * per, min((server + 1) * per, world))
        vector = tuple(factors.get(g, 1.0) for g in gpus)
        if 0.0 in vector:
            found.update(_failed_server(server, vector, world, fabric))
            continue
        for g in gpus:
            nics = nics_carrying(g, _peers(tables, g), per, domains)
            rails = tuple(sorted((h % per, factors[h]) for h in gpus if h in factors and h != g and h in nics))
            if g in factors or rails:
                found.setdefault(g, ("degraded", factors.get(g, 1.0), rails))
    codes = _codes(world, found)  # a failed NIC: every GPU by rail too (module docstring)
    return dense([codes, np.arange(world, dtype=np.int64) % per]) if 0.0 in factors.values() else codes


def _failed_server(server: int, vector: tuple, world: int, fabric) -> dict[int, tuple]:
    """Labels around a server with a failed NIC (:func:`sim.hardware.rails.failed_nic_reach`):
    the server's GPUs by position, the scalable unit's others by rail."""
    own, unit = failed_nic_reach(server, fabric, world)
    out = {g: ("failed-su", own.start - unit.start, vector, g % fabric.gpus_per_node) for g in unit}
    out.update({g: ("failed-server", own.start - unit.start, vector, g % fabric.gpus_per_node) for g in own})
    return out


def _peers(tables: dict[GroupType, GroupTable], g: int) -> np.ndarray:
    """Every member of every group of ``g`` (but the step-end sync's group of every rank, one
    instance of a 4-byte all-reduce whose members all end together, labels no one)."""
    return np.concatenate([t.rows[t.row_of[g]] for t in distinct(tables) if t.name is not G.INST or len(t.rows) > 1])


def _codes(world: int, by_rank: dict[int, tuple]) -> np.ndarray:
    codes = np.zeros(world, np.int64)
    kinds = {k: i + 1 for i, k in enumerate(sorted(set(by_rank.values()), key=repr))}
    for r, k in by_rank.items():
        codes[r] = kinds[k]
    return codes


def fold(s, layout, fabric, domains, uneven_experts: bool) -> Folding:
    """Classes under the scenario's perturbations (``fabric``: the topology spec), and the
    simulated ranks."""
    tables = group_tables(layout)
    domains = np.asarray(domains)
    classes = refine(labels(s, tables, layout.world, fabric, domains, uneven_experts), tables)
    return Folding(classes, closure(classes, tables), tables, uneven_experts)


def unfolded(layout, uneven_experts: bool) -> Folding:
    """Every rank its own class, every rank simulated (``parallel.fold = false``, jitter)."""
    world = layout.world
    return Folding(np.arange(world), np.ones(world, dtype=bool), group_tables(layout), uneven_experts)
