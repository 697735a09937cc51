"""Pipeline parallelism: real schedules, executed op by op (no bubble formula).

GPipe (Huang et al. 2019): all forwards, then all backwards. 1F1B / PipeDream-Flush
(Narayanan et al. 2019): stage s runs p-s-1 warm-up forwards, then alternates one
forward and one backward, then drains. Interleaved 1F1B (Narayanan et al. 2021): each
rank holds v model chunks; Megatron-LM's ordering (warm-up (p-s-1)*2 + (v-1)*p).
Activations go forward and gradients back between neighbouring virtual stages as
point-to-point transfers; with Megatron's scatter/gather optimization each tp rank sends
1/tp of the b*s*h activation (Narayanan et al. 2021, section 4.1).
"""

from functools import lru_cache

from ..collectives.kinds import SEND_RECV
from ..input.choices import Schedule
from ..model.layers import ELEM, attention_core, attention_post, attention_pre, backward, mlp_block
from . import pp_zero_bubble as zb
from .pp_zero_bubble import EQUAL, ZERO_BUBBLE, Kind, held_peak  # (re-exported: the planner reads schedules through pp)
from .tp import grad_parts
from ..engine.kinds import Category, StreamName

AXIS = Category.PP
# (sending, direction, chunk's pipeline) -> the stream of that side of a transfer; the second
# chunk's pipeline of a two-chunk zero-bubble schedule has its own (its own neighbours)
STREAMS = {(True, Kind.F, 0): StreamName.PP_SEND_FWD, (False, Kind.F, 0): StreamName.PP_RECV_FWD,
           (True, Kind.B, 0): StreamName.PP_SEND_BWD, (False, Kind.B, 0): StreamName.PP_RECV_BWD,
           (True, Kind.F, 1): StreamName.PP_SEND_FWD1, (False, Kind.F, 1): StreamName.PP_RECV_FWD1,
           (True, Kind.B, 1): StreamName.PP_SEND_BWD1, (False, Kind.B, 1): StreamName.PP_RECV_BWD1}


def split_layers(layers: int, chunks: int, explicit: list[int] | None) -> list[range]:
    """Layers of each virtual stage; the remainder goes to the middle stages, since the
    first and last also hold the embedding and the output layer."""
    counts = list(explicit) if explicit else _even_counts(layers, chunks)
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def _even_counts(layers: int, chunks: int) -> list[int]:
    base, extra = divmod(layers, chunks)
    counts = [base] * chunks
    middle = list(range(1, chunks - 1)) or list(range(chunks))
    order = sorted(middle, key=lambda i: abs(i - (chunks - 1) / 2))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def order(schedule: Schedule, p: int, v: int, m: int, stage: int, combined: bool = False) -> list[tuple[Kind, int, int]]:
    """The (direction :attr:`Kind.F` | :attr:`Kind.B`, micro-batch, chunk) sequence stage ``stage`` executes.
    ``combined``: one more warm-up forward, so that each steady-state forward is
    independent of the backward it is paired with (EP all-to-all overlap, :func:`steps`)."""
    if schedule == Schedule.GPIPE:
        return [(Kind.F, i, 0) for i in range(m)] + [(Kind.B, i, 0) for i in range(m)]
    total = m * v
    warmup = _warmup(schedule, p, v, m, stage, combined)
    seq = [(Kind.F, k) for k in range(warmup)]
    for k in range(total - warmup):
        seq += [(Kind.F, k + warmup), (Kind.B, k)]
    seq += [(Kind.B, k) for k in range(total - warmup, total)]
    return [(d, *_mb_chunk(d, k, p, v)) for d, k in seq]


def _warmup(schedule: Schedule, p: int, v: int, m: int, stage: int, combined: bool) -> int:
    """Forwards before the first backward (Megatron-LM schedules.py; +1 when combined, as
    its ``overlap_moe_expert_parallel_comm`` path does)."""
    if schedule == Schedule.INTERLEAVED:
        return min((p - stage - 1) * 2 + (v - 1) * p + combined, m * v)
    return min(p - stage - 1 + combined, m)


def steps(schedule: Schedule, p: int, v: int, m: int, stage: int, combined: bool, costs: tuple = zb.EQUAL) -> list[tuple]:
    """The schedule as steps of one (direction, micro-batch, chunk) each or, when
    ``combined``, steady-state pairs (forward, backward) that run as one step
    (Megatron-Core combined 1F1B, megatron/core/pipeline_parallel/combined_1f1b.py: with
    pp = 1 the first forward and the last backward run alone, every other forward
    together with the previous micro-batch's backward)."""
    if schedule in zb.ZERO_BUBBLE:
        return list(zb.steps(schedule, p, m, stage, costs))
    seq = order(schedule, p, v, m, stage, combined)
    if not combined:
        return [(item,) for item in seq]
    warmup = _warmup(schedule, p, v, m, stage, combined)
    steady = len(seq) - 2 * warmup
    return ([(item,) for item in seq[:warmup]] + [(seq[i], seq[i + 1]) for i in range(warmup, warmup + steady, 2)]
            + [(item,) for item in seq[warmup + steady:]])


def _mb_chunk(direction: Kind, k: int, p: int, v: int) -> tuple[int, int]:
    """Megatron's mapping from the k-th forward/backward to (micro-batch, chunk)."""
    group = k % (p * v)
    chunk = group // p
    if direction is Kind.B:
        chunk = v - 1 - chunk
    return (k // (p * v)) * p + k % p, chunk


def peak_in_flight(schedule: Schedule, p: int, v: int, m: int, stage: int, combined: bool = False,
                   costs: tuple = zb.EQUAL) -> int:
    """``in_flight(order(...))`` without building the order: GPipe holds all m micro-batches;
    1F1B and interleaved 1F1B hold their warm-up forwards plus the one whose backward comes
    next, at most all m * v chunks (the memory of every pipeline stage, and the planner's
    thousands of layouts, need only this)."""
    if schedule == Schedule.GPIPE:
        return m
    if schedule in zb.ZERO_BUBBLE:
        return zb.peaks(schedule, p, m, stage, costs)[0]
    return min(_warmup(schedule, p, v, m, stage, combined) + 1, m * v)


def pass_costs(ctx) -> tuple:
    """(F, B, W) of a transformer layer's forward, input-gradient and weight-gradient passes
    relative to F, to two decimals: the times ZB-H2's and ZB-V's list schedules are built
    for (the zero-bubble runtime profiles them first: runtime.py ``avg_then_mid``; here the
    compute model times one dense layer's kernels). Equal times for the other schedules."""
    if ctx.scenario.parallel.schedule not in (Schedule.ZB_H2, Schedule.ZB_V):
        return zb.EQUAL
    d, sh = ctx.dims, ctx.shard
    fwd = [*attention_pre(d, sh), attention_core(d, sh), *attention_post(d, sh), *mlp_block(d, sh)]
    f, (dgrad, wgrad) = ctx.compute.time(fwd), grad_parts(backward(fwd))
    return tuple(round(ctx.compute.time(k) / f, 2) for k in (fwd, dgrad, wgrad))


def virtual_stages_of(schedule: Schedule, p: int, v: int, stage: int) -> list[int]:
    """The virtual stages (indices into the stage split) a rank at ``stage`` holds, chunk by
    chunk: c * p + stage (interleaved), a V's s and 2p-1-s, DualPipe's s and p-1-s."""
    chunks = 2 if schedule == Schedule.DUALPIPE else v
    return [zb.virtual_stage(schedule, p, stage, c) for c in range(chunks)]


def neighbours(direction: Kind, vs: int, last: int) -> tuple[bool, bool]:
    """(receives, sends): whether a pass of ``direction`` (:attr:`Kind.F`, or a backward) on
    virtual stage ``vs`` of ``0..last`` receives its input from a neighbouring virtual stage and
    sends its output to one: a forward from vs - 1 and to vs + 1, a backward the other way
    (:mod:`.workload`'s ``open_pass`` and ``close_pass``)."""
    before, after = vs > 0, vs < last
    return (before, after) if direction is Kind.F else (after, before)


@lru_cache(maxsize=4096)
def issued(schedule: Schedule, p: int, v: int, m: int, stage: int) -> tuple[int, int]:
    """(passes, send/recv calls) the rank at ``stage`` issues in a step of ``m`` micro-batches
    beside its layers' ops: every item of its :func:`steps` is a pass (a zero-bubble W too),
    and each pass but a W receives and sends as :func:`neighbours` says. The builder charges
    the host the schedule's Python per pass (sim/model/host.py ``SCHEDULE_PASS_S``) and a c10d
    call per transfer; the planner reads these counts
    (:func:`sim.parallel.layer_program.schedule_host_s`)."""
    last = p * v - 1  # (the stage split holds p * v virtual stages: DualPipe's v is 1, DualPipeV's 2)
    if schedule not in zb.ZERO_BUBBLE:  # :func:`order`: one forward and one backward per micro-batch and chunk
        calls = sum(sum(neighbours(kind, zb.virtual_stage(schedule, p, stage, chunk), last))
                    for chunk in range(v) for kind in (Kind.F, Kind.B))
        return 2 * v * m, calls * m
    items = [item for step in steps(schedule, p, v, m, stage, False) for item in step]
    calls = sum(sum(neighbours(Kind.F if kind is Kind.F else Kind.B, zb.virtual_stage(schedule, p, stage, chunk),
                               last)) for kind, _, chunk in items if kind is not Kind.W)
    return len(items), calls


def in_flight(seq: list[tuple[Kind, int, int]]) -> int:
    """Most (micro-batch, chunk) activations held at once under a schedule."""
    held = peak = 0
    for direction, _, _ in seq:
        held += 1 if direction is Kind.F else -1
        peak = max(peak, held)
    return peak


def activation_bytes(b) -> float:
    """Bytes each rank sends per micro-batch across one boundary."""
    return b.ctx.shard.tokens * b.ctx.dims.h * ELEM / b.ctx.layout.sizes[Category.TP]


def transfer(b, direction: Kind, mb: int, src_vs: int, dst_vs: int, deps, sending: bool, chunk: int = 0) -> int:
    """One side of a send/recv between virtual stages (the rank holding a virtual stage in
    ``chunk``'s pipeline: vs % p, or as :func:`.pp_zero_bubble.stage_of` places it)."""
    layout, p = b.ctx.layout, b.ctx.layout.sizes[Category.PP]
    schedule = b.ctx.scenario.parallel.schedule
    src_stage, dst_stage = zb.stage_of(schedule, p, src_vs, chunk), zb.stage_of(schedule, p, dst_vs, chunk)
    src = layout.stage_rank(b.rank, src_stage)
    dst = layout.stage_rank(b.rank, dst_stage)
    stream = STREAMS[sending, direction, chunk if schedule in zb.ZERO_BUBBLE else 0]
    name = ("send_" if sending else "recv_") + ("act" if direction is Kind.F else "grad")
    return b.collective(name, AXIS, SEND_RECV, (src, dst), activation_bytes(b), deps, stream=stream, mb=mb,
                        tag=(direction, src_vs, dst_vs), key="p2p",
                        group_of=lambda r: (layout.stage_rank(r, src_stage), layout.stage_rank(r, dst_stage)))

