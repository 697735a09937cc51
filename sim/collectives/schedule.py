"""What a collective algorithm produces: a schedule of phases of chained hops.

A :class:`Phase` is a set of chains; a chain is a list of hops (src GPU -> dst GPU) that
each carry ``nbytes[chain]`` bytes at one common rate, as a pipelined ring channel or
tree does. Phases of a :class:`Schedule` run one after another. ``steps`` is the number
of sequential algorithm steps, each paying one hop latency (the alpha term), scaled by
``latency_scale`` (a protocol's, see :mod:`sim.collectives.protocols`); ``overhead`` is
a fixed latency paid once (the synchronisation of in-switch reduction, NVLS / SHARP);
``wire`` is the protocol's bytes on the wire per byte of payload (``nbytes``).
A hop's endpoint may be a switch (negative ids, :mod:`sim.hardware.switching`).
"""

from dataclasses import dataclass

import numpy as np

from .kinds import CollectiveOp


@dataclass(frozen=True, eq=False)
class Phase:
    """Chains of hops moving bytes at once. Arrays: ``src``, ``dst``, ``chain`` per hop;
    ``nbytes`` per chain (bytes each hop of the chain carries)."""

    src: np.ndarray
    dst: np.ndarray
    chain: np.ndarray
    nbytes: np.ndarray
    steps: int
    label: str = ""
    latency_scale: float = 1.0  # per-step latency factor of the protocol (1: Simple)
    overhead: float = 0.0  # seconds paid once before the bytes flow
    wire: float = 1.0  # bytes on the wire per byte of payload (a protocol's flags: LL 2)

    @property
    def n_chains(self) -> int:
        """Number of chains."""
        return len(self.nbytes)


@dataclass(frozen=True)
class Schedule:
    """The phases of one collective, run in order."""

    op: CollectiveOp
    algo: str
    phases: tuple[Phase, ...]


def chains_phase(hop_lists: list[list[tuple[int, int]]], nbytes: list[float] | np.ndarray,
                 steps: int, label: str = "", overhead: float = 0.0) -> Phase:
    """Build a phase from one list of (src, dst) hops per chain."""
    src = [s for hops in hop_lists for s, _ in hops]
    dst = [d for hops in hop_lists for _, d in hops]
    chain = [i for i, hops in enumerate(hop_lists) for _ in hops]
    return Phase(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64),
                 np.array(chain, dtype=np.int64), np.asarray(nbytes, dtype=float), steps, label,
                 overhead=overhead)


def merge(phases: list[Phase], label: str = "") -> Phase:
    """Run several phases as one (e.g. the rings of every NVLink domain at once)."""
    offsets = np.cumsum([0] + [p.n_chains for p in phases[:-1]])
    return Phase(np.concatenate([p.src for p in phases]), np.concatenate([p.dst for p in phases]),
                 np.concatenate([p.chain + o for p, o in zip(phases, offsets)]),
                 np.concatenate([p.nbytes for p in phases]),
                 max(p.steps for p in phases), label, max(p.latency_scale for p in phases),
                 max(p.overhead for p in phases), max(p.wire for p in phases))
