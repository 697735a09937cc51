"""Which ranks a trace or a timeline shows: the ``--trace-ranks`` / ``--ranks`` selector.

A selector is ``all`` (every simulated rank) or a list like ``0,8,16-23``; without one,
a run with few simulated ranks shows them all and a large run shows representatives
(one rank per pipeline stage, a neighbour on each parallel axis, the busiest ranks) plus
every rank a straggler or a fault names.

Folded runs simulate one rank per class of identical ranks (per pipeline stage in a clean
run; a straggler, a faulty NIC or skewed experts split the classes, see
:mod:`sim.parallel.folding`; ``result.facts.simulated_ranks``). A rank that was not
simulated is shown as the simulated rank whose timeline it shares, its *representative*
(:func:`representative`): ``--trace-ranks 8191`` on the 16k-GPU Llama 3 run shows stage
7's simulated rank.
"""

from ..errors import InputError
from ..engine.kinds import Category

MAX_DEFAULT_RANKS = 32  # beyond this many simulated ranks the default is a selection


def parse_ranks(text: str, world: int, key: str = "--trace-ranks") -> list[int]:
    """'0,8,16-23' -> [0, 8, 16, ..., 23]; every rank must exist (``InputError(key)``)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InputError(key, f"expected 'all' or ranks like 0,8,16-23, got {text!r}") from None
        if a > b:
            raise InputError(key, f"range {part!r} runs backwards")
        if a < 0 or b >= world:
            raise InputError(key, f"rank {b if b >= world else a} is outside 0..{world - 1}")
        out.extend(range(a, b + 1))
    if not out:
        raise InputError(key, f"no ranks in {text!r}")
    return sorted(set(out))


def representative(result, rank: int) -> int:
    """The simulated rank whose timeline ``rank`` shares (itself when simulated): the
    smallest simulated rank of its class (:mod:`sim.parallel.folding`)."""
    folding = result.facts.folding
    if folding is None:
        return rank
    return int(folding.representative[rank])


def stands_for(result, rank: int) -> int:
    """How many ranks a simulated rank's timeline stands for (1 when nothing is folded)."""
    folding = result.facts.folding
    return 1 if folding is None else int(round(folding.weight(rank)))


def straggler_ranks(result) -> set[int]:
    """Ranks named by ``[[stragglers]]`` (ranks, or every rank of the listed nodes)."""
    from ..hardware.faults import straggler_ranks as entry_ranks

    per_node = result.facts.topology.spec.gpus_per_node
    return set().union(*(entry_ranks(st, per_node) for st in getattr(result.scenario, "stragglers", []) or []))


def fault_ranks(result) -> set[int]:
    """Ranks whose NIC a ``[[cluster.faults]]`` entry degrades (``gpu_nic``, or every GPU
    of ``node_nics``); a spine fault names no rank."""
    from ..hardware.faults import nic_ranks

    topo = result.facts.topology
    faults = getattr(getattr(result.scenario, "cluster", None), "faults", []) or []
    return {g for f in faults for g in nic_ranks(f, topo.spec.gpus_per_node) if g < topo.num_gpus}


def flagged_ranks(result) -> set[int]:
    """Stragglers and ranks behind faulty links: always shown."""
    return straggler_ranks(result) | fault_ranks(result)


def default_ranks(result) -> list[int]:
    """All simulated ranks when they are few; else one per pipeline stage, one peer per
    parallel axis (a tp, cp, dp, ep neighbour of stage 0's representative), the two ranks
    whose compute took longest (hot experts, stragglers) and every flagged rank."""
    simulated = result.facts.simulated_ranks
    if len(simulated) <= MAX_DEFAULT_RANKS:
        return list(simulated)
    layout, sim_set = result.facts.layout, set(simulated)
    chosen = {}
    for r in simulated:  # first simulated rank of each stage
        chosen.setdefault(layout.coords(r)[Category.PP], r)
    picked = set(chosen.values())
    base = chosen[min(chosen)]
    for axis in (Category.TP, Category.CP, Category.DP):
        peers = [r for r in layout.group(base, axis) if r != base and r in sim_set]
        if peers:
            picked.add(peers[0])
    if layout.ep > 1:
        peers = [r for r in layout.ep_group(base) if r != base and r in sim_set]
        if peers:
            picked.add(peers[0])
    sp = result.spans
    comp = sp[sp.category == Category.COMPUTE]
    if len(comp):
        busy = (comp.end_s - comp.start_s).groupby(comp["rank"]).sum()
        picked.update(int(r) for r in busy.nlargest(2).index)
    picked.update(representative(result, r) for r in flagged_ranks(result))  # a folded one: its class's
    return sorted(picked)


def check_selector(text: str | None, world: int, key: str = "--trace-ranks") -> None:
    """Validate a selector before simulating: 'all', empty, or ranks that exist."""
    if text and text.strip().lower() != "all":
        parse_ranks(text, world, key)


def select_ranks(result, text: str | None, key: str = "--trace-ranks") -> list[int]:
    """Simulated ranks to show for a selector: None (default), 'all', or '0,8,16-23'
    (ranks that were folded into another show as their :func:`representative`)."""
    if text is None or text.strip() == "":
        return default_ranks(result)
    if text.strip().lower() == "all":
        return list(result.facts.simulated_ranks)
    world = result.facts.layout.world
    return sorted({representative(result, r) for r in parse_ranks(text, world, key)})
