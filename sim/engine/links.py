"""A phase mapped onto a topology's directed links, once per link structure.

Each hop of a :class:`~sim.collectives.schedule.Phase` is routed
(:func:`sim.hardware.paths.routes`: sprayed or hashed over equal-cost paths, PXN relays);
the result, a :class:`CompiledPhase`, lists which share of which chain's rate lands on which
link. It depends on the hops only, never on bytes, so :class:`sim.engine.network.Network`
caches it by the phase's structure, and a phase whose hops repeat an earlier one's a whole
number of scalable units away reuses its entries on moved links
(:func:`sim.hardware.paths.translate`).

Run: ``python -m pytest -q tests/test_network.py tests/test_paths.py``
"""

from dataclasses import dataclass

import numpy as np

from ..hardware.paths import routes, translate
from ..hardware.topology import Topology


@dataclass
class CompiledPhase:
    """A phase mapped onto the topology's links (bytes-independent, so cacheable): entry
    i puts ``entry_weight[i]`` times chain ``entry_chain[i]``'s rate on link
    ``links[link_index[i]]``."""

    entry_chain: np.ndarray
    entry_weight: np.ndarray  # share of the chain's rate on that link (spraying splits it)
    n_chains: int
    step_latency: float  # seconds: the longest hop's path latency
    key: int  # identifies the link structure, for the rate cache
    links: np.ndarray  # the distinct links it uses, ascending
    link_index: np.ndarray  # per entry: the position of its link in ``links``


def compile_phase(topo: Topology, phase, serial: int, templates: dict) -> CompiledPhase:
    """Route ``phase``'s hops; or, when an earlier phase had the same hops a whole number
    of scalable units away, move its links (:func:`sim.hardware.paths.translate`:
    the same entries, shared, on the moved links). ``serial``: the new structure's key;
    ``templates``: the caller's cache of routed shapes (hops relative to their first source ->
    (that source, compiled)), added to here."""
    shape = _shape_key(phase)
    template = templates.get(shape) if shape is not None else None
    if template is not None:
        base, found = template
        links = translate(topo, found.links, int(phase.src[0]) - base)
        if links is not None and (len(links) < 2 or bool((np.diff(links) > 0).all())):
            return CompiledPhase(found.entry_chain, found.entry_weight, found.n_chains, found.step_latency,
                                 serial, links, found.link_index)
    stats: dict = {}
    entry_link, entry_weight, lengths, latency = routes(topo, phase.src, phase.dst, stats)
    if phase.wire != 1.0:  # a protocol's flags: each byte of payload takes more of the link
        entry_weight = entry_weight * phase.wire
    used = np.zeros(len(topo.caps), dtype=bool)  # its distinct links, without sorting the entries
    used[entry_link] = True
    links = np.flatnonzero(used)
    position = np.empty(len(used), dtype=np.int32)  # (entries' chains and link positions as int32: 13M
    position[links] = np.arange(len(links))  # entries a phase at 131k GPUs, 0.1 GB less each; same values)
    compiled = CompiledPhase(np.repeat(phase.chain.astype(np.int32), lengths), entry_weight, phase.n_chains,
                             float(latency.max()) if len(latency) else 0.0, serial, links, position[entry_link])
    if shape is not None and not stats["slow"]:
        templates.setdefault(shape, (int(phase.src[0]), compiled))
    return compiled


def link_bytes(phase: CompiledPhase, nbytes: np.ndarray) -> np.ndarray:
    """Bytes a transfer of ``phase`` (``nbytes`` per chain) carries on each of ``phase.links``."""
    return np.bincount(phase.link_index, weights=nbytes[phase.entry_chain] * phase.entry_weight,
                       minlength=len(phase.links))


def _shape_key(phase) -> tuple | None:
    """A phase's hops relative to its first source (GPU endpoints only), for translation."""
    if not len(phase.src) or phase.src.min() < 0 or phase.dst.min() < 0:
        return None
    base = phase.src[0]
    return (phase.chain.tobytes(), (phase.src - base).tobytes(), (phase.dst - base).tobytes(), phase.wire)
