"""Where ranks sit: coordinates on the tp / cp / dp / pp axes and the process groups.

Megatron order by default: tp innermost (inside an NVLink domain), then cp, dp, and pp
outermost (across IB); ``parallel.order`` overrides it.

Expert layers have a mesh of their own (Megatron-Core's MoE parallel folding,
megatron/core/parallel_state.py: ``initialize_model_parallel`` builds a second
``RankGenerator`` with ``tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
dp=expert_data_parallel_size, cp=1`` over the same ranks and pipeline groups, order
tp-ep-dp-pp). Here: the tp*cp*dp ranks of one pipeline stage, numbered tp fastest,
then cp, then dp (position q), are re-split as expert_tp fastest, then ep, then
expert-dp: ``etp = q % expert_tp``, ``ep = q // expert_tp % ep``, ``edp = q //
(expert_tp * ep)``, so expert_tp * ep * expert_dp = tp * cp * dp. An all-to-all group
varies ``ep`` (it may span tp ranks when expert_tp < tp), expert gradients reduce over
``edp``. With the default expert_tp = tp, the ep ranks are consecutive on the combined
cp*dp axis at one tp index: the groups of Megatron's unfolded MoE.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..engine.kinds import Category
from ..input.scenario import Parallel

AXES = (Category.TP, Category.CP, Category.DP, Category.PP)  # Megatron order, tp fastest
TP, CP, DP, PP = AXES


class Group(tuple):
    """A tuple of ranks that remembers its hash: groups key many dicts in the engine."""

    def __hash__(self):
        try:  # (an attribute read: a third of the time of a __dict__.get call; 670k hashes in a 16k-GPU run)
            return self._hash
        except AttributeError:
            h = self._hash = tuple.__hash__(self)
            return h


@dataclass(frozen=True)
class Layout:
    """Rank <-> (tp, cp, dp, pp) coordinates for one parallel section, and the expert mesh."""

    sizes: dict
    order: tuple[str, ...]
    ep: int
    expert_tp: int | None = None  # None: tp
    sp: bool = True  # sequence parallelism (Megatron requires it for MoE with tp > 1)
    dp_shard: int | None = None  # HSDP: dp ranks a ZeRO/FSDP shard group spans (None: dp)

    @classmethod
    def megatron(cls, tp: int, cp: int, dp: int, pp: int, ep: int = 1, expert_tp: int | None = None) -> "Layout":
        """The layout of these sizes in Megatron order (tp fastest, then cp, dp, pp: :data:`AXES`)."""
        return cls(dict(zip(AXES, (tp, cp, dp, pp))), AXES, ep, None if expert_tp == tp else expert_tp)

    @classmethod
    def from_parallel(cls, p: Parallel) -> "Layout":
        """The layout of a parallel section (its ``order`` was checked at load)."""
        return cls(dict(zip(AXES, (p.tp, p.cp, p.dp, p.pp))), tuple(map(Category, p.order.split("-"))), p.ep,
                   p.expert_tp, p.sequence_parallel, p.dp_shard if p.dp_shard != p.dp else None)

    @cached_property
    def strides(self) -> dict:
        """Rank distance between neighbours on each axis."""
        out, stride = {}, 1
        for axis in self.order:
            out[axis] = stride
            stride *= self.sizes[axis]
        return out

    @property
    def world(self) -> int:
        """Total ranks."""
        return self.sizes[TP] * self.sizes[CP] * self.sizes[DP] * self.sizes[PP]

    def coords(self, rank: int) -> dict:
        """{axis: index} of a rank."""
        return {a: (rank // self.strides[a]) % self.sizes[a] for a in AXES}

    def rank(self, **coords) -> int:
        """Rank at the given coordinates."""
        return sum(coords[a] * self.strides[a] for a in AXES)

    @cached_property
    def _groups(self) -> dict:
        return {}

    def group(self, rank: int, *axes: str) -> tuple[int, ...]:
        """Ranks sharing every coordinate of ``rank`` except ``axes`` (first axis varies
        fastest). Cached: every op of a rank asks for the same few groups."""
        key = (rank, axes)
        found = self._groups.get(key)
        if found is None:
            base = rank - sum(self.coords(rank)[a] * self.strides[a] for a in axes)
            members = np.array([base], dtype=np.int64)
            for axis in axes:  # index i x len(members) + j holds members[j] + i x stride (first axis fastest)
                members = (self.strides[axis] * np.arange(self.sizes[axis], dtype=np.int64)[:, None]
                           + members[None, :]).ravel()
            found = self._groups[key] = Group(members.tolist())
        return found

    @property
    def shard(self) -> int:
        """dp ranks of one shard group (HSDP's ``dp_shard``; dp without it)."""
        return self.dp_shard or self.sizes[DP]

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """The ranks a ZeRO/FSDP shard of ``rank``'s (dense) parameters spans: its cp x dp
        group, or under HSDP the cp x dp_shard ranks of its block of dp_shard consecutive dp
        indices (torchtitan's mesh puts dp_shard inside dp_replicate: parallel_dims.py)."""
        if self.dp_shard is None:
            return self.group(rank, CP, DP)
        return self._hsdp_group(rank, True)

    def replica_group(self, rank: int) -> tuple[int, ...]:
        """Under HSDP, the dp / dp_shard ranks holding the same shard as ``rank`` (same cp
        index and dp index modulo dp_shard), which all-reduce it; ``(rank,)`` without HSDP."""
        return (rank,) if self.dp_shard is None else self._hsdp_group(rank, False)

    def _hsdp_group(self, rank: int, inside: bool) -> tuple[int, ...]:
        key = (rank, "hsdp", inside)
        found = self._groups.get(key)
        if found is None:
            c, s, n = self.coords(rank), self.strides, self.shard
            base = rank - c[DP] * s[DP]
            if inside:
                first = c[DP] // n * n
                found = Group(m - c[CP] * s[CP] + i * s[CP] + (first + j) * s[DP]
                              for j in range(n) for i in range(self.sizes[CP]) for m in (base,))
            else:
                found = Group(base + (c[DP] % n + k * n) * s[DP] for k in range(self.sizes[DP] // n))
            self._groups[key] = found
        return found

    def instance_group(self, rank: int | None) -> tuple[int, ...]:
        """The ranks of ``rank``'s HSDP block (the same dp // dp_shard; every tp, cp and pp
        position): one optimizer instance (Megatron's ``intra_dist_opt_group``); ``rank``
        None: every rank. Vectorised: a world group may hold 10^6 ranks."""
        block = None if rank is None else self.coords(rank)[DP] // self.shard
        key = ("instance", block)
        found = self._groups.get(key)
        if found is None:
            ranks = np.arange(self.world, dtype=np.int64)
            if block is not None:
                ranks = ranks[ranks // self.strides[DP] % self.sizes[DP] // self.shard == block]
            found = self._groups[key] = Group(ranks.tolist())
        return found

    def dc_index(self, rank: int) -> int:
        """Position on the combined cp*dp axis (cp fastest)."""
        c = self.coords(rank)
        return c[CP] + self.sizes[CP] * c[DP]

    @property
    def etp(self) -> int:
        """Expert tensor-parallel size (default: tp)."""
        return self.expert_tp or self.sizes[TP]

    @property
    def folded_experts(self) -> bool:
        """Whether expert layers take the alltoall dispatcher's own path: each rank routes
        its sequence-parallel shard, all-to-all over ep, then all-gather over expert tp
        (Megatron-Core >= 0.10 MoEAlltoAllTokenDispatcher: permute -> A2A(EP) -> AG(ETP)).
        That is every layout with expert_tp != tp (folding needs SP) and every tp > 1 with
        SP, expert_tp = tp included; only tp > 1 without SP gathers the tokens first."""
        tp = self.sizes[TP]
        return self.etp != tp or (tp > 1 and self.sp)

    @property
    def expert_dp(self) -> int:
        """Ranks of one stage holding the same expert shard: tp*cp*dp / (expert_tp*ep)."""
        return self.sizes[TP] * self.sizes[CP] * self.sizes[DP] // (self.etp * self.ep)

    def _stage_position(self, rank: int) -> int:
        """q: place of ``rank`` among its stage's tp*cp*dp ranks (tp fastest, then cp, dp)."""
        c = self.coords(rank)
        return c[TP] + self.sizes[TP] * self.dc_index(rank)

    def expert_coords(self, rank: int) -> tuple[int, int, int]:
        """(expert_tp, ep, expert_dp) indices of ``rank`` on the expert mesh."""
        q, etp = self._stage_position(rank), self.etp
        return q % etp, q // etp % self.ep, q // (etp * self.ep)

    def ep_index(self, rank: int) -> int:
        """Which ep slice of the experts ``rank`` holds."""
        return self.expert_coords(rank)[1]

    def _expert_group(self, rank: int, axis: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s expert mesh that differ from it along ``axis`` (0 expert
        tp, 1 ep, 2 expert dp), in order; vectorised, as an expert-dp group of a million-GPU
        data-parallel stage is a million ranks."""
        key = (rank, "expert", axis)
        found = self._groups.get(key)
        if found is None:
            etp, n = self.etp, (self.etp, self.ep, self.expert_dp)[axis]
            parts = [np.full(n, c, dtype=np.int64) for c in self.expert_coords(rank)]
            parts[axis] = np.arange(n, dtype=np.int64)
            q = parts[0] + etp * (parts[1] + self.ep * parts[2])  # stage positions (tp fastest, then cp, dp)
            tp, cp, s = self.sizes[TP], self.sizes[CP], self.strides
            members = (q % tp * s[TP] + q // tp % cp * s[CP] + q // (tp * cp) * s[DP]
                       + self.coords(rank)[PP] * s[PP])
            found = self._groups[key] = Group(members.tolist())
        return found

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The ``ep`` ranks that exchange one set of experts' tokens (all-to-all group)."""
        return self._expert_group(rank, 1)

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same experts: gradients of expert weights reduce over these."""
        return self._expert_group(rank, 2)

    def expert_tp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks splitting the same experts' weights (expert tensor parallelism)."""
        return self._expert_group(rank, 0)

    def moe_tokens(self, tokens: float) -> float:
        """Tokens a rank routes per micro-batch: its own sequence-parallel shard tokens/tp
        on the dispatcher's path (:attr:`folded_experts`), else all ``tokens`` of its tp
        group (tp > 1 without SP: every tp rank holds them all)."""
        return tokens / self.sizes[TP] if self.folded_experts else tokens

    def stage_rank(self, rank: int, stage: int) -> int:
        """The rank at pipeline stage ``stage`` with the other coordinates of ``rank``."""
        return self.rank(**{**self.coords(rank), PP: stage})
