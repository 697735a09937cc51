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

from dataclasses import dataclass

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
                found = self.comm.reduce(c.op, c.nbytes, domains)
            self._memo[key] = found
        return found


def schedule(lp: LayerProgram, price) -> tuple[list[float], list[int]]:
    """When each of ``lp``'s ops ends, scheduled on its stream in program order after its
    dependencies, and the op each waited for last (-1: none)."""
    n = len(lp.ops)
    end, pred, last_on = [0.0] * n, [-1] * n, {}
    for i, op in enumerate(lp.ops):
        start, before = 0.0, last_on.get(op.stream, -1)
        if before >= 0:
            start = end[before]
        for j in op.deps:
            if end[j] > start:
                start, before = end[j], j
        pred[i] = before
        end[i] = start + (op.duration if op.collective is None else price(op.collective))
        last_on[op.stream] = i
    return end, pred


def cost(lp: LayerProgram, price) -> Cost:
    """Schedule ``lp``'s ops on their streams (:func:`schedule`); the exposed time
    (makespan less compute) split over the axes by their collectives' time on the critical
    path, and how much longer issuing the layer takes than running it (signed)."""
    n = len(lp.ops)
    end, pred = schedule(lp, price)
    # The host runs ahead of the GPU across layers (it never blocks inside a step): a layer
    # that runs longer than it takes to issue (the output layer's GEMM) gives the host a lead
    # that later layers' issue can use up. So the excess is kept signed here and summed over a
    # stage's layers before it is clamped at zero (sim/plan/estimate.py ``_shape``).
    fsdp_issue = sum(op.issue for op in lp.ops if op.collective is not None and op.collective.axis == Category.DP)
    issued = sum(op.issue for op in lp.ops) - fsdp_issue
    seconds = {p: lp.compute_s(p) for p in Phase}
    on_path = dict.fromkeys(EXPOSED_AXES, 0.0)
    i = max(range(n), key=end.__getitem__) if n else -1
    while i >= 0:
        c = lp.ops[i].collective
        if c is not None and c.axis in on_path:
            on_path[c.axis] += price(c)
        i = pred[i]
    exposed = max(0.0, (max(end) if n else 0.0) - sum(seconds.values()))
    total = sum(on_path.values())
    share = {a: exposed * t / total if total > 0 else 0.0 for a, t in on_path.items()}
    return Cost(seconds[Phase.FORWARD], seconds[Phase.BACKWARD], seconds[Phase.RECOMPUTE], **share,
                host=issued - (max(end) if n else 0.0), host_dp=fsdp_issue)


def costs(programs: dict, price) -> dict[str, Cost]:
    """Every kind's cost (a kind the model lacks: zero; a dense model's MoE column: its
    dense layer's)."""
    out = {k.value: cost(lp, price) for k, lp in programs.items()}
    out.setdefault(Kind.MOE.value, out.get(Kind.DENSE.value, Cost()))
    out.setdefault(Kind.DENSE.value, Cost())
    out.setdefault(Kind.MTP.value, Cost())
    return out
