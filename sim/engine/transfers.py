"""What the flow-level network (:mod:`sim.engine.network`) keeps per phase (:class:`Plan`, worked out
once per Phase object) and per transfer in flight (:class:`Transfer`), and which transfers a joint
re-solve must re-plan (:func:`changed_rates`: those whose rates are new or differ)."""

from dataclasses import dataclass

import numpy as np

from .links import CompiledPhase


@dataclass(eq=False, slots=True)
class Plan:
    """What the network needs to know of one Phase object, worked out once: schedules are
    cached, so the same Phase comes back for every call of a collective."""

    compiled: CompiledPhase
    nbytes: np.ndarray  # bytes per chain, as floats (never written: transfers replace, not modify)
    empty: bool  # moves no bytes: done once its latency is paid
    mask: bytes  # which chains move bytes (see the network's _mask_key)
    latency: float  # seconds before its bytes flow (see the network's start: the phase's, computed once)
    alone: tuple | None = None  # (rates, seconds until its first chain ends, whether all end then)
    #                              when on its links alone
    finished: int = 0  # transfers of it that ran to the end
    residue: np.ndarray = None  # bytes per chain that count as rounding residue (see the network's _finishing)


@dataclass(eq=False, slots=True)
class Transfer:
    """One transfer of a phase in flight: its bytes left as of ``updated``, its rates and planned wake-up."""

    plan: Plan
    phase: CompiledPhase
    remaining: np.ndarray  # bytes per chain (a new array at each update: it starts as the plan's)
    done: object  # called when every chain has finished
    links: np.ndarray  # the distinct links it uses
    rates: np.ndarray = None
    updated: float = 0.0  # when ``remaining`` was last brought up to date
    generation: int = 0  # bumps whenever its rates change, voiding its planned wake-up
    mask: bytes = b""  # which chains were live at the last solve (see the network's _mask_key)
    wake: object = None  # its planned wake-up (a new plan empties the old one's callbacks)
    solo: bool = False  # started on links no other transfer used (see the network's _on_wake)
    call: object = None  # what each of its wake-ups calls, made once (a superseded wake-up calls nothing)


def changed_rates(order: list[Transfer], rates: list[np.ndarray]) -> list[int]:
    """Positions in ``order`` of the acts whose ``rates`` are new (none before) or differ from their own."""
    old = [act.rates for act in order]
    if any(r is None for r in old):
        old = [np.full(len(r), np.nan) if o is None else o for o, r in zip(old, rates)]
    sizes = [len(r) for r in rates]
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    differ = np.logical_or.reduceat(np.concatenate(old) != np.concatenate(rates), starts)
    return np.flatnonzero(differ).tolist()
