"""Switchless nodes: AMD Instinct GPUs fully meshed by xGMI (Infinity Fabric) links.

An 8-GPU MI300X / MI325X / MI355X platform has no switch inside the node: each GPU has 7
xGMI links, one straight to each peer ("a fully connected mesh", ROCm blogs, "Understanding
RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02), so a GPU reaches
a peer over that one link only (64 GB/s per direction on CDNA3, 45-48 GB/s usable:
``FABRIC_EFFICIENCY["xgmi"]`` in sim/hardware/gpus.py; RCCL's topology model assumes 48 GB/s
per link, ROCm/rccl src/graph/topo.h ``GFX94X_XGMI_WIDTH``). Scale-out is one 400 Gb/s NIC per GPU into the rail-optimized fat
tree of :func:`sim.hardware.topology.fat_tree` (topology ``builder = "xgmi_mesh"``).
Routes (``Topology._mesh_hops``): a peer in the node over its own link; a GPU of another
node from the GPU's own NIC (leaf -> spines -> leaf -> NIC), no relay over the mesh (PXN,
an NVSwitch-node path, is not modelled here). Try ``clustersim collective --op all_reduce --gpus 8 --topology amd-xgmi``.
"""

from ..errors import InputError
from .gpus import LINK_LATENCY
from .specs import Builder


def check_gpu(spec, gpu, key: str = "cluster.gpu") -> None:
    """InputError(key) when the GPU cannot sit in this topology: an xGMI-meshed GPU (AMD
    Instinct) on an NVSwitch system, a GPU without xGMI links on the mesh, or more GPUs per
    node than a GPU has links to reach them."""
    mesh = spec.builder is Builder.XGMI_MESH
    if gpu.peer_links and not mesh:
        raise InputError(key, f"{gpu.name} joins its peers by xGMI links, not NVLink switches; topology "
                              f"{spec.name!r} is an NVSwitch system (use topology 'amd-xgmi')")
    if mesh and not gpu.peer_links:
        raise InputError(key, f"{gpu.name} has no xGMI links; topology {spec.name!r} meshes AMD Instinct GPUs "
                              "(mi300x, mi325x, mi355x)")
    if mesh and spec.gpus_per_node > gpu.peer_links + 1:
        raise InputError(key, f"{gpu.name} has {gpu.peer_links} xGMI links: it meshes at most "
                              f"{gpu.peer_links + 1} GPUs, but topology {spec.name!r} puts {spec.gpus_per_node} in a node")


def add_mesh(g, num_gpus: int, spec, link_bw: float, pcie: float) -> None:
    """GPUs (one domain per node), a direct xGMI link between every two GPUs of a node at
    ``link_bw`` bytes/s per direction, and each GPU's PCIe link to its NIC."""
    per = spec.gpus_per_node
    lat = LINK_LATENCY["xgmi"]
    for i in range(num_gpus):
        node = i // per
        g.add_node(("gpu", i), kind="gpu", domain=node, node=node)
        g.add_node(("nic", i), kind="nic")
        g.add_edge(("gpu", i), ("nic", i), bw=pcie, kind="pcie", latency=LINK_LATENCY["pcie"])
        for j in range(node * per, i):
            g.add_edge(("gpu", j), ("gpu", i), bw=link_bw, kind="xgmi", latency=lat)
