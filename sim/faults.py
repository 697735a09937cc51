"""Stragglers, jitter and link faults: what breaks the symmetry of a step.

Slow ranks and thermal throttling scale compute time (the engine asks
:func:`compute_scale` at each op's start); jitter multiplies every compute op by a seeded
random draw; link faults scale (or remove) links of the graph before routing.
"""

import numpy as np

from .errors import InputError


def compute_scale(s, topo):
    """callable(rank, now) -> compute slowdown, or None when nothing is slow."""
    if not s.stragglers:
        return None
    per_node = topo.spec.gpus_per_node
    rules = []
    for st in s.stragglers:
        ranks = set(st.ranks) | {n * per_node + i for n in st.nodes for i in range(per_node)}
        rules.append((ranks, st.slowdown, st.start_s))

    def scale(rank: int, now: float) -> float:
        factor = 1.0
        for ranks, slowdown, start in rules:
            if rank in ranks and now >= start:
                factor = max(factor, slowdown)
        return factor

    return scale


def jitter_fn(s):
    """callable(rank, op_index) -> multiplier, or None. Each rank draws its multipliers in
    op order from its own generator seeded by (seed, rank), so a draw depends only on the
    seed, the rank and the op."""
    j = s.jitter
    if j.sigma <= 0:
        return None
    streams: dict[int, tuple[np.random.Generator, list]] = {}

    def draw(rank: int, index: int) -> float:
        found = streams.get(rank)
        if found is None:
            found = streams[rank] = (np.random.default_rng((s.seed, rank)), [])
        rng, drawn = found
        while len(drawn) <= index:
            drawn.extend(_draws(rng, j, 4096))
        return drawn[index]

    return draw


def _draws(rng: np.random.Generator, j, n: int) -> list[float]:
    if j.distribution == "lognormal":  # mean-one lognormal
        return rng.lognormal(-j.sigma**2 / 2, j.sigma, n).tolist()
    return np.maximum(j.floor, rng.normal(1.0, j.sigma, n)).tolist()


def apply_faults(graph, faults, spec) -> None:
    """Scale the bandwidth of faulty links; remove failed ones (factor 0)."""
    for i, f in enumerate(faults):
        edges = _edges(graph, f, spec)
        if not edges:
            raise InputError(f"cluster.faults[{i}]", "names no link of this cluster (give gpu_nic, node_nics or spine)")
        for u, v in edges:
            if f.factor == 0:
                graph.remove_edge(u, v)
            else:
                graph.edges[u, v]["bw"] *= f.factor


def _edges(graph, f, spec) -> list[tuple]:
    found = []
    if f.gpu_nic is not None:
        found += [(("nic", f.gpu_nic), n) for n in graph.neighbors(("nic", f.gpu_nic))
                  if n[0] == "leaf"] if ("nic", f.gpu_nic) in graph else []
    if f.node_nics is not None:
        per = spec.gpus_per_node
        for g in range(f.node_nics * per, (f.node_nics + 1) * per):
            if ("nic", g) in graph:
                found += [(("nic", g), n) for n in graph.neighbors(("nic", g)) if n[0] == "leaf"]
    if f.spine is not None and ("spine", f.spine) in graph:
        found += [(n, ("spine", f.spine)) for n in graph.neighbors(("spine", f.spine))]
    return found
