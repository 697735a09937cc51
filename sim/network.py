"""Flow-level network model: concurrent transfers share links by max-min fairness.

A transfer is a :class:`~sim.collectives.schedule.Phase`: a set of *chains*, each a
list of hops (src GPU -> dst GPU) that move the same bytes at one common rate (a ring
channel is one chain: a pipeline runs at the pace of its slowest hop). Rates are the
max-min fair allocation (progressive filling, vectorized with numpy) over every active
chain, recomputed whenever a chain starts or ends. A phase pays ``steps`` times the
latency of its longest hop before its bytes flow.

Rates depend only on which chains are active, never on bytes, so allocations are cached
by the set of active phase shapes: a step that repeats the same collectives re-solves
nothing.
"""

from dataclasses import dataclass, field

import numpy as np
import simpy

from .topology import Topology

_EPS = 1e-9


def max_min_rates(entry_chain: np.ndarray, entry_link: np.ndarray, n_chains: int,
                  caps: np.ndarray, entry_weight: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of each chain (bytes/s) by progressive filling.

    ``entry_chain[i]`` puts ``entry_weight[i]`` (default 1) times its rate on link
    ``entry_link[i]``: a chain with k hops on one link consumes k times its rate there,
    a flow sprayed over p paths 1/p on each.

    >>> max_min_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), 2, np.array([10., 3.]))
    array([7., 3.])
    """
    weight = np.ones(len(entry_chain)) if entry_weight is None else entry_weight
    links, local = np.unique(entry_link, return_inverse=True)
    remaining = caps[links].astype(float)
    rates = np.zeros(n_chains)
    frozen = np.zeros(n_chains, dtype=bool)
    live = np.ones(len(entry_chain), dtype=bool)
    while live.any():
        load = np.bincount(local[live], weights=weight[live], minlength=len(links))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, np.maximum(remaining, 0) / load, np.inf)
        level = share.min()
        tight = share <= level * (1 + _EPS)
        hit = np.unique(entry_chain[live & tight[local]])
        rates[hit] = level
        frozen[hit] = True
        newly = live & frozen[entry_chain]
        remaining -= np.bincount(local[newly], weights=weight[newly], minlength=len(links)) * level
        live &= ~newly
    return rates


@dataclass
class CompiledPhase:
    """A phase mapped onto the topology's links (bytes-independent, so cacheable)."""

    entry_chain: np.ndarray
    entry_link: np.ndarray
    entry_weight: np.ndarray  # share of the chain's rate on that link (spraying splits it)
    n_chains: int
    step_latency: float  # seconds: the longest hop's path latency
    key: int  # identifies the link structure, for the rate cache


@dataclass
class _Active:
    phase: CompiledPhase
    remaining: np.ndarray  # bytes per chain
    done: simpy.Event
    nbytes: np.ndarray  # bytes per chain at the start
    rates: np.ndarray = field(default=None)


class Network:
    """Executes phases on a topology inside a SimPy environment.

    ``yield from net.run(phase)`` pays the phase's latency then moves its bytes, sharing
    links max-min fairly with every other phase in flight.
    """

    def __init__(self, env: simpy.Environment, topo: Topology):
        self.env, self.topo = env, topo
        self._active: list[_Active] = []
        self._last = 0.0
        self._generation = 0
        self._compiled: dict[tuple, CompiledPhase] = {}
        self._rate_cache: dict[tuple, list[np.ndarray]] = {}
        self.bytes_by_link = np.zeros(len(topo.caps))  # bytes carried per link in the run

    def compile(self, phase) -> CompiledPhase:
        """Route every hop of ``phase`` (cached by its structure)."""
        key = phase.structure_key()
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(phase, len(self._compiled))
        return compiled

    def _compile(self, phase, serial: int) -> CompiledPhase:
        routes = [self.topo.route(int(s), int(d)) for s, d in zip(phase.src, phase.dst)]
        lengths = np.array([len(r.links) for r in routes], dtype=np.int64)
        if routes:
            entry_link = np.concatenate([r.links for r in routes])
            entry_weight = np.concatenate([r.weights for r in routes])
        else:
            entry_link, entry_weight = np.zeros(0, dtype=np.int64), np.zeros(0)
        return CompiledPhase(np.repeat(phase.chain, lengths), entry_link, entry_weight,
                             phase.n_chains, max((r.latency for r in routes), default=0.0), serial)

    def run(self, phase):
        """SimPy generator: latency, then the bytes. Returns when every chain is done."""
        compiled = self.compile(phase)
        latency = phase.steps * compiled.step_latency
        if latency > 0:
            yield self.env.timeout(latency)
        if phase.nbytes.sum() <= 0 or compiled.n_chains == 0:
            return
        done = self.env.event()
        self._advance()
        nbytes = phase.nbytes.astype(float)
        self._active.append(_Active(compiled, nbytes.copy(), done, nbytes))
        self._reschedule()
        yield done

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0:
            return
        for act in self._active:
            act.remaining -= act.rates * dt

    def _reschedule(self) -> None:
        self._solve_rates()
        self._generation += 1
        horizon = min((_time_to_first_finish(a) for a in self._active), default=None)
        if horizon is not None:
            wake = self.env.timeout(max(horizon, 0.0))
            generation = self._generation
            wake.callbacks.append(lambda _ev: self._on_wake(generation))

    def _solve_rates(self) -> None:
        if not self._active:
            return
        key = tuple(sorted((a.phase.key, _mask_key(a.remaining)) for a in self._active))
        cached = self._rate_cache.get(key)
        if cached is None:
            cached = self._rate_cache[key] = self._max_min()
        by_phase = sorted(range(len(self._active)),
                          key=lambda i: (self._active[i].phase.key, _mask_key(self._active[i].remaining)))
        for i, rates in zip(by_phase, cached):
            self._active[i].rates = rates

    def _max_min(self) -> list[np.ndarray]:
        order = sorted(self._active, key=lambda a: (a.phase.key, _mask_key(a.remaining)))
        chains, links, weights, offset = [], [], [], 0
        for act in order:
            live = act.remaining[act.phase.entry_chain] > 0
            chains.append(act.phase.entry_chain[live] + offset)
            links.append(act.phase.entry_link[live])
            weights.append(act.phase.entry_weight[live])
            offset += act.phase.n_chains
        rates = max_min_rates(np.concatenate(chains), np.concatenate(links), offset,
                              self.topo.caps, np.concatenate(weights))
        out, offset = [], 0
        for act in order:
            out.append(rates[offset:offset + act.phase.n_chains])
            offset += act.phase.n_chains
        return out

    def _on_wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # the rates changed since this wake-up was planned
        self._advance()
        still = []
        for act in self._active:
            finishing = act.remaining <= act.rates * 1e-12 + 1e-3  # done within a picosecond
            act.remaining[finishing] = 0.0
            if (act.remaining > 0).any():
                still.append(act)
            else:
                self._account(act)
                act.done.succeed()
        self._active = still
        self._reschedule()


    def _account(self, act: _Active) -> None:
        ph = act.phase
        self.bytes_by_link += np.bincount(ph.entry_link, weights=act.nbytes[ph.entry_chain] * ph.entry_weight,
                                          minlength=len(self.bytes_by_link))


def _time_to_first_finish(act: _Active) -> float:
    live = act.remaining > 0
    return float((act.remaining[live] / act.rates[live]).min())


def _mask_key(remaining: np.ndarray) -> bytes | int:
    """Which chains of a phase are still moving (all of them, almost always)."""
    live = remaining > 0
    return len(live) if live.all() else live.tobytes()
