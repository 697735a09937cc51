"""Collective times for the fast estimate (:mod:`.estimate`).

Reductions and gathers inside one NVLink domain (tensor parallelism, and any group that
fits a node) take the simulator's own time: the (algorithm, protocol) NCCL's tuner picks
(:func:`sim.collectives.tuner.pick`, NVIDIA/nccl src/graph/tuning.cc) run alone on one
domain of this cluster (:func:`sim.studies.nccl_tests.time_collective`, what ``clustersim
collective`` prints), once per (op, bytes, members). The tuner's own prediction, latency +
bytes / bandwidth, differs from it (tp 8 all-gather of 64 MiB on a DGX H100: 190.9 us
predicted, 165.7 us simulated; an NVLS all-reduce: 224 vs 267 us), and the estimate is
checked against the simulation. Groups across domains keep the tuner's prediction.
All-to-alls (which NCCL runs as point-to-point sends) and send/recv move each byte once,
over NVLink inside a domain and over the GPU's NIC outside it; the slower of the two sets
the time. Groups are those of rank 0 of the layout (Megatron order tp-cp-dp-pp), which
every other group mirrors.
"""

from functools import lru_cache

from ..collectives import tuner
from ..collectives.kinds import CollectiveOp
from ..hardware import topology
from ..hardware.gpus import gpu_preset
from ..hardware.switching import fabric_of
from ..parallel.layout import Layout
from ..studies.nccl_tests import time_collective

P2P_LATENCY_S = 10e-6  # one point-to-point exchange: NCCL's ring Simple base + NVLink/net hop latencies (~10 us)


class Comm:
    """Closed-form collective times on one cluster (a topology spec and a GPU)."""

    def __init__(self, spec, gpu_name: str, calibration=None):
        self.fabric = fabric_of(spec, gpu_name, calibration)
        self.domain = spec.gpus_per_domain
        self._one_domain = lambda: topology.build(spec, max(spec.gpus_per_node, spec.gpus_per_domain),
                                                  gpu_preset(gpu_name), calibration=calibration)
        self._topo = None
        self.reduce = lru_cache(maxsize=None)(self._reduce)
        self.groups = lru_cache(maxsize=None)(self._groups)  # (tp, cp, dp, pp, ep, etp) -> Groups

    def _groups(self, tp: int, cp: int, dp: int, pp: int, ep: int, etp: int) -> "Groups":
        return Groups(self.domain, Layout({"tp": tp, "cp": cp, "dp": dp, "pp": pp}, ("tp", "cp", "dp", "pp"), ep,
                                          None if etp == tp else etp))

    def _reduce(self, op: CollectiveOp, nbytes: float, domains: tuple[int, ...]) -> float:
        """Seconds of an all_reduce / all_gather / reduce_scatter as NCCL's tuner predicts it."""
        if len(domains) < 2 or nbytes <= 0:
            return 0.0
        pick = tuner.pick(op, nbytes, domains, self.fabric)
        if len(set(domains)) > 1:
            return pick.time_s
        if self._topo is None:
            self._topo = self._one_domain()
        return time_collective(self._topo, op, pick.name, tuple(range(len(domains))), nbytes)

    def all_to_all(self, nbytes: float, domains: tuple[int, ...]) -> float:
        """Each member sends ``nbytes`` spread evenly over the group: the share for its own
        NVLink domain over NVLink, the rest through its NIC."""
        n = len(domains)
        if n < 2 or nbytes <= 0:
            return 0.0
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
    """NVLink domains of the members of rank 0's group on each axis (``groups["ep"]``),
    built on first use: tp, cp, dp (cp x dp), ep, edp (expert-dp), etp (expert-tp), pp
    (rank 0 and its next stage)."""

    def __init__(self, domain: int, layout: Layout):
        self.domain, self.layout, self.found = domain, layout, {}

    def __getitem__(self, axis: str) -> tuple[int, ...]:
        found = self.found.get(axis)
        if found is None:
            found = self.found[axis] = tuple(r // self.domain for r in self._members(axis))
        return found

    def _members(self, axis: str) -> tuple[int, ...]:
        layout = self.layout
        if axis in ("tp", "cp"):
            return layout.group(0, axis)
        if axis == "dp":
            return layout.group(0, "cp", "dp")
        if axis == "pp":
            return (0, layout.stage_rank(0, 1)) if layout.sizes["pp"] > 1 else (0,)
        return {"ep": layout.ep_group, "edp": layout.expert_dp_group, "etp": layout.expert_tp_group}[axis](0)
