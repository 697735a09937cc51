"""Collective algorithms: pure functions from (group, bytes, domains) to a Schedule.

``schedule(op, algo, group, nbytes, domains, shares, fabric)`` is the one entry point;
the engine runs the phases on the network model. Sizes follow nccl-tests: all_gather's
``nbytes`` is the total output, reduce_scatter's the total input, all_to_all's the
per-rank buffer. ``algo`` is an algorithm (ring, tree, nvls, nvls_tree, collnet, pat,
hierarchical, direct), optionally with a protocol (``ring:ll``, ``tree:ll128``; bare
names run Simple), or ``auto``: NCCL's tuner picks both (:mod:`.tuner`). ``fabric``
(``Topology.fabric``) says what the cluster's switches can do and how fast its links
are; without it, a DGX H100 whose NVSwitches cannot reduce is assumed.
"""

from dataclasses import replace
from functools import lru_cache

from ..errors import InputError
from ..hardware.switching import Fabric
from . import collnet, direct, hierarchical, nvls, pat, protocols, ring, tree, tuner
from .kinds import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE_SCATTER, RING_SHIFT, SEND_RECV,
                    Algorithm, CollectiveOp)
from .schedule import Phase, Schedule

OPS = tuple(CollectiveOp)
ALGOS = tuple(Algorithm)
RING, TREE, NVLS, NVLS_TREE, COLLNET, PAT, HIERARCHICAL, DIRECT, AUTO = Algorithm
DIRECT_OPS = (ALL_TO_ALL, SEND_RECV, RING_SHIFT)

ALGORITHMS = {
    (ALL_REDUCE, RING): ring.all_reduce,
    (ALL_GATHER, RING): ring.all_gather,
    (REDUCE_SCATTER, RING): ring.reduce_scatter,
    (BROADCAST, RING): ring.broadcast,
    (ALL_REDUCE, TREE): tree.all_reduce,
    (ALL_REDUCE, NVLS): nvls.all_reduce,
    (ALL_GATHER, NVLS): nvls.all_gather,
    (REDUCE_SCATTER, NVLS): nvls.reduce_scatter,
    (ALL_REDUCE, NVLS_TREE): nvls.tree_all_reduce,
    (ALL_REDUCE, COLLNET): collnet.all_reduce,
    (ALL_GATHER, COLLNET): collnet.all_gather,
    (REDUCE_SCATTER, COLLNET): collnet.reduce_scatter,
    (ALL_GATHER, PAT): pat.all_gather,
    (REDUCE_SCATTER, PAT): pat.reduce_scatter,
    (ALL_REDUCE, HIERARCHICAL): hierarchical.all_reduce,
    (ALL_GATHER, HIERARCHICAL): hierarchical.all_gather,
    (REDUCE_SCATTER, HIERARCHICAL): hierarchical.reduce_scatter,
    (ALL_TO_ALL, DIRECT): direct.all_to_all,
    (SEND_RECV, DIRECT): direct.send_recv,
    (RING_SHIFT, DIRECT): direct.ring_shift,
}
NEEDS_FABRIC = (NVLS, NVLS_TREE, COLLNET, PAT)  # take the fabric as a fourth argument
MESH_AWARE = (RING, HIERARCHICAL, TREE)  # lay rings and chains over an xGMI mesh's links (fourth argument)
# What a DGX H100 fabric looks like to the tuner when no topology is given (NVLS off).
DEFAULT_FABRIC = Fabric("hopper", 370e9, 47.5e9, 0.0, False, 8, 256)


def pick_algorithm(op: CollectiveOp, group: tuple[int, ...], nbytes: float, domains: tuple[int, ...],
                   fabric: Fabric | None = None) -> str:
    """What ``auto`` means: the (algorithm, protocol) NCCL's tuner picks (:mod:`.tuner`)."""
    if op in DIRECT_OPS:
        return DIRECT
    return tuner.pick(op, nbytes, domains, fabric or DEFAULT_FABRIC).name


def unsupported(op: CollectiveOp, algo: str, domains: tuple[int, ...], fabric: Fabric | None) -> str | None:
    """Why this fabric cannot run ``algo`` for this group (None if it can), as NCCL refuses."""
    base = algo.split(":")[0]
    if base not in NEEDS_FABRIC:
        return None
    f = fabric or DEFAULT_FABRIC
    c = tuner.comm_of(op, domains, f)
    if base in (NVLS, NVLS_TREE) and not f.nvls:
        return (f"{base!r} needs NVSwitches that reduce (NVLink SHARP: Hopper or newer, topology nvls = true); "
                "this cluster's cannot")
    if base in (NVLS, NVLS_TREE) and c.local < 2:
        return f"{base!r} reduces inside NVLink domains, but the group has one GPU per domain"
    if base == NVLS and c.nodes > 1 and not (f.sharp and c.op is ALL_REDUCE):
        return (f"'nvls' across {c.nodes} NVLink domains needs SHARP switches (topology sharp = true) and "
                "all_reduce; use nvls_tree")
    if base in (NVLS, NVLS_TREE) and op != ALL_REDUCE and c.local > 32:
        return f"NCCL runs {base!r} {op} only up to 32 GPUs per NVLink domain (NCCL_MAX_NVLS_ARITY); use ring"
    if base == NVLS_TREE and c.nodes == 1:
        return "'nvls_tree' joins several NVLink domains; the group has one (use nvls)"
    if base == COLLNET and not f.sharp:
        return "'collnet' needs IB switches that reduce (SHARP: topology sharp = true); this cluster's cannot"
    if base == COLLNET and c.nodes == 1:
        return "'collnet' reduces across nodes in the IB switches; the group is inside one NVLink domain"
    if base == PAT and c.local > 1:
        return (f"'pat' needs one GPU per node (NCCL 2.23+ refuses PAT otherwise); the group has {c.local} "
                "GPUs in one node")
    return None


def resolve(op: CollectiveOp, algo: str, nbytes: float, domains: tuple[int, ...], fabric: Fabric | None) -> str:
    """The algorithm (with protocol) a call runs: ``auto`` asks the tuner."""
    return pick_algorithm(op, (), nbytes, domains, fabric) if algo == AUTO else algo


def check(op: CollectiveOp, algo: str, domains: tuple[int, ...], fabric: Fabric | None, key: str = "--algo") -> None:
    """Raise InputError(key) if ``algo`` does not implement ``op`` or this fabric cannot run it."""
    if op not in OPS:
        raise InputError("--op", f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if algo == AUTO:
        return
    base, _, proto = algo.partition(":")
    if (op, base) not in ALGORITHMS:
        known = sorted(a for o, a in ALGORITHMS if o == op)
        raise InputError(key, f"{base!r} does not implement {op}; use one of {', '.join(known + ['auto'])}")
    if proto and (proto not in protocols.PROTOCOLS or (base not in protocols.WITH_PROTOCOLS and proto != "simple")):
        raise InputError(key, f"{algo!r}: {base} runs protocols "
                              f"{', '.join(protocols.PROTOCOLS if base in protocols.WITH_PROTOCOLS else ('simple',))}")
    reason = unsupported(op, base, domains, fabric) if len(domains) > 1 else None
    if reason:
        raise InputError(key, reason)


def check_programs(programs, topo, key: str) -> None:
    """Raise InputError(key) for the first collective of ``programs`` whose explicit
    algorithm the cluster cannot run for its group (NVLS without NVSwitches that reduce,
    PAT with several GPUs per node, CollNet without SHARP, ...)."""
    seen = set()
    for prog in programs:
        for op in prog.ops:
            call = op.comm
            if call is None or call.algo.split(":")[0] not in NEEDS_FABRIC or (call.op, call.group) in seen:
                continue
            seen.add((call.op, call.group))
            check(call.op, call.algo, tuple(int(d) for d in topo.domains[list(call.group)]), topo.fabric, key)


@lru_cache(maxsize=4096)
def schedule(op: CollectiveOp, algo: str, group: tuple[int, ...], nbytes: float,
             domains: tuple[int, ...], shares: tuple | None = None, fabric: Fabric | None = None) -> Schedule:
    """The phases of collective ``op`` over ``group`` (GPU ids) moving ``nbytes``.
    ``shares`` (all_to_all only): (send weights, receive weights) per member, member a
    sending ``nbytes * send[a] * recv[b]`` to member b -- an uneven all-to-all (MoE
    routing); None is the even exchange (send 1, receive 1/N); a :class:`.direct.Dedup`:
    DeepEP's deduplicated exchange, ``nbytes`` one rank's tokens once."""
    check(op, algo, domains, fabric)
    op = CollectiveOp(op)  # (text from a test or a study becomes the member it names; cached below)
    if len(group) < 2 or nbytes <= 0:
        return Schedule(op, algo, ())
    algo = resolve(op, algo, nbytes, domains, fabric)
    base, _, proto = algo.partition(":")
    fn = ALGORITHMS[(op, base)]
    if isinstance(shares, direct.Dedup):
        if fn is not direct.all_to_all:
            raise ValueError(f"DeepEP's deduplicated exchange is an all_to_all, not {op}/{algo}")
        return Schedule(op, algo, tuple(direct.dedup_all_to_all(group, domains, nbytes, shares)))
    if shares is not None:
        if fn is not direct.all_to_all:
            raise ValueError(f"uneven shares apply to the direct all_to_all, not {op}/{algo}")
        return Schedule(op, algo, tuple(fn(group, domains, nbytes, shares)))
    if base in NEEDS_FABRIC:
        phases = tuple(fn(group, domains, nbytes, fabric or DEFAULT_FABRIC))
    elif base in MESH_AWARE and fabric is not None and fabric.mesh:  # rings, chains over xGMI links
        phases = tuple(fn(group, domains, nbytes, True))
    else:
        phases = tuple(fn(group, domains, nbytes))
    if proto and proto != "simple":
        c = tuner.comm_of(op, domains, fabric or DEFAULT_FABRIC)
        scale = tuner.latency(c, base, proto) / tuner.latency(c, base, "simple")
        phases = protocols.apply(phases, protocols.bandwidth_fraction(base, proto, c.nodes == 1), scale)
    if base == TREE and fabric is not None:  # NCCL's per-channel tree cap, where it binds (tuner.tree_cap)
        cap = tuner.tree_cap(tuner.comm_of(op, domains, fabric))
        if cap < 1.0:
            phases = tuple(replace(p, wire=p.wire / cap) for p in phases)
    if base == NVLS_TREE and fabric is not None:
        phases = _nvls_tree_capped(phases, group, domains, nbytes, fabric)
    return Schedule(op, algo, phases)


def _nvls_tree_capped(phases, group, domains, nbytes, fabric):
    """NCCL's per-head NVLS_TREE bound (:func:`tuner.nvls_tree_cap`), where it binds: the
    schedule's bus bandwidth on its busiest endpoint link, B / T x 2(N-1)/N, is held to the
    cap by stretching its bytes on the wire (as for trees), so T = B 2(N-1)/N / cap. The bound is
    the healthy non-blocking fabric's: where faults or oversubscription slow the links further,
    the stretch multiplies with them, as the tree cap's does."""
    cap = tuner.nvls_tree_cap(tuner.comm_of(ALL_REDUCE, domains, fabric))
    (phase,) = phases
    n = len(group)
    bus = nbytes / nvls.endpoint_time(phase, group, domains, fabric) * 2 * (n - 1) / n
    return phases if bus <= cap else (replace(phase, wire=phase.wire * bus / cap),)


__all__ = ["schedule", "Schedule", "Phase", "CollectiveOp", "OPS", "ALGOS", "pick_algorithm", "check", "check_programs",
           "unsupported", "resolve"]
