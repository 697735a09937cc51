"""The work a simulation will do, estimated before anything big is built.

:func:`estimate` counts, from the scenario alone, what drives a run's time and memory:
the ops of the simulated ranks (:mod:`sim.parallel.census` asks the workload how many
ranks it simulates and counts a rank's ops), the GPUs (graph nodes, routes, the traffic
of folded ranks), the fabric's leaf-spine links, the router scores drawn (tokens x
experts), the expert kernels timed and, where routing loads experts unevenly (whole
expert groups simulated), the all-to-alls of the simulated ranks: each is a transfer on
every pair of its group that the network re-rates together with the others in flight
(max-min solves over connected components, sim/engine/maxmin.py), which costs far more
than an op's own events. Each is priced with a constant measured on this
machine by ``python bench/work.py`` (CPU seconds and bytes per unit; wall time is CPU
time on an idle machine). :func:`check` refuses a scenario whose estimate exceeds the
budget with an InputError naming the key that drives the cost (exit 2); ``--force`` on
``clustersim run`` / ``plot`` (``simulate(..., force=True)``) runs it anyway.

Run ``python -c "import sim, sim.work as w; print(w.estimate(sim.load_scenario('scenarios/gpt3-175b-ptd.toml')))"``;
``python bench/work.py --cases`` prints the estimate against measured runs, case by case.

:func:`watchdog` stops a run past 20x its estimate of CPU; it and the planner point's CPU limit
(sim/plan/explain.py ``cpu_limit``) are both :func:`cpu_deadline`, the process's one CPU timer,
nestable (a point's limit wraps a simulation's watchdog).
"""

from contextlib import contextmanager
import dataclasses
from dataclasses import dataclass
import math
import os
import signal
import threading
import time

import numpy as np

from . import bounds
from .errors import InputError, SimulationError
from .hardware.faults import perturbed
from .input.load import clean_copy, topology_spec
from .input.choices import MicroBatches
from .parallel import census, steady
from .parallel.layout import Layout
from .engine.maxmin import MEMO_BYTES

# Per-unit costs, rounded up from `python bench/work.py` on the 2-core VM (CPU seconds; the
# probe isolating each; estimate / measured for it in brackets after the change):
OP_S, OP_BYTES = 25e-6, 650.0  # per op: build + engine + spans (gpt3-175b-ptd 15 us, 662 B per estimated op;
#                                jitter-dp-1k, every rank simulated, 17 us, 1.2 KB) [1.6x, 1.3-2.1x]; since
#   programs are built once per stage and copied (sim/parallel/copies.py): gpt3-175b-ptd 7.4 us, 549 B;
#   jitter-dp-1k 10.5 us, 872 B; 405B on 16k GPUs with a straggler (64 ranks) 10.1 us, 925 B with its
#   16,384 GPUs; with sampled jitter (512 ranks) 6.3 us, 453 B [CPU 2.4-4.1x, memory 1.6-2.2x]. Bytes
#   re-fitted 2026-11-27 (i28-moe, `python bench/work.py --case NAME`, after the programs', engine's
#   and spans table's memory cuts of docs/scaling.md): peak RSS past the interpreter, GPUs and links
#   per op 378 B (gpt-1t-384), 501 (gpt3-175b), 510 (405b-straggler), 526 (405b-1k-192), 456
#   (dsv3-128gpu-64), 620 (mixtral-8x7b-tc), 636 (qwen-128gpu-64): 650, above every row (est /
#   measured 1.05-1.69x; with 900 1.14-2.00x, which refused bench/step.py's gpt-1t, 5.0M ops, at 4.4
#   GiB: measured whole 2.04 GB, 370 B an op, 201 s CPU at load ~10; now 3.2 GiB, 126 s, not refused)
GPU_S, GPU_BYTES = 130e-6, 11e3  # per GPU of the cluster (llama3-70b FSDP on 16k: 114 us, 10.6 KB) [1.2x, 1.1x]
LINK_S, LINK_BYTES = 20e-6, 1.6e3  # per leaf-spine link (2,048 spines: 17 us, 1.6 KB) [1.1x, 1.1x]
SCORE_S, SCORE_BYTES = 170e-9, 16.0  # per router score sorted (token choice 0.1 us; expert choice, whole batch
#                                      at once, 0.17 us), bytes per score held at once [1.7x, 1.1x]
CROWD_RANKS, CROWD_EXP = 1024, 0.6  # per-op cost grows as (ranks simulated / 1024)^0.6 past 1,024 ranks
#   (more transfers in flight share each max-min solve; jitter-dp-1k at 4,096 GPUs: 39 us per op) [1.5x]
JITTER_DRAW_BYTES = 32.0  # a jittered rank draws its multipliers 4,096 at a time, as Python floats
KERNEL_S = 170e-9  # per expert kernel timed: the compute-time memo hashes each op's kernel list (0.14 us) [1.2x]
# Per all-to-all of a simulated rank under uneven routing (whole expert groups simulated), on
# top of its op's cost: the network re-rates it with everything in flight, more so as more ranks
# run at once: A2A_S x (ranks / A2A_RANKS)^A2A_EXP CPU s, A2A_BYTES x (ranks / A2A_RANKS)^A2A_BYTES_EXP
# bytes. Fitted by `python bench/work.py --fit ROWS` to rows of `python bench/work.py --cases --json
# ROWS` measured on the 2-core VM at load 11-13 (CPU seconds scaled by 0.523, the dense rows'
# median estimate / measured then, so the dense constants above stay as calibrated): per
# all-to-all, Mixtral 8x7B token choice on 64 H100 (8 ranks, 8 and 32 experts, 8 to 32
# micro-batches) 93-197 us, 0-1.2 KB; 32 experts over ep 16 and 32 (16, 32 ranks) 226 and 181 us,
# 1.2 and 1.6 KB; Qwen3-235B-A22B (bench/step.py `qwen`) at 128 sequences, 256 ranks, 98,304
# all-to-alls: 257 s CPU (134 s scaled), 2.02 GB peak RSS: 1,071 us and 6.7 KB each (its rate
# memos not yet bounded). Fit 1.21e-4 s ^ 0.59, 823 B ^ 0.58 [est / measured 0.6-1.6x CPU].
A2A_RANKS = 8
A2A_S, A2A_EXP = 1.3e-4, 0.6
A2A_BYTES, A2A_BYTES_EXP = 900.0, 0.6
# The bytes were fitted while the network's rate memos grew without bound; they are least
# recently used memos of MEMO_BYTES each now (sim/engine/maxmin.py: the network's, and the
# component solver's two), so the all-to-alls' memory is at most theirs. Measured (i28-moe,
# `python bench/work.py --case NAME`, docs/scaling.md): `qwen-128` 0.744 GB peak RSS where
# the estimate said 2.07 GB (0.71 GB of it this term), `qwen-128gpu-64` 0.28 GB against 0.53,
# `dsv3-128gpu-64` 0.375 GB against 0.96.
A2A_BYTES_MAX = 3 * MEMO_BYTES
BASE_BYTES = 150e6  # the interpreter with numpy, pandas, networkx, simpy and pydantic loaded (124 MiB)

BUDGET_S = 300.0  # five minutes of CPU: past it, say so and let --force decide
BUDGET_BYTES = 4 * 2**30  # 4 GiB: this machine's 24 GiB are shared by eight users
WATCHDOG_FACTOR, WATCHDOG_MIN_S = 20.0, 120.0  # a run past 20x its estimate (and 2 min) of CPU is stuck


@dataclass(frozen=True)
class Work:
    """What one ``simulate()`` will do, and what it will cost (estimated)."""

    ranks: int  # ranks simulated (the perturbed run's, when stragglers/jitter/faults fold nothing)
    ops: int  # ops of every simulated program, the clean baseline's included
    events: int  # SimPy events (~3 per op, bench/work.py)
    gpus: int
    fabric_links: int  # leaf-spine links
    scores: int  # router scores drawn per step (tokens x experts)
    expert_kernels: int
    alltoalls: int  # all-to-alls of the simulated ranks re-rated with whole expert groups (uneven routing)
    seconds: float  # CPU seconds, estimated
    bytes: float  # peak memory, estimated
    driver: str  # the key that drives the larger share of the cost
    counted: bool = True  # False: the ops were not counted (the rest alone is past the budget, :func:`check`)

    def describe(self) -> str:
        """One line: the estimate and its parts."""
        ops = f"{self.ops // max(self.ranks, 1):,} ops" if self.counted else "ops not counted"
        return cost_text(self.seconds, self.bytes, f"{self.ranks:,} ranks x {ops}, "
                         f"{self.gpus:,} GPUs, {self.fabric_links:,} fabric links, {self.scores:,} router scores, "
                         f"{self.expert_kernels:,} expert kernels, {self.alltoalls:,} uneven all-to-alls")


def estimate(s, count_ops: bool = True) -> Work:
    """The work of ``simulate(s)`` for a checked scenario (sim.load_scenario's result). In
    steady-state mode (``[simulation] micro_batches = "steady"``), what runs: the scenario at
    each of its few micro-batch counts (sim/parallel/steady.py), one after the other (CPU
    summed; memory the largest run's, sim/steady.py keeps only the last run's spans), or the
    exact step where steady mode does not apply."""
    if s.simulation.micro_batches is MicroBatches.STEADY:
        plan = steady.counts(s)
        if plan.eligible:
            runs = [_estimate(steady.at(s, m), count_ops) for m in plan.simulated]
            last = runs[-1]
            return dataclasses.replace(last, ops=sum(w.ops for w in runs), events=sum(w.events for w in runs),
                                       seconds=sum(w.seconds for w in runs), bytes=max(w.bytes for w in runs))
        return _estimate(steady.at(s, plan.real), count_ops)
    return _estimate(s, count_ops)


def _estimate(s, count_ops: bool = True) -> Work:
    """:func:`estimate` of one exact step (``count_ops=False``: without the ops, whose count
    builds a rank's program: what the other parts cost)."""
    ranks, per_rank = census.simulated_ranks(s), census.ops_per_rank(s) if count_ops else 0
    ops = ranks * per_rank
    if perturbed(s):  # the clean baseline
        ops += census.simulated_ranks(clean_copy(s)) * per_rank
    gpus, links = s.cluster.gpus, fabric_links(s)
    scores, held = census.routed_scores(s)
    kernels = census.expert_kernels(s) * ranks
    a2a = census.alltoalls(s) * ranks if census.uneven_routing(s, Layout.from_parallel(s.parallel)) else 0
    draws = ranks * max(per_rank, 4096) * JITTER_DRAW_BYTES if s.jitter.sigma > 0 else 0.0
    parts = {"ops": (ops_seconds(ops, ranks), ops * OP_BYTES + draws), "gpus": (gpus * GPU_S, gpus * GPU_BYTES),
             "links": (links * LINK_S, links * LINK_BYTES), "scores": (scores * SCORE_S, held * SCORE_BYTES),
             "kernels": (kernels * KERNEL_S, 0.0),
             "alltoalls": alltoall_part(a2a, ranks)}
    seconds = sum(t for t, _ in parts.values())
    # the router scores are held while the context is made, before any program is built, and
    # freed then: a peak of their own, not on top of the run's (build-phase peak RSS 0.19 and
    # 0.28 GB against 0.28 and 0.74 GB at the spans table, `qwen-128gpu-64`, `qwen-128`)
    nbytes = BASE_BYTES + max(parts["scores"][1], sum(b for name, (_, b) in parts.items() if name != "scores"))
    share = {name: t / BUDGET_S + b / BUDGET_BYTES for name, (t, b) in parts.items()}
    return Work(ranks, ops, 3 * ops, gpus, links, scores, kernels, a2a, seconds, nbytes,
                _driver(s, max(share, key=share.get), ranks), count_ops)


def ops_seconds(ops, ranks):
    """CPU seconds of ``ops`` ops of ``ranks`` simulated ranks: :data:`OP_S` each, more as more
    ranks run at once (:data:`CROWD_RANKS`). Plain numbers or numpy arrays (the planner prices
    every candidate with it, sim/plan/cost.py)."""
    if isinstance(ranks, np.ndarray):
        return ops * OP_S * np.maximum(1.0, ranks / CROWD_RANKS) ** CROWD_EXP
    return ops * OP_S * max(1.0, ranks / CROWD_RANKS) ** CROWD_EXP


def cluster_seconds(s) -> float:
    """CPU seconds of the cluster's own part of a step's simulation: its GPUs and fabric links
    (what every layout of the cluster pays, sim/plan/cost.py)."""
    return s.cluster.gpus * GPU_S + fabric_links(s) * LINK_S


def alltoall_part(a2a: int, ranks: int) -> tuple[float, float]:
    """(CPU s, bytes) of ``a2a`` uneven all-to-alls among ``ranks`` simulated ranks."""
    crowd = max(1.0, ranks / A2A_RANKS)
    return a2a * A2A_S * crowd ** A2A_EXP, min(a2a * A2A_BYTES * crowd ** A2A_BYTES_EXP, A2A_BYTES_MAX)


def check(s, budget_s: float | None = None, budget_bytes: float | None = None) -> Work:
    """The estimate, or InputError naming the key that drives the cost when it exceeds
    the budget (default :data:`BUDGET_S`, :data:`BUDGET_BYTES`). The parts that need no
    program built are estimated first: where they alone exceed the budget, the refusal comes
    without counting the ops (counting them builds a rank's program, which for a million
    tokens over 16k experts is itself seconds of CPU; tests/test_hostile.py)."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    budget_bytes = BUDGET_BYTES if budget_bytes is None else budget_bytes
    rest = estimate(s, count_ops=False)
    refuse_past_budget(rest, "this scenario would need more than", rest.describe(), budget_s, budget_bytes)
    work = estimate(s)
    refuse_past_budget(work, "this scenario would need", work.describe(), budget_s, budget_bytes)
    return work


def cost_text(seconds: float, nbytes: float, parts: str) -> str:
    """One estimate as people read it: ``~S s of CPU and B GiB (parts)`` (every work estimate's
    ``describe``: this module's, the planner's and the RL loop's)."""
    return f"~{seconds:,.0f} s of CPU and {nbytes / 2**30:,.1f} GiB ({parts})"


def refuse_past_budget(work, what: str, need: str, budget_s: float = BUDGET_S,
                       budget_bytes: float = BUDGET_BYTES) -> None:
    """InputError naming ``work.driver`` when ``work`` (anything with ``seconds``, ``bytes``,
    ``driver``) exceeds the budget: "<what> <need>, past this machine's budget ..."."""
    if work.seconds > budget_s or work.bytes > budget_bytes:
        raise InputError(work.driver, f"{what} {need}, past this machine's budget of {budget_s:,.0f} s and "
                                      f"{budget_bytes / 2**30:,.1f} GiB; --force runs it anyway")


def watchdog_seconds(w: Work) -> float:
    """CPU seconds after which a simulation estimated at ``w`` counts as stuck."""
    return max(WATCHDOG_MIN_S, WATCHDOG_FACTOR * w.seconds)


def watchdog(name: str, seconds: float | None):
    """Abort the body with a SimulationError (an internal error, exit 1, naming the
    scenario) once the process has spent ``seconds`` of CPU in it: whatever stops a
    simulation from progressing -- a livelock no guard knows of, an estimate wrong by
    20x -- ends as an error, never a spin. A :func:`cpu_deadline`, so a busy machine
    does not trip it; only in the main thread (signals), and not under ``--force``
    (``seconds`` None)."""

    def expire():
        raise SimulationError(f"scenario {name!r}: still simulating after {seconds:,.0f} s of CPU, "
                              f"{WATCHDOG_FACTOR:g}x its work estimate (sim/work.py): the estimate or the "
                              "engine is wrong; --force runs without this watchdog")

    return cpu_deadline(seconds, expire)


# One CPU timer for every deadline of the process: ITIMER_PROF counts user + system CPU of the
# whole process (setitimer(2)), the clock time.process_time() reads (CLOCK_PROCESS_CPUTIME_ID)
# and the one both callers mean: the work estimate is fitted to ru_utime + ru_stime
# (bench/work.py), a planner point's CPU is process_time() (sim/plan/explain.py `CPU`).
# ITIMER_VIRTUAL counts user CPU only; RLIMIT_CPU (setrlimit(2)) is whole seconds, is
# inherited by forked children and kills at its hard limit.
_SIGNAL = getattr(signal, "SIGPROF", None) if hasattr(signal, "setitimer") else None
_SOONEST = 1e-6  # s: a deadline already due is armed this far ahead (setitimer's 0 disarms)
_DEADLINES: list = []  # the main thread's live :func:`cpu_deadline` entries, outermost first


@dataclass(eq=False)
class _Deadline:
    at: float  # time.process_time() at which it expires
    expire: object  # an exception class to raise, or a callable to call
    live: bool = True  # False once fired or left


@contextmanager
def cpu_deadline(seconds: float | None, expire):
    """Call ``expire`` (an exception class: raise it) in the body once the process has spent
    ``seconds`` more of CPU (user + system; 0 or less: at once). Nestable: an inner deadline
    neither cancels nor extends an outer one, the earlier fires first, and on leaving the
    inner the outer is re-armed with the CPU spent since counted. The outermost saves the
    SIGPROF handler and ITIMER_PROF timer it finds and restores them on leaving (a timer
    found armed: less the CPU spent meanwhile). Off (the body runs unbounded) where it
    cannot be set: ``seconds`` None, off the main thread (a Dask worker's, any thread:
    signals reach the main thread only), no POSIX timers, or a SIGPROF handler installed
    from C (it could not be restored)."""
    if (seconds is None or _SIGNAL is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(_SIGNAL) is None):
        yield
        return
    entry = _Deadline(time.process_time() + max(seconds, 0.0), expire)
    saved = None if _DEADLINES else (signal.signal(_SIGNAL, _on_timer), signal.setitimer(signal.ITIMER_PROF, 0),
                                     time.process_time())
    _DEADLINES.append(entry)
    _arm()
    try:
        yield
    finally:
        entry.live = False  # (first: a signal arriving now does not fire it)
        signal.setitimer(signal.ITIMER_PROF, 0)
        if entry in _DEADLINES:  # (not in a forked child: its stack was cleared)
            del _DEADLINES[_DEADLINES.index(entry):]  # itself, and any inner left by an exception
        _arm()
        if saved is not None:
            _restore(*saved)


def _arm() -> None:
    """Set the timer to the earliest live deadline."""
    due = [d.at for d in _DEADLINES if d.live]
    if due:
        signal.setitimer(signal.ITIMER_PROF, max(min(due) - time.process_time(), _SOONEST))


def _on_timer(_signum, _frame) -> None:
    """SIGPROF: fire the earliest deadline that is due (re-arm when none is yet)."""
    now = time.process_time()
    due = [d for d in _DEADLINES if d.live and d.at <= now]
    if not due:
        _arm()
        return
    first = min(due, key=lambda d: d.at)
    first.live = False
    _arm()
    if isinstance(first.expire, type) and issubclass(first.expire, BaseException):
        raise first.expire
    first.expire()


def _restore(handler, timer: tuple[float, float], since: float) -> None:
    """Put back the SIGPROF handler and timer the outermost deadline found."""
    signal.signal(_SIGNAL, handler)
    value, interval = timer
    if value > 0:
        signal.setitimer(signal.ITIMER_PROF, max(value - (time.process_time() - since), _SOONEST), interval)


if hasattr(os, "register_at_fork"):  # a forked child inherits no timer (fork(2)): nor the deadlines
    os.register_at_fork(after_in_child=_DEADLINES.clear)


# An all-to-all puts a flow on every ordered pair of its group at once: measured with
# `clustersim collective --op all_to_all --sizes 1G` on dgx-h100, 512 GPUs 0.64 GB and 1,024
# GPUs 2.98 GB peak RSS (~2.8 KB per pair), ~3.1 us of CPU per pair and size.
PAIR_S, PAIR_BYTES = 3.1e-6, 2.8e3


def check_gpus(key: str, gpus: int, runs: int = 1, force: bool = False, all_pairs: bool = False) -> None:
    """For commands that build a cluster of ``gpus`` GPUs and run ``runs`` collectives on
    all of them (``clustersim collective``): the GPU bound, then the work budget
    (``all_pairs``: an all-to-all, whose flows grow with the square of the group)."""
    bounds.GPUS.check(key, gpus, whole=True)
    seconds, nbytes = gpus * GPU_S * (1 + runs), BASE_BYTES + gpus * GPU_BYTES
    if all_pairs:
        seconds, nbytes = seconds + runs * gpus**2 * PAIR_S, nbytes + gpus**2 * PAIR_BYTES
    if not force and (seconds > BUDGET_S or nbytes > BUDGET_BYTES):
        raise InputError(key, f"{gpus:,} GPUs would need ~{seconds:,.0f} s of CPU and {nbytes / 2**30:,.1f} GiB, "
                              f"past this machine's budget of {BUDGET_S:,.0f} s and {BUDGET_BYTES / 2**30:,.1f} GiB")


def fabric_links(s) -> int:
    """Leaf-spine links of the fat tree (sim.hardware.topology.fat_tree builds them)."""
    spec = topology_spec(s)
    servers_per_su = spec.gpus_per_node * spec.nodes_per_su
    leaves = math.ceil(s.cluster.gpus / servers_per_su) * min(spec.gpus_per_node, s.cluster.gpus)
    return leaves * spec.spines


def _driver(s, part: str, ranks: int) -> str:
    """The key behind the costliest part: the factor furthest past a typical value."""
    p, t = s.parallel, s.training
    gpus_key = "cluster.nodes" if s.cluster.nodes else "cluster.gpus"
    if part == "gpus":
        return gpus_key
    if part == "links":
        spec = topology_spec(s)
        return "cluster.topology_overrides.spines" if spec.spines > 64 else gpus_key
    if part == "alltoalls":
        factors = {"parallel.ep": s.parallel.ep / 32, "training.global_batch": census.micro_batches(s) / 64}
        return max(factors, key=factors.get)
    if part in ("scores", "kernels"):
        tokens = t.micro_batch * t.seq_len // p.cp
        factors = {"model.moe.experts": s.model.moe.experts / 256, "training.seq_len": tokens / 8192}
        if part == "kernels":
            factors = {"model.moe.experts": s.model.moe.experts / 256,
                       "training.global_batch": census.micro_batches(s) / 64}
        return max(factors, key=factors.get)
    factors = {"training.global_batch": census.micro_batches(s) / 64,
               "model.layers": census.layers_per_rank(s) / 32,
               "parallel.cp": p.cp / 8,
               gpus_key: ranks / 64}
    return max(factors, key=factors.get)
