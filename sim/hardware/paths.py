"""Routes of many GPU pairs at once: :meth:`Topology.route` vectorized over arrays.

A collective of a folded 131,072-GPU run carries the traffic of thousands of groups in
one phase (400k hops in the Llama 3 405B step), and routing them one ``route()`` call at a
time took 12 s. Here the common cases, same NVLink domain or the PXN path across the
fat tree (relay -> NIC -> leaf -> spines -> leaf -> NIC), are built as arrays, one
matrix per route shape; pairs a fault reroutes, and ECMP's per-flow hashing, still go
through ``route()``. The result is the concatenation of ``route(a, b)`` for every pair,
link by link and bit for bit (tests/test_topology.py checks it).
"""

import numpy as np


def routes(topo, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(links, weights, lengths, latencies): the routes of every pair src[i] -> dst[i]
    concatenated in pair order, each route's hop count, and each route's latency."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    ends, dom = topo._endpoint_links, topo.domains
    per = topo.spec.gpus_per_node
    same = dom[src] == dom[dst]
    relay = src - src % per + dst % per
    valid = (relay != src) & (relay < topo.num_gpus)
    valid[valid] = dom[relay[valid]] == dom[src[valid]]
    relay = np.where(valid, relay, src)
    hops = {"nv": (ends["up_nv"][src], ends["down_nv"][dst]), "pre": (ends["up_nv"][src], ends["down_nv"][relay]),
            "nic": (ends["up_nic"][relay], ends["up_ib"][relay]), "last": (ends["down_ib"][dst], ends["down_nic"][dst])}
    broken = {k: (a < 0) | (b < 0) for k, (a, b) in hops.items()}
    slow = np.where(same, broken["nv"], (valid & broken["pre"]) | broken["nic"] | broken["last"])
    if topo.spec.routing == "ecmp":
        slow |= ~same
    shapes, cores = _shapes(topo, same, valid, slow, relay, dst)
    return _assemble(topo, src, dst, slow, shapes, cores, hops)


def _shapes(topo, same, valid, slow, relay, dst) -> tuple[np.ndarray, list]:
    """Per pair, an id of its route's shape: 0 same domain, then (relayed?, leaf pair) of
    the pairs crossing the fabric (-1: through ``route()``); and the core hops per shape."""
    leaf = leaf_ids(topo)
    cross = ~same & ~slow
    shape = np.where(same & ~slow, 0, -1)
    cores: list = [None]
    if cross.any():
        key = (leaf[relay[cross]] * (leaf.max() + 1) + leaf[dst[cross]]) * 2 + valid[cross]
        uniq, inverse = np.unique(key, return_inverse=True)
        nodes = topo._leaf_nodes
        for k in uniq:
            la, lb = nodes[k // 2 // (leaf.max() + 1)], nodes[k // 2 % (leaf.max() + 1)]
            core = topo._core_hops(la, lb, None)
            cores.append((bool(k % 2), np.array([c[0] for c in core], dtype=np.int64),
                          np.array([c[1] for c in core], dtype=float)))
        shape[cross] = inverse.reshape(-1) + 1
    return shape, cores


def _assemble(topo, src, dst, slow, shape, cores, hops):
    n = len(src)
    lengths = np.zeros(n, dtype=np.int64)
    lengths[shape == 0] = 2
    for s, (relayed, core, _) in enumerate(cores[1:], start=1):
        lengths[shape == s] = 2 * relayed + 4 + len(core)
    slow_routes = {int(i): topo.route(int(src[i]), int(dst[i])) for i in np.flatnonzero(slow)}
    for i, r in slow_routes.items():
        lengths[i] = len(r.links)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    links, weights = np.zeros(int(lengths.sum()), dtype=np.int64), np.zeros(int(lengths.sum()))
    latency = np.zeros(n)
    for s in range(len(cores)):
        idx = np.flatnonzero(shape == s)
        if len(idx):
            m, w = _matrix(s, cores, hops, idx)
            where = offsets[idx][:, None] + np.arange(m.shape[1])[None, :]
            links[where], weights[where] = m, w
            latency[idx] = (topo.latency[m] * w).sum(axis=1)
    for i, r in slow_routes.items():
        links[offsets[i]:offsets[i] + lengths[i]] = r.links
        weights[offsets[i]:offsets[i] + lengths[i]] = r.weights
        latency[i] = r.latency
    return links, weights, lengths, latency


def _matrix(s: int, cores: list, hops: dict, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The links and weights of the pairs ``idx`` of shape ``s``, one row each."""
    if s == 0:
        cols = [hops["nv"][0][idx], hops["nv"][1][idx]]
        return np.column_stack(cols), np.ones((len(idx), 2))
    relayed, core, share = cores[s]
    head = ([hops["pre"][0][idx], hops["pre"][1][idx]] if relayed else []) + [hops["nic"][0][idx], hops["nic"][1][idx]]
    tail = [hops["last"][0][idx], hops["last"][1][idx]]
    middle = [np.broadcast_to(core, (len(idx), len(core)))] if len(core) else []
    m = np.column_stack(head + middle + tail)
    w = np.ones(m.shape)
    w[:, len(head):len(head) + len(core)] = share
    return m, w


def leaf_ids(topo) -> np.ndarray:
    """Per GPU: an integer id of the leaf its NIC plugs into (cached on the topology;
    ``topo._leaf_nodes[id]`` is the node; GPUs whose NIC is cut off get id 0, and a
    route never reaches them here: their broken links send them through ``route()``)."""
    found = topo.__dict__.get("_leaf_ids")
    if found is None:
        nodes, ids = [], {}
        out = np.zeros(topo.num_gpus, dtype=np.int64)
        for i, leaf in enumerate(topo._leaves):
            if leaf is not None:
                out[i] = ids.setdefault(leaf, len(ids))
                if out[i] == len(nodes):
                    nodes.append(leaf)
        topo.__dict__["_leaf_nodes"] = nodes
        found = topo.__dict__["_leaf_ids"] = out
    return found
