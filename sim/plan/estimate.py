"""The fast estimate: an analytic step time for every valid candidate, vectorized over the
candidate table, so that hundreds of thousands can be ranked before the best are simulated.

    step = m * T_crit + (sum_s T_s - T_crit) / v + PP sends + DP/ZeRO tail + optimizer

T_s is one micro-batch's time on pipeline stage s: its layers' compute (kernels timed by
the simulator's ComputeModel, :mod:`.layers`), recompute, and the TP, CP, EP and FSDP
communication that sits on the critical path. With v = 1 the pipeline term is
(m + p - 1) T for balanced stages, the GPipe / 1F1B bubble (p - 1) / m of Narayanan et
al. 2021; interleaving divides the fill and drain by v ((p - 1) / (v m)); the zero-bubble
and DualPipe schedules shrink it further (:func:`fill_factor`). PP sends cross
the fill and drain once per virtual stage boundary each way. The DP tail is the gradient
reduction (DDP all-reduce, ZeRO reduce-scatter, in grad_bucket_mb buckets) beyond the last
micro-batch's backward it overlaps, plus ZeRO-1/2's parameter all-gather beyond the first
forward; FSDP gathers each layer once per micro-batch and pass, hidden behind the layer's
compute when shorter. EP overlap (combined 1F1B) hides the all-to-alls under the paired
micro-batch's compute except in warm-up and cool-down. The optimizer is Adam's
memory-bound update of the rank's shard (:func:`sim.model.layers.optimizer`).

The estimate is measured, not trusted: ``clustersim plan`` reports its Spearman rank
correlation with the full simulation over the layouts it simulated.
"""

import numpy as np
import pandas as pd

from ..hardware.gpus import gpu_preset
from ..model.compute import ComputeModel
from ..model.layers import ELEM, Shard, optimizer
from ..parallel.layout import Layout
from ..parallel.params import EMBEDDING, layer_params
from ..parallel.workload import expert_loads
from .comm import Comm
from .cost import sim_cost
from .fit import lookup
from .layers import KINDS, LayerCosts

COMPONENTS = ("compute", "recompute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer")
FIELDS = ("forward", "backward", "recompute", "tp", "cp", "ep")  # per layer kind (:class:`.layers.Cost`)
GRAD_BYTES = PARAM_BYTES = 2  # bf16 on the wire (sim/parallel/dp.py, zero.py, fsdp.py)
LAYER_KEY = ["tp", "cp", "micro_batch", "recompute", "tp_comm_overlap", "ep", "expert_tp"]


def fill_factor(schedules: np.ndarray, pp: int) -> np.ndarray:
    """The fill-and-drain term's share left by each schedule, with equal F, B, W passes: 1
    for GPipe and (interleaved) 1F1B; 1/3 for ZB-H1 ((p-1)(F+B-W) of Qi et al. 2024 against
    1F1B's (p-1)(F+B+W)); DualPipe (p-2)/(3(p-1)) and DualPipeV 2/3 of the interleaved
    term it is divided by v = 2 in ((PP/2-1)(F&B+B-3W), DeepSeek-V3 report Table 2)."""
    factor = {"zb-h1": 1 / 3, "dualpipe": (pp - 2) / (3 * (pp - 1)) if pp > 1 else 1.0, "dualpipev": 2 / 3}
    return np.array([factor.get(str(x), 1.0) for x in schedules])


class Estimator:
    """Estimates candidates of one base scenario (model, training, cluster)."""

    def __init__(self, scenario, stages, spec, gpu_name: str):
        self.s, self.stages, self.d = scenario, stages, stages.dims
        self.compute = ComputeModel(gpu_preset(gpu_name), attention=scenario.training.attention_backend)
        self.comm = Comm(spec, gpu_name)
        self.domain = spec.gpus_per_domain
        self.bucket = scenario.training.grad_bucket_mb * 2**20
        self._routed: dict = {}
        self.micro_of = lambda c: scenario.training.global_batch // (c["dp"] * c["micro_batch"])

    def frame(self, c: pd.DataFrame) -> pd.DataFrame:
        """``estimate_s``, ``est_<component>_s`` and ``sim_cost_s`` of every candidate."""
        out = pd.DataFrame(index=c.index, columns=["estimate_s"] + [f"est_{k}_s" for k in COMPONENTS],
                           dtype=float)
        c = c.assign(micro=self.micro_of(c).to_numpy())
        layer = lookup(c, LAYER_KEY, self._layer_costs)  # n x KINDS x FIELDS
        for (pp, v), idx in c.groupby(["pp", "virtual_stages"], sort=False).indices.items():
            out.iloc[idx] = self._shape(c.iloc[idx], pp, v, layer[idx])
        out["sim_cost_s"] = sim_cost(c, self.d, self.s, self.domain)
        return out

    # ------------------------------------------------------------------ per layer kind
    def _layer_costs(self, tp, cp, mb, rec, tpov, ep, etp) -> np.ndarray:
        groups = self.comm.groups(tp, cp, max(ep, 1), 1, ep, etp)
        lc = LayerCosts(self.s, self.d, self.compute, self.comm, (tp, cp, mb, rec, bool(tpov), ep, etp), groups)
        if self.d.experts:
            lc.loads, lc.dispatched = self._loads(tp, cp, mb, ep, etp)
        costs = lc.costs()
        costs.setdefault("moe", costs["dense"])  # a dense model: no MoE layers to count
        return np.array([[getattr(costs[k], f) for f in FIELDS] for k in KINDS])

    def _loads(self, tp: int, cp: int, mb: int, ep: int, etp: int) -> tuple[tuple[float, ...], float]:
        """Tokens per local expert on the busiest ep rank, and the tokens x top_k each rank
        dispatches, from the scenario's routing (sim/parallel/workload.py)."""
        t = self.s.training
        shard = Shard(mb * t.seq_len // cp, t.seq_len, mb, tp, tp > 1, t.flash_attention)
        layout = Layout({"tp": tp, "cp": cp, "dp": ep, "pp": 1}, ("tp", "cp", "dp", "pp"), ep,
                        None if etp == tp else etp)
        key = (layout.moe_tokens(shard.tokens), ep)  # all expert_loads depends on
        found = self._routed.get(key)
        if found is None:
            loads = next(iter(expert_loads(self.s, self.d, shard, layout).values()))
            per = len(loads) // ep
            slices = [loads[j * per:(j + 1) * per] for j in range(ep)]
            busiest = max(slices, key=lambda x: float(x.sum()))
            found = self._routed[key] = (tuple(float(x) for x in busiest), float(loads.sum()) / ep)
        return found

    # ------------------------------------------------------------------ one pipeline shape
    def _shape(self, g: pd.DataFrame, pp: int, v: int, layer: np.ndarray) -> np.ndarray:
        """Every component of every candidate of one (pp, v), as columns of ``frame``."""
        split = self.stages.split(pp, v)
        counts = np.column_stack([split.dense, split.moe, split.embedding, split.output])  # stages x KINDS
        micro = g["micro"].to_numpy().astype(float)
        ep = self._ep_exposed(g, layer, micro, pp, v)
        fsdp, scatters = self._fsdp(g, layer)
        per_kind = np.stack([layer[:, :, 0] + layer[:, :, 1], layer[:, :, 2], layer[:, :, 3], layer[:, :, 4], ep,
                             fsdp], axis=2)  # n x KINDS x (compute, recompute, tp, cp, ep, fsdp)
        stage = np.einsum("sk,nkf->nsf", counts, per_kind)  # n x stages x parts
        total = stage.sum(axis=2)
        crit = total.argmax(axis=1)
        rows = np.arange(len(g))
        t_crit = total[rows, crit]
        pipe = micro * t_crit + (total.sum(axis=1) - t_crit) / v * fill_factor(g["schedule"].to_numpy(), pp)
        parts = micro[:, None] * stage[rows, crit]
        fwd = counts @ layer[:, :, 0].T  # stages x n
        bwd = counts @ (layer[:, :, 1] + layer[:, :, 2]).T
        pp_s = self._pp(g, pp, v)
        fsdp_tail = (counts @ scatters.T).T + scatters.max(axis=1)[:, None]  # n x stages
        dp_s = self._dp_tail(g, pp, v, fwd.T, bwd.T, fsdp_tail)
        opt = self._optimizer(g, pp, v)
        step = pipe + pp_s + dp_s + opt
        return np.column_stack([step, parts[:, 0], parts[:, 1], pipe - micro * t_crit, parts[:, 2], parts[:, 3],
                                parts[:, 4], pp_s, parts[:, 5] + dp_s, opt])

    def _ep_exposed(self, g, layer: np.ndarray, micro: np.ndarray, pp: int, v: int) -> np.ndarray:
        """All-to-all time left exposed per micro-batch (n x KINDS): all of it, or with EP
        overlap only the warm-up / cool-down passes' and what outlasts the paired compute."""
        a2a, comp = layer[:, :, 5], layer[:, :, 0] + layer[:, :, 1]
        alone = 1.0 / micro if pp == 1 else np.minimum(1.0, ((pp - 1) * 2 + (v - 1) * pp + 1) / (micro * v))
        hidden = alone[:, None] * a2a + (1 - alone[:, None]) * np.maximum(0.0, a2a - comp)
        return np.where(g["ep_comm_overlap"].to_numpy(dtype=bool)[:, None], hidden, a2a)

    def _fsdp(self, g, layer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per kind (n x KINDS), zero 3 only: FSDP all-gather time, forward and backward,
        beyond the compute it hides under (per micro-batch); and each layer's gradient
        reduce-scatter beyond its backward (last micro-batch)."""
        zero3 = g["zero"].to_numpy() == 3
        gathers, scatters = np.zeros(layer.shape[:2]), np.zeros(layer.shape[:2])
        if not zero3.any():
            return gathers, scatters
        times = lookup(g[zero3], ["tp", "cp", "dp", "ep", "expert_tp"], self._layer_collectives)
        lay = layer[zero3]
        ag, rs, bwd = times[:, 0], times[:, 1], lay[:, :, 1] + lay[:, :, 2]
        gathers[zero3] = np.maximum(0.0, ag - lay[:, :, 0]) + np.maximum(0.0, ag - bwd)
        scatters[zero3] = np.maximum(0.0, rs - bwd)
        return gathers, scatters

    def _layer_collectives(self, tp, cp, dp, ep, etp) -> np.ndarray:
        """Seconds of one layer's all-gather and reduce-scatter, for each kind (2 x KINDS),
        over the data-parallel group (sim/parallel/fsdp.py: per layer, unbucketed)."""
        ctx = self.stages.context(tp, 1, 1, ep, etp)
        d = self.d
        ids = (0 if not d.experts or d.dense_layers else None, d.dense_layers if d.experts else None, EMBEDDING,
               d.layers)
        group = self.comm.groups(tp, cp, dp, 1, ep, etp)["dp"]
        nbytes = [sum(layer_params(ctx, i)) * PARAM_BYTES if i is not None else 0.0 for i in ids]
        return np.array([[self.comm.reduce(op, b, group) for b in nbytes] for op in ("all_gather", "reduce_scatter")])

    def _pp(self, g, pp: int, v: int) -> np.ndarray:
        """Activation and gradient sends on the fill and drain: 2 (p v - 1) boundary crossings."""
        if pp == 1:
            return np.zeros(len(g))

        def one(tp, cp, dp, mb):
            tokens = mb * self.s.training.seq_len // cp
            return self.comm.p2p(tokens * self.d.h * ELEM / tp, self.comm.groups(tp, cp, dp, pp, 1, tp)["pp"])

        return 2 * (pp * v - 1) * lookup(g, ["tp", "cp", "dp", "micro_batch"], one)

    def _dp_tail(self, g, pp: int, v: int, fwd: np.ndarray, bwd: np.ndarray, fsdp_tail: np.ndarray) -> np.ndarray:
        """Gradient reduction (and ZeRO-1/2's parameter gather) exposed at the ends of the
        step, on the stage where it is longest (n x stages -> n); FSDP's is ``fsdp_tail``:
        what each layer's reduce-scatter adds beyond its backward, and the last one."""
        params = lookup(g, ["tp", "expert_tp", "ep"],
                        lambda tp, etp, ep: np.stack(self.stages.params(tp, etp, ep, pp, v)[:2]))
        dense, expert = params[:, 0] * GRAD_BYTES, params[:, 1] * GRAD_BYTES
        rates = lookup(g, ["tp", "cp", "dp", "ep", "expert_tp"], self._bucket_times)  # n x 6
        zero = g["zero"].to_numpy()[:, None]
        reduce_dense = np.where(zero == 0, rates[:, 0:1], rates[:, 1:2])
        reduce_expert = np.where(zero == 0, rates[:, 3:4], rates[:, 4:5])
        red = (dense * reduce_dense + expert * reduce_expert) / self.bucket
        buckets = np.maximum(1.0, (dense + expert) / self.bucket)
        tail = np.maximum(red / buckets, red - bwd)
        gather = (dense * rates[:, 2:3] + expert * rates[:, 5:6]) / self.bucket
        tail = tail + np.where((zero == 1) | (zero == 2), np.maximum(0.0, gather - fwd), 0.0)
        return np.where(zero == 3, fsdp_tail, tail).max(axis=1)

    def _bucket_times(self, tp, cp, dp, ep, etp) -> np.ndarray:
        """Seconds per full gradient bucket: all-reduce, reduce-scatter, all-gather over the
        data-parallel group, then the same over the expert-dp group."""
        groups = self.comm.groups(tp, cp, dp, 1, ep, etp)
        ops = ("all_reduce", "reduce_scatter", "all_gather")
        return np.array([self.comm.reduce(op, self.bucket, groups[axis]) for axis in ("dp", "edp") for op in ops])

    def _optimizer(self, g, pp: int, v: int) -> np.ndarray:
        """Adam on the fullest stage's shard (sim/parallel/workload.py optimizer_step); its
        kernels are memory-bound, so their time is linear in the parameters it updates."""
        params = lookup(g, ["tp", "expert_tp", "ep"],
                        lambda tp, etp, ep: np.stack(self.stages.params(tp, etp, ep, pp, v)[:2]))
        dense, expert = params[:, 0], params[:, 1]
        zero = g["zero"].to_numpy()[:, None]
        edp = (g["tp"] * g["cp"] * g["dp"] // (g["expert_tp"] * g["ep"])).to_numpy()[:, None]
        shard = np.where(zero >= 1, dense / (g["dp"] * g["cp"]).to_numpy()[:, None] + expert / edp, dense + expert)
        fp8 = self.s.training.precision == "fp8"
        base = self.compute.time(optimizer(0.0, 1.0 if fp8 else 0.0))
        per_param = self.compute.time(optimizer(1e9)) - self.compute.time(optimizer(0.0))
        per_fp8 = (self.compute.time(optimizer(0.0, 1e9)) - self.compute.time(optimizer(0.0, 1.0))) if fp8 else 0.0
        return (base + shard * per_param / 1e9 + (dense + expert) * per_fp8 / 1e9).max(axis=1)
