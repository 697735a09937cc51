"""What each pipeline stage of a candidate holds, computed once per distinct shape and
shared by the memory rule (:mod:`.fit`) and the fast estimate (:mod:`.estimate`).

Everything here is the simulator's own code on a Context without programs: the layer
split (``pp.split_layers``), the parameters a rank holds (``params.rank_params``,
``params.layer_params``), the micro-batches a schedule keeps in flight
(``pp.peak_in_flight``). A planner search asks for thousands of candidates but
only for a few hundred distinct (tp, expert_tp, ep, pp, v) shapes, so each is computed
once (a ``functools.lru_cache`` per search).
"""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..input.choices import V_SCHEDULES, Schedule
from ..model import transformer as model_costs
from ..parallel import pp as pipeline
from ..parallel.layout import Layout
from ..model.layer_ids import EMBEDDING, mtp_ids
from ..parallel.params import block_ids, layer_params, stage_layer_ids
from ..parallel.program import Context


@dataclass(frozen=True)
class Split:
    """Per pipeline stage (arrays of length pp): mean transformer layers per chunk (MTP
    depths included), dense and MoE layer counts, embedding and output layer, MTP depths."""

    layers_mean: np.ndarray
    dense: np.ndarray
    moe: np.ndarray
    embedding: np.ndarray
    output: np.ndarray
    mtp: np.ndarray


class Stages:
    """Memoized per-stage facts of one base scenario (its model; the layout varies)."""

    def __init__(self, scenario, stage_layers: list[int] | None = None):
        """``stage_layers``: a scenario's own split of the layers over the virtual stages
        (``parallel.stage_layers``; a search uses the default split)."""
        self.scenario, self.stage_layers = scenario, stage_layers
        self.dims = model_costs.dims(scenario.model)
        for name in ("split", "params", "_chunk_params", "layer_params", "in_flight"):  # one cache per search
            setattr(self, name, lru_cache(maxsize=None)(getattr(self, name)))

    def context(self, tp: int, pp: int, v: int, ep: int = 1, etp: int | None = None, cp: int = 1,
                dp: int = 1) -> Context:
        """A Context with the layout and layer split (no programs, compute model or domains)."""
        layout = Layout.megatron(tp, cp, dp, pp, ep, etp)
        return Context(self.scenario, self.dims, layout, None, None, [], frozenset(), 0,
                       pipeline.split_layers(self.dims.layers, pp * v, self.stage_layers))

    def split(self, pp: int, v: int, schedule: Schedule = Schedule.ONE_F_ONE_B) -> Split:
        """Layer counts per stage under the simulator's default split (the virtual stages a
        rank holds as ``schedule`` places them: ``pp.virtual_stages_of``)."""
        ctx, d = self.context(1, pp, v), self.dims
        rows = []
        for s in range(pp):
            held = pipeline.virtual_stages_of(schedule, pp, v, s)
            mine = [block_ids(ctx, c) for c in held]
            ids = [l for c in mine for l in c]
            mtp = sum(l > d.layers for l in ids)
            moe = sum(model_costs.is_moe_layer(d, l) for l in ids if l < d.layers)
            rows.append((sum(len(c) for c in mine) / len(mine), len(ids) - moe - mtp, moe, 0 in held,
                         pp * v - 1 in held, mtp))
        cols = np.array(rows, dtype=float).T
        return Split(*cols)

    def params(self, tp: int, etp: int, ep: int, pp: int, v: int, schedule: Schedule = Schedule.ONE_F_ONE_B) \
            -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dense, expert, biggest) parameters per stage on one rank: ``rank_params`` (the sum
        of ``layer_params`` over the stage's layers, in its order) and the largest layer
        (embedding and output included) that FSDP gathers whole."""
        per_layer = self.layer_params(tp, etp, ep)
        ctx = self.context(tp, pp, v, ep, etp)
        dense, expert, biggest = [], [], []
        for s in range(pp):
            dl = el = 0.0
            big = 0.0
            for vs in pipeline.virtual_stages_of(schedule, pp, v, s):  # (DualPipe: two copies)
                for layer in stage_layer_ids(ctx, vs):
                    d_, e_ = per_layer[layer]
                    dl, el, big = dl + d_, el + e_, max(big, d_ + e_)
            dense.append(dl)
            expert.append(el)
            biggest.append(big)
        return np.array(dense), np.array(expert), np.array(biggest)

    def chunk_params(self, tp: int, etp: int, ep: int, pp: int, v: int, schedule: Schedule = Schedule.ONE_F_ONE_B) -> np.ndarray:
        """(dense, expert) parameters on one rank per stage and model chunk (2 x pp x chunks),
        the chunks in the order ``pp.virtual_stages_of`` gives them (the builder's chunk index)."""
        placed = schedule if schedule in V_SCHEDULES or schedule == Schedule.DUALPIPE else Schedule.ONE_F_ONE_B  # (else c * pp + s)
        return self._chunk_params(tp, etp, ep, pp, v, placed)

    def _chunk_params(self, tp: int, etp: int, ep: int, pp: int, v: int, schedule: Schedule) -> np.ndarray:
        per_layer, ctx = self.layer_params(tp, etp, ep), self.context(tp, pp, v, ep, etp)
        return np.array([[[sum(per_layer[l][k] for l in stage_layer_ids(ctx, vs))
                           for vs in pipeline.virtual_stages_of(schedule, pp, v, s)] for s in range(pp)]
                         for k in (0, 1)], dtype=float)

    def layer_params(self, tp: int, etp: int, ep: int) -> dict[int, tuple[float, float]]:
        """``params.layer_params`` of every layer id (embedding -1 .. output ``layers``, MTP depths)."""
        ctx = self.context(tp, 1, 1, ep, etp)
        ids = [*range(EMBEDDING, self.dims.layers + 1), *mtp_ids(self.dims)]
        return {layer: layer_params(ctx, layer) for layer in ids}

    def in_flight(self, schedule: Schedule, pp: int, v: int, micro: int, combined: bool, w_share: float = 1.0) \
            -> np.ndarray:
        """Micro-batch chunks whose activations each stage holds at once, at its peak (the
        zero-bubble schedules: ``memory.activations``' count, a chunk counting ``w_share``
        between its input-gradient pass and its W)."""
        if schedule in pipeline.ZERO_BUBBLE:
            return np.array([pipeline.held_peak(schedule, pp, micro, s, pipeline.EQUAL, w_share) for s in range(pp)],
                            dtype=float)
        return np.array([pipeline.peak_in_flight(schedule, pp, v, micro, s, combined) for s in range(pp)], dtype=float)

    def layer_ids(self, pp: int, v: int, stage: int) -> list[int]:
        """Layer ids of a stage, embedding (-1) and output (layers) included."""
        ctx = self.context(1, pp, v)
        return [l for vs in range(stage, pp * v, pp) for l in stage_layer_ids(ctx, vs)]


__all__ = ["Stages", "Split", "EMBEDDING"]
