"""The search space of ``clustersim plan``: every parallel layout of a model on a cluster.

A layout is a mesh (tp, pp, cp, dp with tp * pp * cp * dp = GPUs; virtual stages and the
pipeline schedule; ep and expert_tp for MoE models) times the knobs (ZeRO stage,
activation recompute, micro-batch size, TP and EP communication overlap). Which values
each axis takes is a choice of this module, stated here and in docs/plan.md; whether a
layout is *valid* is the loader's (sim/plan/rules.py):

- tp: divisors of the GPU count up to the NVLink domain (TP across InfiniBand is never
  competitive: Megatron-LM keeps TP inside a node, Narayanan et al. 2021 section 3.2);
  sequence parallelism is on whenever tp > 1 (same bytes as plain TP, a tp-th of the
  norm and dropout work and activations; Megatron's --tp-comm-overlap and MoE folding
  require it);
- pp: divisors of the GPU count up to the layer count;
- cp: 1, and 2, 4, 8, 16 dividing the GPU count where each CP rank keeps at least
  :data:`MIN_CP_TOKENS` tokens of the sequence;
- virtual stages: 1, and :data:`VIRTUAL_STAGES` with pp * v <= layers when pp > 1 (the
  layers split as the simulator splits them, remainder to the middle stages); schedule
  1f1b or gpipe when v = 1 and pp > 1, interleaved when v > 1;
- MoE: ep over the powers of two dividing the expert count, up to the ranks of a stage;
  expert_tp = tp (Megatron's default) or 1 (MoE parallel folding, DeepSeek-V3's layout);
- knobs: ZeRO 0-3, recompute none / selective / full (and, for MLA models, ``mla_up_proj``:
  Megatron-Core's ``--recompute-modules mla_up_proj``, which NeMo's DeepSeek-V3 recipe runs),
  micro-batch :data:`MICRO_BATCHES`, tp_comm_overlap when tp > 1, ep_comm_overlap when ep > 1.

Run ``clustersim plan llama3.1-70b --gpus 1024 --topology dgx-h100 --seq-len 8192
--global-batch-tokens 8388608``.
"""

from dataclasses import dataclass
import itertools

import numpy as np
import pandas as pd

from ..input.choices import ONE_F_ONE_B_SCHEDULES, Recompute, Schedule

MIN_CP_TOKENS = 1024  # a CP rank's sequence shard: below this the ring's K/V shifts outlast its attention chunks
CP_VALUES = (1, 2, 4, 8, 16)
VIRTUAL_STAGES = (2, 3, 4, 5, 6, 8, 10, 12, 16)
MICRO_BATCHES = (1, 2, 4)
ZERO = (0, 1, 2, 3)
RECOMPUTE = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
# MLA models also search Megatron-Core's ``--recompute-modules mla_up_proj`` (the up projections,
# RoPE and the q/k/v assembly rerun, the attention core not: sim/model/layers.py mla_up_recompute);
# NeMo's DeepSeek-V3 pretraining recipe runs it (``recompute_modules=["mla_up_proj"]``), so the
# published layout has peers with its knobs (bench/plan_published.py)
MLA_RECOMPUTE = RECOMPUTE + (Recompute.MLA_UP_PROJ,)
SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED)
# Columns of a candidate table, in the order of the contract's layout keys.
MESH = ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_stages", "schedule")
MEMORY_KNOBS = ("zero", "recompute", "micro_batch")  # what trades memory for time (and a 2021 run chose too)
KNOBS = MEMORY_KNOBS + ("tp_comm_overlap", "ep_comm_overlap")
COLUMNS = MESH + KNOBS


@dataclass(frozen=True)
class Space:
    """The values each axis may take for one model on one cluster."""

    gpus: int
    domain: int  # GPUs per NVLink domain: tp at most this
    layers: int
    seq_len: int
    experts: int = 0  # 0: a dense model
    mla: bool = False  # multi-head latent attention: recompute also takes ``mla_up_proj``

    @classmethod
    def of(cls, req, d) -> "Space":
        """The space of a planner request (:class:`.inputs.Request`) for model dims ``d``."""
        return cls(req.gpus, req.spec.gpus_per_domain, d.layers, req.scenario.training.seq_len, d.experts, d.mla)

    def recompute_values(self) -> tuple[Recompute, ...]:
        return MLA_RECOMPUTE if self.mla else RECOMPUTE

    def tp_values(self) -> list[int]:
        return [d for d in divisors(self.gpus) if d <= self.domain]

    def pp_values(self) -> list[int]:
        return [d for d in divisors(self.gpus) if d <= self.layers]

    def cp_values(self) -> list[int]:
        return [c for c in CP_VALUES if self.gpus % c == 0 and (c == 1 or self.seq_len >= c * MIN_CP_TOKENS)]

    def v_values(self, pp: int) -> list[int]:
        return [1] if pp == 1 else [1] + [v for v in VIRTUAL_STAGES if pp * v <= self.layers]

    def ep_values(self, stage_ranks: int) -> list[int]:
        if not self.experts:
            return [1]
        return [e for e in (2**i for i in range(self.experts.bit_length())) if self.experts % e == 0
                and e <= stage_ranks]

    def expert_tp_values(self, tp: int, ep: int) -> list[int]:
        """expert_tp = tp (unfolded), and 1 when that differs (folded; needs a MoE model)."""
        return [tp] if not self.experts or tp == 1 else [tp, 1]


def divisors(n: int) -> list[int]:
    """Divisors of n, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def schedules_of(pp: int, v: int) -> tuple[Schedule, ...]:
    """The schedules a pipeline shape can run: 1F1B and GPipe, ZB-H1 and (even pp) DualPipe
    with one chunk per rank; interleaved 1F1B and DualPipeV with two; interleaved beyond.
    (ZB-H2 and ZB-V are left out: their list schedules are built for the layer's pass times,
    which the per-layer estimate does not give the memory rule.)"""
    if pp == 1:
        return (Schedule.ONE_F_ONE_B,)
    if v == 1:
        return (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.ZB_H1) + ((Schedule.DUALPIPE,) if pp % 2 == 0 else ())
    return (Schedule.INTERLEAVED, Schedule.DUALPIPEV) if v == 2 else (Schedule.INTERLEAVED,)


def meshes(space: Space) -> list[tuple]:
    """Every (tp, pp, dp, cp, ep, expert_tp, v, schedule) of the space."""
    out = []
    for tp, pp, cp in itertools.product(space.tp_values(), space.pp_values(), space.cp_values()):
        if space.gpus % (tp * pp * cp):
            continue
        dp = space.gpus // (tp * pp * cp)
        for v in space.v_values(pp):
            schedules = schedules_of(pp, v)
            for ep in space.ep_values(tp * cp * dp):
                for etp, schedule in itertools.product(space.expert_tp_values(tp, ep), schedules):
                    out.append((tp, pp, dp, cp, ep, etp, v, schedule))
    return out


def knobs(tp_overlap: bool, ep_overlap: bool, recompute: tuple = RECOMPUTE) -> list[tuple]:
    """Every (zero, recompute, micro_batch, tp_comm_overlap, ep_comm_overlap) of a mesh."""
    return list(itertools.product(ZERO, recompute, MICRO_BATCHES, (False, True) if tp_overlap else (False,),
                                  (False, True) if ep_overlap else (False,)))


def enumerate_layouts(space: Space) -> pd.DataFrame:
    """Every candidate layout, one row each (columns :data:`COLUMNS`): the meshes in the
    order of :func:`meshes`, each with its knobs in the order of :func:`knobs`."""
    mesh = pd.DataFrame(meshes(space), columns=list(MESH))
    parts = []
    for (tp_on, ep_on), group in mesh.groupby([mesh.tp > 1, mesh.ep > 1], sort=True):
        k = pd.DataFrame(knobs(tp_on, ep_on, space.recompute_values()), columns=list(KNOBS))
        which = np.repeat(group.index.to_numpy(), len(k))
        part = pd.concat([mesh.loc[which].reset_index(drop=True), pd.concat([k] * len(group), ignore_index=True)],
                         axis=1)
        parts.append(part.assign(_mesh=which, _knob=np.tile(np.arange(len(k)), len(group))))
    if not parts:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(parts, ignore_index=True)
    order = np.lexsort((table["_knob"].to_numpy(), table["_mesh"].to_numpy()))
    return table.iloc[order][list(COLUMNS)].reset_index(drop=True)


def candidate_of(s) -> dict:
    """Scenario ``s``'s own layout as a candidate: its value of each of :data:`COLUMNS`
    (the inverse of :func:`overrides`)."""
    p, t = s.parallel, s.training
    return dict(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, expert_tp=p.expert_tp or p.tp,
                virtual_stages=p.virtual_stages, schedule=str(p.schedule), zero=p.zero, recompute=str(t.recompute),
                micro_batch=t.micro_batch, tp_comm_overlap=bool(p.tp_comm_overlap),
                ep_comm_overlap=bool(p.ep_comm_overlap))


def overrides(row) -> dict:
    """The scenario keys of one candidate (a row or a dict with :data:`COLUMNS`), as
    ``--set`` overrides: the planner's whole [parallel] section plus the training knobs."""
    tp = int(row["tp"])
    out = {f"parallel.{k}": int(row[k]) for k in ("tp", "pp", "dp", "cp", "ep", "virtual_stages", "zero")}
    out.update({"parallel.schedule": str(row["schedule"]), "parallel.sequence_parallel": tp > 1,
                "parallel.tp_comm_overlap": bool(row["tp_comm_overlap"]),
                "parallel.ep_comm_overlap": bool(row["ep_comm_overlap"]),
                "training.micro_batch": int(row["micro_batch"]), "training.recompute": str(row["recompute"])})
    if int(row["expert_tp"]) != tp:
        out["parallel.expert_tp"] = int(row["expert_tp"])
    if int(row["cp"]) == 1:  # no context parallelism to implement: a base row's cp_impl does not carry over
        out["parallel.cp_impl"] = "ring"
    if int(row["pp"]) == 1 or Schedule(row["schedule"]) not in ONE_F_ONE_B_SCHEDULES:  # nor Megatron's flush deferral
        out.update({"parallel.defer_embedding_wgrad_compute": False, "parallel.wgrad_deferral_limit": 0})
    return out
