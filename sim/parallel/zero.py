"""ZeRO-1/2 (Rajbhandari et al. 2020) as Megatron's distributed optimizer does it.

Gradients are reduce-scattered in buckets during backward (each rank keeps the reduced
shard it updates); after the optimizer, each rank's updated parameter shard is
all-gathered. ZeRO-2 also shards the gradients (memory only; the traffic is the same).

``parallel.overlap_param_gather`` (Megatron ``--overlap-param-gather``; default true, as
NeMo's recipes set it): the gather is overlapped with the next step's forward -- here the
gathers of the previous update are issued at the start of the step, bucket by bucket in
forward order, and a layer's first forward waits for its bucket. False: the optimizer step
all-gathers every bucket before it returns (megatron/core/distributed/
distributed_data_parallel.py ``start_param_sync``: synchronous when overlap_param_gather is
off), so the gathers run after the optimizer and block the next forward.

HSDP (``parallel.dp_shard`` < dp): Megatron's ``num_distributed_optimizer_instances`` =
dp / dp_shard. Each bucket is reduce-scattered within the rank's shard group, then its
1/dp_shard shard is all-reduced across the instances (the replica group), and the gather
runs within the shard group (megatron/core/distributed/param_and_grad_buffer.py
``start_grad_sync``: the inter-instance all-reduce of each bucket's local shard). Expert
parameters keep their expert-data-parallel group.
"""

from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from . import dp
from .dp import AXIS, GradSync
from .params import layer_params
from ..engine.kinds import StreamName

PARAM_BYTES = 2  # bf16


class ShardedGradSync(GradSync):
    """Bucketed reduce-scatter instead of all-reduce (then, under HSDP, the shard's all-reduce
    across the replicas)."""

    op = REDUCE_SCATTER
    name = "zero_rs"

    def reduce(self, name: str, group, group_of, nbytes: float, deps, layer: int) -> int:
        op = super().reduce(name, group, group_of, nbytes, deps, layer)
        layout = self.b.ctx.layout
        replicas = layout.replica_group(self.b.rank)
        if name.endswith("_expert") or len(replicas) == 1:  # (expert shards keep their expert-dp group)
            return op
        return self.b.collective(name + "_replica_ar", AXIS, ALL_REDUCE, replicas, nbytes / len(group), op,
                                 stream=StreamName.DP, layer=layer, algo=self.b.ctx.scenario.parallel.dp_algo,
                                 group_of=layout.replica_group)


def enabled(b) -> bool:
    """ZeRO stage 1 or 2."""
    return b.ctx.scenario.parallel.zero in (1, 2)


def overlapped(b) -> bool:
    """``parallel.overlap_param_gather`` with its default (true)."""
    return b.ctx.scenario.parallel.overlap_param_gather is not False


def gather_params(b, chunks: dict, deps=()) -> dict[int, int]:
    """All-gather the updated parameters of each chunk (``{chunk: layer ids}``) in
    forward-order buckets (:func:`sim.parallel.dp.bucket_bytes`), after ``deps``; layer ->
    the ops its first forward waits for."""
    waits = {}
    for chunk, layers in chunks.items():
        waits.update(_gather_chunk(b, layers, dp.bucket_bytes(b.ctx, b.stage, chunk), deps))
    return waits


def _gather_chunk(b, layers: list[int], bucket: float, deps) -> dict[int, tuple]:
    layout = b.ctx.layout
    groups = ((layout.shard_group(b.rank), layout.shard_group),
              (layout.expert_dp_group(b.rank), layout.expert_dp_group))
    waits, pending, members = {}, [0.0, 0.0], []
    for i, layer in enumerate(layers):
        dense, expert = layer_params(b.ctx, layer)
        pending = [pending[0] + dense * PARAM_BYTES, pending[1] + expert * PARAM_BYTES]
        members.append(layer)
        if sum(pending) >= bucket or i == len(layers) - 1:
            ops = [b.collective("zero_param_ag", AXIS, ALL_GATHER, g, n, deps, stream=StreamName.DP_AG, layer=layer,
                                algo=b.ctx.scenario.parallel.dp_algo, group_of=fn)
                   for n, (g, fn) in zip(pending, groups) if n > 0 and len(g) > 1]
            waits.update({m: tuple(ops) for m in members})
            pending, members = [0.0, 0.0], []
    return waits
