"""Data parallelism (PyTorch DDP, Li et al. 2020): gradient all-reduce in buckets.

Gradients of the last micro-batch are packed into buckets of ``grad_bucket_mb`` in the
order backward produces them; each bucket's all-reduce is issued as soon as its last
layer's backward finishes, so it overlaps the backward of earlier layers. Expert
gradients reduce over the ranks holding the same experts. Per step each rank sends 2x
its parameter bytes x (N-1)/N.
"""

from .params import layer_params, stage_layer_ids

AXIS = "dp"
GRAD_BYTES = 2  # bf16 gradients on the wire (Megatron-Core default: grad_reduce_in_fp32 off)


class GradSync:
    """Buckets one virtual stage's gradients and issues their reduction."""

    op = "all_reduce"
    name = "dp_ar"

    def __init__(self, b):
        self.b = b
        self.bucket_bytes = b.ctx.scenario.training.grad_bucket_mb * 2**20
        self.pending = [0.0, 0.0]  # dense, expert bytes
        self.issued: list[int] = []
        self.groups = (b.ctx.layout.group(b.rank, "cp", "dp"), b.ctx.layout.expert_dp_group(b.rank))

    @property
    def active(self) -> bool:
        """Whether any gradient needs reducing across ranks."""
        return any(len(g) > 1 for g in self.groups)

    def add(self, layer: int, op_index: int) -> None:
        """Layer ``layer``'s gradients are ready after ``op_index``."""
        dense, expert = layer_params(self.b.ctx, layer)
        self.pending[0] += dense * GRAD_BYTES
        self.pending[1] += expert * GRAD_BYTES
        if sum(self.pending) >= self.bucket_bytes:
            self.flush(op_index, layer)

    def flush(self, op_index: int, layer: int = -1) -> None:
        """Issue the pending bucket's reduction."""
        layout = self.b.ctx.layout
        group_fns = (lambda r: layout.group(r, "cp", "dp"), layout.expert_dp_group)
        for nbytes, group, group_of, kind in zip(self.pending, self.groups, group_fns, ("", "_expert")):
            if nbytes > 0 and len(group) > 1:
                self.issued.append(self.b.collective(
                    self.name + kind, AXIS, self.op, group, nbytes, op_index, stream="dp", layer=layer,
                    algo=self.b.ctx.scenario.parallel.dp_algo, group_of=group_of))
        self.pending = [0.0, 0.0]


def copy_grad_sync(b, vs: int, deps) -> int:
    """DualPipe: ranks s and p-1-s both hold stage ``vs`` (one copy per direction); each
    adds the other's gradients of it before the optimizer (deepseek-ai/DualPipe
    examples/example_dualpipe.py: ``p0.grad += p1all[pp_size - 1 - rank]``), an
    all-reduce over the pair, on the gradient-reduction stream."""
    layout, p = b.ctx.layout, b.ctx.layout.sizes["pp"]
    pair = lambda r: tuple(sorted((r, layout.stage_rank(r, p - 1 - layout.coords(r)["pp"]))))
    nbytes = GRAD_BYTES * sum(sum(layer_params(b.ctx, l)) for l in stage_layer_ids(b.ctx, vs))
    return b.collective("copy_grad_ar", "pp", "all_reduce", pair(b.rank), nbytes, deps, stream="dp", tag=(vs,),
                        group_of=pair)
