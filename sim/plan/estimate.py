"""The fast estimate: an analytic step time for every valid candidate, vectorized over the
candidate table, so that hundreds of thousands can be ranked before the best are simulated.

    step = m * T_crit + (sum_s T_s - T_crit) / v + PP sends + DP/ZeRO tail + optimizer

T_s is one micro-batch's time on pipeline stage s: its layers' compute (kernels timed by the
simulator's ComputeModel, :mod:`.layers`), recompute, the TP, CP, EP and FSDP communication on the
critical path, what waiting for the host adds (the builder's issue costs, :mod:`.layers`), and under
FP8 with Transformer Engine's recipe each chunk's amax reductions (sim/parallel/amax.py
``pass_pair_s``: the builder's kernels, bytes and group, timed by :class:`.comm.Comm`; as compute).
With v = 1 the pipeline term is (m + p - 1) T for balanced stages, the GPipe / 1F1B bubble
(p - 1) / m of Narayanan et al. 2021; interleaving divides the fill and drain by v; the zero-bubble
and DualPipe schedules shrink it further (:func:`fill_factor`). PP sends cross the fill and drain
once per virtual stage boundary each way. The DP tail is the gradient reduction (DDP all-reduce,
ZeRO reduce-scatter, in ddp_bucket_mb buckets) beyond the last micro-batch's backward it overlaps,
plus ZeRO-1/2's parameter all-gather beyond the first forward; FSDP gathers each layer once per
micro-batch and pass, hidden behind the layer's compute when shorter. EP overlap (combined 1F1B)
hides the all-to-alls under the paired micro-batch's compute except in warm-up and cool-down; with
``overlap_grad_reduce = false`` the whole reduction is exposed. The optimizer is Adam's memory-bound
update of the rank's shard (:func:`sim.model.optimizer.optimizer`), with the builder's per-step
costs (sim/parallel/step_end.py): the gradient-norm kernel and the gradient buffer's memset.

Measured, not trusted: ``clustersim plan`` reports its Spearman rank correlation with the simulation.
"""

from functools import lru_cache

import numpy as np
import pandas as pd

from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from ..hardware.gpus import gpu_preset
from ..input.choices import Recompute, Schedule
from ..model.compute import ComputeModel, quantized
from ..model import transformer as model_costs
from ..model.layers import ELEM
from ..model.optimizer import grad_norm, optimizer, zero_grad
from ..parallel import layer_program
from ..parallel.layout import Layout
from . import dp_ends
from .comm import Comm
from .cost import COUNTS, layer_counts, sim_cost
from .fit import keyed, lookup
from .layers import KINDS, PASS_FIELDS, Pricer, costs as layer_costs, stage_waits
from ..engine.kinds import Category

COMPONENTS = ("compute", "recompute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer", "host")
FIELDS = ("forward", "backward", "recompute", "tp", "cp", "ep", "host", "host_dp")  # per layer kind (:class:`.layers.Cost`)
PASSES = len(FIELDS) + np.arange(len(PASS_FIELDS))  # where each kind's PASS_FIELDS follow them
COUNTS_AT = len(FIELDS) + len(PASS_FIELDS)  # and where its COUNTS follow those
PARAM_BYTES = 2  # bf16 parameters gathered (sim/parallel/zero.py); gradient bytes: sim.parallel.dp.grad_bytes
LAYER_KEY = ["tp", "cp", "micro_batch", "recompute", "tp_comm_overlap", "ep", "expert_tp", "sharded"]


def fill_factor(schedules: np.ndarray, pp: int) -> np.ndarray:
    """The fill-and-drain term's share left by each schedule, with equal F, B, W passes: 1
    for GPipe and (interleaved) 1F1B; 1/3 for ZB-H1 ((p-1)(F+B-W) of Qi et al. 2024 against
    1F1B's (p-1)(F+B+W)); DualPipe (p-2)/(3(p-1)) and DualPipeV 2/3 of the interleaved
    term it is divided by v = 2 in ((PP/2-1)(F&B+B-3W), DeepSeek-V3 report Table 2)."""
    factor = {Schedule.ZB_H1: 1 / 3, Schedule.DUALPIPE: (pp - 2) / (3 * (pp - 1)) if pp > 1 else 1.0,
              Schedule.DUALPIPEV: 2 / 3}
    return np.array([factor.get(str(x), 1.0) for x in schedules])


class Estimator:
    """Estimates candidates of one base scenario (model, training, cluster)."""

    def __init__(self, scenario, stages, spec, gpu_name: str):
        self.s, self.stages, self.d = scenario, stages, stages.dims
        cal = scenario.cluster.calibration  # a measured profile (sim/hardware/calibration.py), or None
        self.gpu_name, self.comm = gpu_name, Comm(spec, gpu_name, cal)
        self.compute = ComputeModel(gpu_preset(gpu_name), attention=scenario.training.attention_backend, calibration=cal,
                                    precision=scenario.training.precision)
        self.price = Pricer(self.comm, spec.gpus_per_domain)
        self._base_key = layer_program.content_key(scenario, gpu_name, None)
        d, kinds = self.d, layer_program.Kind
        with_experts = {kinds.MOE} | ({kinds.MTP} if d.mtp and model_costs.is_moe_layer(d, d.layers + 1) else set())
        self.moe_kinds = tuple(k for k in kinds if k in with_experts) if d.experts else ()
        self.other_kinds = tuple(k for k in kinds if k not in self.moe_kinds)
        self.domain = spec.gpus_per_domain
        p = scenario.parallel
        self.grads_overlapped = p.overlap_grad_reduce is not False
        self._routed: dict = {}
        self._built = lru_cache(maxsize=None)(self._built)  # per search (the shared cache is bounded)
        self.micro_of = lambda c: scenario.training.global_batch // (c["dp"] * c["micro_batch"])

    def frame(self, c: pd.DataFrame) -> pd.DataFrame:
        """``estimate_s``, ``est_<component>_s`` and ``sim_cost_s`` of every candidate."""
        out = pd.DataFrame(index=c.index, columns=["estimate_s"] + [f"est_{k}_s" for k in COMPONENTS],
                           dtype=float)
        c = keyed(c).assign(micro=self.micro_of(c).to_numpy())
        both = lookup(c, LAYER_KEY, self._layer_costs)  # n x KINDS x (FIELDS, COUNTS, FSDP gather bytes)
        f, n = COUNTS_AT, COUNTS_AT + len(COUNTS)
        layer, ops, gathered, gemms = both[:, :, :f], both[:, :, f:n], both[:, :, n], both[:, :, n + 1]
        for (pp, v), idx in c.groupby(["pp", "virtual_stages"], sort=False).indices.items():
            out.iloc[idx] = self._shape(c.iloc[idx], pp, v, layer[idx], gathered[idx], gemms[idx])
        out["sim_cost_s"] = sim_cost(c, self.d, self.s, self.domain, ops, self.stages.split(1, 1))
        return out

    # ------------------------------------------------------------------ per layer kind
    def _layer_costs(self, tp, cp, mb, rec, tpov, ep, etp, sharded: bool | None = None) -> np.ndarray:
        """KINDS x (FIELDS, PASS_FIELDS, COUNTS, FSDP bytes, FP8 GEMMs): each kind's :class:`.layers.Cost`, its op
        counts, the bytes of its FSDP all-gather (sim/parallel/fsdp.py) and its forward's
        Transformer Engine FP8 GEMMs (whose amaxes a chunk reduces: sim/parallel/amax.py), from the
        builder's layer programs of this (tp, cp, micro-batch, recompute, TP overlap, ep,
        expert_tp, zero 3: by default the base scenario's)."""
        programs = self._programs(tp, cp, mb, rec, bool(tpov), ep, etp,
                                  self.s.parallel.zero == 3 if sharded is None else bool(sharded))
        costs = layer_costs(programs, self.price)
        counts = {k.value: layer_counts(lp) for k, lp in programs.items()}
        counts.setdefault("moe", counts.get("dense", (0,) * len(COUNTS)))
        gathers = {k.value: next((c.nbytes for c in lp.collectives(Category.DP) if c.op is ALL_GATHER), 0.0)
                   for k, lp in programs.items()}
        gemms = {k.value: lp.fp8_gemms for k, lp in programs.items()}
        return np.array([[getattr(costs[k], f) for f in FIELDS] + [costs[k].passes.get(f, 0.0) for f in PASS_FIELDS]
                         + list(counts.get(k, (0,) * len(COUNTS)))
                         + [gathers.get(k, 0.0), gemms.get(k, gemms.get("dense", 0))] for k in KINDS])

    def _programs(self, tp, cp, mb, rec, tpov, ep, etp, sharded: bool = True) -> dict:
        """The layer programs of one candidate's per-layer knobs: the base scenario with them
        set (sequence parallel when tp > 1, as :func:`.space.overrides` does), one stage, and
        FSDP on for a ``sharded`` candidate so its gathers count (:mod:`.cost`; .layers leaves
        their time to :meth:`_fsdp`), else zero 1, whose wgrads accumulate into main_grad (workload.shard_of). Layers without experts are built without the expert mesh (ep 1):
        tests/test_plan.py checks that it changes none of their programs."""
        out = {}
        for kinds, e, et in ((self.moe_kinds, ep, etp), (self.other_kinds, 1, tp)):
            if kinds:
                out.update(self._built(kinds, tp, cp, mb, rec, tpov, e, et, sharded))
        return out

    def _built(self, kinds, tp, cp, mb, rec, tpov, ep, etp, sharded: bool = True) -> dict:
        dp = 2 * ep  # any dp whose groups hold the ep ranks; > 1 so FSDP gathers
        s = self.s
        par = s.parallel.model_copy(update=dict(tp=tp, cp=cp, dp=dp, pp=1, virtual_stages=1, stage_layers=None,
                                                schedule=Schedule.ONE_F_ONE_B, ep=ep, expert_tp=None if etp == tp else etp,
                                                sequence_parallel=tp > 1, tp_comm_overlap=tpov, zero=3 if sharded else 1,
                                                ep_comm_overlap=False))
        training = s.training.model_copy(update=dict(micro_batch=mb, recompute=Recompute(rec), global_batch=mb * dp))
        candidate = s.model_copy(update={"parallel": par, "training": training})
        key = (self._base_key, tp, cp, mb, rec, tpov, ep, etp, sharded)
        loads = self._loads(candidate) if self.d.experts else {}
        return layer_program.programs(candidate, self.gpu_name, key=key, loads=loads, kinds=kinds,
                                      compute=self.compute)

    def _loads(self, s) -> dict:
        """Tokens per expert of every MoE layer (sim/parallel/workload.py), drawn once per
        tokens routed by an expert group (all they depend on besides the base scenario)."""
        layout, shard = Layout.from_parallel(s.parallel), layer_program.shard_of(s)
        key = layout.moe_tokens(shard.tokens) * layout.ep
        found = self._routed.get(key)
        if found is None:
            found = self._routed[key] = layer_program.expert_loads(s, self.d, shard, layout)
        return found

    # ------------------------------------------------------------------ one pipeline shape
    def _shape(self, g: pd.DataFrame, pp: int, v: int, layer: np.ndarray, gathered: np.ndarray,
               gemms: np.ndarray) -> np.ndarray:
        """Every component of every candidate of one (pp, v), as columns of ``frame``
        (``gemms``: each kind's FP8 GEMMs, n x KINDS, for the amax reductions)."""
        split = self.stages.split(pp, v)
        counts = np.column_stack([getattr(split, k) for k in KINDS])  # stages x KINDS
        micro = g["micro"].to_numpy().astype(float)
        ep = self._ep_exposed(g, layer, micro, pp, v)
        gathers, scatters = self._fsdp(g, layer, gathered)
        zero3 = g["zero"].to_numpy() == 3
        compute = layer[:, :, 0] + layer[:, :, 1] + self._accumulation(g, gathered)
        per_kind = np.stack([compute, layer[:, :, 2], layer[:, :, 3], layer[:, :, 4], ep,
                             gathers, layer[:, :, 6] + zero3[:, None] * layer[:, :, 7]], axis=2)
        # n x KINDS x (compute, recompute, tp, cp, ep, fsdp, host: FSDP's calls issued under ZeRO 3 only)
        stage = np.einsum("sk,nkf->nsf", counts, per_kind)  # n x stages x parts
        synced = counts @ (layer[:, :, PASSES[PASS_FIELDS.index("fwd_sync")]]
                           + layer[:, :, PASSES[PASS_FIELDS.index("bwd_sync")]]).T > 0  # stages x n
        beside = self._schedule_host(g, pp, v, stage[:, :, 6], synced.any(axis=0))  # host only: the schedule's work
        stage[:, :, 6] = np.maximum(stage[:, :, 6] + beside, 0.0)  # the host waits only where a stage's issue outlasts it
        if synced.any():  # a sync op loses the host's lead: pass by pass (.layers.stage_waits)
            rows = synced.any(axis=0)
            held = layer[rows]
            parts = {name: held[:, :, i] for name, i in zip(PASS_FIELDS, PASSES)}
            waits = stage_waits(counts, parts, zero3[rows].astype(float), beside[rows])
            stage[rows, :, 6] = np.where(synced[:, rows].T, waits, stage[rows, :, 6])
        stage[:, :, 0] += self._amax(g, counts, gemms, v)  # (the compute stream waits for them)
        total = stage.sum(axis=2)
        crit = total.argmax(axis=1)
        rows = np.arange(len(g))
        t_crit = total[rows, crit]
        gpu = total - stage[:, :, 6]  # the fill and drain are the GPUs' (a host behind its GPU issues the first
        #   micro-batches while the stage waits for its input)
        pipe = micro * t_crit + (gpu.sum(axis=1) - gpu[rows, crit]) / v * fill_factor(g["schedule"].to_numpy(), pp)
        parts = micro[:, None] * stage[rows, crit]
        fwd = counts @ layer[:, :, 0].T  # stages x n
        bwd = counts @ (layer[:, :, 1] + layer[:, :, 2]).T
        pp_s = self._pp(g, pp, v)
        fsdp_tail = (counts @ scatters.T).T + scatters.max(axis=1)[:, None]  # n x stages
        busy = (fwd + bwd).T
        scale = np.divide(total, busy, out=np.ones_like(busy), where=busy > 0)  # a pass with its exposed comm
        dp_s = self._dp_tail(g, pp, v, fwd.T * scale, bwd.T * scale, fsdp_tail)
        opt = self._optimizer(g, pp, v)
        step = pipe + pp_s + dp_s + opt
        return np.column_stack([step, parts[:, 0], parts[:, 1], pipe - micro * t_crit, parts[:, 2], parts[:, 3],
                                parts[:, 4], pp_s, parts[:, 5] + dp_s, opt, parts[:, 6]])

    def _schedule_host(self, g, pp: int, v: int, issue: np.ndarray, synced: np.ndarray) -> np.ndarray:
        """n x stages: host seconds per micro-batch each stage spends beside its layers' ops (the
        schedule's Python per pass, a c10d call per pipeline transfer:
        ``layer_program.schedule_host_s``, the builder's), counted on a schedule of
        ``dp_ends.short_m`` micro-batches (the same warm-up and cool-down). Only where it can
        count: a stage with a sync op (:func:`.layers.stage_waits` reads it), or whose issue less
        its GPU time (``issue``, n x stages) is within ``layer_program.schedule_host_bound_s`` of
        zero; elsewhere the GPU's lead hides it and the clamped host term is 0 either way (the
        zero-bubble and DualPipe schedules take milliseconds to count per stage)."""
        out, host_issue = np.zeros(issue.shape), self.compute.gpu.host_issue  # (Grace: gpus.GRACE_HOST_ISSUE)
        need = synced | (issue.max(axis=1) + layer_program.schedule_host_bound_s(pp, v, host_issue) > 0)
        if need.any():
            out[need] = lookup(g[need], ["schedule", "micro"], lambda sched, m: np.array([
                layer_program.schedule_host_s(Schedule(sched), pp, v, dp_ends.short_m(sched, pp, m), s, host_issue)
                for s in range(pp)]))
        return out

    def _amax(self, g, counts: np.ndarray, gemms: np.ndarray, v: int) -> np.ndarray:
        """n x stages: seconds the FP8 amax reductions add to one micro-batch of each stage --
        each of its v chunks reduces its share of the stage's FP8 GEMMs forward and backward
        (sim/parallel/amax.py ``pass_pair_s``, the builder's definition, read through
        :mod:`sim.parallel.layer_program`), exposed."""
        if not layer_program.amax_applies(self.s.training):
            return np.zeros((len(g), counts.shape[0]))
        per_chunk = np.rint(np.einsum("sk,nk->ns", counts, gemms) / v).astype(int)  # n x stages
        axes = layer_program.amax_axes(self.s.training)

        def one(tp, cp, dp, n):
            group = self.comm.groups(tp, cp, dp, 1, 1, tp).of(*axes)
            return layer_program.amax_pass_pair_s(self.compute, n, lambda b: self.comm.reduce(ALL_REDUCE, b, group))

        rows = pd.DataFrame({k: np.repeat(g[k].to_numpy(), counts.shape[0]) for k in ("tp", "cp", "dp")})
        rows["n"] = per_chunk.ravel()
        return v * lookup(rows, ["tp", "cp", "dp", "n"], one).reshape(per_chunk.shape)

    def _ep_exposed(self, g, layer: np.ndarray, micro: np.ndarray, pp: int, v: int) -> np.ndarray:
        """All-to-all time left exposed per micro-batch (n x KINDS): all of it, or with EP
        overlap only the warm-up / cool-down passes' and what outlasts the paired compute --
        or, where the all-to-all kernels hold a share ``s`` of the SMs (DeepEP), what they take
        from the compute beside them: paired compute of ``c`` seconds beside an all-to-all of
        ``a`` ends ``s a`` later, or with the all-to-all, so ``max(s a, a - c)`` is exposed
        (sim/engine/sms.py ``SmLedger``: the simulator's own rule, per kernel). A paired DeepEP
        all-to-all lasts ``k a`` (``ep_paired_stretch``: its kernels slowed beside the compute)."""
        a2a, comp = layer[:, :, 5], layer[:, :, 0] + layer[:, :, 1]
        alone = 1.0 / micro if pp == 1 else np.minimum(1.0, ((pp - 1) * 2 + (v - 1) * pp + 1) / (micro * v))
        paired = layer_program.ep_paired_stretch(self.s.parallel) * a2a
        taken = layer_program.ep_sm_share(self.s.parallel) * paired
        hidden = alone[:, None] * a2a + (1 - alone[:, None]) * np.maximum(taken, paired - comp)
        return np.where(g["ep_comm_overlap"].to_numpy(dtype=bool)[:, None], hidden, a2a)

    def _fsdp(self, g, layer: np.ndarray, gathered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per kind (n x KINDS), zero 3 only: FSDP all-gather time, forward and backward,
        beyond the compute it hides under (per micro-batch); and each layer's gradient
        reduce-scatter beyond its backward (last micro-batch). ``gathered``: each kind's
        all-gather bytes (n x KINDS)."""
        zero3 = g["zero"].to_numpy() == 3
        gathers, scatters = np.zeros(layer.shape[:2]), np.zeros(layer.shape[:2])
        if not zero3.any():
            return gathers, scatters
        sizes = [f"bytes_{k}" for k in KINDS]
        rows = g[zero3].assign(**{name: gathered[zero3, i] for i, name in enumerate(sizes)})
        times = lookup(rows, ["tp", "cp", "dp", "ep", "expert_tp"] + sizes, self._layer_collectives)
        lay = layer[zero3]
        ag, rs, bwd = times[:, 0], times[:, 1], lay[:, :, 1] + lay[:, :, 2]
        gathers[zero3] = np.maximum(0.0, ag - lay[:, :, 0]) + np.maximum(0.0, ag - bwd)
        scatters[zero3] = np.maximum(0.0, rs - bwd)
        return gathers, scatters

    def _accumulation(self, g, gathered: np.ndarray) -> np.ndarray:
        """n x KINDS, zero 3: FSDP's fp32 gradient accumulation per micro-batch, the builder's kernels
        (``layer_program.fsdp_accumulation_s``) for each kind's parameters (its bf16 all-gather's bytes)."""
        out, zero3, p = np.zeros(gathered.shape), g["zero"].to_numpy() == 3, self.s.parallel
        layers = [layer_program.representative(self.d, layer_program.Kind(k)) for k in KINDS]
        for i, m in zip(np.flatnonzero(zero3 if p.grad_reduce_in_fp32 else []), g["micro"].to_numpy()[zero3]):
            out[i] = [0.0 if layer is None else layer_program.fsdp_accumulation_s(
                self.compute, p, self.d, layer, nbytes / layer_program.fsdp_param_bytes, int(m))
                for layer, nbytes in zip(layers, gathered[i])]
        return out

    def _layer_collectives(self, tp, cp, dp, ep, etp, *nbytes) -> np.ndarray:
        """Seconds of one layer's FSDP all-gather and reduce-scatter of ``nbytes`` (per kind),
        2 x KINDS, over the data-parallel group (sim/parallel/fsdp.py: per layer, unbucketed;
        the reduce-scatter, once per step, moves what the gather moved, twice that with fp32
        gradients: ``parallel.grad_reduce_in_fp32``)."""
        group = self.comm.groups(tp, cp, dp, 1, ep, etp).dp_ranks
        scale = {ALL_GATHER: 1.0, REDUCE_SCATTER: layer_program.grad_bytes(self.s.parallel)
                 / layer_program.fsdp_param_bytes}
        return np.array([[self.comm.reduce(op, b * scale[op], group) for b in nbytes]
                         for op in (ALL_GATHER, REDUCE_SCATTER)])

    def _pp(self, g, pp: int, v: int) -> np.ndarray:
        """Activation and gradient sends on the fill and drain: 2 (p v - 1) boundary crossings."""
        if pp == 1:
            return np.zeros(len(g))

        def one(tp, cp, dp, mb):
            tokens = mb * self.s.training.seq_len // cp
            return self.comm.p2p(tokens * self.d.h * ELEM / tp, self.comm.groups(tp, cp, dp, pp, 1, tp).pp)

        return 2 * (pp * v - 1) * lookup(g, ["tp", "cp", "dp", "micro_batch"], one)

    def _dp_tail(self, g, pp: int, v: int, fwd: np.ndarray, bwd: np.ndarray, fsdp_tail: np.ndarray) -> np.ndarray:
        """Gradient reduction exposed after the last backward and ZeRO-1/2's parameter gather
        before the first forwards (n x stages -> n; :mod:`.dp_ends`: the builder's buckets and
        the schedule's order of passes); ``fwd``, ``bwd``: each stage's forward and backward
        per micro-batch. FSDP's is ``fsdp_tail``: what each layer's reduce-scatter adds beyond
        its backward, and the last one."""
        out = np.zeros(len(g))
        rates = lookup(g, ["tp", "cp", "dp", "ep", "expert_tp"], self._bucket_times)  # n x 13
        zero, micro, schedules = g["zero"].to_numpy(), g["micro"].to_numpy(), g["schedule"].to_numpy()
        keys = g[["tp", "expert_tp", "ep"]]
        for schedule in pd.unique(schedules[zero < 3]):
            idx = np.flatnonzero((zero < 3) & (schedules == schedule))
            params = lookup(keys.iloc[idx], list(keys.columns), lambda tp, etp, ep: self.stages.chunk_params(
                tp, etp, ep, pp, v, str(schedule)))  # n x 2 x pp x chunks
            ms, which = np.unique(micro[idx], return_inverse=True)
            for j, m in enumerate(ms):
                at = np.flatnonzero(which == j)
                rows = idx[at]
                out[rows] = self._ends(zero[rows], str(schedule), pp, v, int(m), fwd[rows], bwd[rows], rates[rows],
                                       params[at])
        return np.where(zero == 3, fsdp_tail.max(axis=1), out)

    def _ends(self, zero, schedule: str, pp: int, v: int, m: int, fwd, bwd, rates, params) -> np.ndarray:
        """:meth:`_dp_tail` of candidates (``zero``: their stages 0-2) sharing a schedule and
        micro-batch count."""
        g = layer_program.grad_bytes(self.s.parallel)
        dense, expert = params[:, 0] * g, params[:, 1] * g  # gradient bytes; the gather moves bf16 parameters
        sharded = zero[:, None, None] > 0
        layers = self.stages.split(pp, v, schedule).layers_mean[0]
        nb = np.clip((dense[:, 0, 0] + expert[:, 0, 0]) / rates[:, 12], 1.0, layers + 1)  # first chunk's buckets

        def timed(op: int, nbytes: np.ndarray, first: int) -> np.ndarray:  # (op: 0 AR, 1 RS, 2 AG) n x pp x c
            lat, per = rates[:, first + 2 * op, None, None], rates[:, first + 2 * op + 1, None, None]
            calls = np.ones_like(nbytes)
            calls[:, 0, 0] = nb if self.grads_overlapped else 1.0
            return np.where(nbytes > 0, calls * lat + nbytes * per, 0.0)

        reduce = np.where(sharded, timed(1, dense, 0) + timed(1, expert, 6), timed(0, dense, 0) + timed(0, expert, 6))
        gather = np.where(sharded, (timed(2, dense * PARAM_BYTES / g, 0) + timed(2, expert * PARAM_BYTES / g, 6)), 0.0)
        chunks = reduce.shape[2]
        f, b = fwd / chunks, bwd / chunks  # n x stages: one chunk's pass
        offset = -np.cumsum(np.column_stack([np.zeros(len(zero)), b[:, :-1]]), axis=1)  # each stage's last backward
        p = self.s.parallel
        overlap_params = p.overlap_param_gather is not False
        start = np.zeros(len(zero))
        tail = np.full(len(zero), -np.inf)
        for s in dp_ends.stages_to_price(pp):
            order = dp_ends.passes(schedule, pp, v, m, s)
            bucketed = s == 0 and self.grads_overlapped
            if overlap_params:
                start = np.maximum(start, dp_ends.start_delay(order, f[:, s], b[:, s], gather[:, s], nb, bucketed, s))
            if self.grads_overlapped:
                end = dp_ends.reduce_tail(order, f[:, s], b[:, s], reduce[:, s], nb, bucketed, offset[:, s])
            else:
                end = offset[:, s] + reduce[:, s].sum(axis=1)
            tail = np.maximum(tail, end + (0.0 if overlap_params else gather[:, s].sum(axis=1)))
        return start + np.maximum(0.0, tail)

    def _bucket_times(self, tp, cp, dp, ep, etp) -> np.ndarray:
        """A gradient collective's time (:class:`.comm.Comm`) as latency + bytes x seconds per
        byte, fitted through the bucket size (the builder's, ``layer_program.grad_bucket_bytes``
        of the first chunk; Megatron's default where none is bucketed) and 8x it, for
        all-reduce, reduce-scatter and all-gather over the data-parallel group, then the
        expert-dp group (12 values); and the bucket's bytes."""
        groups = self.comm.groups(tp, cp, dp, 1, ep, etp)
        bucket = layer_program.grad_bucket_bytes(self.s.parallel, dp * cp, 0, 0)
        size = bucket if np.isfinite(bucket) else layer_program.DEFAULT_BUCKET_BYTES
        out = []
        for group in (groups.dp_ranks, groups.edp_ranks):
            for op in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER):
                small, big = (self.comm.reduce(op, k * size, group) for k in (1, 8))
                per_byte = (big - small) / (7 * size)
                out += [small - per_byte * size, per_byte]
        return np.array(out + [bucket])

    def _optimizer(self, g, pp: int, v: int) -> np.ndarray:
        """Adam on the fullest stage's shard (sim/parallel/step_end.py optimizer_step); its
        kernels are memory-bound, so their time is linear in the parameters it updates."""
        params = lookup(g, ["tp", "expert_tp", "ep"],
                        lambda tp, etp, ep: np.stack(self.stages.params(tp, etp, ep, pp, v)[:2]))
        dense, expert = params[:, 0], params[:, 1]
        zero = g["zero"].to_numpy()[:, None]
        edp = (g["tp"] * g["cp"] * g["dp"] // (g["expert_tp"] * g["ep"])).to_numpy()[:, None]
        shard = np.where(zero >= 1, dense / (g["dp"] * g["cp"]).to_numpy()[:, None] + expert / edp, dense + expert)
        fp8 = quantized(self.s.training.precision)
        gb = layer_program.grad_bytes(self.s.parallel)  # zero 0-2: the gradient buffer's width
        base = self.compute.time(optimizer(0.0, 1.0 if fp8 else 0.0, grad_bytes=gb))
        t = self.compute.time
        fsdp2 = dict(grad_bytes=4, copies_to_model=False)  # FSDP2: fp32 shards (sim/parallel/step_end.py)
        megatron = dict(grad_bytes=gb)
        per_param = np.where(zero >= 3, t(optimizer(1e9, **fsdp2)) - t(optimizer(0.0, **fsdp2)),
                             t(optimizer(1e9, **megatron)) - t(optimizer(0.0, **megatron))) + t(grad_norm(1e9)) - t(
            grad_norm(0.0))
        per_fp8 = (t(optimizer(0.0, 1e9)) - t(optimizer(0.0, 1.0))) if fp8 else 0.0
        memset = np.where(zero < 3, t(zero_grad(1.0, gb)) + (dense + expert) * (
            t(zero_grad(1e9, gb)) - t(zero_grad(0.0, gb))) / 1e9, 0.0)
        base = base + t(grad_norm(0.0))
        return (base + shard * per_param / 1e9 + (dense + expert) * per_fp8 / 1e9 + memset).max(axis=1)
