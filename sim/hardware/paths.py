"""Routes of many GPU pairs at once: :meth:`Topology.route` vectorized over arrays.

A collective of a folded 131,072-GPU run carries the traffic of thousands of groups in
one phase (400k hops in the Llama 3 405B step), and routing them one ``route()`` call at a
time took 12 s. Here the common cases, same NVLink domain or the PXN path across the
fat tree (relay -> NIC -> leaf -> spines -> leaf -> NIC), are built as arrays, one
matrix per route shape, the sprayed spine hops of every leaf pair from one leaf x spine
table; pairs a fault reroutes, ECMP's per-flow hashing, leaf pairs not joined by
two-hop spine paths, hops to or from a switch (in-switch reduction) and every hop of a
rail-only or multi-plane fabric still go through ``route()``. The result is the concatenation of
``route(a, b)`` for every pair, link by link and bit for bit (tests/test_paths.py).
"""

import numpy as np

from .rails import pxn_relay
from .specs import Builder, Routing


def routes(topo, src: np.ndarray, dst: np.ndarray, stats: dict | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(links, weights, lengths, latencies): the routes of every pair src[i] -> dst[i]
    concatenated in pair order, each route's hop count, and each route's latency.
    ``stats["slow"]``, if given: how many pairs went through ``route()``."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    # hops ending at a switch (in-switch reduction: negative ids) and every hop of a
    # rail-only or multi-plane fabric (sim/hardware/switching.py) go through route()
    other = (src < 0) | (dst < 0) | (topo.spec.planes > 1) | (topo.spec.builder is not Builder.FAT_TREE)
    calls = (src, dst)  # what route() is asked
    src, dst = np.where(other, 0, src), np.where(other, 0, dst)
    ends, dom = topo.endpoint_links, topo.domains
    same = dom[src] == dom[dst]
    slow = other.copy()
    near = np.flatnonzero(same & ~other)  # through the NVSwitch
    nv = (ends["up_nv"][src[near]], ends["down_nv"][dst[near]])
    slow[near[(nv[0] < 0) | (nv[1] < 0)]] = True
    x = np.flatnonzero(~same)  # across the fabric: the hops below are of these pairs only
    relay = pxn_relay(src[x], dst[x], topo.spec.gpus_per_node, dom)
    valid = relay != src[x]
    hops = {"pre": (ends["up_nv"][src[x]], ends["down_nv"][relay]), "nic": (ends["up_nic"][relay], ends["up_ib"][relay]),
            "last": (ends["down_ib"][dst[x]], ends["down_nic"][dst[x]])}
    broken = {k: (a < 0) | (b < 0) for k, (a, b) in hops.items()}
    slow[x[(valid & broken["pre"]) | broken["nic"] | broken["last"]]] = True
    if topo.spec.routing is Routing.ECMP:
        slow[x] = True
    core = np.full(len(x), -1, dtype=np.int64)  # per pair crossing the fabric: its leaf pair's row in ``table``
    table = None
    cross = np.flatnonzero(~slow[x])
    if len(cross):
        leaf, leaves = leaf_ids(topo), len(leaf_nodes(topo))
        uniq, inverse = np.unique(leaf[relay[cross]] * leaves + leaf[dst[x[cross]]], return_inverse=True)
        table = spine_hops(topo, uniq // leaves, uniq % leaves)
        core[cross] = inverse.reshape(-1)
        slow[x[cross[table[1][core[cross]] < 0]]] = True  # leaf pairs without two-hop paths
    if stats is not None:
        stats["slow"] = int(slow.sum())
    hops["nv"] = nv
    return _assemble(topo, calls, (near, x), valid, slow, core, table, hops)


CHUNK = 1 << 15  # fabric-crossing routes assembled at a time (131k GPUs' world-wide tree: 262k of them)


def _assemble(topo, calls, where, relayed, slow, core, table, hops):
    """Concatenate the routes: columns per shape (same domain; across the fabric by
    relayed and spine count), then the pairs ``route()`` took (``calls``: (src, dst));
    ``where``: (the pairs of ``hops["nv"]``, those of the other hops, ``relayed``, ``core``)."""
    src, dst = calls
    near, x = where
    keep_near, far = ~slow[near], np.flatnonzero(~slow[x])
    lengths = np.full(len(src), 2, dtype=np.int64)
    k = table[1][core[far]] if table is not None else np.zeros(0, dtype=np.int64)
    lengths[x[far]] = 2 * relayed[far] + 4 + k
    one = {int(i): topo.route(int(src[i]), int(dst[i])) for i in np.flatnonzero(slow)}
    for i, r in one.items():
        lengths[i] = len(r.links)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    links, weights, latency = np.zeros(int(lengths.sum()), np.int64), np.zeros(int(lengths.sum())), np.zeros(len(src))
    at, (a, b) = offsets[near[keep_near]], (h[keep_near] for h in hops["nv"])
    links[at], links[at + 1], weights[at], weights[at + 1] = a, b, 1.0, 1.0
    latency[near[keep_near]] = topo.latency[a] + topo.latency[b]  # (weights 1: the sum of two is the same float)
    shape = relayed[far] * 10**6 + k
    for s in np.unique(shape):
        same_shape = far[shape == s]
        for start in range(0, len(same_shape), CHUNK):  # (a row's matrices are ~40 wide: chunks bound the peak)
            idx = same_shape[start:start + CHUNK]
            m, w = _matrix(idx, bool(relayed[idx[0]]), core, table, hops)
            at = offsets[x[idx]][:, None] + np.arange(m.shape[1])[None, :]
            links[at], weights[at] = m, w
            latency[x[idx]] = (topo.latency[m] * w).sum(axis=1)
    for i, r in one.items():
        links[offsets[i]:offsets[i] + lengths[i]], weights[offsets[i]:offsets[i] + lengths[i]] = r.links, r.weights
        latency[i] = r.latency
    return links, weights, lengths, latency


def _matrix(idx: np.ndarray, relayed: bool, core, table, hops) -> tuple[np.ndarray, np.ndarray]:
    """Links and weights of the fabric-crossing pairs ``idx`` (one shape; indices into the
    pairs of ``hops``), one row each."""
    head = ([hops["pre"][0][idx], hops["pre"][1][idx]] if relayed else []) + [hops["nic"][0][idx], hops["nic"][1][idx]]
    k = int(table[1][core[idx[0]]])
    spine_links = table[0][core[idx], table[0].shape[1] - k:]
    m = np.column_stack(head + [spine_links, hops["last"][0][idx], hops["last"][1][idx]])
    w = np.ones(m.shape)
    w[:, len(head):len(head) + k] = table[2][core[idx]][:, None]
    return m, w


def spine_hops(topo, la: np.ndarray, lb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For leaf pairs (ids): the sprayed core of :meth:`Topology._core_hops`, up to every
    switch both leaves link to and down again, 1/k of the flow on each of the k paths,
    sorted by link id (nothing for a leaf to itself). Returns (links, length, share) per
    pair: the row's ``length`` links sit at the end of ``links`` (padded with -1 before
    them); length -1 marks a pair with no two-hop paths (or a direct link): ``route()``."""
    up, down, index = spine_table(topo)
    ends_u, ends_d = up[la], down[:, lb].T
    common = (ends_u >= 0) & (ends_d >= 0)
    count = common.sum(axis=1)
    links = np.where(np.concatenate([common, common], axis=1), np.concatenate([ends_u, ends_d], axis=1), -1)
    links.sort(axis=1)
    length = np.where(la == lb, 0, np.where(count > 0, 2 * count, -1))
    if index is not None:  # leaves linked to leaves: a direct link is a one-hop path
        length[(la != lb) & (up[la, np.maximum(index[lb], 0)] >= 0) & (index[lb] >= 0)] = -1
    return links, length, 1.0 / np.maximum(count, 1)


def spine_table(topo) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(up, down, index): link ids leaf -> switch and switch -> leaf for every leaf (by
    id) and every switch a leaf links to (-1 where none), and, if some of those switches
    are leaves, each leaf's column (-1: none); cached on the topology."""
    found = topo.__dict__.get("_spine_table")
    if found is None and topo.tree is not None:  # a clean fat tree: sim/hardware/tree_arrays.py
        found = topo.__dict__["_spine_table"] = topo.tree.spine_table()
    if found is None:
        leaf_ids(topo)
        adj, kinds, link_id = topo.graph._adj, topo.graph._node, topo.link_id
        nodes = leaf_nodes(topo)
        spines: dict = {}
        for leaf in nodes:
            for n in adj[leaf]:
                if kinds[n]["kind"] == "switch":
                    spines.setdefault(n, len(spines))
        up, down = np.full((len(nodes), len(spines)), -1, np.int64), np.full((len(spines), len(nodes)), -1, np.int64)
        for i, leaf in enumerate(nodes):
            for n in adj[leaf]:
                j = spines.get(n)
                if j is not None:
                    up[i, j], down[j, i] = link_id[(leaf, n)], link_id[(n, leaf)]
        index = np.array([spines.get(leaf, -1) for leaf in nodes], dtype=np.int64)
        found = topo.__dict__["_spine_table"] = (up, down, index if (index >= 0).any() else None)
    return found


def leaf_ids(topo) -> np.ndarray:
    """Per GPU: an integer id of the leaf its NIC plugs into (cached on the topology;
    ``leaf_nodes(topo)[id]`` is the node; GPUs whose NIC is cut off get id 0, and a
    route never reaches them here: their broken links send them through ``route()``)."""
    found = topo.__dict__.get("_leaf_ids")
    if found is None and topo.tree is not None:
        topo.__dict__["_leaf_nodes"] = [topo.tree.leaf_node(i) for i in range(topo.tree.leaf_count)]
        found = topo.__dict__["_leaf_ids"] = topo.tree.leaf_ids
    if found is None:
        nodes, ids = [], {}
        out = np.zeros(topo.num_gpus, dtype=np.int64)
        for i, leaf in enumerate(topo.leaves):
            if leaf is not None:
                out[i] = ids.setdefault(leaf, len(ids))
                if out[i] == len(nodes):
                    nodes.append(leaf)
        topo.__dict__["_leaf_nodes"] = nodes
        found = topo.__dict__["_leaf_ids"] = out
    return found


def leaf_nodes(topo) -> list:
    """Per leaf id (:func:`leaf_ids`): the leaf's node."""
    leaf_ids(topo)
    return topo.__dict__["_leaf_nodes"]


# Translation: on a clean rail-optimised fat tree of whole scalable units, moving every
# endpoint of a set of hops by a whole number of units (``off`` GPUs) moves each hop's
# route link for link: the same kinds of links of the moved GPUs and leaves, the same
# spines. A folded run meets the same collective shape once per pipeline stage (their
# ranks ``off`` apart), so the network routes it once and translates its link set.
ENDPOINTS = ("up_nv", "down_nv", "up_nic", "down_nic", "up_ib", "down_ib")


def translatable(topo, off: int) -> bool:
    """Whether ``translate`` applies: spraying over a plain fat tree built of whole units
    and never cut since (link faults that only slow a link change no route), ``off`` a
    multiple of the unit and of the NVLink domain."""
    spec = topo.spec
    unit = spec.gpus_per_node * spec.nodes_per_su
    plain = topo.__dict__.get("_translatable")
    if plain is None:  # (counting a graph's edges walks every node: once per topology)
        plain = topo.__dict__["_translatable"] = (
            spec.routing is Routing.SPRAY and spec.planes == 1 and spec.builder is Builder.FAT_TREE
            and topo.intact
            and topo.num_gpus % unit == 0 and spine_table(topo)[2] is None)
    return plain and off % unit == 0 and off % spec.gpus_per_domain == 0


def translate(topo, links: np.ndarray, off: int) -> np.ndarray | None:
    """The links a route uses ``off`` GPUs further on, link for link (None when some link
    is of no kind a batched route uses, or ``translatable`` says no)."""
    if not translatable(topo, off):
        return None
    cls, idx = link_owners(topo)
    c, i = cls[links], idx[links]
    if (c < 0).any():
        return None
    out = np.full(len(links), -1, dtype=np.int64)
    ends = topo.endpoint_links
    for k, name in enumerate(ENDPOINTS):
        sel = c == k
        if sel.any():
            gpu = i[sel] + off
            if gpu.min() < 0 or gpu.max() >= topo.num_gpus:
                return None
            out[sel] = ends[name][gpu]
    up, down, _ = spine_table(topo)
    switches = up.shape[1]
    leaf, switch = i // switches, i % switches
    for k, table in ((len(ENDPOINTS), up), (len(ENDPOINTS) + 1, down.T)):
        sel = c == k
        if sel.any():
            gpu = leaf_gpus(topo)[leaf[sel]] + off
            if gpu.min() < 0 or gpu.max() >= topo.num_gpus:
                return None
            out[sel] = table[leaf_ids(topo)[gpu], switch[sel]]
    return out if (out >= 0).all() else None


def link_owners(topo) -> tuple[np.ndarray, np.ndarray]:
    """Per link (cached): its kind among :data:`ENDPOINTS` (index: the GPU), leaf -> switch
    or switch -> leaf (index: leaf * switches + switch), or -1."""
    found = topo.__dict__.get("_link_owners")
    if found is None:
        kind, index = np.full(len(topo.caps), -1, np.int64), np.full(len(topo.caps), -1, np.int64)
        for k, name in enumerate(ENDPOINTS):
            ids = topo.endpoint_links[name]
            ok = ids >= 0
            kind[ids[ok]], index[ids[ok]] = k, np.flatnonzero(ok)
        up, down, _ = spine_table(topo)
        for k, table in ((len(ENDPOINTS), up), (len(ENDPOINTS) + 1, down.T)):
            ok = table >= 0
            kind[table[ok]], index[table[ok]] = k, np.flatnonzero(ok.reshape(-1))
        found = topo.__dict__["_link_owners"] = (kind, index)
    return found


def leaf_gpus(topo) -> np.ndarray:
    """Per leaf id: the first GPU whose NIC plugs into it (cached)."""
    found = topo.__dict__.get("_leaf_gpus")
    if found is None:
        ids = leaf_ids(topo)
        first = np.full(len(leaf_nodes(topo)), -1, np.int64)
        first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # the smallest GPU wins (written last)
        found = topo.__dict__["_leaf_gpus"] = first
    return found
