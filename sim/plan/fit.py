"""The memory rule: a candidate fits when the simulator's peak memory per GPU stays below
HBM less a headroom.

The peak is :func:`sim.parallel.memory.peak_memory`'s (weights, gradients, Adam state,
activations of the micro-batches in flight, FSDP's gathered layers, 1 GiB runtime), for a
whole candidate table at once: the per-stage pieces come from the simulator's own
functions (:mod:`.stages`), and :func:`peak` composes them exactly as
``memory.stage_memory`` does, stage by stage, keeping the fullest stage.
tests/test_plan.py checks that it equals ``peak_memory`` on every candidate of small
cases (dense, MoE, FP8).

Headroom (:data:`HEADROOM`): PyTorch's caching allocator rounds blocks (2 MiB small, 20 MiB
large segments) and cannot always reuse freed memory whose gaps are too small (the
PyTorch docs' "CUDA memory management" notes on fragmentation and
``expandable_segments``; NVIDIA's NeMo memory-tuning guide: "OOM failures often stem
from memory fragmentation rather than raw capacity"). A layout the estimate puts within
the last 5% of HBM is rejected; ``--headroom`` changes the share.
"""

import numpy as np
import pandas as pd

from ..input.choices import Recompute
from ..model.compute import quantized
from ..model.layers import ELEM
from ..model.transformer import activation_bytes_per_layer
from ..parallel.memory import RUNTIME_BYTES, shard_bytes, w_share, weight_bytes

HEADROOM = 0.05  # share of HBM kept free for allocator fragmentation


def capacity(hbm_bytes: float, headroom: float = HEADROOM) -> float:
    """Bytes a layout may use: HBM less the headroom."""
    return hbm_bytes * (1 - headroom)


def peak(c: pd.DataFrame, stages, scenario) -> np.ndarray:
    """Peak memory per GPU (bytes) of every candidate in ``c`` (valid ones: micro-batches whole)."""
    out = np.zeros(len(c))
    act = _activations(c, stages, scenario)
    for (pp, v), idx in c.groupby(["pp", "virtual_stages"], sort=False).indices.items():
        out[idx] = _shape_peak(c.iloc[idx], pp, v, stages, scenario, act[idx])
    return out


def lookup(g: pd.DataFrame, keys: list[str], fn) -> np.ndarray:
    """``fn(*key)`` for every distinct combination of ``keys`` in ``g``, one row per row of
    ``g`` (computed once per combination)."""
    combined = np.zeros(len(g), dtype=np.int64)
    for k in keys:
        codes, uniques = pd.factorize(g[k], sort=True)
        combined = combined * len(uniques) + codes
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    columns = [g[k].to_numpy() for k in keys]
    values = np.array([fn(*(_plain(col[i]) for col in columns)) for i in first])
    return values[inverse]


def keyed(c: pd.DataFrame) -> pd.DataFrame:
    """``c`` with the column a layer's cost depends on besides its knobs: ``sharded`` (zero 3:
    the estimate's LAYER_KEY builds FSDP layers, else ones whose wgrads accumulate into main_grad)."""
    return c.assign(sharded=c["zero"].to_numpy() == 3)


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _activations(c: pd.DataFrame, stages, scenario) -> np.ndarray:
    """Per candidate: (bytes per layer and micro-batch, a layer's full activations during its
    recompute (0 unless full recompute), fp32 logits of the last stage, what a chunk waiting
    for its W holds relative to its activations: ``memory.w_share``)."""
    return lookup(c, ["tp", "cp", "micro_batch", "recompute"],
                  lambda tp, cp, mb, rec: layer_activations(stages.dims, scenario.training, tp, cp, mb, rec))


def layer_activations(d, t, tp: int, cp: int, mb: int, rec: Recompute) -> tuple[float, float, float, float]:
    """:func:`_activations` of one (tp, cp, micro_batch, recompute) of model dims ``d`` and
    training section ``t`` (the last, ``w_share``, also keys the schedule replays :mod:`.budget` counts)."""
    fp8 = quantized(t.precision)
    tokens = mb * t.seq_len // cp
    layer = activation_bytes_per_layer(d, tokens // mb, mb, tp, tp > 1, rec, t.flash_attention, fp8)
    whole = activation_bytes_per_layer(d, tokens // mb, mb, tp, tp > 1, "none", t.flash_attention, fp8) \
        if rec == Recompute.FULL else 0.0
    return layer, whole, 4 * tokens * d.v / tp, w_share(d, tokens, tp, tp > 1, layer)


def _shape_peak(g: pd.DataFrame, pp: int, v: int, stages, scenario, act: np.ndarray) -> np.ndarray:
    """``memory.stage_memory`` for every stage (columns) of every candidate (rows) of one
    pipeline shape (pp, v)."""
    params = lookup(g, ["tp", "expert_tp", "ep", "schedule"],
                    lambda tp, etp, ep, sched: np.stack(stages.params(tp, etp, ep, pp, v, sched)))
    dense, expert, biggest = params[:, 0], params[:, 1], params[:, 2]
    split = lookup(g, ["schedule"], lambda sched: np.stack([stages.split(pp, v, sched).layers_mean,
                                                            stages.split(pp, v, sched).output]))
    flight = lookup(g.assign(micro=scenario.training.global_batch // (g["dp"] * g["micro_batch"]), share=act[:, 3]),
                    ["schedule", "micro", "ep_comm_overlap", "share"],
                    lambda sched, micro, combined, share: stages.in_flight(sched, pp, v, micro, bool(combined),
                                                                           share))
    t = scenario.training
    zero = g["zero"].to_numpy()[:, None]
    nd = (g["dp"] * g["cp"]).to_numpy()[:, None]
    ne = (g["tp"] * g["cp"] * g["dp"] // (g["expert_tp"] * g["ep"])).to_numpy()[:, None]
    sharded = dense / nd + expert / ne
    full = dense + expert
    weights = np.where(zero >= 3, shard_bytes(t) * sharded, weight_bytes(t) * full)
    gradients = 2 * np.where(zero >= 2, sharded, full)
    optimizer = 12 * np.where(zero >= 1, sharded, full)
    activations = act[:, :1] * split[:, 0] * flight + act[:, 1:2] + act[:, 2:3] * split[:, 1]
    weight = weight_bytes(t)  # memory.gathered: resharded after the forward or kept (FSDP2)
    p = scenario.parallel
    if (p.reshard_after_forward if p.reshard_after_forward is not None else pp == 1):
        kept = 2 * biggest * (weight + ELEM)
    else:
        kept = full * weight + (full if pp > 1 else 2 * biggest) * ELEM
    gathered = np.where(zero >= 3, kept, 0.0)
    total = weights + gradients + optimizer + activations + gathered + RUNTIME_BYTES
    return total.max(axis=1)
