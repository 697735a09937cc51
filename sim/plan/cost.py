"""What a full simulation of a candidate costs, predicted, to budget the planner's
simulations (:mod:`.select`) deterministically.

A folded simulation runs one rank per pipeline stage (whole expert groups when routing
loads experts unevenly, sim/parallel/workload.py ``simulated_ranks``), so its work is the
ops of those ranks. But a collective whose group leaves its NVLink domain also carries the
traffic of every folded copy of it (``Context.siblings``): all ranks of the stage put
flows on the network, and the max-min fair solver re-rates them. An all-to-all leaving
the domain puts a flow on every pair of its ep ranks, in every folded copy: ``ranks x (ep -
1)`` pairs. So

    seconds = WORK_SCALE * (sim/work.py's cluster_seconds + ops_seconds(ops, simulated ranks))
              + SECONDS_PER_FLOW * flows * max(1, ranks / CROWD_RANKS)^2
              + SECONDS_PER_CP_FLOW * CP flows + SECONDS_PER_A2A_PAIR * cross-domain all-to-all pairs

The first term is the work estimate's own (issue 28: one definition, no separate guess):
``ops`` is the census's count (sim/parallel/census.py: the builder's layer programs per
micro-batch plus each chunk's pipeline transfers, :data:`PP_TRANSFERS`; tests/test_plan_cost.py
checks it against ``sim.work.estimate``'s ops, 0.65-1.03x on tiny models whose step's own ops
weigh most, 0.93-0.97x on DeepSeek-V3 layouts on 2,048 GPUs), priced by sim/work.py's
constants (``OP_S``, ``GPU_S``, ``LINK_S``). :data:`WORK_SCALE` is what a planner point costs
against that estimate, measured: the worker also checks the work budget (the census builds
a skeleton of each stage), keeps the spans and breaks the critical rank down; and this
2-core VM is shared. Measured on six DeepSeek-V3 layouts (2026-11-27, load 4-5, each point
forked as ``bench/plan_cost.py`` does, its topology built afresh): tp 2 x pp 8 x dp 128, ep 8
(v 6 interleaved / v 2 DualPipeV / 1F1B) 5.77 / 6.17 / 4.49 s of CPU where the work
estimate says 2.86 / 2.72 / 2.73 s; tp 1 x pp 4 (v 4) x dp 512, ep 8: 1.01 s (0.50); tp 1 x
dp 2,048, ep 8: 0.79 s (0.34): 1.6-2.3x, so 2. The old per-op price (8e-6 s, fitted before
the engine's later changes) underrated the pipelines 4-6x.

with ``flows`` the stage's ranks for every cross-domain gather, reduction and send, and
``CP flows`` those of the CP ring's K/V shifts across domains. A flow costs more as more
run at once (every one re-rates the others; sim/work.py's crowd factor on ops): FSDP over
4,096 ranks (405B, dp 512 x cp 2 x tp 4) measured ~20x the per-flow seconds of 1,024.
CP rings across domains are far costlier still (a K/V shift per attention chunk overlapped
with compute: 405B with cp 4 x tp 8 ran past 240 s where the flow term predicted 8 s). Groups
are Megatron's (tp-cp-dp-pp from rank 0), so whether one leaves its domain is arithmetic:
the tp*cp ranks of a CP ring, the tp*cp*dp of a data-parallel group, ep * stride of an
all-to-all. The constants are a least-squares fit (relative error) to the CPU seconds of
16 full points (scenario load, simulation, breakdown: what a planner worker runs) of the
70B, 405B and DeepSeek-V3 searches and the dg-l405-512 and dg-grok-512 published rows,
measured on the 2-core VM: predicted / measured 0.5-1.5x (docs/plan.md); the crowd and
CP terms from the two 405B points above (the CP one a lower bound). Only the budget uses
them; a simulation the predictor underrates stops at the planner's point time limit.

Issue 28 (2026-11-27, ``python bench/plan_cost.py``-style points of the DeepSeek-V3 search on
the 2-core VM at load ~12, CPU of a forked worker): the all-to-all term is per pair of ranks
it puts on the network (it was one price per all-to-all, which overrated small groups and
underrated large ones: an ep 256 layout ran past 90 s of CPU where 6.6 s was predicted): tp 1
x dp 1,024 x cp 2 with ep 16 and ep 32 (928 all-to-alls across domains each, 2,048 ranks a
stage) took 2.52 and 3.73 s, 1.2 s apart for 3.0e7 more pairs: 4e-8 s a pair. EP overlap
(combined 1F1B, sim/parallel/ep_overlap.py; its programs' op counts are those without it)
costs more than its counts say, measured at load 4-5 on the same mesh with and without it:
tp 2 x pp 8 (v 6) x dp 128, ep 8 in the domain, 7.90 s against 5.77 s (:data:`EP_OVERLAP_OPS`
1.4); tp 4 x pp 2 (v 16) x dp 256, ep 32 across domains, 20.5 s where the ops and pairs
without overlap price 10.6 s, the rest from its pairs (:data:`EP_OVERLAP_PAIRS` 2.7).
``python bench/plan.py`` prints each simulated layout's prediction against its worker's
measured CPU (docs/plan.md).
"""

import numpy as np

from .. import work
from ..input.choices import ExpertRouting, MicroBatches
from ..parallel import steady
from .layers import KINDS

# Refitted (issue 28, 2026-11-27 20:30 UTC) to 30 planner points simulated in steady-state mode, the planner's
# default now (sim/plan/inputs.py): ``python bench/plan_cost.py --only gb200 --only dsv3 --points 15 --spread
# --cap 90`` (15 picks evenly spread over each first round; each forked as a worker, its topology built afresh;
# the 2-core VM at load 11-14) printed predicted / measured 0.31-1.62x (median 0.57) with the constants before
# (WORK_SCALE 2, SECONDS_PER_FLOW 1.6e-7, SECONDS_PER_A2A_PAIR 4e-8) and 0.55-1.41x (median 0.95) refitted.
# GB200's pp 9 picks (ZB-H1, 1F1B, GPipe; 2.1-6.2 s of CPU) were 0.31-0.83x, DeepSeek-V3's ep 16 picks across
# NVLink domains 0.8-1.6x (their pairs priced too high). SECONDS_PER_CP_FLOW is not refitted: no point sent
# a CP ring across domains (the fit's term was zero), so the 405B lower bound below stays.
WORK_SCALE = 3.5  # a planner point's measured CPU / sim/work.py's estimate of its step (refit: 3.53; 1.6-2.3x at load 4-5)
PP_TRANSFERS = 4  # ops per micro-batch, chunk and stage: the forward's send and receive, the backward's
SECONDS_PER_FLOW = 2.3e-7  # one flow of a cross-domain collective, siblings included (refit: 2.27e-7; 1.58e-7 before)
SECONDS_PER_A2A_PAIR = 1.3e-8  # one pair of ranks of an all-to-all leaving the NVLink domain, copies included (refit: 1.34e-8)
SECONDS_PER_CP_FLOW = 5e-6  # one flow of a CP K/V shift across domains (> 240 s / 49.5M flows measured)
EP_OVERLAP_OPS = 1.4  # an op of a candidate with ep_comm_overlap costs this many (measured; see above)
EP_OVERLAP_PAIRS = 2.7  # and a pair of its cross-domain all-to-alls this many (measured; see above)
CROWD_RANKS = 1024  # flows of stages up to this many GPUs cost SECONDS_PER_FLOW each
COUNTS = ("ops", "dp", "cp", "ep")  # per layer kind and micro-batch: ops but FSDP's, FSDP gathers, K/V shifts, all-to-alls


def layer_counts(lp) -> tuple[int, int, int, int]:
    """:data:`COUNTS` of one layer program (sim/parallel/layer_program.py)."""
    by = lp.by_category()
    return lp.count - by["dp"], by["dp"], by["cp"], by["ep"]


def counts(c, d, s, domain: int, layer: np.ndarray, split) -> tuple[np.ndarray, ...]:
    """(ops, flows, CP flows, cross-domain all-to-all pairs, GPUs per stage) of one step's
    simulation of every candidate of table ``c`` (with its ``micro`` column: micro-batches
    per step). ``layer``: n x kinds x :data:`COUNTS` of its layer programs
    (:meth:`.estimate.Estimator._layer_costs`); ``split``: the layers of each kind of the
    whole model (one stage's :class:`.stages.Split`)."""
    tp, cp, dp, ep, etp, pp, v = (c[k].to_numpy() for k in ("tp", "cp", "dp", "ep", "expert_tp", "pp",
                                                            "virtual_stages"))
    micro, _ = simulated_micro_batches(c, s)
    zero3 = c["zero"].to_numpy() == 3
    ranks = tp * cp * dp  # GPUs of one stage: the copies a cross-domain collective carries
    cross_cp, cross_dp, cross_pp = tp * cp > domain, ranks > domain, ranks >= domain
    cross_ep = np.where(etp == tp, tp, etp) * ep > domain
    per_kind = np.array([float(getattr(split, k)[0]) for k in KINDS])  # layers of each kind, all stages
    ops_l, fsdp_l, shifts_l, a2a_l = (layer[:, :, i] @ per_kind for i in range(len(COUNTS)))
    ops = micro * (ops_l + np.where(zero3, fsdp_l, 0) + PP_TRANSFERS * v * pp * (pp > 1))
    flows = (micro * fsdp_l * zero3 * cross_dp + 2 * micro * v * pp * cross_pp) * ranks
    cp_flows = micro * shifts_l * cross_cp * ranks
    a2a_out = micro * a2a_l * cross_ep * ranks * (ep - 1)  # pairs of the simulated rank's cross-domain all-to-alls
    if uneven(s):
        ops, a2a_out = ops * ep, a2a_out * ep  # whole expert groups are simulated
    overlap = c["ep_comm_overlap"].to_numpy(dtype=bool) & (ep > 1)
    ops, a2a_out = ops * np.where(overlap, EP_OVERLAP_OPS, 1.0), a2a_out * np.where(overlap, EP_OVERLAP_PAIRS, 1.0)
    return ops.astype(float), flows.astype(float), cp_flows.astype(float), a2a_out.astype(float), ranks


def simulated_ranks(c, s) -> np.ndarray:
    """Ranks the simulation of each candidate runs: one per pipeline stage, whole expert
    groups where routing loads experts unevenly (as sim.parallel.census.simulated_ranks
    counts a clean step's; the planner plans no faults or stragglers)."""
    pp, ep = c["pp"].to_numpy(), c["ep"].to_numpy()
    return pp * np.where(uneven(s), ep, 1)


def simulated_micro_batches(c, s) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batches the simulation of each candidate of table ``c`` runs in all, and its
    runs: its ``micro`` once, or under ``[simulation] micro_batches = "steady"`` the three
    counts of its first window (sim/parallel/steady.py ``window``) where they are at most
    half its micro-batches (``steady.within_share``; a window that is not linear costs more: priced as the
    first, as sim/work.py does)."""
    micro = c["micro"].to_numpy()
    if s.simulation.micro_batches is not MicroBatches.STEADY:
        return micro, np.ones(len(micro))
    keys = list(zip(c["schedule"].to_numpy(), c["pp"].to_numpy()))
    first = {k: sum(steady.window(str(k[0]), int(k[1]))[0]) for k in set(keys)}
    total = np.fromiter((first[k] for k in keys), float, len(keys))
    cheaper = steady.within_share(total, micro)
    return np.where(cheaper, total, micro), np.where(cheaper, float(steady.COUNTS), 1.0)


def uneven(s) -> bool:
    """Whether routing loads experts unevenly, so the workload simulates whole expert groups
    (sim/parallel/workload.py: uniform routing without skew, padded token dropping and
    expert choice, which gives every expert its capacity, load them evenly and fold)."""
    moe = s.model.moe
    if moe is None:
        return False
    return not ((moe.routing is ExpertRouting.UNIFORM and moe.skew == 0) or moe.padded
                or moe.routing is ExpertRouting.EXPERT_CHOICE)


def sim_cost(c, d, s, domain: int, layer: np.ndarray, split) -> np.ndarray:
    """Predicted seconds of one full simulation of each candidate on one core (arguments
    as :func:`counts`)."""
    ops, flows, cp_flows, a2a, ranks = counts(c, d, s, domain, layer, split)
    crowd = np.maximum(1.0, ranks / CROWD_RANKS) ** 2
    _, runs = simulated_micro_batches(c, s)  # (steady mode: each run builds the cluster)
    work_s = work.cluster_seconds(s) * runs + work.ops_seconds(ops, simulated_ranks(c, s))
    return (WORK_SCALE * work_s + SECONDS_PER_FLOW * flows * crowd
            + SECONDS_PER_CP_FLOW * cp_flows + SECONDS_PER_A2A_PAIR * a2a)
