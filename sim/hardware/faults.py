"""Stragglers, jitter and link faults: what breaks the symmetry of a step.

Slow ranks and thermal throttling scale compute time (the engine asks
:func:`compute_scale` at each op's start); jitter multiplies every compute op by a seeded
random draw; link faults scale (or remove) links of the graph before routing.
"""

from enum import StrEnum

import numpy as np

from ..errors import InputError


class Distribution(StrEnum):
    """``jitter.distribution``: the law of each compute op's slowdown draw (:func:`_draws`)."""

    LOGNORMAL = "lognormal"  # mean-one lognormal
    NORMAL = "normal"  # mean one, cut at jitter.floor


def straggler_ranks(st, per_node: int) -> set[int]:
    """The ranks one ``[[stragglers]]`` entry slows: its ranks and every GPU of its nodes."""
    return set(st.ranks) | {n * per_node + i for n in st.nodes for i in range(per_node)}


def straggler_slowdowns(s, per_node: int, from_start: bool = False) -> dict[int, float]:
    """Rank -> the compute slowdown the ``[[stragglers]]`` give it once they are all in
    effect (the larger slowdown wins where entries overlap, as in :func:`compute_scale`);
    ``from_start``: only the entries in effect from t = 0 (every op of the rank is slow)."""
    slow: dict[int, float] = {}
    for st in s.stragglers:
        if from_start and st.start_s > 0:
            continue
        for r in straggler_ranks(st, per_node):
            slow[r] = max(slow.get(r, 1.0), st.slowdown)
    return slow


def compute_scale(s, topo):
    """callable(rank, now) -> compute slowdown, or None when nothing is slow."""
    if not s.stragglers:
        return None
    per_node = topo.spec.gpus_per_node
    rules = [(straggler_ranks(st, per_node), st.slowdown, st.start_s) for st in s.stragglers]

    def scale(rank: int, now: float) -> float:
        factor = 1.0
        for ranks, slowdown, start in rules:
            if rank in ranks and now >= start:
                factor = max(factor, slowdown)
        return factor

    return scale


def jitter_draws(s, rank: int, n: int) -> np.ndarray:
    """The first ``n`` compute multipliers of ``rank`` (index i belongs to the rank's op i):
    drawn in blocks of 4,096 from the rank's own generator seeded by (seed, rank), so a draw
    depends only on the seed, the rank and the op, and a whole program's draws are one
    vectorized call."""
    rng = np.random.default_rng((s.seed, rank))
    blocks = [_draws(rng, s.jitter, JITTER_BLOCK) for _ in range(-(-n // JITTER_BLOCK))]
    return np.concatenate(blocks)[:n] if blocks else np.zeros(0)


JITTER_BLOCK = 4096  # draws per generator call (the block size fixes which draw an op gets)


def jitter_fn(s):
    """callable(rank, op_index) -> multiplier (:func:`jitter_draws` one at a time), or None."""
    if s.jitter.sigma <= 0:
        return None
    drawn: dict[int, np.ndarray] = {}

    def draw(rank: int, index: int) -> float:
        found = drawn.get(rank)
        if found is None or len(found) <= index:
            found = drawn[rank] = jitter_draws(s, rank, (index // JITTER_BLOCK + 1) * JITTER_BLOCK)
        return float(found[index])

    return draw


def _draws(rng: np.random.Generator, j, n: int) -> np.ndarray:
    if j.distribution is Distribution.LOGNORMAL:
        return rng.lognormal(-j.sigma**2 / 2, j.sigma, n)
    return np.maximum(j.floor, rng.normal(1.0, j.sigma, n))


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


def nic_ranks(f, per_node: int) -> list[int]:
    """GPUs whose NIC one ``[[cluster.faults]]`` entry names (``gpu_nic``, then every GPU
    of ``node_nics``); a spine fault names none."""
    out = [f.gpu_nic] if f.gpu_nic is not None else []
    if f.node_nics is not None:
        out += range(f.node_nics * per_node, (f.node_nics + 1) * per_node)
    return out


def nic_factors(faults, per_node: int, world: int) -> dict[int, float]:
    """GPU -> the factor its NIC's bandwidth is scaled by (0: failed), for every GPU a
    ``gpu_nic`` or ``node_nics`` fault names; entries naming one NIC twice multiply, as
    :func:`apply_faults` scales the link once per entry."""
    out: dict[int, float] = {}
    for f in faults:
        for g in nic_ranks(f, per_node):
            if g < world:
                out[g] = out.get(g, 1.0) * f.factor
    return out


def _edges(graph, f, spec) -> list[tuple]:
    found = []
    for g in nic_ranks(f, spec.gpus_per_node):
        if ("nic", g) in graph:
            found += [(("nic", g), n) for n in graph.neighbors(("nic", g)) if n[0] == "leaf"]
    if f.spine is not None and ("spine", f.spine) in graph:
        found += [(n, ("spine", f.spine)) for n in graph.neighbors(("spine", f.spine))]
    return found


def perturbed(s) -> bool:
    """Whether stragglers, jitter or link faults are configured."""
    return bool(s.stragglers) or s.jitter.sigma > 0 or bool(s.cluster.faults)
