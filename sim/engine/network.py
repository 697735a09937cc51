"""Flow-level network model: concurrent transfers share links by max-min fairness.

A transfer is a :class:`~sim.collectives.schedule.Phase`: a set of *chains*, each a
list of hops (src GPU -> dst GPU) that move the same bytes at one common rate (a ring
channel is one chain: a pipeline runs at the pace of its slowest hop). Rates are the
max-min fair allocation (progressive filling, vectorized with numpy) over every active
chain, recomputed whenever a chain starts or ends. A phase pays ``steps`` times the
latency of its longest hop (times its protocol's ``latency_scale``), plus its fixed
``overhead``, before its bytes flow. A hop may end or start at a switch (in-switch
reduction): its route is the GPU's own link to that switch.

Rates depend only on which chains are active, never on bytes, so allocations are cached
by the set of active phase shapes: a step that repeats the same collectives re-solves
nothing. Transfers that share no link are solved apart, each connected component cached
by its own phases' shapes (:mod:`sim.engine.maxmin`: the same floats as one joint solve),
so an all-to-all that recurs beside different traffic is solved once. A phase's routes onto
links are :mod:`sim.engine.links`; each Phase object also keeps a plan (:class:`_Plan`): its
routes, and the rates and wake-up it gets when no other transfer shares its links, so a
collective that runs alone again costs two timeouts and no arithmetic on bytes.
"""

from dataclasses import dataclass
from functools import partial
from heapq import heappush
from math import ulp

import numpy as np
import simpy

from .clock import NORMAL, VOID, Superseded, Wake
from .links import CompiledPhase, PhaseCache, link_bytes
from .joint import Bounds, Ordered, bring_up_to_now
from .maxmin import MEMO_BYTES, ComponentRates, Memo, fill, rates_bytes
from .sharing import Sharing
from ..errors import SimulationError
from ..hardware.topology import Topology

_PICOSECOND = 1e-12  # a chain within this of its end at a wake-up ends there (rounding of times)
_TICKS = 4  # ... or within this many steps of the clock's float64 resolution at that time
_REL_BYTES = 1e-12  # ... or with this share of its bytes left (float64 rounding of bytes - rate * dt)
_MAX_STALLS = 10_000  # wake-ups in a row that move no byte and end no chain: the network is stuck
_INF = float("inf")
_count = np.count_nonzero  # (a C call: ndarray.all() and .any() go through a Python frame of numpy's)


@dataclass(eq=False, slots=True)
class _Plan:
    """What the network needs to know of one Phase object, worked out once: schedules are
    cached, so the same Phase comes back for every call of a collective."""

    compiled: CompiledPhase
    nbytes: np.ndarray  # bytes per chain, as floats (never written: transfers replace, not modify)
    empty: bool  # moves no bytes: done once its latency is paid
    mask: bytes  # which chains move bytes (see _mask_key)
    latency: float  # seconds before its bytes flow (see Network.start: the phase's, computed once)
    alone: tuple | None = None  # (rates, seconds until its first chain ends, whether all end then)
    #                              when on its links alone
    finished: int = 0  # transfers of it that ran to the end
    residue: np.ndarray = None  # bytes per chain that count as rounding residue (see Network._finishing)


@dataclass(eq=False, slots=True)
class _Active:
    plan: _Plan
    phase: CompiledPhase
    remaining: np.ndarray  # bytes per chain (a new array at each update: it starts as the plan's)
    done: object  # called when every chain has finished
    links: np.ndarray  # the distinct links it uses
    rates: np.ndarray = None
    updated: float = 0.0  # when ``remaining`` was last brought up to date
    generation: int = 0  # bumps whenever its rates change, voiding its planned wake-up
    mask: bytes = b""  # which chains were live at the last solve (see _mask_key)
    wake: object = None  # its planned wake-up (a new plan empties the old one's callbacks)
    solo: bool = False  # started on links no other transfer used (see _on_wake)
    call: object = None  # what each of its wake-ups calls, made once (a superseded wake-up calls nothing)


class Network:
    """Executes phases on a topology inside a SimPy environment.

    ``yield from net.run(phase)`` pays the phase's latency then moves its bytes, sharing
    links max-min fairly with every other phase in flight. A phase whose links no other
    phase uses is solved alone (cached), so independent collectives never pay for each
    other; only phases that share a link trigger a joint max-min solve.
    """

    def __init__(self, env: simpy.Environment, topo: Topology):
        self.env, self.topo = env, topo
        self._active: dict[_Active, None] = {}  # in start order (a dict: O(1) removal)
        self._sharing = Sharing(len(topo.caps))  # the phases in flight, and which share links
        self._compiled = PhaseCache(topo)  # by the hops' structure, and shapes moved by whole scalable units
        self._rate_cache = Memo(MEMO_BYTES, rates_bytes)  # bounded: least recently used out
        self._ordered = Ordered()  # the same rates by the acts' own order, concatenated (sim/engine/joint.py)
        self._bounds = Bounds()  # chains' offsets by the acts' chain counts
        self._zeros = np.zeros(0)  # read-only zeros, as long as the longest phase planned (see _plan)
        self.components = ComponentRates(len(topo.caps))  # joint solves, component by component
        self._plans: dict[object, _Plan] = {}  # Phase object -> its plan
        self.joint_solves = 0  # max-min solves over more than one phase (for benchmarks)
        self.log: list | None = None  # set to [] to record every rate change (see _record)
        self._stalls = 0  # consecutive wake-ups that made no progress (see _on_wake)
        self._superseded = Superseded(env._queue)  # old wake-ups of re-planned transfers, dropped in bulk
        self._used = np.zeros(len(topo.caps), dtype=bool)  # scratch of _max_min, left all False
        self._position = np.zeros(len(topo.caps), dtype=np.int32)  # scratch of _max_min (entries' links: int32)

    def compile(self, phase) -> CompiledPhase:
        """Route every hop of ``phase`` (cached by its structure, and by the object itself:
        schedules are cached, so the same Phase comes back and its arrays need no hashing)."""
        return self._plan(phase).compiled

    def _plan(self, phase) -> _Plan:
        plan = self._plans.get(phase)
        if plan is None:
            compiled = self._compiled.get(phase)
            empty = bool(phase.nbytes.sum() <= 0) or compiled.n_chains == 0
            latency = phase.steps * compiled.step_latency * phase.latency_scale + phase.overhead
            nbytes = phase.nbytes.astype(float)
            if len(nbytes) > len(self._zeros):
                self._zeros = np.zeros(len(nbytes))
            plan = self._plans[phase] = _Plan(compiled, nbytes, empty, _mask_key(phase.nbytes), latency,
                                              residue=np.maximum(1e-3, _REL_BYTES * nbytes))
        return plan

    @property
    def bytes_by_link(self) -> np.ndarray:
        """Bytes carried per directed link so far (finished phases)."""
        sent: dict[int, list] = {}  # compiled key -> [compiled, bytes per chain summed]
        for plan in self._plans.values():
            if plan.finished:
                found = sent.setdefault(plan.compiled.key, [plan.compiled, 0.0])
                found[1] = found[1] + plan.nbytes * plan.finished
        out = np.zeros(len(self.topo.caps))
        for ph, nbytes in sent.values():
            out[ph.links] += link_bytes(ph, nbytes)
        return out

    def run(self, phase):
        """SimPy generator: latency, then the bytes. Returns when every chain is done."""
        done = self.env.event()
        self.start(phase, done.succeed)
        yield done

    def start(self, phase, on_done) -> None:
        """Pay the phase's latency, move its bytes, then call ``on_done()`` (no process:
        a collective costs a few events, not a SimPy process per phase)."""
        plan = self._plans.get(phase)
        if plan is None:
            plan = self._plan(phase)
        latency = plan.latency  # (a Phase is frozen: the same float every call)
        if latency > 0:  # (wake_after inlined; partial: no Python frame of its own when called)
            env, wake = self.env, Wake([partial(self._inject, plan, on_done)])
            heappush(env._queue, (env._now + latency, NORMAL, next(env._eid), wake))
        else:
            self._inject(plan, on_done)

    def _inject(self, plan: _Plan, on_done, _event=None) -> None:
        if plan.empty:
            on_done()
            return
        compiled = plan.compiled
        act = _Active(plan, compiled, plan.nbytes, on_done, compiled.links, updated=self.env._now)
        act.call = partial(self._on_wake, act)  # (its wake-ups' callback: a superseded one calls nothing)
        shared = self._sharing.add(compiled)
        self._active[act] = None
        if shared:
            self._solve_all()
            return
        act.solo = True
        if plan.alone is not None:  # alone on its links again: the rates and wake-up it had before
            act.rates, horizon, _ = plan.alone
            act.mask = plan.mask
            act.generation = 1
            self._wake_in(act, horizon)
        else:
            self._solve([act])
            horizon = self._horizon(act)
            with np.errstate(divide="ignore"):
                last = float((act.remaining / act.rates).max()) if plan.mask == b"" else np.inf
            # all chains end at the first wake-up, with a margin the rounding of times never eats
            plan.alone = (act.rates, horizon, last - horizon <= _PICOSECOND / 2)

    def _solve(self, acts) -> None:
        """Bring ``acts`` up to now, give them their max-min rates, plan their wake-ups."""
        if len(acts) > 1:
            self._solve_many(acts)
            return
        for act in acts:
            self._advance(act)
            act.mask = _mask_key(act.remaining)
        key = tuple((a.phase.key, a.mask) for a in acts)
        rates = self._rate_cache.get(key)
        if rates is None:
            rates = self._max_min(acts)
            self._rate_cache.put(key, rates)
        for act, r in zip(acts, rates):
            act.rates = r
            act.generation += 1
            self._wake_in(act, self._horizon(act))

    def _solve_many(self, acts: list[_Active]) -> None:
        """:meth:`_solve` of several acts on all their chains at once (elementwise: the same floats as act
        by act): bytes up to now, live masks, rates of the acts sorted by (phase, mask), seconds until each
        one's first live chain ends (0: its bytes ran out as another re-solved it), wake-ups in that order
        (:mod:`sim.engine.joint`: a few whole-array operations per re-solve)."""
        left, live, starts, all_live, keys = bring_up_to_now(acts, self.env._now, self._bounds, self._zeros)
        found = self._ordered.get(tuple(keys))
        if found is None:
            found = self._rates_in_order(acts, keys)
        perm, new, rates, positive = found
        for act, r in zip(acts, new):
            act.rates = r
            act.generation += 1
        if all_live and positive:  # (bytes and rates all > 0: no division to silence; np.errstate costs more)
            ratio = left / rates
        else:
            with np.errstate(divide="ignore", invalid="ignore"):  # (a dead chain's 0 / 0 is never read)
                ratio = left / rates
        if all_live:
            horizons = np.minimum.reduceat(ratio, starts).tolist()
        else:
            out = np.minimum.reduceat(np.where(live, ratio, np.inf), starts)
            horizons = np.where(np.logical_or.reduceat(live, starts), out, 0.0).tolist()
        self._wake_all([acts[i] for i in perm], perm, horizons)

    def _rates_in_order(self, acts: list[_Active], keys: list) -> tuple:
        """(the acts' order sorted by key, their rates in the acts' own order, those concatenated, whether
        every one is > 0), from the memo of sets in flight (sorted keys) or solved component by component
        (the components from the memo of pairs that share a link); kept by the unsorted key."""
        perm = sorted(range(len(acts)), key=keys.__getitem__)
        order = [acts[i] for i in perm]
        key = tuple([keys[i] for i in perm])
        found = self._rate_cache.get(key)
        if found is None:
            found = self.components.solve([a.phase.links for a in order], key,
                                          lambda group: self._max_min([order[i] for i in group]),
                                          tuple([k for k, _ in key]),  # (a phase's key fixes its links)
                                          lambda: self._sharing.components([a.phase for a in order]))
            self._rate_cache.put(key, found)
        new = [None] * len(acts)  # the rates in the acts' own order
        for i, r in zip(perm, found):
            new[i] = r
        rates = np.concatenate(new)
        entry = (perm, new, rates, _count(rates > 0) == len(rates))
        self._ordered.put(tuple(keys), entry)
        return entry

    def _wake_all(self, order: list[_Active], perm: list[int], horizons: list[float]) -> None:
        """:meth:`_wake_in` of ``order[k]`` at ``horizons[perm[k]]``, in that order (inlined, the same
        events and order: 2M wake-ups in the GPT 530B row of ``clustersim validate`` at 315 sequences)."""
        if self.log is not None:
            for act, i in zip(order, perm):
                self._wake_in(act, horizons[i])
            return
        queue, eid, now, voided = self.env._queue, self.env._eid, self.env._now, 0
        for act, i in zip(order, perm):
            horizon = horizons[i]
            if not horizon < _INF:
                self._wake_in(act, horizon)  # (raises)
            if act.wake is not None:
                act.wake.callbacks = VOID
                voided += 1
            act.wake = wake = Wake([act.call])
            heappush(queue, (now + (0.0 if horizon < 0.0 else horizon), NORMAL, next(eid), wake))
        self._superseded.add(voided)

    def _solve_all(self) -> None:
        self.joint_solves += 1
        self._solve(list(self._active))

    def _advance(self, act: _Active) -> None:
        dt = self.env.now - act.updated
        act.updated = self.env.now
        if dt > 0 and act.rates is not None:
            act.remaining = act.remaining - act.rates * dt

    @staticmethod
    def _horizon(act: _Active) -> float:
        """Seconds until the first of its moving chains ends at its current rates."""
        if act.mask == b"":  # every chain still moving (the usual case)
            return float((act.remaining / act.rates).min())
        live = act.remaining > 0
        # a phase whose bytes ran out while another's wake-up re-solved it finishes now
        return float((act.remaining[live] / act.rates[live]).min()) if _count(live) else 0.0

    def _wake_in(self, act: _Active, horizon: float) -> None:
        if not horizon < _INF:  # nan or inf: a moving chain without bandwidth never ends
            raise SimulationError(f"a transfer ({act.phase.n_chains} chains) has no bandwidth to finish "
                                  f"(horizon {horizon} s at t = {self.env.now} s)")
        if act.wake is not None:  # a wake-up of an older generation: left in the queue, but calls nothing
            act.wake.callbacks = VOID
            self._superseded.add(1)
        env = self.env  # (wake_after inlined; max(horizon, 0.0) spelled out: -0.0 stays -0.0 as there)
        act.wake = wake = Wake([act.call])
        heappush(env._queue, (env._now + (0.0 if horizon < 0.0 else horizon), NORMAL, next(env._eid), wake))
        if self.log is not None:
            self._record(act, act.rates)

    def _max_min(self, order: list[_Active]) -> list[np.ndarray]:
        """Joint max-min rates of ``order``'s live chains. Links are numbered over the union
        of the phases' own (cached) link sets, not by sorting every entry each time: the
        same rates as :func:`max_min_rates` (a link no live entry uses never binds)."""
        if len(order) == 1:
            act = order[0]
            ph = act.phase
            chain, local, weight = ph.entry_chain, ph.link_index, ph.entry_weight
            if act.mask != b"":
                live = act.remaining[chain] > 0
                chain, local, weight = chain[live], local[live], weight[live]
            return [fill(chain, local, self.topo.caps[ph.links].astype(float), ph.n_chains, weight)]
        phases = [act.phase for act in order]
        used = self._used  # (a mask over every link: np.unique of the concatenation is far slower at scale)
        used[np.concatenate([ph.links for ph in phases])] = True
        union = np.flatnonzero(used)
        used[union] = False
        position = self._position  # (only the union's entries are read)
        position[union] = np.arange(len(union))
        n_chains = [ph.n_chains for ph in phases]
        offsets = np.zeros(len(phases), dtype=np.int64)
        np.cumsum(n_chains[:-1], out=offsets[1:])
        chain = (np.concatenate([ph.entry_chain for ph in phases])
                 + np.repeat(offsets.astype(np.int32), [len(ph.entry_chain) for ph in phases]))
        local = np.concatenate([position[ph.links][ph.link_index] for ph in phases])  # (each entry's link, renumbered)
        weight = np.concatenate([ph.entry_weight for ph in phases])
        if any(act.mask != b"" for act in order):  # (an act whose mask is b"" has every chain live)
            live = np.concatenate([act.remaining for act in order])[chain] > 0
            chain, local, weight = chain[live], local[live], weight[live]
        rates = fill(chain, local, self.topo.caps[union].astype(float), int(offsets[-1]) + n_chains[-1], weight)
        ends = [*offsets.tolist(), len(rates)]
        return [rates[ends[k]:ends[k + 1]] for k in range(len(order))]

    def _on_wake(self, act: _Active, _event=None) -> None:  # (its planned wake-up; a superseded one calls nothing)
        shared = not _solo_since_start(act, act.generation) and self._sharing.others(act.phase)
        if not self._ends_untouched(act):
            moved = self.env.now > act.updated
            self._advance(act)
            finishing = self._finishing(act)
            if _count(finishing) != len(finishing):  # (not .all(), .any(): the same answers, no Python frame)
                self._guard_progress(moved or _count(finishing & (act.remaining > 0)) > 0)
                act.remaining = np.where(finishing, 0.0, act.remaining)
                self._solve_all() if shared else self._solve([act])
                return
        self._sharing.remove(act.phase)
        del self._active[act]
        act.call = None  # (it held the act: a cycle the paused collector would keep to the end of the run)
        act.plan.finished += 1
        if self.log is not None:
            self._record(act, None)
        act.done()
        if shared:
            self._solve_all()  # the others may speed up now

    def _finishing(self, act: _Active) -> np.ndarray:
        """Chains done at this wake-up: within a picosecond (or a few ticks of the clock,
        whose resolution coarsens as time grows) of their end at their rates, or with
        only rounding residue of their bytes left (the first term alone keeps every
        scenario so far byte-identical; the others keep huge runs from re-solving forever
        at one instant)."""
        tick = max(_PICOSECOND, _TICKS * ulp(self.env._now))  # (math.ulp: np.spacing's float for times >= 0)
        return act.remaining <= act.rates * tick + act.plan.residue  # (the residue: worked out once per plan)

    def _guard_progress(self, progressed: bool) -> None:
        """Count wake-ups in a row that neither moved bytes nor ended a chain; past
        :data:`_MAX_STALLS` the simulation is stuck, which is an internal error, not a spin."""
        self._stalls = 0 if progressed else self._stalls + 1
        if self._stalls > _MAX_STALLS:
            raise SimulationError(f"the network model made no progress in {_MAX_STALLS:,} wake-ups at "
                                  f"t = {self.env.now} s ({len(self._active)} transfers in flight)")

    def _ends_untouched(self, act: _Active) -> bool:
        """Whether ``act`` ran alone at its first rates all along and every chain ends now:
        the general test in :meth:`_on_wake` would find every chain within a picosecond of
        its end (all end within half of one, and this wake-up came within a quarter of one
        of the planned time), so it needs no arithmetic on the byte counts. (A re-solved
        transfer already fails the last test; its generation says so directly.)"""
        alone = act.plan.alone
        return (act.generation == 1 and alone is not None and act.rates is alone[0] and alone[2]
                and abs(self.env.now - act.updated - alone[1]) <= _PICOSECOND / 4)

    def _record(self, act: _Active, rates) -> None:
        """Log (time, transfer id, phase, bytes/s per chain) at every rate change of a
        transfer, and rates None when it ends: the exact piecewise-constant link use."""
        self.log.append((self.env.now, id(act), act.phase, rates))


def _solo_since_start(act: _Active, generation: int) -> bool:
    """Whether ``act`` (at ``generation``) has had its links to itself since it started, so no
    other transfer in flight shares one: it started alone and was never re-solved (generation 1),
    and a transfer that came since on one of its links would have re-solved every transfer in
    flight, this one too (tests/test_sharing.py checks it on overlapping transfers)."""
    return act.solo and generation == 1


def _mask_key(remaining: np.ndarray) -> bytes:
    """Which chains of a phase are still moving (all of them, almost always): b"" for all,
    else the live mask. Always bytes, so keys of two copies of one phase compare."""
    live = remaining > 0
    return b"" if _count(live) == len(live) else live.tobytes()
