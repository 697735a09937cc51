"""One definition of a layer: what the rank-program builder produces for ONE layer of each
kind and ONE micro-batch, obtained by running the builder itself.

:func:`programs` runs :class:`.passes.Pass` -- the forward, then the backward (with its
recomputation) -- over a single layer of each kind (:class:`Kind`: the embedding, a dense
and an MoE transformer layer, a multi-token-prediction depth, the output layer) on the
busiest rank of the scenario's layout, and records what it built as a frozen
:class:`LayerProgram`: its ops (stream, category, compute seconds, dependencies, phase),
its collectives (axis, operation, bytes, group) and the kernels it timed. Everything that
needs to know what a layer does reads this instead of restating formulas: the work census
(:mod:`.census`, op counts), the planner's per-layer estimate (sim/plan/layers.py) and its
simulation-cost predictor (sim/plan/cost.py). A feature added to the builder reaches them
with no other edit. :func:`step_skeleton` is the rest of a rank's program for the census:
the real builder run with the fewest micro-batches the schedule takes, so the per-step ops
(gradient buckets, parameter gathers, FSDP reduce-scatters, optimizer) and the pipeline
transfers are counted, not re-derived.

Phases: an op built by the forward pass is FORWARD, by the backward pass BACKWARD, and
RECOMPUTE where the builder tagged it a recomputation (its name or its collective's key
says ``recompute``; to be replaced by the op's own phase once ops carry one).

Programs are cached by content (the model, training and parallel sections, the seed that
draws expert loads, the GPU and its efficiency), at most :data:`CACHE_SIZE` of them.

Run ``python -c "import sim; from sim.parallel import layer_program as lp;
print(lp.programs(sim.load_scenario('scenarios/mixtral-small-ep-h100.toml'), 'h100-sxm'))"``.
"""

from collections import Counter, OrderedDict
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..collectives.kinds import SEND_RECV, CollectiveOp
from ..input.choices import Schedule
from ..model import host, transformer as model_costs
from ..model.compute import ComputeModel
from .layout import Layout
from ..model.layer_ids import EMBEDDING, is_output, mtp_ids
from .params import moe_block_ids, stage_layer_ids
from .passes import Pass
from .program import Context, RankBuilder
from . import amax, dp, ep, fsdp, pp as pipeline, pp_zero_bubble as zb, wgrad_deferral
from . import workload
from .workload import expert_loads  # (the routing's tokens per expert: what MoE layers are built with)
from ..engine.kinds import Category, StreamName

CACHE_SIZE = 4096  # programs kept; a planner search of DeepSeek-V3 on 2,048 GPUs asks for ~11k


class Kind(Enum):
    """The kinds of layer a rank program holds."""

    EMBEDDING = "embedding"
    DENSE = "dense"
    MOE = "moe"
    MTP = "mtp"  # a multi-token-prediction depth (dense or MoE, as its layer id says)
    OUTPUT = "output"


class Phase(Enum):
    """Which pass of the layer an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"  # the forward rerun during the backward (full or selective recompute)


@dataclass(frozen=True)
class LayerCollective:
    """One collective call of the layer on its rank."""

    axis: Category  # tp, cp, ep, dp, pp (the builder's category)
    op: CollectiveOp
    nbytes: float
    group: tuple[int, ...]  # the ranks of its group
    shares: tuple | None = None  # all_to_all: uneven weights, or DeepEP's Dedup (sim.collectives.schedule)

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.group)


@dataclass(frozen=True)
class LayerOp:
    """One op of the layer's program: enough to schedule it on its streams."""

    stream: str
    category: Category  # compute or the collective's axis
    duration: float  # seconds, compute ops (0 for collectives)
    deps: tuple[int, ...]  # earlier ops of this layer program
    phase: Phase
    collective: LayerCollective | None = None
    kernels: int = 0  # kernels timed (compute ops)
    issue: float = 0.0  # seconds of host time to issue it (the builder's Op.issue: sim/model/host.py)
    sync: bool = False  # the host waits for its end before issuing more (the builder's Op.sync: a D2H read)


@dataclass(frozen=True)
class LayerProgram:
    """What the builder produces for one layer of ``kind`` and one micro-batch on ``rank``."""

    kind: Kind
    layer: int  # the layer id it was built for (the first of its kind)
    rank: int
    ops: tuple[LayerOp, ...]
    fp8_gemms: int = 0  # Transformer Engine FP8 GEMMs of its forward (the amaxes a chunk reduces: .amax)

    @property
    def count(self) -> int:
        """Ops per micro-batch."""
        return len(self.ops)

    def compute_s(self, phase: Phase) -> float:
        """Compute seconds of one phase."""
        return sum(op.duration for op in self.ops if op.phase is phase and op.collective is None)

    @property
    def forward_s(self) -> float:
        return self.compute_s(Phase.FORWARD)

    @property
    def backward_s(self) -> float:
        return self.compute_s(Phase.BACKWARD)

    @property
    def recompute_s(self) -> float:
        return self.compute_s(Phase.RECOMPUTE)

    def by_category(self) -> Counter:
        """Ops per category (compute, tp, cp, ep, dp)."""
        return Counter(op.category for op in self.ops)

    def by_stream(self) -> Counter:
        """Ops per stream."""
        return Counter(op.stream for op in self.ops)

    def collectives(self, axis: Category | None = None) -> list[LayerCollective]:
        """The collective calls (of one axis)."""
        return [op.collective for op in self.ops if op.collective is not None
                and (axis is None or op.collective.axis == axis)]

    @property
    def kernels(self) -> int:
        """Kernels timed per micro-batch."""
        return sum(op.kernels for op in self.ops)

    @property
    def issue_s(self) -> float:
        """Host seconds to issue the layer's ops for one micro-batch, forward and backward."""
        return sum(op.issue for op in self.ops)


class _Recorder(RankBuilder):
    """A RankBuilder that also remembers how many kernels each compute op timed."""

    def __init__(self, ctx: Context, rank: int):
        super().__init__(ctx, rank)
        self.kernel_counts: dict[int, int] = {}

    def compute(self, name, kernels, deps=(), layer=-1, mb=-1, stream=StreamName.COMPUTE, weights=True, loads=None,
                linears=True, issue=None) -> int:
        index = super().compute(name, kernels, deps, layer, mb, stream, weights, loads, linears, issue)
        self.kernel_counts[index] = len(kernels)
        return index


def context(s, gpu_name: str, e_max: float | None = None, loads: dict | None = None,
            compute: ComputeModel | None = None, micro_batches: int | None = None) -> Context:
    """A Context of ``s`` for building single layers: the scenario's layout, shard and
    compute model (``compute``: one the caller keeps, with its memo of kernel times; ``loads``:
    the expert loads when the caller has drawn them), every
    rank simulated (no folding: a layer's ops do not depend on it)."""
    p, t = s.parallel, s.training
    layout, shard = Layout.from_parallel(p), shard_of(s)
    d = model_costs.dims(s.model)
    compute = compute or workload.compute_model(s, gpu_name, e_max, layout.world)
    m = t.global_batch // (p.dp * t.micro_batch) if micro_batches is None else micro_batches
    return Context(s, d, layout, shard, compute, [0] * layout.world, _All(layout.world), m,
                   pipeline.split_layers(d.layers, p.pp * p.virtual_stages, p.stage_layers),
                   expert_loads(s, d, shard, layout) if loads is None else loads)


shard_of = workload.shard_of  # (what one rank holds of one micro-batch: one definition)


class _All(frozenset):
    """Every rank of the world, without listing them (``Context.simulated`` when nothing is folded)."""

    def __new__(cls, world: int):
        obj = super().__new__(cls)
        obj.world = world
        return obj

    def __len__(self) -> int:
        return self.world

    def __contains__(self, rank) -> bool:
        return 0 <= rank < self.world


def representative(d, kind: Kind) -> int | None:
    """The layer id a kind is built for (the first layer of that kind), None if the model has none."""
    if kind is Kind.EMBEDDING:
        return EMBEDDING
    if kind is Kind.OUTPUT:
        return d.layers
    if kind is Kind.MTP:
        return next(iter(mtp_ids(d)), None)
    moe = kind is Kind.MOE
    return next((l for l in range(d.layers) if model_costs.is_moe_layer(d, l) == moe), None)


def kind_of(d, layer: int) -> Kind:
    """The kind of layer id ``layer``."""
    if layer == EMBEDDING:
        return Kind.EMBEDDING
    if layer == d.layers:
        return Kind.OUTPUT
    if layer > d.layers:
        return Kind.MTP
    return Kind.MOE if model_costs.is_moe_layer(d, layer) else Kind.DENSE


def busiest_rank(ctx: Context, layer: int) -> int:
    """Rank 0, or for an MoE layer with uneven loads the rank of rank 0's expert group whose
    experts receive the most tokens (the first such)."""
    loads = ctx.expert_loads.get(layer)
    if loads is None or loads.min() == loads.max():
        return 0
    layout = ctx.layout
    per = len(loads) // layout.ep
    held = [float(loads[j * per:(j + 1) * per].sum()) for j in range(layout.ep)]
    best = int(np.argmax(held))
    return next(r for r in layout.ep_group(0) if layout.ep_index(r) == best)


def build(ctx: Context, kind: Kind) -> LayerProgram | None:
    """Run the builder over one layer of ``kind`` for one micro-batch -- the second when there
    are several, the steady state (FSDP under PP without resharding gathers a layer only for
    the first: sim/parallel/fsdp.py) -- forward, then backward."""
    layer = representative(ctx.dims, kind)
    if layer is None:
        return None
    rank = busiest_rank(ctx, layer)
    b = _Recorder(ctx, rank)
    mb = 1 if ctx.micro_batches > 1 else 0  # a steady micro-batch (FSDP without resharding gathers on the first)
    forward = Pass(b, [layer], mb, (), zb.Kind.F, param_waits={})
    forward.run()
    first_backward, gemms = len(b.program.ops), b.fp8_gemms
    Pass(b, [layer], mb, forward.x, zb.Kind.B, sync=None, last_mb=False).run()
    ops = tuple(_layer_op(op, i, i >= first_backward, b.kernel_counts.get(i, 0))
                for i, op in enumerate(b.program.ops))
    return LayerProgram(kind, layer, rank, ops, gemms)


def _layer_op(op, index: int, backward: bool, kernels: int) -> LayerOp:
    coll = None
    if op.comm is not None:
        coll = LayerCollective(op.category, op.comm.op, op.comm.nbytes, tuple(op.comm.group), op.comm.shares)
    return LayerOp(op.stream, op.category, op.duration, op.deps, _phase(op, backward), coll, kernels, op.issue,
                   op.sync)


def _phase(op, backward: bool) -> Phase:
    """Forward or backward by the pass that built it; recompute when the builder tagged the
    op so (its name, or its collective's key: ``_recompute`` / ``"recompute"``)."""
    tags = op.comm.key if op.comm is not None else ()
    if "recompute" in op.name or "recompute" in tags:
        return Phase.RECOMPUTE
    return Phase.BACKWARD if backward else Phase.FORWARD


_CACHE: OrderedDict = OrderedDict()


def content_key(s, gpu_name: str, e_max: float | None) -> tuple:
    """What a layer program depends on: the model, training and parallel sections, the seed
    (expert loads), the GPU and its efficiency (a calibration profile's; ``variability``'s factor)."""
    return (s.model.model_dump_json(), s.training.model_dump_json(), s.parallel.model_dump_json(), s.seed,
            gpu_name, e_max, s.cluster.calibration, s.variability.sigma)


def programs(s, gpu_name: str, e_max: float | None = None, key: tuple | None = None,
             loads: dict | None = None, kinds=tuple(Kind),
             compute: ComputeModel | None = None) -> dict[Kind, LayerProgram]:
    """The layer program of each of ``kinds`` the model has (cached by :func:`content_key`,
    or by ``key`` when the caller holds one that determines the same content;
    ``loads`` and ``compute`` as :func:`context` takes them)."""
    kinds = tuple(kinds)
    key = ("programs", kinds) + (key if key is not None else content_key(s, gpu_name, e_max))
    found = _CACHE.get(key)
    if found is None:
        ctx = context(s, gpu_name, e_max, loads, compute)
        found = {k: lp for k in kinds if (lp := build(ctx, k)) is not None}
        _remember(key, found)
    else:
        _CACHE.move_to_end(key)
    return found


def _remember(key, value) -> None:
    _CACHE[key] = value
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)


def stage_layers(s) -> list[list[int]]:
    """Layer ids (pseudo layers included) of every pipeline stage, all its chunks, as the
    builder assigns them (:func:`.params.stage_layer_ids`)."""
    p, d = s.parallel, model_costs.dims(s.model)
    ctx = Context(s, d, None, None, None, [], frozenset(), 0,
                  pipeline.split_layers(d.layers, p.pp * p.virtual_stages, p.stage_layers))
    return [[l for vs in pipeline.virtual_stages_of(p.schedule, p.pp, p.virtual_stages, stage)
             for l in stage_layer_ids(ctx, vs)] for stage in range(p.pp)]


def counting_loads(s) -> dict:
    """Expert loads for counting ops and kernels without routing a token (the census must
    not do the work it estimates): every expert receives some. An MoE layer's ops do not
    depend on its loads; its kernels do only where an expert receives none (it then times
    no MLP), so the kernels counted with these are an upper bound."""
    d = model_costs.dims(s.model)
    return {layer: np.ones(d.experts) for layer in moe_block_ids(d)}


def counted(s, gpu_name: str) -> dict[Kind, LayerProgram]:
    """:func:`programs` with :func:`counting_loads`: ops and kernels, not durations."""
    return programs(s, gpu_name, key=("counting",) + content_key(s, gpu_name, None), loads=counting_loads(s))


def step_skeleton(s, gpu_name: str, stage: int) -> tuple[int, int, int]:
    """(ops of rank ``stage``'s program with ``m0`` micro-batches, and of its flush with all (:mod:`.wgrad_deferral`),
    ``m0``, its ops per micro-batch outside the layers: pipeline transfers, FP8 amax reductions (:mod:`.amax`)):
    the builder itself (:func:`sim.parallel.workload.build_rank`) on a context with
    :func:`counting_loads` and the fewest micro-batches the schedule takes (one; interleaved
    1F1B runs them in groups of pp, sim/input/rules.py). The census adds the other
    micro-batches from the layer programs."""
    p, m = s.parallel, s.training.global_batch // (s.parallel.dp * s.training.micro_batch)
    m0 = min(m, p.pp) if p.schedule is Schedule.INTERLEAVED else 1
    if p.schedule in pipeline.ZERO_BUBBLE:  # W passes and DualPipe's pairs differ by micro-batch: all of them
        m0 = m
    key = ("skeleton", stage, m0) + content_key(s, gpu_name, None)
    found = _CACHE.get(key)
    if found is None:
        ctx = context(s, gpu_name, loads=counting_loads(s), micro_batches=m0)
        rank = ctx.layout.rank(tp=0, cp=0, dp=0, pp=stage)
        ops = workload.build_rank(ctx, rank).program.ops
        extra = wgrad_deferral.flush_ops(p, m, m0) if any(is_output(ctx.dims, x) for x in stage_layers(s)[stage]) else 0
        found = (len(ops) + extra, m0, sum(op.category == Category.PP or op.name in amax.NAMES for op in ops) // m0)
        _remember(key, found)
    return found


def schedule_host_s(schedule: Schedule, p: int, v: int, m: int, stage: int, host_issue: float = 1.0) -> float:
    """Host seconds per micro-batch the rank at pipeline ``stage`` spends beside its layers' ops
    in a step of ``m`` micro-batches, as the builder charges them (:func:`sim.parallel.pp.issued`'s
    counts): the schedule's Python per pass (:data:`sim.model.host.SCHEDULE_PASS_S`) and a c10d
    call per pipeline send or receive (:func:`sim.model.host.collective_issue_s`), at the host's
    ``host_issue`` (``GPU.host_issue``, as the builder's ``RankBuilder._issue``). No GPU time."""
    passes, calls = pipeline.issued(schedule, p, v, m, stage)
    return (passes * host.SCHEDULE_PASS_S + calls * host.collective_issue_s(SEND_RECV)) * host_issue / m


def schedule_host_bound_s(p: int, v: int, host_issue: float = 1.0) -> float:
    """At least :func:`schedule_host_s` of any schedule of ``p`` stages and ``v`` chunks: a
    micro-batch visits at most max(v, 2) chunks of a rank (DualPipe's two at v = 1), each in
    at most 3 passes (a zero-bubble F, I and W) and 4 transfers (a receive and a send each way;
    tests/test_plan_accuracy.py checks it bounds every schedule's count)."""
    chunks = max(v, 2) if p > 1 else 1
    return chunks * (3 * host.SCHEDULE_PASS_S + 4 * host.collective_issue_s(SEND_RECV)) * host_issue


# What a chunk adds per micro-batch beside its layers under FP8 delayed scaling, its amax
# reductions (.amax; the planner reads them here, the builder's own definition): whether they
# apply, the group's axes, the seconds of one chunk's forward and backward reductions.
amax_applies, amax_axes, amax_pass_pair_s = amax.applies, amax.axes, amax.pass_pair_s

# The share of a GPU's SMs the dispatcher's all-to-all kernels hold while they run (DeepEP's;
# the builder's own definition, :func:`sim.parallel.ep.sm_share`): compute paired with them
# under EP overlap runs on the rest.
ep_sm_share = ep.sm_share
ep_paired_stretch = ep.paired_stretch  # ... and how much longer they last paired with it (DeepEP's, slowed)

# Bytes per gradient element the builder reduces (``parallel.grad_reduce_in_fp32``; .dp's, read by .fsdp too),
# the bf16 parameters FSDP's gathers move, and FSDP's fp32 accumulation, for the planner.
grad_bytes, fsdp_param_bytes = dp.grad_bytes, fsdp.PARAM_BYTES
fsdp_accumulation_s = fsdp.accumulation_s

DEFAULT_BUCKET_BYTES = dp.BUCKET_PARAMS * dp.GRAD_BYTES  # Megatron-Core's bucket floor, bf16 gradients


def grad_bucket_bytes(parallel, dp_cp: int, stage: int, chunk: int) -> float:
    """Gradient bytes per bucket the builder uses for model chunk ``chunk`` of pipeline
    ``stage`` with ``dp_cp`` data x context-parallel ranks (inf: one bucket for the chunk):
    :func:`sim.parallel.dp.bucket_size`, for the planner's estimate of the data-parallel ends."""
    return dp.bucket_size(parallel, dp_cp, stage, chunk)
