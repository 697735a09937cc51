"""ZeRO-1/2 (Rajbhandari et al. 2020) as Megatron's distributed optimizer does it.

Gradients are reduce-scattered in buckets during backward (each rank keeps the reduced
shard it updates); after the optimizer, each rank's updated parameter shard is
all-gathered. Megatron overlaps that gather with the next step's forward
(``--overlap-param-gather``): here the gathers of the previous update are issued at the
start of the step and a layer's first forward waits for its bucket. ZeRO-2 also shards
the gradients (memory only; the traffic is the same).
"""

from .dp import AXIS, GradSync
from .params import layer_params

PARAM_BYTES = 2  # bf16


class ShardedGradSync(GradSync):
    """Bucketed reduce-scatter instead of all-reduce."""

    op = "reduce_scatter"
    name = "zero_rs"


def enabled(b) -> bool:
    """ZeRO stage 1 or 2."""
    return b.ctx.scenario.parallel.zero in (1, 2)


def gather_params(b, layers: list[int]) -> dict[int, int]:
    """All-gather the updated parameters in forward-order buckets; layer -> op to wait for."""
    bucket = b.ctx.scenario.training.grad_bucket_mb * 2**20
    layout = b.ctx.layout
    groups = ((layout.group(b.rank, "cp", "dp"), lambda r: layout.group(r, "cp", "dp")),
              (layout.expert_dp_group(b.rank), layout.expert_dp_group))
    waits, pending, members = {}, [0.0, 0.0], []
    for i, layer in enumerate(layers):
        dense, expert = layer_params(b.ctx, layer)
        pending = [pending[0] + dense * PARAM_BYTES, pending[1] + expert * PARAM_BYTES]
        members.append(layer)
        if sum(pending) >= bucket or i == len(layers) - 1:
            ops = [b.collective("zero_param_ag", AXIS, "all_gather", g, n, (), stream="dp_ag", layer=layer,
                                algo=b.ctx.scenario.parallel.dp_algo, group_of=fn)
                   for n, (g, fn) in zip(pending, groups) if n > 0 and len(g) > 1]
            waits.update({m: tuple(ops) for m in members})
            pending, members = [0.0, 0.0], []
    return waits
