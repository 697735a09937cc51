"""The work of a planner search's analytic phase, counted before anything is enumerated
(``clustersim plan``; the full simulations it picks have their own budget, ``--budget``).

Two things drive it, both counted from the meshes of the space (:func:`.space.meshes`:
a few thousand tuples at most, since tp, pp and cp take divisors of the GPU count up to
the NVLink domain, the layers and 16) without building the candidate table:

- the candidate layouts: each is enumerated, checked by the rules and the memory rule and
  estimated (a row of every table of :mod:`.driver`);
- the schedule replays of the memory rule: a zero-bubble or DualPipe schedule's peak
  in-flight activations are found by replaying its steps on every stage
  (``pp_zero_bubble.held_peak``), walked once per (schedule, pp, micro-batches) and then
  weighed once per layer shape (``w_share``) from the walk's cached counts, 250x cheaper a
  step: the work grows as pp x micro-batches per pipeline, with the batch, not the layouts.
  (Priced per shape at a walk's cost until 2026-11-27: DeepSeek-V3 on 2,048 GPUs counted
  2,182,738 steps where its rules walk 1,045,740 (1,048 stage walks of 94 schedules).)

Measured with ``search(request(...), budget=0)`` on the 2-core VM (CPU seconds of the
search, peak RSS; estimate in brackets): llama3-70b on 1,024 GPUs, 8,388,608 tokens (59,184
layouts, 1.7 M replayed steps) 6.3 s, 211 MB [18 s, 0.2 GiB]; on 8 GPUs, 65,536 sequences
(7,560 layouts, 15 M steps) ~40 s, 1.3 GB [76 s, 1.4 GiB]; on 720,720 GPUs, 2,882,880
sequences (401,724 layouts, 23 M steps) ~130 s, 2.3 GB [180 s, 1.3 GiB]; deepseek-v3
on 2,048 GPUs (1,127,412 layouts) 180 s, 0.9 GB [200 s, 3.5 GiB]. A replayed step took
2-7 us. Those bracketed estimates priced 3 KB a layout and 400 B a step of the 256 largest
replays only, 3.9x high on DeepSeek-V3 and 1.8x low at 720,720 GPUs: the peaks follow all the
replayed steps and the layouts, and 1 KB a layout plus 80 B a replayed step (fitted to these
four peaks over 0.15 GB of base, 2026-11-27) gives 0.34 / 1.36 / 2.4 / <= 1.4 GB for the four
(measured 0.21 / 1.3 / 2.3 / 0.9 GB), and 1.8 GB for DeepSeek-V3's space with ``mla_up_proj``
(1,503,216 layouts, 2.2 M steps; its 1,024-GPU search of 1,424,592 peaked at 1.5 GB).
:func:`check` refuses a search past :data:`sim.work.BUDGET_S` / :data:`sim.work.BUDGET_BYTES`
in one line naming the flag that drives the cost (``--force`` runs it).

Run ``python -c "from sim.plan import request; from sim.plan.budget import estimate;
print(estimate(request('llama3-70b', 1024, 'dgx-h100', None, 8192, 8388608)).describe())"``.
"""

from dataclasses import dataclass

from ..input.choices import DUALPIPE_SCHEDULES, Schedule
from ..model.transformer import dims
from ..work import BASE_BYTES, BUDGET_BYTES, BUDGET_S, cost_text, refuse_past_budget
from .fit import layer_activations
from .space import MICRO_BATCHES, Space, knobs, meshes

LAYOUT_S, LAYOUT_BYTES = 160e-6, 1e3  # per candidate layout: enumerated, ruled, fitted, estimated
# Per schedule step the memory rule walks (``pp_zero_bubble._held_counts``: once per (schedule, pp,
# micro-batches, stage), whatever the share): re-measured 2026-11-27 (i28-moe, load 11-13 on the 2
# cores) 3.5-7.6 us a step walking ZB-H1 / DualPipe(V) stages of 512-4,096 micro-batches, and the
# rules of llama3-70b on 8 GPUs x 65,536 sequences (14,968,440 steps walked) 66.0 s of CPU: 4.4 us
# a step. Per step of each further ``w_share`` (the cached counts weighed, numpy): 0.004-0.013 us.
# Bytes: over all (schedule, pp, micro-batches, w_share) replays, fitted to the peaks above.
STEP_S, SHARE_STEP_S, STEP_BYTES = 5e-6, 2e-8, 80.0
STEPS_PER_MICRO = {Schedule.ZB_H1: 3, Schedule.DUALPIPE: 2, Schedule.DUALPIPEV: 4}  # a stage's steps per micro-batch (F, B, W each)

@dataclass(frozen=True)
class PlanWork:
    """The analytic phase's estimate: CPU seconds, peak bytes, the flag behind the larger share."""

    layouts: int
    replay_steps: int  # schedule steps the memory rule walks (each schedule once)
    seconds: float
    bytes: float
    driver: str

    def describe(self) -> str:
        return cost_text(self.seconds, self.bytes, f"{self.layouts:,} layouts, {self.replay_steps:,} "
                         "pipeline-schedule steps walked by the memory rule")


def estimate(req) -> PlanWork:
    """The work of enumerating, ruling, fitting and estimating every layout of ``req``
    (:class:`.inputs.Request`), counted over the meshes of its space."""
    layouts, keys = count(req)
    steps = sum(_steps(sched, pp, micro) for sched, pp, micro, _ in keys)  # every share's
    walked = sum(_steps(*walk) for walk in {key[:3] for key in keys})  # each schedule walked once
    parts = {"--gpus": (layouts * LAYOUT_S, layouts * LAYOUT_BYTES),
             "--global-batch-tokens": (walked * STEP_S + steps * SHARE_STEP_S, steps * STEP_BYTES)}
    share = {k: sec / BUDGET_S + b / BUDGET_BYTES for k, (sec, b) in parts.items()}
    return PlanWork(layouts, walked, sum(sec for sec, _ in parts.values()),
                    BASE_BYTES + sum(b for _, b in parts.values()), max(share, key=share.get))


def _steps(schedule: Schedule, pp: int, micro: int) -> int:
    """Steps of one replay: every stage's (:data:`STEPS_PER_MICRO` per micro-batch, 2 pp more)."""
    return pp * (STEPS_PER_MICRO[schedule] * micro + 2 * pp)


def count(req) -> tuple[int, list[tuple]]:
    """(candidate layouts, the replays the memory rule will make: (schedule, pp, micro-batches,
    ``w_share``), keyed as ``Stages.in_flight`` keys them; those of layouts the rules on
    heads, batch, CP and DualPipe reject are left out, the rest counted)."""
    s = req.scenario
    d, t = dims(s.model), s.training
    heads, kv, batch = s.model.heads, s.model.kv_heads or s.model.heads, t.global_batch
    space = Space.of(req, d)  # as the driver's
    layouts, keys, share_of = 0, set(), {}
    for tp, pp, dp, cp, ep, _etp, _v, schedule in meshes(space):
        layouts += len(knobs(tp > 1, ep > 1, space.recompute_values()))
        if schedule not in STEPS_PER_MICRO or heads % tp or kv % tp or t.seq_len % cp:
            continue
        for mb in MICRO_BATCHES:
            micro = batch // (dp * mb)
            if batch % (dp * mb) or micro < 1 or (schedule in DUALPIPE_SCHEDULES and (
                    micro < 2 * pp or (schedule == Schedule.DUALPIPE and micro % 2))):
                continue
            for rec in space.recompute_values():  # w_share: what a chunk keeps until its W, by (tp, cp, mb, recompute)
                if (tp, cp, mb, rec) not in share_of:
                    share_of[tp, cp, mb, rec] = layer_activations(d, t, tp, cp, mb, rec)[3]
                keys.add((schedule, pp, micro, share_of[tp, cp, mb, rec]))
    return layouts, sorted(keys)


def check(req) -> PlanWork:
    """The estimate, or InputError naming the flag that drives the cost past the budget."""
    w = estimate(req)
    refuse_past_budget(w, "the search would need", f"{w.describe()} before any simulation")
    return w
