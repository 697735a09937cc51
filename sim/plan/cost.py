"""What a full simulation of a candidate costs, predicted, to budget the planner's
simulations (:mod:`.select`) deterministically.

A folded simulation runs one rank per pipeline stage (whole expert groups when routing
loads experts unevenly, sim/parallel/workload.py ``simulated_ranks``), so its work is the
ops of those ranks. But a collective whose group leaves its NVLink domain also carries the
traffic of every folded copy of it (``Context.siblings``): all ranks of the stage put
flows on the network, and the max-min fair solver re-rates them. An all-to-all leaving
the domain puts a flow on every pair of its ep ranks, in every folded copy: ``ranks x (ep -
1)`` pairs. So

    seconds = WORK_SCALE * (sim/work.py's cluster_seconds + ops_seconds(ops, folded ranks))
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
(Stop 52: the refit below prices flows far lower; a CP ring across domains, once measured past
240 s for 405B cp 4 x tp 8, took 9.1 s at dceb139.) ``folded ranks``: the ranks the workload
simulates (:func:`folded_ranks`: one a stage, or more where a stage straddles a domain). Groups
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
from ..input.load import topology_spec
from ..parallel import census, steady
from ..parallel.layout import Layout
from .layers import KINDS

# Refitted (issue 28, 2026-11-27 20:30 UTC) to 30 planner points simulated in steady-state mode, the planner's
# default now (sim/plan/inputs.py): ``python bench/plan_cost.py --only gb200 --only dsv3 --points 15 --spread
# --cap 90`` (15 picks evenly spread over each first round; each forked as a worker, its topology built afresh;
# the 2-core VM at load 11-14) printed predicted / measured 0.31-1.62x (median 0.57) with the constants before
# (WORK_SCALE 2, SECONDS_PER_FLOW 1.6e-7, SECONDS_PER_A2A_PAIR 4e-8) and 0.55-1.41x (median 0.95) refitted.
# Refitted again (stop 52, 2026-11-28, i28-plancost) to 33 points of the 405B, 70B, GB200 and DeepSeek-V3 searches
# measured at load 2-6 (bench/measured/plan-cost-2026-11-28.jsonl; tests/test_plan_cost.py keeps each within 2x),
# with the folded ranks the workload really simulates (:func:`folded_ranks`): the constants above predicted
# 3.7-34x the 405B points' CPU (the CP term alone 41 s on a tp 8 x cp 2 pick that took 6.5 s), 2.5-4.2x the 70B
# ones, 1.6-4.4x GB200's (0.77-34x over all 33). Least squares on the 405B, 70B and GB200 points
# (bench/plan_cost.py ``refit``): WORK_SCALE 1.05, SECONDS_PER_FLOW 5.8e-9, SECONDS_PER_CP_FLOW 0 (the bound below
# kept instead); on the DeepSeek-V3 points alone WORK_SCALE 2.32. Per op of the work estimate, the 405B points
# cost 1.0-1.35x, the 70B 0.9-1.2x, GB200's 0.45-1.3x (its pipelines ~1.8x, ZB-H1 and 1F1B alike), DeepSeek-V3's
# small in-domain ones up to 2.9x (not found why: the work estimate's per-op price does not tell these apart),
# so WORK_SCALE takes the one global value that centres the 33 points' range on 1 (the geometric mean of its
# ends at WORK_SCALE 1): 1.46, 0.50-1.98x (median 1.17). SECONDS_PER_A2A_PAIR: the DeepSeek-V3 refit 1.5e-8: kept.
WORK_SCALE = 1.46  # a planner point's measured CPU / sim/work.py's estimate of its step (3.5 at load 11-14)
PP_TRANSFERS = 4  # ops per micro-batch, chunk and stage: the forward's send and receive, the backward's
SECONDS_PER_FLOW = 6e-9  # one flow of a cross-domain collective, siblings included (refit: 5.8e-9; 2.3e-7 before)
SECONDS_PER_A2A_PAIR = 1.3e-8  # one pair of ranks of an all-to-all leaving the NVLink domain, copies included (refit: 1.34e-8)
# one flow of a CP K/V shift across domains: 405B tp 8 x pp 4 (v 16) x dp 128 x cp 4 on 16,384 H100, 49.5M such
# flows, took 9.1 s of CPU where its work term prices 8.3 s: at most (9.1 - 8.3) / 49.5M (5e-6 before, a lower
# bound from the same layout's > 240 s at an older engine)
SECONDS_PER_CP_FLOW = 1.5e-8
EP_OVERLAP_OPS = 1.4  # an op of a candidate with ep_comm_overlap costs this many (measured; see above)
EP_OVERLAP_PAIRS = 2.7  # and a pair of its cross-domain all-to-alls this many (measured; see above)
CROWD_RANKS = 1024  # flows of stages up to this many GPUs cost SECONDS_PER_FLOW each
COUNTS = ("ops", "dp", "cp", "ep")  # per layer kind and micro-batch: ops but FSDP's, FSDP gathers, K/V shifts, all-to-alls


def layer_counts(lp) -> tuple[int, int, int, int]:
    """:data:`COUNTS` of one layer program (sim/parallel/layer_program.py)."""
    by = lp.by_category()
    return lp.count - by["dp"], by["dp"], by["cp"], by["ep"]


def counts(c, d, s, domain: int, layer: np.ndarray, split, folded: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """(ops, flows, CP flows, cross-domain all-to-all pairs, GPUs per stage) of one step's
    simulation of every candidate of table ``c`` (with its ``micro`` column: micro-batches
    per step). ``layer``: n x kinds x :data:`COUNTS` of its layer programs
    (:meth:`.estimate.Estimator._layer_costs`); ``split``: the layers of each kind of the
    whole model (one stage's :class:`.stages.Split`); ``folded``: :func:`folded_ranks` of
    ``c`` where the caller has it already."""
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
    folded = folded_ranks(c, s) if folded is None else folded
    ops = ops * folded / pp  # the ranks the workload simulates, one per stage where it folds
    if uneven(s):
        a2a_out = a2a_out * ep  # whole expert groups are simulated
    overlap = c["ep_comm_overlap"].to_numpy(dtype=bool) & (ep > 1)
    ops, a2a_out = ops * np.where(overlap, EP_OVERLAP_OPS, 1.0), a2a_out * np.where(overlap, EP_OVERLAP_PAIRS, 1.0)
    return ops.astype(float), flows.astype(float), cp_flows.astype(float), a2a_out.astype(float), ranks


def simulated_ranks(c, s) -> np.ndarray:
    """Ranks the simulation of each candidate runs: one per pipeline stage, whole expert
    groups where routing loads experts unevenly (as sim.parallel.census.simulated_ranks
    counts a clean step's; the planner plans no faults or stragglers)."""
    pp, ep = c["pp"].to_numpy(), c["ep"].to_numpy()
    return pp * np.where(uneven(s), ep, 1)


def folded_ranks(c, s) -> np.ndarray:
    """Ranks the simulation of each candidate runs, as the workload folds them
    (sim/parallel/workload.py ``folding``, what sim/parallel/census.py ``simulated_ranks``
    counts): :func:`simulated_ranks` where every group block (tp, tp x cp, a stage's tp x cp x
    dp, an expert group's span) divides or is a multiple of each placement column's size
    (NVLink domain, server, scalable unit; sim/hardware/rails.py ``placement``) and the world is
    whole units, so every rank of a stage routes alike; otherwise the fold itself, once per
    layout (a GB200 NVL72 stage of 64 ranks straddles its 72-GPU domains: tp 1 x pp 18 x dp 64
    simulates 144 ranks, not 18; docs/plan.md "The predictor's folding")."""
    base = simulated_ranks(c, s)
    spec = topology_spec(s)
    tp, cp, dp, pp, ep, etp = (c[k].to_numpy() for k in ("tp", "cp", "dp", "pp", "ep", "expert_tp"))
    sizes = (spec.gpus_per_domain, spec.gpus_per_node, spec.gpus_per_node * spec.nodes_per_su)
    blocks = (tp, tp * cp, tp * cp * dp, np.where(etp == tp, tp, etp) * ep)
    aligned = np.ones(len(base), bool) & (s.cluster.gpus % sizes[2] == 0)
    for b in blocks:
        for n in sizes:
            aligned &= (n % b == 0) | (b % n == 0)
    out = base.astype(float)
    for i in np.flatnonzero(~aligned):
        out[i] = _folded(s, spec, int(tp[i]), int(cp[i]), int(dp[i]), int(pp[i]), int(ep[i]), int(etp[i]))
    return out


def _folded(s, spec, *key: int) -> int:
    """The workload's simulated ranks of one layout ``(tp, cp, dp, pp, ep, expert_tp)`` of
    scenario ``s``'s cluster (cached per spec, model and layout)."""
    full = (spec, s.model.name, uneven(s), key)
    if full not in _FOLDS:
        tp, cp, dp, pp, ep, etp = key
        p = s.parallel.model_copy(update=dict(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, expert_tp=etp, dp_shard=None))
        _FOLDS[full] = census.ranks_of(s, Layout.from_parallel(p), spec, uneven(s))
    return _FOLDS[full]


_FOLDS: dict = {}  # (spec, model, uneven, layout) -> simulated ranks


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


def terms(c, d, s, domain: int, layer: np.ndarray, split) -> np.ndarray:
    """n x :data:`TERMS` of each candidate (arguments as :func:`counts`): the work estimate's
    seconds of its simulated ranks, its cross-domain flows times their crowd factor, CP flows
    and all-to-all pairs; :func:`sim_cost` weighs them by :data:`CONSTANTS`."""
    folded = folded_ranks(c, s)
    ops, flows, cp_flows, a2a, ranks = counts(c, d, s, domain, layer, split, folded)
    crowd = np.maximum(1.0, ranks / CROWD_RANKS) ** 2
    _, runs = simulated_micro_batches(c, s)  # (steady mode: each run builds the cluster)
    work_s = work.cluster_seconds(s) * runs + work.ops_seconds(ops, folded)
    return np.stack([work_s, flows * crowd, cp_flows, a2a], axis=1)


TERMS = ("work_s", "flows", "cp_flows", "a2a_pairs")  # :func:`terms`'s columns
CONSTANTS = ("WORK_SCALE", "SECONDS_PER_FLOW", "SECONDS_PER_CP_FLOW", "SECONDS_PER_A2A_PAIR")  # their prices


def sim_cost(c, d, s, domain: int, layer: np.ndarray, split) -> np.ndarray:
    """Predicted seconds of one full simulation of each candidate on one core (arguments
    as :func:`counts`)."""
    return terms(c, d, s, domain, layer, split) @ np.array([globals()[k] for k in CONSTANTS])
