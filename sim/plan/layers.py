"""Per micro-batch costs of one layer of each kind on one rank, for the fast estimate.

Nothing here says what a layer does: the rank-program builder does, once
(:mod:`sim.parallel.layer_program` runs it over one layer of each kind for one micro-batch
on a candidate's layout). This module prices that program: compute ops take the
simulator's own durations (the same :class:`~sim.model.compute.ComputeModel`), collectives
their closed-form time (:mod:`.comm`: NCCL's tuner for reductions and gathers, bytes over
NVLink or the NIC for all-to-alls and point-to-point shifts), and the ops are scheduled on
their streams in program order, each after its dependencies, as the engine runs them. So
what a collective hides under (TP overlap's GEMM chunks, a CP ring's attention chunks, the
backward's dgrad / wgrad) is the program's, not a formula. The time past the layer's
compute is the exposed communication, attributed to the axes of the collectives on the
critical path. The host issues the ops in program order at their issue costs (``LayerOp.issue``,
sim/model/host.py) and none starts before it is issued, as in the engine; the host runs ahead
across layers, so a layer's ``host`` time is what issuing it takes beyond its makespan,
signed (a layer that runs longer than its issue gives the host a lead), and :mod:`.estimate`
clamps it at zero only summed over a stage's layers. FSDP's gathers (axis dp: their time,
and their issue as ``host_dp``) are left to :mod:`.estimate` (they hide behind the previous
layer, which a one-layer program cannot show); the MoE all-to-alls are reported as exposed here, and the schedule's EP overlap is applied by :mod:`.estimate`.
"""

from dataclasses import dataclass, field

import numpy as np

from ..collectives.kinds import ALL_TO_ALL, RING_SHIFT, SEND_RECV
from ..parallel.layer_program import Kind, LayerProgram, Phase
from ..engine.kinds import Category

KINDS = tuple(k.value for k in (Kind.DENSE, Kind.MOE, Kind.EMBEDDING, Kind.OUTPUT, Kind.MTP))
EXPOSED_AXES = (Category.TP, Category.CP, Category.EP)  # priced and scheduled; FSDP's dp gathers are priced by .estimate


@dataclass(frozen=True)
class Cost:
    """Seconds per micro-batch of one layer: forward and backward compute, recomputation,
    exposed TP, CP and EP communication."""

    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0
    host: float = 0.0  # issuing the layer less running it (< 0: the lead the host gains on it)
    host_dp: float = 0.0  # issuing its FSDP calls (axis dp: built for every candidate, run under ZeRO 3 only)
    passes: dict = field(default_factory=dict)  # the host and the GPU pass by pass (:func:`passes`: PASS_FIELDS)


class Pricer:
    """Closed-form seconds of a layer program's collectives on one cluster."""

    def __init__(self, comm, domain: int):
        self.comm, self.domain, self._memo = comm, domain, {}

    def __call__(self, c) -> float:
        if c.axis not in EXPOSED_AXES:
            return 0.0
        key = (c.op, c.nbytes, c.group, c.shares)
        found = self._memo.get(key)
        if found is None:
            domains = tuple(r // self.domain for r in c.group)
            if c.op is ALL_TO_ALL:
                found = self.comm.all_to_all(c.nbytes, domains, c.shares)
            elif c.op in (RING_SHIFT, SEND_RECV):
                found = self.comm.p2p(c.nbytes, domains)
            else:
                found = self.comm.reduce(c.op, c.nbytes, c.group)
            self._memo[key] = found
        return found


def schedule(lp: LayerProgram, price, part=None, released: bool = False, timed: tuple | None = None) \
        -> tuple[dict, dict, float]:
    """``lp``'s ops (or those of ``part``, indices in program order; ops outside it taken as done
    at 0) as the engine runs them: each on its stream in program order after its dependencies.
    Returns when each ends, the op each waited for last (-1: none, or its host), and when the
    last sync op among them ended (0: none). ``released``: the host starts with them and issues
    them in program order at their issue costs (FSDP's apart), none starts before it is issued,
    and a sync op stops the host until its end (:meth:`sim.engine.ops.RankProgram.anchors`).
    ``timed``: :func:`timed_ops` of ``lp`` and ``price``, when the caller walks it several times."""
    ops = timed_ops(lp, price) if timed is None else timed
    end, pred, last_on, host, synced = {}, {}, {}, 0.0, 0.0
    for i in range(len(ops)) if part is None else part:
        stream, deps, seconds, issue, sync = ops[i]
        before = last_on.get(stream, -1)
        start = end[before] if before >= 0 else 0.0
        if released:
            host += issue
            start, before = (host, -1) if host > start else (start, before)
        for j in deps:
            if end.get(j, 0.0) > start:
                start, before = end[j], j
        pred[i], end[i] = before, start + seconds
        last_on[stream] = i
        if sync:
            synced = end[i]
            host = max(host, end[i]) if released else host
    return end, pred, synced


def timed_ops(lp: LayerProgram, price) -> tuple:
    """Per op of ``lp``, what :func:`schedule` reads: (stream, deps, seconds (a collective's
    :class:`Pricer` time), the host's issue seconds (0.0 for FSDP's calls), sync)."""
    return tuple((op.stream, op.deps, op.duration if op.collective is None else price(op.collective),
                  0.0 if _fsdp(op) else op.issue, op.sync) for op in lp.ops)


def _fsdp(op) -> bool:
    return op.collective is not None and op.collective.axis == Category.DP


def _walk(lp: LayerProgram, price, part: list[int], released: bool, timed: tuple | None = None) \
        -> tuple[float, float]:
    """(when the GPU has run the ``part`` ops of ``lp``, when the last sync op among them ended;
    0: none): :func:`schedule` of them."""
    end, _, synced = schedule(lp, price, part, released, timed)
    return max(end.values(), default=0.0), synced


# Per pass (forward; backward with its recompute), split after its last sync op (pre: up to it;
# post: the rest, or the whole pass without one): the host's issue seconds (I), when the GPU has
# run the ops alone (M) and issued by a host starting with them (Q), the sync op's own M and Q,
# whether it has one, and the FSDP calls' issue (ZeRO 3 only).
PASS_PARTS = ("i_pre", "m_pre", "q_pre", "m_sync", "q_sync", "i_post", "m_post", "q_post", "sync", "dp")
PASS_FIELDS = tuple(f"{d}_{p}" for d in ("fwd", "bwd") for p in PASS_PARTS)


def passes(lp: LayerProgram, price, timed: tuple | None = None) -> dict:
    """:data:`PASS_FIELDS` of ``lp``: what :func:`stage_waits` needs to run the host beside the
    GPU pass by pass. A sync op (the host reading GPU values: the MoE dispatcher's split sizes,
    sim/parallel/ep.py) stops the host until the GPU gets there, so the lead the host had built
    (a layer whose GPU time outlasts its issue: the output head) is lost there, which a sum of
    per-layer excesses cannot show."""
    out, timed = {}, timed_ops(lp, price) if timed is None else timed
    for name, backward in (("fwd", False), ("bwd", True)):
        ops = [i for i, op in enumerate(lp.ops) if (op.phase is not Phase.FORWARD) == backward]
        last = max((k for k, i in enumerate(ops) if lp.ops[i].sync), default=-1)
        pre, post = ops[:last + 1], ops[last + 1:]
        (m_pre, m_sync), (q_pre, q_sync) = _walk(lp, price, pre, False, timed), _walk(lp, price, pre, True, timed)
        values = dict(i_pre=sum(lp.ops[i].issue for i in pre if not _fsdp(lp.ops[i])), m_pre=m_pre, q_pre=q_pre,
                      m_sync=m_sync, q_sync=q_sync, i_post=sum(lp.ops[i].issue for i in post if not _fsdp(lp.ops[i])),
                      m_post=_walk(lp, price, post, False, timed)[0], q_post=_walk(lp, price, post, True, timed)[0],
                      sync=float(last >= 0), dp=sum(lp.ops[i].issue for i in ops if _fsdp(lp.ops[i])))
        out.update({f"{name}_{k}": v for k, v in values.items()})
    return out


def cost(lp: LayerProgram, price) -> Cost:
    """Schedule ``lp``'s ops on their streams (:func:`schedule`); the exposed time
    (makespan less compute) split over the axes by their collectives' time on the critical
    path, and how much longer issuing the layer takes than running it (signed)."""
    n, timed = len(lp.ops), timed_ops(lp, price)
    end, pred, _ = schedule(lp, price, timed=timed)
    # The host runs ahead of the GPU across layers (it never blocks inside a step): a layer
    # that runs longer than it takes to issue (the output layer's GEMM) gives the host a lead
    # that later layers' issue can use up. So the excess is kept signed here and summed over a
    # stage's layers before it is clamped at zero (sim/plan/estimate.py ``_shape``).
    fsdp_issue = sum(op.issue for op in lp.ops if _fsdp(op))
    issued = sum(op.issue for op in lp.ops) - fsdp_issue
    seconds = {p: lp.compute_s(p) for p in Phase}
    on_path = dict.fromkeys(EXPOSED_AXES, 0.0)
    i = max(range(n), key=end.__getitem__) if n else -1
    while i >= 0:
        c = lp.ops[i].collective
        if c is not None and c.axis in on_path:
            on_path[c.axis] += price(c)
        i = pred[i]
    exposed = max(0.0, (max(end.values()) if n else 0.0) - sum(seconds.values()))
    total = sum(on_path.values())
    share = {a: exposed * t / total if total > 0 else 0.0 for a, t in on_path.items()}
    return Cost(seconds[Phase.FORWARD], seconds[Phase.BACKWARD], seconds[Phase.RECOMPUTE], **share,
                host=issued - (max(end.values()) if n else 0.0), host_dp=fsdp_issue, passes=passes(lp, price, timed))


def costs(programs: dict, price) -> dict[str, Cost]:
    """Every kind's cost (a kind the model lacks: zero; a dense model's MoE column: its
    dense layer's)."""
    out = {k.value: cost(lp, price) for k, lp in programs.items()}
    out.setdefault(Kind.MOE.value, out.get(Kind.DENSE.value, Cost()))
    out.setdefault(Kind.DENSE.value, Cost())
    out.setdefault(Kind.MTP.value, Cost())
    return out


FORWARD_ORDER = tuple(KINDS.index(k.value) for k in (Kind.EMBEDDING, Kind.DENSE, Kind.MOE, Kind.MTP, Kind.OUTPUT))


def _pass(v: dict, lead, zero3):
    """One pass from a GPU ``lead`` (its queued work, in seconds past the host's clock): (the
    GPU's advance, the lead after). Without a sync op the GPU ends at max(lead + M, Q); with one
    the host waits at it until max(lead + M, Q) of the sync op, and the rest runs from there."""
    shift = zero3 * v["dp"]  # (ZeRO 3: the host issues the layer's FSDP calls first)
    sync = v["sync"] > 0
    e_pre = np.maximum(lead + v["m_pre"], v["q_pre"] + shift)
    host = np.where(sync, np.maximum(v["i_pre"] + shift, np.maximum(lead + v["m_sync"], v["q_sync"] + shift)), 0.0)
    queued = np.where(sync, np.maximum(e_pre - host, 0.0), lead)
    post_shift = np.where(sync, 0.0, shift)
    end = host + np.maximum(queued + v["m_post"], v["q_post"] + post_shift)
    return end - lead, end - host - v["i_post"] - post_shift


def _host_only(seconds) -> dict:
    """:data:`PASS_PARTS` of host work that issues no GPU op (the schedule's Python, the
    pipeline's send/recv calls): the next op cannot start before it is done."""
    zero = np.zeros_like(seconds)
    return dict.fromkeys(PASS_PARTS, zero) | dict(i_post=seconds, q_post=seconds)


def stage_waits(counts, parts: dict, zero3, beside=None, cycles: int = 2):
    """Seconds per micro-batch each stage's GPU waits for its host (n x stages): its passes in
    the builder's order (embedding, dense, MoE, MTP, output forward; the reverse backward), each
    layer's GPU run beside its host (:func:`_pass`) from the lead the one before left, less the
    GPU's own time; the last of ``cycles`` micro-batches (a steady state: the lead the last
    passes leave carries into the next micro-batch). ``parts``: :data:`PASS_FIELDS` -> n x KINDS;
    ``beside``: each stage's host seconds per micro-batch outside its layers (n x stages:
    ``layer_program.schedule_host_s``), half before the forward layers, half before the backward."""
    rows = distinct_rows([*parts.values(), zero3[:, None]] + ([] if beside is None else [beside]))
    if rows is not None:  # each row is walked alone: walk each distinct one once
        first, inverse = rows
        return stage_waits(counts, {k: v[first] for k, v in parts.items()}, zero3[first],
                           None if beside is None else beside[first], cycles)[inverse]
    n = len(zero3)
    order = [(k, "fwd") for k in FORWARD_ORDER] + [(k, "bwd") for k in reversed(FORWARD_ORDER)]
    out = np.zeros((n, counts.shape[0]))
    for s in range(counts.shape[0]):
        steps = [(int(counts[s, k]), {p: parts[f"{d}_{p}"][:, k] for p in PASS_PARTS}) for k, d in order
                 if counts[s, k] > 0]
        if beside is not None:
            half = (1, _host_only(beside[:, s] / 2))
            forwards = sum(counts[s, k] > 0 for k in FORWARD_ORDER)
            steps = [half] + steps[:forwards] + [half] + steps[forwards:]
        lead = np.zeros(n)
        for _cycle in range(cycles):
            waits = np.zeros(n)
            for c, v in steps:
                for _layer in range(c):
                    advance, lead = _pass(v, lead, zero3)
                    waits += advance - v["m_pre"] - v["m_post"]
        out[:, s] = waits
    return out


def distinct_rows(columns: list, share: float = 0.5):
    """(the first row of each distinct row, each row's distinct row) of the 2-d arrays
    ``columns`` side by side, rows compared bit for bit (0.0 and -0.0 apart); None where
    more than ``share`` of the rows are distinct (nothing to save)."""
    table = np.ascontiguousarray(np.column_stack([np.asarray(c, dtype=float) for c in columns]))
    if len(table) < 2:
        return None
    keys = table.view(np.dtype((np.void, table.dtype.itemsize * table.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return None if len(first) > share * len(table) else (first, inverse.ravel())
