"""A clean rail-optimised fat tree indexed as arrays, without building its graph.

:func:`sim.hardware.topology.fat_tree` adds a 131,072-GPU cluster's 590k nodes and 459k
links to a NetworkX graph one by one, and :class:`~sim.hardware.topology.Topology` then
numbers the directed links in the graph's edge order: ~15 s of a 131k-GPU step's ~40
(docs/scaling.md). On a fat tree the builder made and nothing changed since (one plane, no
faults, no calibration profile), that order is a closed form of the GPU index, so the link
ids, capacities, latencies and kinds, every GPU's first and last hops and the leaf x spine
table are computed here as arrays, the same numbers in the same order. The graph itself is
still built, on demand, for what reads it (``clustersim`` topology outputs, rail-only and
in-switch paths); tests/test_tree_arrays.py checks every array and link id against it.

The order (NetworkX iterates nodes in insertion order, each node's links in insertion
order, skipping links to nodes already visited): per NVLink domain starting at GPU i0 with
m GPUs, GPU i0's links to its NVSwitch and its NIC, the NVSwitch's links to GPUs i0+1 ..
i0+m-1, NIC i0's link to its leaf, then per GPU i0+k (k >= 1) its NIC link and the NIC's
leaf link: 3 links per GPU, 3m per domain. Then every leaf's S spine uplinks, leaves in
the order their first GPU appears (scalable unit, then rail). Edge e gives directed link
ids 2e (as listed) and 2e + 1 (reversed).

Run: ``python -m pytest -q tests/test_tree_arrays.py``
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .gpus import FABRIC_EFFICIENCY, GPU, LINK_LATENCY, nvlink_efficiency
from .specs import Builder, FatTreeSpec
from ..units import GB

KINDS = ("nvlink", "pcie", "ib")  # edge kind codes, in this order


def applies(spec: FatTreeSpec, faults=(), calibration=None) -> bool:
    """Whether :class:`TreeArrays` describes the topology :func:`build` would make: a plain
    one-plane fat tree of NVLink domains, no link fault, no calibration profile."""
    return spec.builder is Builder.FAT_TREE and spec.planes == 1 and not faults and calibration is None


@dataclass(frozen=True, eq=False)
class TreeArrays:
    """The links of ``fat_tree(num_gpus, spec, gpu)`` as arrays (see the module docstring)."""

    spec: FatTreeSpec
    num_gpus: int
    gpu: GPU

    @cached_property
    def bandwidths(self) -> tuple[float, float, float, float]:
        """Usable bytes/s of an NVLink, PCIe, NIC and leaf-uplink link (line rate x fabric
        efficiency, as the builder writes ``bw`` and Topology multiplies it)."""
        spec, gpu = self.spec, self.gpu
        nvlink = (spec.nvlink_gbps * GB) if spec.nvlink_gbps else gpu.nvlink_bw
        nic = (spec.nic_gbps * GB) if spec.nic_gbps else gpu.nic_bw
        uplink = spec.nodes_per_su * nic / spec.oversubscription / spec.spines
        ib = FABRIC_EFFICIENCY["ib"]
        return (nvlink * nvlink_efficiency(gpu.name), gpu.pcie_bw * FABRIC_EFFICIENCY["pcie"], nic * ib, uplink * ib)

    @property
    def leaf_count(self) -> int:
        """Leaves: one per rail per scalable unit (a last partial unit has those of its GPUs' rails)."""
        per, unit = self.spec.gpus_per_node, self.spec.gpus_per_node * self.spec.nodes_per_su
        rest = self.num_gpus % unit
        return self.num_gpus // unit * per + min(per, rest)

    @property
    def edge_count(self) -> int:
        """Undirected links: 3 per GPU, then every leaf's spine uplinks."""
        return 3 * self.num_gpus + self.leaf_count * self.spec.spines

    @cached_property
    def gpu_edges(self) -> dict[str, np.ndarray]:
        """Per GPU: the edge index of its NVLink, its PCIe link and its NIC's leaf link, and
        ``first`` (the domain's first GPU, whose NVLink edge is listed from the GPU side)."""
        n, dom = self.num_gpus, self.spec.gpus_per_domain
        i = np.arange(n, dtype=np.int64)
        i0 = i // dom * dom
        k, m = i - i0, np.minimum(dom, n - i0)
        first = k == 0
        return {"nv": np.where(first, 3 * i0, 3 * i0 + 1 + k), "nic": np.where(first, 3 * i0 + 1, 3 * i0 + m + 2 * k),
                "ib": np.where(first, 3 * i0 + m + 1, 3 * i0 + m + 2 * k + 1), "first": first}

    @cached_property
    def endpoint_links(self) -> dict[str, np.ndarray]:
        """Per GPU: the link ids of its first and last hops (as :attr:`Topology.endpoint_links`)."""
        e = self.gpu_edges
        up_nv = np.where(e["first"], 2 * e["nv"], 2 * e["nv"] + 1)
        return {"up_nv": up_nv, "down_nv": np.where(e["first"], up_nv + 1, up_nv - 1),
                "up_nic": 2 * e["nic"], "down_nic": 2 * e["nic"] + 1, "up_ib": 2 * e["ib"], "down_ib": 2 * e["ib"] + 1}

    def links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(caps, latency, kinds) per directed link id, as Topology builds them from the graph."""
        e, edges = self.gpu_edges, self.edge_count
        code = np.full(edges, 2, dtype=np.int64)  # leaf uplinks and NIC -> leaf: ib
        code[e["nv"]], code[e["nic"]] = 0, 1
        bw = np.array(self.bandwidths)
        cap = bw[code]
        cap[3 * self.num_gpus:] = bw[3]
        latency = np.array([LINK_LATENCY[k] for k in KINDS])[code]
        return np.repeat(cap, 2), np.repeat(latency, 2), np.repeat(np.array(KINDS)[code], 2)

    @cached_property
    def leaf_ids(self) -> np.ndarray:
        """Per GPU: its leaf's id (the order leaves first appear: unit, then rail)."""
        i, per = np.arange(self.num_gpus, dtype=np.int64), self.spec.gpus_per_node
        return i // (per * self.spec.nodes_per_su) * per + i % per

    def leaf_node(self, leaf: int) -> tuple:
        """The graph's name of leaf id ``leaf``."""
        per = self.spec.gpus_per_node
        return ("leaf", leaf // per, leaf % per)

    def spine_table(self) -> tuple[np.ndarray, np.ndarray, None]:
        """(up, down, None) as :func:`sim.hardware.paths.spine_table`: leaf -> spine and
        spine -> leaf link ids; no leaf links to a leaf."""
        leaves, spines = self.leaf_count, self.spec.spines
        up = 2 * (3 * self.num_gpus + np.arange(leaves * spines, dtype=np.int64).reshape(leaves, spines))
        return up, (up + 1).T.copy(), None

    def link_id(self, u: tuple, v: tuple) -> int | None:
        """The id of directed link u -> v (node names as the graph's), None if there is none."""
        for a, b, flip in ((u, v, 0), (v, u, 1)):
            edge = self._edge(a, b)
            if edge is not None:
                return 2 * edge[0] + (flip ^ edge[1])
        return None

    def _edge(self, a: tuple, b: tuple) -> tuple[int, int] | None:
        """(edge index, 1 if the edge is listed b -> a) of the link a - b, where a is the
        lower end (GPU, NIC or leaf), or None."""
        if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) >= 2 and len(b) >= 2):
            return None
        n, spec = self.num_gpus, self.spec
        if a[0] == "leaf" and b[0] == "spine" and len(a) == 3 and _int(b[1], spec.spines):
            per, (_, su, rail) = spec.gpus_per_node, a
            leaf = su * per + rail if _int(rail, per) and _int(su, n) else -1
            if 0 <= leaf < self.leaf_count:
                return 3 * n + leaf * spec.spines + b[1], 0
            return None
        if not _int(a[1], n) or len(a) != 2 or len(b) < 2:
            return None
        g, e = a[1], self.gpu_edges
        if a[0] == "gpu" and b == ("nvsw", g // spec.gpus_per_domain):
            return int(e["nv"][g]), 0 if e["first"][g] else 1
        if a[0] == "gpu" and b == ("nic", g):
            return int(e["nic"][g]), 0
        if a[0] == "nic" and b == ("leaf", g // (spec.gpus_per_node * spec.nodes_per_su), g % spec.gpus_per_node):
            return int(e["ib"][g]), 0
        return None

    def link_ends(self) -> list[tuple]:
        """(from node, to node) of every directed link, by link id."""
        n, spec = self.num_gpus, self.spec
        nv, nic, ib, first, leaf_ids = (a.tolist() for a in (*map(self.gpu_edges.get, ("nv", "nic", "ib", "first")),
                                                             self.leaf_ids))
        edges: list = [None] * self.edge_count
        for g in range(n):
            nvsw = ("nvsw", g // spec.gpus_per_domain)
            edges[nv[g]] = (("gpu", g), nvsw) if first[g] else (nvsw, ("gpu", g))
            edges[nic[g]] = (("gpu", g), ("nic", g))
            edges[ib[g]] = (("nic", g), self.leaf_node(leaf_ids[g]))
        for leaf in range(self.leaf_count):
            for s in range(spec.spines):
                edges[3 * n + leaf * spec.spines + s] = (self.leaf_node(leaf), ("spine", s))
        return [pair for u, v in edges for pair in ((u, v), (v, u))]


def _int(x, bound: int) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and 0 <= x < bound


class LinkIds:
    """``Topology.link_id`` of a :class:`TreeArrays` topology: (u, v) -> directed link id,
    computed rather than stored (a dict of 1.8M pairs at 131k GPUs)."""

    def __init__(self, tree: TreeArrays):
        self.tree = tree

    def get(self, pair: tuple, default=None):
        """The id of directed link ``pair`` = (u, v), or ``default``."""
        found = self.tree.link_id(*pair) if isinstance(pair, tuple) and len(pair) == 2 else None
        return default if found is None else found

    def __getitem__(self, pair: tuple) -> int:
        found = self.get(pair)
        if found is None:
            raise KeyError(pair)
        return found

    def __contains__(self, pair) -> bool:
        return self.get(pair) is not None

    def __len__(self) -> int:
        return 2 * self.tree.edge_count

    def __iter__(self):
        return iter(self.tree.link_ends())

    def items(self):
        """((u, v), id) of every directed link, by id (builds every node name: for outputs)."""
        return ((pair, lid) for lid, pair in enumerate(self.tree.link_ends()))
