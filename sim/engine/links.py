"""A phase mapped onto a topology's directed links, once per link structure.

Each hop of a :class:`~sim.collectives.schedule.Phase` is routed
(:func:`sim.hardware.paths.routes`: sprayed or hashed over equal-cost paths, PXN relays);
the result, a :class:`CompiledPhase`, lists which share of which chain's rate lands on which
link. It depends on the hops only, never on bytes, so :class:`PhaseCache` keeps it by the
phase's structure, and a phase whose hops repeat an earlier one's a whole number of
scalable units away reuses its entries on moved links (:func:`sim.hardware.paths.translate`).
Both caches are keyed by digests of the hop arrays, checked against the arrays themselves
on a hit, so no copy of the hops is held (a world-wide tree phase at 131k GPUs is 2.1M hops).

Run: ``python -m pytest -q tests/test_network.py tests/test_paths.py tests/test_links.py``
"""

import hashlib
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


def _digest(arrays, extra: float) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a))
    h.update(np.float64(extra).tobytes())
    return h.digest()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as bytes (what ``tobytes()`` keys compared): dtype, shape and every value."""
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


class PhaseCache:
    """Compiled phases by structure (the hops and the protocol's ``wire``: rates never depend
    on bytes), numbered in the order first compiled (``key``), with the routed shapes that
    :func:`compile_phase` translates."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._compiled: dict[bytes, list[tuple[object, CompiledPhase]]] = {}  # digest -> (phase, compiled)
        self._templates: dict[bytes, list[tuple[object, int, CompiledPhase]]] = {}  # see compile_phase
        self.count = 0

    def get(self, phase) -> CompiledPhase:
        """The compiled form of ``phase``: an earlier one of the same structure, or routed now."""
        digest = _digest((phase.src, phase.dst, phase.chain), phase.wire)
        found = self._compiled.setdefault(digest, [])
        for other, compiled in found:
            if (other.wire == phase.wire and _same(other.src, phase.src) and _same(other.dst, phase.dst)
                    and _same(other.chain, phase.chain)):
                return compiled
        compiled = compile_phase(self.topo, phase, self.count, self._templates)
        self.count += 1
        found.append((phase, compiled))
        return compiled


def compile_phase(topo: Topology, phase, serial: int, templates: dict) -> CompiledPhase:
    """Route ``phase``'s hops; or, when an earlier phase had the same hops a whole number
    of scalable units away, move its links (:func:`sim.hardware.paths.translate`:
    the same entries, shared, on the moved links). ``serial``: the new structure's key;
    ``templates``: the caller's cache of routed shapes (digest of the hops relative to their
    first source -> [(phase, its first source, compiled)]), added to here."""
    shape = _shape_digest(phase)
    template = _template(templates.get(shape, ()), phase) if shape is not None else None
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
    link_index = position[entry_link]
    del entry_link, used, position  # (each temporary goes as soon as it is read: a 13M-entry phase's peak)
    compiled = CompiledPhase(np.repeat(phase.chain.astype(np.int32), lengths), entry_weight, phase.n_chains,
                             float(latency.max()) if len(latency) else 0.0, serial, links, link_index)
    if shape is not None and not stats["slow"]:
        found = templates.setdefault(shape, [])
        if _template(found, phase) is None:
            found.append((phase, int(phase.src[0]), compiled))
    return compiled


def link_bytes(phase: CompiledPhase, nbytes: np.ndarray) -> np.ndarray:
    """Bytes a transfer of ``phase`` (``nbytes`` per chain) carries on each of ``phase.links``."""
    carried = nbytes[phase.entry_chain]
    carried *= phase.entry_weight  # (in place: the same products, one entry-long array fewer)
    return np.bincount(phase.link_index, weights=carried, minlength=len(phase.links))


def _shape_digest(phase) -> bytes | None:
    """Digest of a phase's hops relative to its first source (GPU endpoints only), for translation."""
    if not len(phase.src) or phase.src.min() < 0 or phase.dst.min() < 0:
        return None
    base = phase.src[0]
    return _digest((phase.chain, phase.src - base, phase.dst - base), phase.wire)


def _template(found, phase) -> tuple[int, CompiledPhase] | None:
    """(its first source, compiled) of the template in ``found`` whose hops relative to their
    first source are ``phase``'s, if any (the digest matched: the arrays decide)."""
    base = phase.src[0]
    for other, other_base, compiled in found:
        if (other.wire == phase.wire and _same(other.chain, phase.chain)
                and _same(other.src - other_base, phase.src - base) and _same(other.dst - other_base, phase.dst - base)):
            return other_base, compiled
    return None
