"""ZeRO-3 / FSDP (Rajbhandari et al. 2020; PyTorch FSDP, Zhao et al. 2023).

Every rank keeps 1/N of each layer's parameters. Before a layer's forward, and again
before its backward, the layer is all-gathered and discarded after use; after its
backward the gradients are reduce-scattered (once per step, on the last micro-batch).
Weights do not depend on the previous layer, so the next layer's all-gather is issued
while the current layer computes (prefetch): the gather of layer l waits only for the
compute of layer l-2 to finish, which bounds memory to two gathered layers. Per step
each rank sends 3x its parameter bytes (the seeds' 50% over DP's 2x).
"""

from .params import layer_params
from ..engine.kinds import Category

AXIS = Category.DP
PARAM_BYTES = 2  # bf16 weights and gradients on the wire


def enabled(b) -> bool:
    """ZeRO stage 3 with more than one data-parallel rank."""
    return b.ctx.scenario.parallel.zero == 3 and len(grad_group(b)) > 1


def grad_group(b) -> tuple[int, ...]:
    """The ranks sharing (and sharding) the same parameters."""
    return b.ctx.layout.group(b.rank, "cp", "dp")


def _group_of(b):
    return lambda r: b.ctx.layout.group(r, "cp", "dp")


def layer_bytes(b, layer: int) -> float:
    """Bytes of one layer's (tp-sharded) parameters in bf16; layer -1 is the embedding,
    layer ``layers`` the output layer."""
    dense, expert = layer_params(b.ctx, layer)
    return (dense + expert) * PARAM_BYTES


class Gatherer:
    """Issues the per-layer all-gathers of one pass with one-layer-ahead prefetch."""

    def __init__(self, b, layers: list[int], mb: int, direction: str):
        self.b, self.layers, self.mb, self.direction = b, layers, mb, direction
        self.gathers: dict[int, int] = {}
        self.computed: dict[int, int] = {}

    def before(self, layer: int) -> int | None:
        """The all-gather op the first compute of ``layer`` must wait for."""
        if not enabled(self.b):
            return None
        depth = 1 if self.b.ctx.scenario.training.fsdp_prefetch else 0
        pos = self.layers.index(layer)
        for ahead in self.layers[pos:pos + depth + 1]:
            if ahead not in self.gathers:
                self.gathers[ahead] = self._gather(ahead)
        return self.gathers[layer]

    def _gather(self, layer: int) -> int:
        pos = self.layers.index(layer)
        depth = 1 if self.b.ctx.scenario.training.fsdp_prefetch else 0
        behind = self.layers[pos - depth - 1] if pos - depth - 1 >= 0 else None
        deps = self.computed.get(behind) if behind is not None else None
        return self.b.collective(f"fsdp_ag_{self.direction}", AXIS, "all_gather", grad_group(self.b),
                                 layer_bytes(self.b, layer), deps, stream="dp", layer=layer, mb=self.mb,
                                 algo=self.b.ctx.scenario.parallel.dp_algo, group_of=_group_of(self.b))

    def after(self, layer: int, last_op: int) -> None:
        """Record that ``layer`` finished computing (frees its buffer for the next gather)."""
        self.computed[layer] = last_op


def reduce_scatter(b, layer: int, mb: int, deps) -> int | None:
    """Reduce-scatter a layer's gradients after its backward (last micro-batch only)."""
    if not enabled(b):
        return None
    return b.collective("fsdp_rs", AXIS, "reduce_scatter", grad_group(b), layer_bytes(b, layer), deps,
                        stream="dp_rs", layer=layer, mb=mb, algo=b.ctx.scenario.parallel.dp_algo,
                        group_of=_group_of(b))
