"""Rails: which NIC a flow leaves its server by, what a GPU's routes depend on, and whose
routes a failed NIC changes; the routing rules stated once, for the router
(:meth:`sim.hardware.topology.Topology.route` and its vectorized form
:func:`sim.hardware.paths.routes`) and for folding (:mod:`sim.parallel.folding`, which
must know which ranks see a faulty NIC and which route alike).

A rail-optimised fat tree gives each GPU of a server its own NIC, plugged into the leaf
of its rail (its position in the server). A flow to a GPU in another NVLink domain
leaves by the NIC on the *destination's* rail: NCCL's PXN moves the data over NVLink to
the GPU of the source's server on that rail first, so the flow crosses one leaf and no
rail switch (NCCL src/graph/paths.cc, ``ncclTopoComputePaths``: a peer GPU on the same
node, reached over NVLink, with the better path to the NIC; on unless ``NCCL_PXN_DISABLE``).
Used by every fabric builder: the relay is the first hop also on rail-only and
multi-plane fabrics (sim/hardware/switching.py).
"""

import numpy as np


def pxn_relay(src, dst, per_node: int, domains: np.ndarray):
    """The GPU whose NIC a flow ``src -> dst`` across NVLink domains leaves by: the GPU of
    src's server on dst's rail when it exists and shares src's NVLink domain (PXN), else
    src itself. ``src``, ``dst``: GPU ids, two ints (one route) or two arrays (many);
    ``domains``: the NVLink domain of every GPU."""
    relay = src - src % per_node + dst % per_node
    if np.ndim(relay) == 0:  # one pair (Topology.route): plain ints, 20x faster than 0-d arrays
        src, relay = int(src), int(relay)
        return relay if relay != src and relay < len(domains) and domains[relay] == domains[src] else src
    ok = (relay != src) & (relay < len(domains))
    ok[ok] = domains[relay[ok]] == domains[src[ok]]
    return np.where(ok, relay, src)


def nics_carrying(src: int, peers: np.ndarray, per_node: int, domains: np.ndarray) -> set[int]:
    """The GPUs whose NICs carry ``src``'s flows to ``peers``: a flow to a peer in src's
    own NVLink domain takes no NIC (the NVSwitch), any other leaves by its PXN relay."""
    peers = np.asarray(peers, dtype=np.int64)
    away = peers[domains[peers] != domains[src]]
    return set(pxn_relay(np.full(len(away), src, dtype=np.int64), away, per_node, domains).tolist())


def placement(spec, domains: np.ndarray, world: int) -> np.ndarray:
    """Per GPU (columns): NVLink domain, server, scalable unit (leaf group), rail: all that
    a route between two GPUs depends on (``Topology.route``), so two groups whose members
    agree on which columns they share route their collectives alike."""
    gpu, per = np.arange(world), spec.gpus_per_node
    return np.column_stack([domains[:world], gpu // per, gpu // (per * spec.nodes_per_su), gpu % per])


def failed_nic_reach(server: int, spec, world: int) -> tuple[range, range]:
    """(the server's GPUs, its scalable unit's GPUs), for a server with a failed NIC
    (``[[cluster.faults]]`` factor 0: :func:`sim.hardware.faults.apply_faults` removes the
    NIC's link). The GPU's flows then take the graph's other shortest paths
    (``Topology.route``): over NVLink to a server mate and out through its NIC and rail
    leaf. So every GPU of the server routes differently, and the detour loads leaves
    beyond what their own NICs do, which every GPU of the unit on those rails may share."""
    per, su = spec.gpus_per_node, spec.gpus_per_node * spec.nodes_per_su
    first = server * per // su * su
    return range(server * per, min((server + 1) * per, world)), range(first, min(first + su, world))
