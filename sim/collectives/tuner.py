"""What ``auto`` means: NCCL's tuner, with this cluster's bandwidths.

NCCL picks an algorithm and a protocol per collective, size and communicator by a cost
model, time = latency + bytes / bandwidth, over the (algorithm, protocol) pairs the
system supports, taking the smallest (NVIDIA/nccl src/graph/tuning.cc,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``, master at commit 5067397c). This module
is that model: NCCL's latencies (``baseLatencies``, ``hwLatencies``, the network
overheads), its per-protocol and per-algorithm bandwidth refinements and caps
(``llMaxBws``, ``perChMax*Bws``, ``nvlsEfficiency``, the tree correction factors), and
its enable rules (NVLS needs NVSwitches that reduce; NVLS across nodes and CollNet need
SHARP; NVLS_TREE needs several nodes; PAT needs one GPU per node). What NCCL measures by
its topology search (bandwidth per channel inside a node and across nodes) comes from
the cluster instead: W_nvlink per GPU, and k x W_nic across nodes for k GPUs per node
(one NIC each). A "node" is an NVLink domain (NCCL's MNNVL treats an NVL72 rack as one).

Simplifications, as documented in docs/collectives.md: 16 channels for rings and trees
(the caps they scale bind only on trees joining Blackwell NVL72 racks or 8-GPU Blackwell
nodes: :func:`tree_cap`, which the simulated tree obeys too), x86 CPUs for the LL caps across
nodes, balanced trees (no 0.85 tree-pattern factor), CollNet Direct only. NVLS_TREE's channels
are NCCL's, its heads (:func:`nvls_heads`), and its per-head cap (:func:`nvls_tree_cap`) binds
the simulated NVLS_TREE too.
Run ``clustersim collective --op all_reduce --gpus 8 --topology dgx-h100 --explain``.
"""

from dataclasses import dataclass
import math

from .kinds import ALL_GATHER, ALL_REDUCE, BROADCAST, REDUCE_SCATTER, Algorithm, CollectiveOp
from .protocols import PROTOCOLS

US, GBS = 1e-6, 1e9
ORDER = (Algorithm.TREE, Algorithm.RING, Algorithm.COLLNET, Algorithm.NVLS, Algorithm.NVLS_TREE,
         Algorithm.PAT)  # NCCL's algorithm order
N_CHANNELS = 16
NVLS_CHANNELS = {"hopper": (16, 16), "blackwell": (24, 32)}  # (one node, several); transport/nvls.cc
BASE = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet": (0, 0, 0), "nvls": (0, 0, 0),
        "nvls_tree": (0, 0, 0), "pat": (8.0, 8.0, 8.0)}  # baseLatencies, us (LL, LL128, Simple)
HW = {"nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet": (0, 0, 3.7),
                 "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
      "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnet": (0, 0, 31),
              "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)}}  # hwLatencies, us
ARCHS = ("volta", "ampere", "hopper", "blackwell")
LL_MAX = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))  # llMaxBws
RING_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)  # perChMaxRingLL128Bws
TREE_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))  # perChMaxTreeLL128Bws
TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))  # perChMaxTreeBws
NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))  # perChMaxNVLSTreeBws
TREE_CORRECTION = (  # treeCorrectionFactor[protocol][log2(bytes / 64)]
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9))
GATHERS = (ALL_GATHER, REDUCE_SCATTER)  # n - 1 steps, one share each; tuning.cc treats the two alike


@dataclass(frozen=True)
class Candidate:
    """One (algorithm, protocol) NCCL's model considers, with what it predicts."""

    algo: Algorithm
    proto: str
    latency_s: float
    algbw: float  # bytes/s
    time_s: float

    @property
    def name(self) -> str:
        """The schedule's algorithm name: Simple is the bare algorithm."""
        return self.algo if self.proto == "simple" else f"{self.algo}:{self.proto}"


@dataclass(frozen=True)
class Comm:
    """NCCL's view of one communicator on this fabric."""

    op: CollectiveOp
    ranks: int
    nodes: int
    ppn: float  # ranks per node, as NCCL's float nRanks / nNodes
    local: int  # the most ranks in one node (NICs a ring spreads over)
    fabric: object

    @property
    def arch(self) -> int:
        return ARCHS.index(self.fabric.arch) if self.fabric.arch in ARCHS else 1

    @property
    def nsteps(self) -> int:
        n = self.ranks
        return 2 * (n - 1) if self.op is ALL_REDUCE else n - 1 if self.op in GATHERS else n

    @property
    def index2(self) -> int:
        return self.nodes - 1 if self.nodes <= 2 else 2


def comm_of(op: CollectiveOp, domains: tuple, fabric) -> Comm:
    """Ranks, nodes (NVLink domains) and ranks per node of a group (``op`` may be its text: a
    study's or a test's; it becomes the member it names)."""
    counts: dict[int, int] = {}
    for d in domains:
        counts[d] = counts.get(d, 0) + 1
    return Comm(CollectiveOp(op), len(domains), len(counts), len(domains) / len(counts), max(counts.values()), fabric)


def enabled(c: Comm, algo: str, proto: str) -> bool:
    """NCCL's rules for which (algorithm, protocol) may run this collective here."""
    f, op = c.fabric, c.op
    if op is BROADCAST:
        return algo == Algorithm.RING
    if op in GATHERS and algo not in (Algorithm.PAT, Algorithm.RING, Algorithm.NVLS, Algorithm.COLLNET):
        return False  # (CollNet's: the SHARP plugin's iallgather / ireducescatter, one NIC per GPU)
    if (op is ALL_REDUCE and algo == Algorithm.PAT) or (algo not in (Algorithm.RING, Algorithm.TREE)
                                                         and proto != "simple"):
        return False
    if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
        multi_ok = c.nodes == 1 or (algo == Algorithm.NVLS_TREE) or (f.sharp and op is ALL_REDUCE)
        arity_ok = op is ALL_REDUCE or c.local <= 32  # enqueue.cc: NCCL_MAX_NVLS_ARITY local ranks
        return f.nvls > 0 and c.local >= 2 and multi_ok and arity_ok \
            and not (algo == Algorithm.NVLS_TREE and c.nodes == 1)
    if algo == Algorithm.COLLNET:
        return f.sharp and c.nodes > 1 and f.nvlink_w > 0
    if algo == Algorithm.PAT:
        return c.nodes == c.ranks
    return True


def bus_bandwidth(c: Comm, algo: str, proto: str) -> float:
    """NCCL's bus bandwidth (bytes/s) of one (algorithm, protocol), before conversion."""
    f = c.fabric
    intra, inter = f.nvlink_w, c.local * f.nic_w
    if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
        return _nvls_bus(c, algo, intra, inter)
    if algo == Algorithm.PAT:
        return inter * 0.75
    if algo == Algorithm.COLLNET and c.op in GATHERS:
        return c.local * min(intra / c.local, 0.9 * f.nic_w)  # ppn x min(bwIntra, 0.9 bwInter) per head
    one = c.nodes == 1
    if algo == Algorithm.RING:
        bw = intra if one else min(intra, inter)
    elif algo == Algorithm.COLLNET:
        bw = min(intra, 2 * inter) * (0.85 if c.arch >= 2 else 1.0)
    else:  # tree: two nodes may run the intra-node part at twice the network's speed
        bw = intra if one else min(intra, 2 * inter if c.nodes <= 2 else inter)
    ll_max = LL_MAX[c.arch if one else 0][c.index2] * GBS
    ch = N_CHANNELS * GBS
    if algo == Algorithm.RING and proto == "ll":
        bw = min(ll_max, bw * 0.5)
    elif algo == Algorithm.RING and proto == "ll128":
        bw = min(bw * 0.92, ch * RING_LL128[c.arch][c.index2])
    elif algo == Algorithm.TREE:
        bw = min(bw * 0.92, ch * TREE[c.arch][c.index2])
        if proto == "ll":
            bw = min(bw / 3.8, ll_max)
        elif proto == "ll128":
            bw = min(bw * (7 / 9 if one else 120 / 128), ch * TREE_LL128[c.arch][c.index2])
    return bw


def tree_cap(c: Comm) -> float:
    """Share of its link-limited bandwidth a tree all-reduce keeps under NCCL's per-channel
    tree cap (``nChannels x perChMaxTreeBws``, tuning.cc), 1 where the cap does not bind.

    The cap is what one tree channel's kernel moves, whatever the links could: it binds where
    NVLink is fast and the chain long, i.e. Blackwell NVL72 racks joined by a tree (2 racks:
    16 x 42.8 = 685 GB/s of bus bandwidth against 721.8 over NVLink). The simulator's trees run
    Simple at link rate calibrated without NCCL's 0.92 (the fabric efficiency holds it), so only
    the cap is applied (docs/calibrate.md, "Two racks": the two-rack GB200 table of
    coreweave/nccl-tests, read as labelled with NVLS off, measures 2,125 and 3,570 us at 512 MB
    and 1 GB; the tree at the cap takes 2,036 and 3,582).
    NVIDIA architectures only (the tuner's other GPUs borrow Ampere's constants)."""
    if c.fabric.arch not in ARCHS:
        return 1.0
    f = c.fabric
    bw = f.nvlink_w if c.nodes == 1 else min(f.nvlink_w, (2 if c.nodes <= 2 else 1) * c.local * f.nic_w)
    cap = N_CHANNELS * GBS * TREE[c.arch][c.index2]
    return min(1.0, cap / bw) if bw > 0 else 1.0


def nvls_heads(c: Comm) -> int:
    """NCCL's NVLS heads per NVLink domain: the NVLS graph's channels (search.cc, one per
    GPU with its own NIC across nodes, ``maxChannels = min(NCCL_MAX_NVLS_ARITY, ngpus)``;
    every GPU of a preset has its own NIC), so at most 32."""
    return min(c.local, 32)


def nvls_tree_cap(c: Comm) -> float:
    """NCCL's bound on an NVLS_TREE all-reduce's bus bandwidth (bytes/s): ``graphs[a]->nChannels
    x perChMaxNVLSTreeBw`` (tuning.cc ``ncclTopoTuneModel``), the NVLS graph's channels being its
    heads (:func:`nvls_heads`). What one head's reduce and broadcast warps move to and from the
    network per second, whatever the links could: 8 B300 per node, 2 nodes: 8 x 96 = 768 GB/s
    (OCI measures 766.8); 8 H100: 8 x 57.7 = 462. Infinite where NCCL has no constant."""
    if c.fabric.arch not in ARCHS or c.nodes < 2:
        return math.inf
    return nvls_heads(c) * NVLS_TREE[c.arch][c.index2] * GBS


def _nvls_bus(c: Comm, algo: str, intra: float, inter: float) -> float:
    # NVLS_TREE: NCCL's nChannels is the NVLS graph's, its heads (tuning.cc reads graphs[a]->nChannels);
    # plain NVLS keeps the NVLS CTA count (transport/nvls.cc), a simplification of its (n-1)/n term
    n_ch = nvls_heads(c) if algo == Algorithm.NVLS_TREE else NVLS_CHANNELS.get(c.fabric.arch, (16, 16))[c.nodes > 1]
    # (the fabric's NVLS efficiency: tuning.cc's nvlsEfficiency of NCCL's own NVLink figure,
    # sim.hardware.switching.fabric_of, the one the simulated NVLS hops run at)
    per_ch = intra / n_ch * c.fabric.nvls * (n_ch - 1) / n_ch
    per_ch *= 2 if c.op is ALL_REDUCE else (c.ppn - 1) / c.ppn
    limits = [per_ch]
    if c.nodes > 1:
        limits.append(inter / n_ch * (2 if c.nodes <= 2 and algo == Algorithm.NVLS_TREE else 1))
    return min(n_ch * min(limits), nvls_tree_cap(c) if algo == Algorithm.NVLS_TREE else math.inf)


def algo_bandwidth(c: Comm, algo: str, proto: str) -> float:
    """Bus bandwidth converted to bytes of the collective per second (tuning.cc)."""
    bus = bus_bandwidth(c, algo, proto)
    if algo != Algorithm.RING and c.op in GATHERS:
        return bus
    return bus * (c.ranks / c.nsteps if algo in (Algorithm.RING, Algorithm.NVLS, Algorithm.NVLS_TREE) else 0.5)


def latency(c: Comm, algo: str, proto: str) -> float:
    """NCCL's latency (seconds) of one (algorithm, protocol)."""
    p = PROTOCOLS.index(proto)
    intra = HW["nvlink"][algo][p]
    inter = HW["net"]["tree" if c.ppn == 1 else algo][p]
    base, log_nodes, local = BASE[algo][p], int(math.log2(c.nodes)), int(c.ranks // c.nodes)
    if algo == Algorithm.RING:
        if c.op is BROADCAST:
            return (base + HW["nvlink" if c.nodes == 1 else "net"]["ring"][p]) * US
        overhead = (3.0 if proto == "simple" else 1.0) if c.nodes > 1 else 0.0
        n_inter = 0 if c.nodes == 1 else (2 if c.op is ALL_REDUCE else 1) * (c.nodes - 1)
        return (base + (c.nsteps - n_inter) * max(intra, overhead) + n_inter * inter) * US
    if algo == Algorithm.TREE:
        return (base + 2 * ((local - 1) * intra + log_nodes * inter)) * US
    if algo == Algorithm.COLLNET:
        return (base + 2 * (min(1, local - 1) * intra + (local - 1) * 0.4) + inter) * US
    if algo == Algorithm.NVLS:
        return (intra + (inter if c.nodes > 1 else 0.0)) * US
    if algo == Algorithm.NVLS_TREE:
        return (base + intra + 2 * log_nodes * inter) * US
    return (base + log_nodes * inter / 3.5 + c.ranks * 2.8) * US  # pat


def predicted(c: Comm, algo: str, proto: str, nbytes: float) -> Candidate:
    """``ncclTopoGetAlgoTime``: latency + bytes / bandwidth, with NCCL's corrections."""
    bw, lat = algo_bandwidth(c, algo, proto), latency(c, algo, proto)
    log_size = int(math.log2(max(int(nbytes) >> 6, 1))) if int(nbytes) >> 6 else -1
    if algo == Algorithm.TREE and c.op is ALL_REDUCE and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOCOLS.index(proto)][log_size]
    if algo == Algorithm.RING and proto == "simple" and c.nodes > 1 and c.op is ALL_REDUCE \
            and nbytes / (N_CHANNELS * c.ranks) >= 64:
        lat *= 1.9 if c.arch < 1 else 1.4  # "plateau effect of ring"
    return Candidate(algo, proto, lat, bw, lat + nbytes / bw)


def candidates(op: CollectiveOp, nbytes: float, domains: tuple, fabric) -> list[Candidate]:
    """Every enabled (algorithm, protocol) with NCCL's predicted time, in NCCL's order."""
    c = comm_of(op, domains, fabric)
    return [predicted(c, a, p, nbytes) for a in ORDER for p in PROTOCOLS
            if enabled(c, a, p) and bus_bandwidth(c, a, p) > 0]


def pick(op: CollectiveOp, nbytes: float, domains: tuple, fabric, algo: str | None = None,
         proto: str | None = None) -> Candidate:
    """The fastest candidate (the first on ties, as NCCL's loop keeps a strict minimum),
    among those of ``algo`` and ``proto`` when given (NCCL_ALGO, NCCL_PROTO)."""
    found = [x for x in candidates(op, nbytes, domains, fabric)
             if (algo is None or x.algo == algo) and (proto is None or x.proto == proto)]
    if not found:
        raise ValueError(f"no enabled {algo or 'algorithm'}/{proto or 'protocol'} for {op} here")
    best = found[0]
    for x in found[1:]:
        if x.time_s < best.time_s:
            best = x
    return best
