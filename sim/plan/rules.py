"""Which candidate layouts the loader accepts, and why the others are rejected.

The rules are the loader's (sim/input/rules.py ``check_all``): the arithmetic ones are applied
here to the whole candidate table at once, in the loader's order, so each rejected
layout is counted once, under the first rule the loader would raise for it (its
``InputError`` key is :attr:`Reason.key`). tests/test_plan.py runs the loader itself on
every candidate of small cases and checks that it raises exactly these keys. Rules that
hold by construction of the space (tp * pp * dp * cp = GPUs, schedule and virtual stages
consistent, pp * v <= layers, ep dividing the experts, sequence parallelism with tp > 1)
are not repeated. Memory is the last rule (:mod:`.fit`).
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..input.choices import DUALPIPE_SCHEDULES, ZERO_BUBBLE_SCHEDULES, MlaDownProj, Recompute, Schedule


@dataclass(frozen=True)
class Reason:
    """A rejection reason: ``id`` (the --json key), the loader's key, and what it means."""

    id: str
    key: str
    text: str


REASONS = (  # in the loader's order (check_all: heads, batch, stages, moe, overlap), then memory
    Reason("tp_heads", "parallel.tp", "tp does not divide the attention heads or the kv heads"),
    Reason("batch_floor", "training.global_batch", "fewer sequences than dp x micro_batch (batch-size floor)"),
    Reason("batch_divisible", "training.global_batch", "global batch not divisible by dp x micro_batch"),
    Reason("cp_seq_len", "training.seq_len", "seq_len not divisible by cp"),
    Reason("interleaved_micro_batches", "parallel.virtual_stages",
           "interleaved 1F1B needs micro-batches divisible by pp (Megatron's rule)"),
    Reason("zero_bubble_fsdp", "parallel.zero", "zero-bubble and DualPipe schedules are not modelled with FSDP "
                                                "(zero 3)"),
    Reason("zero_bubble_ep_overlap", "parallel.ep_comm_overlap", "EP overlap runs in paired steps: only "
                                                                 "DualPipe(V) has them"),
    Reason("dualpipe_micro_batches", "training.global_batch",
           "DualPipe needs an even number of micro-batches >= 2 pp, DualPipeV >= 2 pp (DualPipe's assertions)"),
    Reason("ep_groups", "parallel.ep", "ep does not divide the ranks experts shard over (dp x cp, or tp x cp x dp "
                                       "when folded)"),
    Reason("expert_tp_groups", "parallel.expert_tp", "ep x expert_tp does not divide tp x cp x dp"),
    Reason("mla_column_tp_overlap", "parallel.mla_down_proj", "MLA's column-parallel down projections (Megatron-Core "
                                                              "0.12-0.13) run no TP-comm overlap"),
    Reason("ep_overlap_recompute", "parallel.ep_comm_overlap", "EP overlap does not work with full recompute"),
    Reason("ep_overlap_pipeline", "parallel.ep_comm_overlap", "EP overlap with pp > 1 needs virtual stages"),
    Reason("ep_overlap_micro_batches", "parallel.ep_comm_overlap", "EP overlap needs at least 2 micro-batches"),
    Reason("memory", "memory", "peak memory per GPU above HBM less the headroom"),
)
MEMORY = len(REASONS)  # code of the memory reason (codes are 1-based; 0: valid)
# Checked only on the layouts picked for a full simulation (sim/work.py's per-scenario
# estimate; the others keep the analytic estimate): a refused pick leaves the table.
WORK = Reason("work_budget", "work", "its full simulation is past this machine's work budget (sim/work.py)")
BY_ID = {r.id: r for r in (*REASONS, WORK)}


@dataclass(frozen=True)
class Fixed:
    """What the rules need of the model and the training setup (the same for every candidate)."""

    heads: int
    kv_heads: int
    global_batch: int
    seq_len: int
    mla_column: bool = False  # parallel.mla_down_proj = "column"


def fixed_of(scenario) -> Fixed:
    """The fixed facts of a loaded base scenario."""
    m, t = scenario.model, scenario.training
    return Fixed(m.heads, m.kv_heads or m.heads, t.global_batch, t.seq_len,
                 scenario.parallel.mla_down_proj is MlaDownProj.COLUMN)


def codes(c: pd.DataFrame, f: Fixed) -> np.ndarray:
    """Per candidate: 0 if the loader accepts it, else 1 + the index in :data:`REASONS` of the
    first rule it breaks (memory excluded: :mod:`.fit` applies it to the valid ones)."""
    tp, pp, dp, cp, ep, etp, v, mb = (c[k].to_numpy() for k in ("tp", "pp", "dp", "cp", "ep", "expert_tp",
                                                              "virtual_stages", "micro_batch"))
    per_step = dp * mb
    micro = f.global_batch // per_step
    folded = etp != tp
    recompute, epov = c["recompute"].to_numpy(), c["ep_comm_overlap"].to_numpy(dtype=bool)
    sched = c["schedule"].to_numpy().astype(str)
    zb = np.isin(sched, ZERO_BUBBLE_SCHEDULES)
    dual = np.isin(sched, DUALPIPE_SCHEDULES)
    tests = [
        (f.heads % tp != 0) | (f.kv_heads % tp != 0),
        f.global_batch < per_step,
        f.global_batch % per_step != 0,
        f.seq_len % cp != 0,
        (sched == Schedule.INTERLEAVED) & (micro % pp != 0),
        zb & (c["zero"].to_numpy() >= 3),
        zb & ~dual & epov,
        dual & ((micro < 2 * pp) | ((sched == Schedule.DUALPIPE) & (micro % 2 != 0))),
        np.where(folded, (tp * cp * dp) % ep != 0, (dp * cp) % ep != 0),
        folded & ((tp * cp * dp) % (ep * etp) != 0),
        f.mla_column & c["tp_comm_overlap"].to_numpy(dtype=bool),
        epov & (recompute == Recompute.FULL),
        epov & (pp > 1) & (v == 1) & (sched != Schedule.DUALPIPE),
        epov & (pp == 1) & (micro < 2),
    ]
    out = np.zeros(len(c), dtype=np.int16)
    for i, fails in enumerate(tests, start=1):
        out[(out == 0) & fails] = i
    return out


def counts(code: np.ndarray) -> dict[str, int]:
    """reason id -> candidates rejected for it (only reasons that occurred, in rule order)."""
    found = np.bincount(code, minlength=len(REASONS) + 1)
    return {r.id: int(found[i]) for i, r in enumerate(REASONS, start=1) if found[i]}
