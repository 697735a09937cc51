"""Context parallelism: ring attention over the cp ranks (Liu et al. 2023; Megatron CP).

The sequence is split across cp ranks (load-balanced for causal masks); each rank
computes attention of its queries against one K/V block at a time while the next block
arrives from its ring neighbour, so cp-1 K/V shifts overlap cp-1 of the cp attention
chunks. Backward circulates K/V and their gradients (twice the bytes). ``parallel.cp_impl =
"torch"``: PyTorch's experimental implementation instead (sim/parallel/cp_torch.py);
``"all_gather"``: K/V all-gathered, then local attention, as Llama 3 trained (sim/parallel/cp_all_gather.py).
The ring's own packing, copies and merges (Transformer Engine's AttnFuncWithCPAndKVP2P) run beside each
step's attention kernel in the same op: :mod:`sim.model.cp_merge`.
"""

from ..input.choices import CpImpl
from ..collectives.kinds import RING_SHIFT
from ..model import cp_merge
from ..model.layers import ELEM, Direction, attention_core, backward
from ..engine.kinds import Category
from . import cp_all_gather, cp_torch

AXIS = Category.CP


def kv_bytes(b) -> float:
    """K and V of this rank's sequence chunk (its tp share of the kv heads; MLA: the
    up-projected per-head keys and values)."""
    d, sh = b.ctx.dims, b.ctx.shard
    return ELEM * sh.tokens * d.kv_width / sh.tp


def attention(b, layer: int, mb: int, deps, direction: Direction = Direction.FWD, tag: str = "") -> int:
    """Attention core, ring-overlapped with K/V shifts when cp > 1. ``tag`` tells a
    recomputation apart from the forward pass."""
    cp = b.ctx.layout.sizes[Category.CP]
    core = attention_core(b.ctx.dims, b.ctx.shard, 1.0 / cp)
    kernels = [core] if direction is Direction.FWD else backward([core])
    if cp == 1:
        return b.compute(f"attn_core_{direction}{tag}", kernels, deps, layer, mb)
    if b.ctx.scenario.parallel.cp_impl is CpImpl.ALL_GATHER:  # Llama 3's (Transformer Engine's all_gather)
        return cp_all_gather.attention(b, layer, mb, deps, direction, f"{direction}{tag}")
    if b.ctx.scenario.parallel.cp_impl is CpImpl.TORCH:  # PyTorch's experimental CP (torchtitan)
        run = cp_torch.forward if direction is Direction.FWD else cp_torch.backward
        return run(b, kernels, layer, mb, deps, f"{direction}{tag}")
    scale = 1 if direction is Direction.FWD else 2
    shift, last = None, deps
    for step in range(cp):
        if step < cp - 1:
            nxt = b.collective(f"kv_shift_{direction}{tag}", AXIS, RING_SHIFT, b.group(AXIS), kv_bytes(b) * scale,
                               deps if shift is None else shift, layer=layer, mb=mb, tag=(step,),
                               group_of=lambda r: b.ctx.layout.group(r, Category.CP))
        step_deps = (last,) if shift is None else (last, shift)
        last = b.compute(f"attn_core_{direction}{tag}", _step_kernels(b, kernels, direction, step, cp), step_deps,
                         layer, mb)
        shift = nxt if step < cp - 1 else shift
    return last


def _step_kernels(b, kernels, direction: Direction, step: int, cp: int) -> list:
    """Ring step ``step``'s attention kernels with Transformer Engine's copies and merges around them
    (:func:`sim.model.cp_merge.forward_step`, :func:`~sim.model.cp_merge.backward_step`)."""
    d, sh = b.ctx.dims, b.ctx.shard
    if direction is Direction.FWD:
        return [*kernels, *cp_merge.forward_step(d, sh, step, cp)]
    before, after = cp_merge.backward_step(d, sh, step, cp)
    return [*before, *kernels, *after]
