"""Expert parallelism for MoE layers (GShard, Lepikhin et al. 2020; Megatron-Core MoE).

Experts are sharded over the ep ranks of an expert group. Per MoE layer: router, an
all-to-all dispatching every token to the ranks holding its top-k experts, the local
experts' GEMMs sized by the tokens each expert actually received, and an all-to-all
combining the results. Both all-to-alls are on the critical path. When the routing
policy loads experts unevenly, the ranks holding hot experts compute longer and every
other rank of the group waits for them at the combine.
"""

from ..model.layers import ELEM, backward, experts, router

AXIS = "ep"


def _group(b):
    return b.ctx.layout.ep_group(b.rank)


def dispatch_bytes(b, layer: int) -> float:
    """Per-rank all-to-all buffer: the token-expert assignments the router kept (each
    rank's tokens x top_k when nothing is dropped), a hidden vector each."""
    d, sh = b.ctx.dims, b.ctx.shard
    loads = b.ctx.expert_loads.get(layer)
    if loads is None:
        return ELEM * sh.tokens * d.top_k * d.h
    return ELEM * float(loads.sum()) / b.ctx.layout.ep * d.h


def shares(b, layer: int, combine: bool) -> tuple | None:
    """Uneven all-to-all weights when experts are loaded unevenly: the dispatch sends
    each member's tokens to rank j in proportion to the load f_j of j's experts; the
    combine sends them back (j -> i: nbytes * f_j). None when the loads are even."""
    loads = b.ctx.expert_loads.get(layer)
    if loads is None or loads.min() == loads.max():
        return None
    group, ep = _group(b), b.ctx.layout.ep
    per = len(loads) // ep
    held = [float(loads[j * per:(j + 1) * per].sum()) for j in (b.ctx.layout.dc_index(r) % ep for r in group)]
    f = tuple(x / sum(held) for x in held)
    n = len(group)
    if combine:
        return tuple(n * x for x in f), (1.0 / n,) * n
    return (1.0,) * n, f


def local_loads(b, layer: int) -> tuple[float, ...]:
    """Tokens each local expert processes in one micro-batch on this rank."""
    loads = b.ctx.expert_loads[layer]  # tokens per expert, over the whole ep group
    ep = b.ctx.layout.ep
    per = len(loads) // ep
    j = b.ctx.layout.dc_index(b.rank) % ep
    return tuple(float(x) for x in loads[j * per:(j + 1) * per])


def moe_mlp(b, layer: int, mb: int, deps, direction: str = "fwd", tag: str = "") -> int:
    """Router -> dispatch -> experts -> combine (backward: the same in reverse); ``tag``
    tells a recomputation apart from the forward pass."""
    d, sh, ep = b.ctx.dims, b.ctx.shard, b.ctx.layout.ep
    route_k = router(d, sh)
    expert_k = experts(d, sh, local_loads(b, layer))
    if direction != "fwd":
        route_k, expert_k = backward(route_k), backward(expert_k)
    first = b.compute(f"router_{direction}{tag}", route_k, deps, layer, mb)
    if ep == 1:
        return b.compute(f"experts_{direction}{tag}", expert_k, first, layer, mb)
    nbytes = dispatch_bytes(b, layer)
    # backward too, the first all-to-all carries (gradients of) tokens to the experts' ranks
    sent = b.collective(f"a2a_dispatch_{direction}{tag}", AXIS, "all_to_all", _group(b), nbytes, first,
                        layer=layer, mb=mb, group_of=b.ctx.layout.ep_group, shares=shares(b, layer, False))
    done = b.compute(f"experts_{direction}{tag}", expert_k, sent, layer, mb)
    return b.collective(f"a2a_combine_{direction}{tag}", AXIS, "all_to_all", _group(b), nbytes, done,
                        layer=layer, mb=mb, group_of=b.ctx.layout.ep_group, shares=shares(b, layer, True))
