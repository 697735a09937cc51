"""Expert parallelism for MoE layers (GShard, Lepikhin et al. 2020; Megatron-Core MoE).

Experts are sharded over the ep ranks of an expert group. Per MoE layer: router, an
all-to-all dispatching every token to the ranks holding its top-k experts, the local
experts' GEMMs sized by the tokens each expert actually received, and an all-to-all
combining the results. Both all-to-alls are on the critical path. When the routing
policy loads experts unevenly, the ranks holding hot experts compute longer and every
other rank of the group waits for them at the combine.
"""

from ..layers import ELEM, backward, experts, router

AXIS = "ep"


def _group(b):
    return b.ctx.layout.ep_group(b.rank)


def dispatch_bytes(b) -> float:
    """Per-rank all-to-all buffer: each of this rank's tokens goes to top_k experts."""
    d, sh = b.ctx.dims, b.ctx.shard
    return ELEM * sh.tokens * d.top_k * d.h


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
    nbytes = dispatch_bytes(b)
    sent = b.collective(f"a2a_dispatch_{direction}{tag}", AXIS, "all_to_all", _group(b), nbytes, first,
                        layer=layer, mb=mb, group_of=b.ctx.layout.ep_group)
    done = b.compute(f"experts_{direction}{tag}", expert_k, sent, layer, mb)
    return b.collective(f"a2a_combine_{direction}{tag}", AXIS, "all_to_all", _group(b), nbytes, done,
                        layer=layer, mb=mb, group_of=b.ctx.layout.ep_group)
