"""Collective times for the fast estimate (:mod:`.estimate`).

Reductions and gathers inside one NVLink domain (tensor parallelism, and any group that
fits a node) take the simulator's own time: the (algorithm, protocol) NCCL's tuner picks
(:func:`sim.collectives.tuner.pick`, NVIDIA/nccl src/graph/tuning.cc) run alone on one
domain of this cluster (:func:`sim.studies.nccl_tests.time_collective`, what ``clustersim
collective`` prints), once per (op, bytes, members). The tuner's own prediction, latency +
bytes / bandwidth, differs from it (tp 8 all-gather of 64 MiB on a DGX H100: 190.9 us
predicted, 165.7 us simulated; an NVLS all-reduce: 224 vs 267 us), and the estimate is
checked against the simulation. A group across domains is priced the same way, at its
members' own ranks on a cluster of this spec (the simulator's ring, tree or PAT crossing
the domains' NICs, :mod:`sim.collectives`), not at the tuner's prediction: an FSDP all-gather
of a 405B layer (1.6 GB) over 32 ranks of two NVL72 racks is 2.29 ms by the tuner and 3.75 ms
simulated, and the estimate had priced it at the former (docs/plan.md, "Published layouts
placed again").
All-to-alls (which NCCL runs as point-to-point sends) and send/recv move each byte once,
over NVLink inside a domain and over the GPU's NIC outside it; the slower of the two sets
the time. Groups are those of rank 0 of the layout (Megatron order tp-cp-dp-pp), which
every other group mirrors.
"""

from functools import cached_property, lru_cache

from ..collectives import tuner
from ..collectives.direct import Dedup, dedup_pairs, dedup_wire
from ..collectives.kinds import CollectiveOp
from ..engine.kinds import Category
from ..hardware import topology
from ..hardware.gpus import gpu_preset
from ..hardware.switching import fabric_of
from ..parallel.layout import Layout
from ..studies.nccl_tests import time_collective

P2P_LATENCY_S = 10e-6  # one point-to-point exchange: NCCL's ring Simple base + NVLink/net hop latencies (~10 us)


class Comm:
    """Closed-form collective times on one cluster (a topology spec and a GPU)."""

    def __init__(self, spec, gpu_name: str, calibration=None):
        self.fabric, self.spec = fabric_of(spec, gpu_name, calibration), spec
        self.domain = spec.gpus_per_domain
        self._build = lambda gpus: topology.build(spec, gpus, gpu_preset(gpu_name), calibration=calibration)
        self._clusters: dict[int, topology.Topology] = {}  # GPUs -> a cluster of this spec that many GPUs large
        self.reduce = lru_cache(maxsize=None)(self._reduce)
        self.groups = lru_cache(maxsize=None)(self._groups)  # (tp, cp, dp, pp, ep, etp) -> Groups

    def _groups(self, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int) -> "Groups":
        return Groups(self.domain, Layout.megatron(tp, cp, dp, pp, ep, etp))

    def _reduce(self, op: CollectiveOp, nbytes: float, members: tuple[int, ...]) -> float:
        """Seconds of an all_reduce / all_gather / reduce_scatter over the ranks ``members``,
        as the simulator runs it alone (the algorithm and protocol NCCL's tuner picks)."""
        if len(members) < 2 or nbytes <= 0:
            return 0.0
        domains = tuple(r // self.domain for r in members)
        pick = tuner.pick(op, nbytes, domains, self.fabric)
        if len(set(domains)) > 1:
            return time_collective(self._cluster(max(members) + 1), op, pick.name, members, nbytes)
        return time_collective(self._cluster(1), op, pick.name, tuple(range(len(domains))), nbytes)  # one domain

    def _cluster(self, gpus: int):
        """A cluster of this spec holding ranks 0..gpus-1, in whole domains (built once per size;
        ``gpus`` 1: one domain, or one node where the domain is smaller)."""
        per = max(self.spec.gpus_per_node, self.domain)
        total = -(-gpus // per) * per
        if total not in self._clusters:
            self._clusters[total] = self._build(total)
        return self._clusters[total]

    def all_to_all(self, nbytes: float, domains: tuple[int, ...], shares: tuple | None = None) -> float:
        """Each member sends ``nbytes`` spread evenly over the group: the share for its own
        NVLink domain over NVLink, the rest through its NIC. DeepEP's exchange (``shares`` a
        :class:`~sim.collectives.direct.Dedup`): the first member's sends of
        :func:`~sim.collectives.direct.dedup_pairs`, the simulator's own, split the same way, its bytes
        on the wire :func:`~sim.collectives.direct.dedup_wire` as there."""
        n = len(domains)
        if n < 2 or nbytes <= 0:
            return 0.0
        if isinstance(shares, Dedup):
            pairs, sizes = dedup_pairs(tuple(range(n)), domains, nbytes, shares)
            sent = [(dst, size) for (src, dst), size in zip(pairs, sizes) if src == 0]
            inside = sum(size for dst, size in sent if domains[dst] == domains[0]) / self.fabric.nvlink_w
            outside = sum(size for dst, size in sent if domains[dst] != domains[0]) / self.fabric.nic_w
            return P2P_LATENCY_S + max(inside, outside) * dedup_wire(domains) * shares.slowdown
        local = domains.count(domains[0])
        inside = nbytes * (local - 1) / n / self.fabric.nvlink_w
        outside = nbytes * (n - local) / n / self.fabric.nic_w
        return P2P_LATENCY_S + max(inside, outside)

    def p2p(self, nbytes: float, domains: tuple[int, ...]) -> float:
        """One send/recv (or one step of a ring shift) between members of ``domains``."""
        if len(domains) < 2 or nbytes <= 0:
            return 0.0
        bw = self.fabric.nvlink_w if len(set(domains)) == 1 else self.fabric.nic_w
        return P2P_LATENCY_S + nbytes / bw


class Groups:
    """Rank 0's groups, each built on first use: the NVLink domains of rank 0 and its next
    stage (``pp``, what a pipeline send crosses), and the members' ranks of the groups
    reductions run over (``of``, ``dp_ranks``: cp x dp, ``edp_ranks``: expert-dp)."""

    def __init__(self, domain: int, layout: Layout):
        self.domain, self.layout = domain, layout

    def _domains(self, members) -> tuple[int, ...]:
        return tuple(r // self.domain for r in members)

    @cached_property
    def pp(self) -> tuple[int, ...]:
        return self._domains((0, self.layout.stage_rank(0, 1)) if self.layout.sizes[Category.PP] > 1 else (0,))

    def of(self, *axes: Category) -> tuple[int, ...]:
        """Rank 0's group over ``axes`` (e.g. the FP8 amax reduction's: sim/parallel/amax.py):
        its members' ranks (what :meth:`Comm.reduce` prices)."""
        return tuple(self.layout.group(0, *axes))

    @cached_property
    def dp_ranks(self) -> tuple[int, ...]:
        """The gradient reduction's group (cp x dp), its members' ranks."""
        return tuple(self.layout.group(0, Category.CP, Category.DP))

    @cached_property
    def edp_ranks(self) -> tuple[int, ...]:
        """The expert-dp group, its members' ranks."""
        return tuple(self.layout.expert_dp_group(0))
