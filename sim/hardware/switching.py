"""Switch fabrics beyond the rail-optimized fat tree, and switches that compute.

- **Rail-only** (``builder = "rail_only"``; Wang et al. 2023, "How to Build Low-cost
  Networks for Large Language Models (without Sacrificing Performance)", arXiv:2307.12169):
  each rail is its own network (rail leaves and rail spines); no switch joins two rails,
  so cross-rail traffic first crosses NVLink to the GPU on the destination's rail, at the
  source (NCCL's PXN) or, when the source's NVLink domain has no GPU on that rail, at the
  destination.
- **Multi-plane** (``planes = P``): every NIC splits its bandwidth over P ports, port p on
  plane p, a leaf-and-spine network of its own (as multi-plane 800G NICs and dual-plane
  designs do); a flow is sprayed evenly over the planes.
- **In-switch reduction**: a hop may end or start at a switch instead of a GPU.
  :func:`nvls_port` (GPU g's NVSwitch, for NVLink SHARP) and :func:`sharp_port` (the IB
  leaf of g's NIC, for SHARP / NCCL CollNet) name those endpoints with negative ids; the
  reduced result coming back down as one chain over several GPUs is a multicast.
  An NVLS byte occupies the NVLink for 1/eta_nvls of a byte's time (route weight 1/eta,
  ``sim.hardware.gpus.NVLS_EFFICIENCY``, NCCL's ``nvlsEfficiency``), eta_nvls taken of
  NCCL's own NVLink figure (``sim.hardware.gpus.NCCL_NVLINK_SHARE``) where a part's rings
  would reach more (no preset's do now: NVLink5 parts' rings run at that figure).

:class:`Fabric` is what the collective tuner reads of a cluster. Try
``clustersim collective --op all_reduce --gpus 8 --topology dgx-h100 --explain``.
"""

from dataclasses import dataclass
from functools import cached_property

from ..errors import InputError
from .gpus import FABRIC_EFFICIENCY, LINK_LATENCY, NCCL_NVLINK_SHARE, NVLS_EFFICIENCY, arch, gpu_preset, \
    nvlink_efficiency
from .specs import Builder
from ..units import GB


def nvls_port(g: int) -> int:
    """Hop endpoint: the NVSwitch port of GPU g (in-switch reduction and multicast)."""
    return -1 - 2 * g


def sharp_port(g: int) -> int:
    """Hop endpoint: the IB leaf switch of GPU g's NIC (SHARP aggregation)."""
    return -2 - 2 * g


def switch_endpoint(x: int) -> tuple[str, int]:
    """("nvls" | "sharp", GPU) of a negative hop endpoint."""
    code = -x - 1
    return ("nvls" if code % 2 == 0 else "sharp"), code // 2


def leaf_name(su: int, rail: int, plane: int, planes: int) -> tuple:
    """The leaf of one rail of one scalable unit (and one plane)."""
    return ("leaf", su, rail) if planes == 1 else ("leaf", su, rail, plane)


def add_railed_fabric(g, num_gpus: int, spec, nic: float) -> None:
    """Leaves and spines of a rail-only and/or multi-plane fabric. Spines are numbered
    globally (``("spine", k)``, as ``[[cluster.faults]] spine = k`` names them): plane p of
    a fat tree owns spines p*S .. p*S+S-1; rail r of a rail-only fabric owns its own S per
    plane. Leaf uplinks: nodes_per_su x port bandwidth / oversubscription / S."""
    planes, per = spec.planes, spec.gpus_per_node
    gpus_per_su = per * spec.nodes_per_su
    port = nic / planes
    uplink = spec.nodes_per_su * port / spec.oversubscription / spec.spines
    for i in range(num_gpus):
        for p in range(planes):
            leaf = leaf_name(i // gpus_per_su, i % per, p, planes)
            g.add_node(leaf, kind="switch", plane=p)
            _edge(g, ("nic", i), leaf, port)
    for su in range(-(-num_gpus // gpus_per_su)):
        for rail in range(per):
            for p in range(planes):
                leaf = leaf_name(su, rail, p, planes)
                if leaf not in g:
                    continue
                group = rail * planes + p if spec.builder is Builder.RAIL_ONLY else p
                for s in range(spec.spines):
                    spine = ("spine", group * spec.spines + s)
                    g.add_node(spine, kind="switch", plane=p)
                    _edge(g, leaf, spine, uplink)


def _edge(g, u, v, bw: float) -> None:
    g.add_edge(u, v, bw=bw, kind="ib", latency=LINK_LATENCY["ib"])


@dataclass(frozen=True, eq=False)
class Fabric:
    """What the collective tuner and the in-switch algorithms know of a cluster (hashed by
    identity: one per Topology). Bandwidths in bytes/s per GPU after fabric efficiency."""

    arch: str  # GPU architecture (NCCL's tuner constants are per architecture)
    nvlink_w: float  # into the NVSwitch
    nic_w: float  # out of the node: the slower of PCIe and the NIC
    nvls: float  # NVLS efficiency; 0: the NVSwitches cannot reduce
    sharp: bool  # the IB switches reduce (SHARP)
    gpus_per_node: int
    gpus_per_su: int
    mesh: bool = False  # no switch in the node: GPUs meshed by xGMI links (sim/hardware/mesh.py)

    def leaf(self, g: int) -> tuple[int, int]:
        """(scalable unit, rail) of GPU g's leaf switch."""
        return g // self.gpus_per_su, g % self.gpus_per_node


def fabric_of(spec, gpu_name: str, calibration=None) -> Fabric:
    """The tuner's view of a topology spec with this GPU (``calibration``: a
    :class:`~sim.hardware.calibration.Calibration` whose link efficiencies replace the presets')."""
    gpu = gpu_preset(gpu_name)
    nvlink = spec.nvlink_gbps * GB if spec.nvlink_gbps else gpu.nvlink_bw
    nic = spec.nic_gbps * GB if spec.nic_gbps else gpu.nic_bw
    eta = NVLS_EFFICIENCY.get(arch(gpu_name), 0.0) if spec.nvls and spec.gpus_per_domain > 1 else 0.0
    eff = FABRIC_EFFICIENCY if calibration is None else {
        kind: calibration.link_efficiency(kind, FABRIC_EFFICIENCY[kind]) for kind in FABRIC_EFFICIENCY}
    nv_eff = nvlink_efficiency(gpu_name) if calibration is None else calibration.link_efficiency(
        "nvlink", nvlink_efficiency(gpu_name))
    share, part = NCCL_NVLINK_SHARE.get(arch(gpu_name), 1.0), nvlink_efficiency(gpu_name)
    if eta and share < part * (1 - 1e-9):  # NVLS runs at NCCL's NVLink figure, not the part's rings'
        eta *= share / part
    return Fabric(arch(gpu_name), nvlink * nv_eff,
                  min(gpu.pcie_bw * eff["pcie"], nic * eff["ib"]),
                  eta, spec.sharp, spec.gpus_per_node, spec.gpus_per_node * spec.nodes_per_su,
                  spec.builder is Builder.XGMI_MESH)


class SwitchRoutes:
    """Routes of :class:`~sim.hardware.topology.Topology` for rail-only and multi-plane
    fabrics and for hops that end at a switch (mixed into Topology)."""

    @cached_property
    def fabric(self) -> Fabric:
        """The tuner's view of this topology."""
        return fabric_of(self.spec, self.attrs.get("gpu", self.spec.gpu), self.attrs.get("calibration"))

    def _railed_hops(self, a: int, b: int, relay: int, prefix: list) -> list | None:
        """a -> b across nodes: NVLink to the relay on b's rail (PXN), its NIC sprayed over
        the planes, and in a rail-only fabric, when no GPU beside a sits on b's rail, over
        a's rail to the GPU on it beside b, then NVLink to b."""
        ends, per = self.endpoint_links, self.spec.gpus_per_node
        last, suffix = b, []
        if relay % per != b % per and self.spec.builder is Builder.RAIL_ONLY:
            last = b - b % per + relay % per
            if last >= self.num_gpus or self.domains[last] != self.domains[b]:
                return None  # no NVLink path to b's rail on either side
            suffix = [(ends["up_nv"][last], 1.0), (ends["down_nv"][b], 1.0)]
        fixed = prefix + [ends["up_nic"][relay], ends["down_nic"][last]] + [h for h, _ in suffix]
        planes = self._plane_hops(relay, last, (a, b))
        if min(fixed) < 0 or planes is None:
            return None
        return [(h, 1.0) for h in prefix + [ends["up_nic"][relay]]] + planes + \
            [(ends["down_nic"][last], 1.0)] + suffix

    def _plane_hops(self, src: int, dst: int, flow) -> list | None:
        """NIC of src -> NIC of dst over every plane, 1/P of the flow on each."""
        out = []
        ups, downs = self._plane_leaves[src], self._plane_leaves[dst]
        if len(ups) != self.spec.planes or len(downs) != self.spec.planes:
            return None  # a fault cut a port: search the graph
        for up, down in zip(ups, downs):
            first = self.link_id.get((("nic", src), up))
            last = self.link_id.get((down, ("nic", dst)))
            if first is None or last is None:
                return None
            core = self._core_hops(up, down, flow)
            out += [(first, 1 / len(ups))] + [(h, w / len(ups)) for h, w in core] + [(last, 1 / len(ups))]
        return out

    @cached_property
    def _plane_leaves(self) -> list[list]:
        """Per GPU: the leaves its NIC plugs into, in plane order."""
        g, out = self.graph, []
        for i in range(self.num_gpus):
            nic = ("nic", i)
            leaves = [n for n in g.neighbors(nic) if g.nodes[n]["kind"] == "switch"] if nic in g else []
            out.append(sorted(leaves, key=lambda n: g.nodes[n].get("plane", 0)))
        return out

    def _switch_hops(self, a: int, b: int) -> list[tuple[int, float]]:
        """Hops to or from a switch endpoint (see :func:`nvls_port`, :func:`sharp_port`)."""
        ends = self.endpoint_links
        if a < 0 and b < 0:  # leaf to leaf of a SHARP aggregation tree
            (_, x), (_, y) = switch_endpoint(a), switch_endpoint(b)
            hops = self._leaf_to_leaf(x, y)
        else:
            (kind, g), up = (switch_endpoint(b), True) if b < 0 else (switch_endpoint(a), False)
            gpu = a if up else b
            if kind == "nvls":
                if gpu != g or not self.fabric.nvls:
                    raise ValueError(f"no NVLS hop between GPU {gpu} and the NVSwitch of GPU {g}")
                hops = [(ends["up_nv" if up else "down_nv"][g], 1 / self.fabric.nvls)]
            elif up:
                hops = [(ends["up_nic"][gpu], 1.0)] + self._nic_ports(gpu, up=True) + self._leaf_to_leaf(gpu, g)
            else:
                hops = self._leaf_to_leaf(g, gpu) + self._nic_ports(gpu, up=False) + [(ends["down_nic"][gpu], 1.0)]
        if any(h < 0 for h, _ in hops):
            raise InputError("cluster.faults", f"in-switch reduction needs every member's NVLink and NIC "
                                               f"(hop {a} -> {b} lost one)")
        return hops

    def _nic_ports(self, g: int, up: bool) -> list[tuple[int, float]]:
        leaves = self._plane_leaves[g]
        pairs = [(("nic", g), leaf) if up else (leaf, ("nic", g)) for leaf in leaves]
        return [(self.link_id.get(p, -1), 1 / max(len(leaves), 1)) for p in pairs] or [(-1, 1.0)]

    def _leaf_to_leaf(self, x: int, y: int) -> list[tuple[int, float]]:
        """Core hops from GPU x's leaf (each plane) to GPU y's, sprayed."""
        ups, downs = self._plane_leaves[x], self._plane_leaves[y]
        out = []
        for up, down in zip(ups, downs):
            out += [(h, w / len(ups)) for h, w in self._core_hops(up, down, (x, y))]
        return out

