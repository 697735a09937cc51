"""Cluster topologies as NetworkX graphs: NVLink domains joined by an InfiniBand fat tree
(or switchless xGMI-meshed AMD nodes, :mod:`sim.hardware.mesh`).

Nodes are GPUs, NVSwitches, NICs and IB switches; every edge is a full-duplex link with
``bw`` (bytes/s per direction, line rate), ``kind`` (nvlink | xgmi | pcie | ib) and ``latency``
(seconds). Builders are plain functions returning a graph (networkx generator style) from a
:class:`~sim.hardware.specs.FatTreeSpec` (a topology file, :mod:`sim.hardware.specs`);
:class:`Topology` indexes a graph for the network model: directed link ids, capacities
after fabric efficiency, and routes.

Run ``clustersim collective --op all_reduce --algo ring --gpus 64 --topology dgx-a100``
to see a topology at work.
"""

from dataclasses import dataclass
from functools import cached_property
import zlib

import networkx as nx
import numpy as np

from ..errors import InputError
from .faults import apply_faults
from .gpus import FABRIC_EFFICIENCY, GPU, LINK_LATENCY, gpu_preset, nvlink_efficiency  # noqa: F401 (doctests)
from . import mesh
from .rails import pxn_relay
from .calibration import apply as apply_calibration
from .specs import Builder, FatTreeSpec, Routing  # (topology files are read and checked in specs)
from .switching import SwitchRoutes
from .tree_arrays import LinkIds, TreeArrays, applies as arrays_apply
from ..units import GB


def fat_tree(num_gpus: int, spec: FatTreeSpec, gpu: GPU) -> nx.Graph:
    """NVLink domains of ``spec.gpus_per_domain`` GPUs on a rail-optimized two-level IB fat tree.

    Each GPU links to its domain's NVSwitch (NVLink) and to its own NIC (PCIe); NIC ``r``
    of every server in a scalable unit plugs into that unit's rail-``r`` leaf; leaves link
    to every spine with uplink bandwidth = downlink bandwidth / oversubscription.

    >>> g = fat_tree(16, FatTreeSpec("t"), gpu_preset("h100-sxm"))
    >>> sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu")
    16
    """
    nvlink = (spec.nvlink_gbps * GB) if spec.nvlink_gbps else gpu.nvlink_bw
    nic = (spec.nic_gbps * GB) if spec.nic_gbps else gpu.nic_bw
    g = nx.Graph(name=spec.name, gpu=gpu.name)
    mesh.check_gpu(spec, gpu)
    if spec.builder is Builder.XGMI_MESH:  # per link: nvlink_gbps (or the GPU's) over its peer links
        mesh.add_mesh(g, num_gpus, spec, nvlink / gpu.peer_links, gpu.pcie_bw)
    else:
        _add_domains(g, num_gpus, spec, nvlink, gpu.pcie_bw, nvlink_efficiency(gpu.name))
    if spec.builder in (Builder.FAT_TREE, Builder.XGMI_MESH) and spec.planes == 1:
        _add_fabric(g, num_gpus, spec, nic)
        g.graph["connected_with"] = g.number_of_edges()  # built connected: Topology re-checks if links go
    else:  # rail-only or multi-plane (sim/hardware/switching.py)
        from .switching import add_railed_fabric

        add_railed_fabric(g, num_gpus, spec, nic)
    return g


def _add_domains(g: nx.Graph, num_gpus: int, spec: FatTreeSpec, nvlink: float, pcie: float,
                 nvlink_eff: float = FABRIC_EFFICIENCY["nvlink"]) -> None:
    eff = None if nvlink_eff == FABRIC_EFFICIENCY["nvlink"] else nvlink_eff  # NVLink5 differs
    for i in range(num_gpus):
        domain, node = i // spec.gpus_per_domain, i // spec.gpus_per_node
        g.add_node(("gpu", i), kind="gpu", domain=domain, node=node)
        g.add_node(("nvsw", domain), kind="nvswitch")
        g.add_node(("nic", i), kind="nic")
        _link(g, ("gpu", i), ("nvsw", domain), nvlink, "nvlink", eff)
        _link(g, ("gpu", i), ("nic", i), pcie, "pcie")


def _add_fabric(g: nx.Graph, num_gpus: int, spec: FatTreeSpec, nic: float) -> None:
    gpus_per_su = spec.gpus_per_node * spec.nodes_per_su
    sus = -(-num_gpus // gpus_per_su)
    uplink = spec.nodes_per_su * nic / spec.oversubscription / spec.spines
    for i in range(num_gpus):
        leaf = ("leaf", i // gpus_per_su, i % spec.gpus_per_node)
        g.add_node(leaf, kind="switch")
        _link(g, ("nic", i), leaf, nic, "ib")
    for su in range(sus):
        for rail in range(spec.gpus_per_node):
            if g.has_node(("leaf", su, rail)):
                for s in range(spec.spines):
                    g.add_node(("spine", s), kind="switch")
                    _link(g, ("leaf", su, rail), ("spine", s), uplink, "ib")


def _link(g: nx.Graph, u, v, bw: float, kind: str, eff: float | None = None) -> None:
    """A full-duplex link; ``eff`` overrides FABRIC_EFFICIENCY[kind] (NVLink5)."""
    g.add_edge(u, v, bw=bw, kind=kind, latency=LINK_LATENCY[kind])
    if eff is not None:
        g.edges[u, v]["eff"] = eff


@dataclass(frozen=True)
class Route:
    """Directed link ids of a path with the share of the flow each carries (below 1 where
    traffic is sprayed over equal-cost paths), and the path latency in seconds."""

    links: np.ndarray
    weights: np.ndarray
    latency: float


class Topology(SwitchRoutes):
    """A graph indexed for the network model.

    ``caps[l]`` is the usable bandwidth (bytes/s) of directed link ``l`` after the fabric
    efficiency of its kind; ``route(a, b)`` returns the link ids from GPU ``a`` to GPU ``b``.
    ``link_id[(u, v)]`` is the id of the directed link u -> v; :attr:`endpoint_links` and
    :attr:`leaves` give every GPU's first and last hops (read by sim/hardware/paths.py).
    Given ``tree`` instead of a graph (:func:`build` on a clean fat tree), the links are
    its arrays (:mod:`sim.hardware.tree_arrays`, the same ids) and :attr:`graph` is built
    only when read; ``attrs`` is the graph's own attributes either way.
    """

    def __init__(self, graph: nx.Graph | None, spec: FatTreeSpec, tree: TreeArrays | None = None):
        self.spec, self.tree = spec, tree
        self._routes: dict[tuple[int, int], Route] = {}
        self._core_paths: dict[tuple, list] = {}
        self._core_shares: dict[tuple, list] = {}  # sprayed (leaf, leaf) -> link shares
        if tree is not None:
            self.attrs = {"name": spec.name, "gpu": tree.gpu.name}
            self.num_gpus, self.link_id = tree.num_gpus, LinkIds(tree)
            self.caps, self.latency, self.kinds = tree.links()
            return
        self.__dict__["graph"], self.attrs = graph, graph.graph
        gpus = [n for n, d in graph.nodes(data=True) if d["kind"] == "gpu"]
        if gpus and not self.intact and not nx.node_connected_component(graph, gpus[0]).issuperset(gpus):
            # (a switch left without links, e.g. a failed spine, isolates no GPU: fine)
            parts = sum(1 for c in nx.connected_components(graph) if any(n in c for n in gpus))
            raise InputError("cluster.topology", f"the network is disconnected ({parts} parts hold GPUs)")
        self.num_gpus = len(gpus)
        self.link_id: dict[tuple, int] = {}
        caps, lats, kinds = [], [], []
        for u, v, d in graph.edges(data=True):
            for a, b in ((u, v), (v, u)):
                self.link_id[(a, b)] = len(caps)
                caps.append(d["bw"] * d.get("eff", FABRIC_EFFICIENCY[d["kind"]]))
                lats.append(d["latency"])
                kinds.append(d["kind"])
        self.caps, self.latency = np.array(caps), np.array(lats)
        self.kinds = np.array(kinds)

    @cached_property
    def graph(self) -> nx.Graph:
        """The NetworkX graph (given, or of a ``tree`` topology built now: the same links)."""
        return fat_tree(self.num_gpus, self.spec, self.tree.gpu)

    @cached_property
    def intact(self) -> bool:
        """Whether the graph is as its builder left it, every link there (counted once)."""
        return self.tree is not None or self.attrs.get("connected_with") == self.graph.number_of_edges()

    def domain(self, gpu: int) -> int:
        """NVLink domain of a GPU."""
        return int(self.domains[gpu])

    def server(self, gpu: int) -> int:
        """Server (node) index of a GPU."""
        if self.tree is not None:
            return gpu // self.spec.gpus_per_node
        return self.graph.nodes[("gpu", gpu)]["node"]

    @cached_property
    def link_ends(self) -> list[tuple]:
        """(from node, to node) of every directed link, by link id."""
        if self.tree is not None:
            return self.tree.link_ends()
        ends = [None] * len(self.caps)
        for pair, lid in self.link_id.items():
            ends[lid] = pair
        return ends

    @cached_property
    def domains(self) -> np.ndarray:
        """Array: NVLink domain of every GPU."""
        if self.tree is not None:
            return np.arange(self.num_gpus) // self.spec.gpus_per_domain
        node = self.graph._node
        return np.array([node[("gpu", i)]["domain"] for i in range(self.num_gpus)])

    def route(self, a: int, b: int) -> Route:
        """The path a -> b (cached). Same domain: through the NVSwitch. Otherwise through a
        NIC on the destination's rail (NCCL's PXN relays over NVLink to the GPU on that
        rail) -> leaf -> spines -> leaf -> NIC -> GPU, sprayed evenly over the equal-cost
        spine paths (IB adaptive routing) or hashed onto one (``routing = "ecmp"``)."""
        key = (a, b)
        found = self._routes.get(key)
        if found is None:
            hops = self._fast_route(a, b) if a >= 0 and b >= 0 else self._switch_hops(a, b)
            if hops is None:  # a fault removed a link of the usual path: search the graph
                hops = self._graph_route(("gpu", a), ("gpu", b), key)
            found = self._routes[key] = self._to_route(hops)
        return found

    def _to_route(self, hops: list[tuple[int, float]]) -> Route:
        links = np.array([h[0] for h in hops], dtype=np.int64)
        weights = np.array([h[1] for h in hops])
        # (a weight above 1 is an in-switch reduction's slower use of one link, not more hops)
        return Route(links, weights, float((self.latency[links] * np.minimum(weights, 1.0)).sum()))

    def _fast_route(self, a: int, b: int) -> list[tuple[int, float]] | None:
        ends = self.endpoint_links
        if self.spec.builder is Builder.XGMI_MESH:
            return self._mesh_hops(a, b)
        if self.domains[a] == self.domains[b]:
            hops = [ends["up_nv"][a], ends["down_nv"][b]]
            return None if min(hops) < 0 else [(h, 1.0) for h in hops]
        relay, prefix = self._rail_relay(a, b)
        if self.spec.planes > 1 or self.spec.builder is not Builder.FAT_TREE:
            return self._railed_hops(a, b, relay, prefix)  # sim/hardware/switching.py
        first = prefix + [ends["up_nic"][relay], ends["up_ib"][relay]]
        last = [ends["down_ib"][b], ends["down_nic"][b]]
        if min(first + last) < 0:
            return None
        core = self._core_hops(self.leaves[relay], self.leaves[b], (a, b))
        return [(h, 1.0) for h in first] + core + [(h, 1.0) for h in last]

    def _mesh_hops(self, a: int, b: int) -> list[tuple[int, float]] | None:
        """A switchless xGMI node (sim/hardware/mesh.py): a peer over its own link; another
        node from a's own NIC, no relay (None where a fault removed a link)."""
        if self.domains[a] == self.domains[b]:
            link = self.link_id.get((("gpu", a), ("gpu", b)), -1)
            return None if link < 0 else [(link, 1.0)]
        ends = self.endpoint_links
        first, last = [ends["up_nic"][a], ends["up_ib"][a]], [ends["down_ib"][b], ends["down_nic"][b]]
        if min(first + last) < 0:
            return None
        core = self._core_hops(self.leaves[a], self.leaves[b], (a, b))
        return [(h, 1.0) for h in first] + core + [(h, 1.0) for h in last]

    def _rail_relay(self, a: int, b: int) -> tuple[int, list[int]]:
        """PXN (:func:`sim.hardware.rails.pxn_relay`): the GPU of a's server on b's rail,
        and the NVLink hops to reach it."""
        relay = pxn_relay(a, b, self.spec.gpus_per_node, self.domains)
        if relay == a:
            return a, []
        ends = self.endpoint_links
        return relay, [ends["up_nv"][a], ends["down_nv"][relay]]

    def _core_hops(self, la, lb, flow: tuple[int, int]) -> list[tuple[int, float]]:
        spray = self.spec.routing is not Routing.ECMP
        found = self._core_shares.get((la, lb)) if spray else None
        if found is not None:  # sprayed shares depend on the leaves only, not on the flow
            return found
        paths = self._paths(la, lb)
        if not spray:
            paths = [paths[zlib.crc32(repr(flow).encode()) % len(paths)]]
        share: dict[int, float] = {}
        for nodes in paths:
            for u, v in zip(nodes, nodes[1:]):
                link = self.link_id[(u, v)]
                share[link] = share.get(link, 0.0) + 1.0 / len(paths)
        found = sorted(share.items())
        if spray:
            self._core_shares[(la, lb)] = found
        return found

    def _graph_route(self, u, v, flow) -> list[tuple[int, float]]:
        nodes = self._paths(u, v)[zlib.crc32(repr(flow).encode()) % len(self._paths(u, v))]
        return [(self.link_id[(x, y)], 1.0) for x, y in zip(nodes, nodes[1:])]

    @cached_property
    def endpoint_links(self) -> dict[str, np.ndarray]:
        """Per GPU: the link ids of its first and last hops (-1 where a fault removed one)."""
        if self.tree is not None:
            return self.tree.endpoint_links
        n, get = self.num_gpus, self.link_id.get
        gpus, nics = [("gpu", i) for i in range(n)], [("nic", i) for i in range(n)]
        pairs = {"up_nv": zip(gpus, [("nvsw", d) for d in self.domains.tolist()]),
                 "up_nic": zip(gpus, nics), "up_ib": zip(nics, self.leaves)}
        out = {}
        for name, ends in pairs.items():
            ends = list(ends)
            out[name] = np.array([get(pair, -1) for pair in ends], dtype=np.int64)
            out[name.replace("up_", "down_")] = np.array([get((b, a), -1) for a, b in ends], dtype=np.int64)
        return out

    @cached_property
    def leaves(self) -> list:
        """Per GPU: the IB switch its NIC plugs into (None if the NIC is cut off)."""
        if self.tree is not None:
            return [self.tree.leaf_node(leaf) for leaf in self.tree.leaf_ids.tolist()]
        adj, node = self.graph._adj, self.graph._node  # (NetworkX's own dicts: 131k lookups)
        out = []
        for i in range(self.num_gpus):
            leaves = [x for x in adj.get(("nic", i), ()) if node[x]["kind"] == "switch"]
            out.append(leaves[0] if leaves else None)
        return out

    def _paths(self, u, v) -> list[list]:
        """Every equal-cost shortest path u -> v (cached)."""
        paths = self._core_paths.get((u, v))
        if paths is None and self.tree is not None and u[0] == v[0] == "leaf":  # every spine joins two leaves
            paths = [[u]] if u == v else [[u, ("spine", s), v] for s in range(self.spec.spines)]
            self._core_paths[(u, v)] = paths
        if paths is None:
            graph = self.graph if u[0] == "gpu" else self._switch_graph
            try:
                paths = _short_paths(graph, u, v) or sorted(nx.all_shortest_paths(graph, u, v))
            except (nx.NetworkXNoPath, nx.NodeNotFound):
                raise InputError("faults", f"no path left from {u} to {v}") from None
            self._core_paths[(u, v)] = paths
        return paths

    @cached_property
    def _switch_graph(self) -> nx.Graph:
        switches = [n for n, d in self.graph.nodes(data=True) if d["kind"] == "switch"]
        return self.graph.subgraph(switches).copy()  # a copy: subgraph views are slow to search


def _short_paths(graph: nx.Graph, u, v) -> list[list]:
    """Shortest paths of at most two hops, found without a graph-wide search (the common
    case in a fat tree: same leaf, or leaf -> spine -> leaf); [] when the path is longer."""
    if u == v:
        return [[u]]
    if u not in graph or v not in graph:
        return []
    if graph.has_edge(u, v):
        return [[u, v]]
    return [[u, w, v] for w in sorted(set(graph.adj[u]) & set(graph.adj[v]))]


def build(spec: FatTreeSpec, num_gpus: int, gpu: GPU, key: str = "cluster", faults=(), calibration=None) -> Topology:
    """Build and index the topology for ``num_gpus`` GPUs (refused before any graph is
    built when the topology holds fewer), with link ``faults`` applied
    (:func:`sim.hardware.faults.apply_faults`) and ``calibration``: a measured profile's
    link efficiencies and latencies (:mod:`sim.hardware.calibration`)."""
    if spec.max_gpus is not None and num_gpus > spec.max_gpus:
        raise InputError(key, f"{num_gpus} GPUs asked but topology {spec.name!r} holds {spec.max_gpus}")
    if arrays_apply(spec, faults, calibration):  # links as arrays, the graph only if read
        mesh.check_gpu(spec, gpu)
        return Topology(None, spec, TreeArrays(spec, num_gpus, gpu))
    graph = fat_tree(num_gpus, spec, gpu)
    apply_faults(graph, faults, spec)
    apply_calibration(graph, calibration)
    return Topology(graph, spec)
