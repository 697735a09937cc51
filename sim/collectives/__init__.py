"""Collective algorithms: pure functions from (group, bytes, domains) to a Schedule.

``schedule(op, algo, group, nbytes, domains)`` is the one entry point; the engine runs
the phases on the network model. Sizes follow nccl-tests: all_gather's ``nbytes`` is the
total output, reduce_scatter's the total input, all_to_all's the per-rank buffer.
"""

from functools import lru_cache

from ..errors import InputError
from . import direct, hierarchical, ring, tree
from .schedule import Phase, Schedule

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv", "ring_shift")
ALGOS = ("ring", "tree", "hierarchical", "direct", "auto")

ALGORITHMS = {
    ("all_reduce", "ring"): ring.all_reduce,
    ("all_gather", "ring"): ring.all_gather,
    ("reduce_scatter", "ring"): ring.reduce_scatter,
    ("broadcast", "ring"): ring.broadcast,
    ("all_reduce", "tree"): tree.all_reduce,
    ("all_reduce", "hierarchical"): hierarchical.all_reduce,
    ("all_gather", "hierarchical"): hierarchical.all_gather,
    ("reduce_scatter", "hierarchical"): hierarchical.reduce_scatter,
    ("all_to_all", "direct"): direct.all_to_all,
    ("send_recv", "direct"): direct.send_recv,
    ("ring_shift", "direct"): direct.ring_shift,
}

# NCCL picks tree for small all-reduces across nodes and ring for large ones; the switch
# point grows with node count (NCCL's tuning model); 4 MiB is typical for 2-16 nodes.
TREE_THRESHOLD = 4 * 2**20  # bytes


def pick_algorithm(op: str, group: tuple[int, ...], nbytes: float, domains: tuple[int, ...]) -> str:
    """What ``auto`` means: roughly what NCCL would pick."""
    if op in ("all_to_all", "send_recv", "ring_shift"):
        return "direct"
    if op == "all_reduce" and len(set(domains)) > 1 and nbytes <= TREE_THRESHOLD:
        return "tree"
    return "ring"


@lru_cache(maxsize=4096)
def schedule(op: str, algo: str, group: tuple[int, ...], nbytes: float,
             domains: tuple[int, ...], shares: tuple | None = None) -> Schedule:
    """The phases of collective ``op`` over ``group`` (GPU ids) moving ``nbytes``.
    ``shares`` (all_to_all only): (send weights, receive weights) per member, member a
    sending ``nbytes * send[a] * recv[b]`` to member b -- an uneven all-to-all (MoE
    routing); None is the even exchange (send 1, receive 1/N)."""
    if op not in OPS:
        raise InputError("--op", f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if algo == "auto":
        algo = pick_algorithm(op, group, nbytes, domains)
    fn = ALGORITHMS.get((op, algo))
    if fn is None:
        known = sorted(a for o, a in ALGORITHMS if o == op)
        raise InputError("--algo", f"{algo!r} does not implement {op}; use one of {', '.join(known + ['auto'])}")
    if len(group) < 2 or nbytes <= 0:
        return Schedule(op, algo, ())
    if shares is not None:
        if fn is not direct.all_to_all:
            raise ValueError(f"uneven shares apply to the direct all_to_all, not {op}/{algo}")
        return Schedule(op, algo, tuple(fn(group, domains, nbytes, shares)))
    return Schedule(op, algo, tuple(fn(group, domains, nbytes)))


__all__ = ["schedule", "Schedule", "Phase", "OPS", "ALGOS", "pick_algorithm"]
