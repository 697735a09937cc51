"""``clustersim collective``: an nccl-tests-style benchmark of one collective, simulated.

Run ``clustersim collective --op all_reduce --algo ring --gpus 64 --topology dgx-a100``.
Sizes and bus-bandwidth factors follow nccl-tests doc/PERFORMANCE.md: algbw = size /
time; busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter
and all_to_all, 1 for broadcast.
"""

from dataclasses import dataclass

from .. import collectives
from ..collectives import tuner
from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SEND_RECV, Algorithm, CollectiveOp
from ..hardware import mesh, specs, topology
from ..engine.core import Engine
from ..engine.ops import Collective, Op, RankProgram
from ..errors import InputError
from ..hardware.gpus import gpu_preset


def bus_factor(op: CollectiveOp, n: int) -> float:
    """nccl-tests' busbw / algbw factor (``op``: a member or its text)."""
    if op == ALL_REDUCE:
        return 2 * (n - 1) / n
    if op in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Measurement:
    """One row of the table."""

    bytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float


def build_topology(topology_name: str, gpus: int, gpu_name: str | None, calibration=None):
    """Topology with at least ``gpus`` GPUs, rounded up to whole servers (``calibration``: a
    :class:`~sim.hardware.calibration.Calibration` applied to its links)."""
    spec = specs.load_spec(topology_name, key="--topology")
    gpu = gpu_preset(spec.gpu) if gpu_name is None else _gpu(gpu_name)
    mesh.check_gpu(spec, gpu, "--gpu")
    per = max(spec.gpus_per_node, spec.gpus_per_domain)
    total = -(-gpus // per) * per
    if spec.max_gpus is not None and gpus > spec.max_gpus:
        raise InputError("--gpus", f"{gpus} GPUs asked but topology {spec.name!r} holds {spec.max_gpus}")
    return topology.build(spec, min(total, spec.max_gpus or total), gpu, key="--gpus", calibration=calibration)


def _gpu(name: str):
    try:
        return gpu_preset(name)
    except InputError as exc:
        raise InputError("--gpu", exc.reason) from None


def run_collective(topo, op: CollectiveOp, algo: str, group: tuple[int, ...], nbytes: float,
                   simulate_all: bool = False, record_links: bool = False) -> Engine:
    """The engine after running one collective alone. Members are symmetric, so by default
    only the first is simulated (the others arrive with it); ``simulate_all`` runs every
    member; ``record_links`` keeps the network's rate log (``engine.net.log``). ``op``: a
    member, or its text (a test's, a calibration table's), which becomes the member here."""
    call = Collective(("bench",), CollectiveOp(op), group, float(nbytes), algo)
    ranks = group if simulate_all else group[:1]
    programs = [RankProgram(r, [Op(op, "comm", "comm", comm=call)]) for r in ranks]
    engine = Engine(topo, programs)
    if record_links:
        engine.net.log = []
    engine.run()
    return engine


def time_collective(topo, op: CollectiveOp, algo: str, group: tuple[int, ...], nbytes: int,
                    simulate_all: bool = False) -> float:
    """Simulated seconds of one collective (see :func:`run_collective`)."""
    return run_collective(topo, op, algo, group, nbytes, simulate_all).env.now


def algorithm(topo, op: CollectiveOp, algo: str, proto: str | None, group: tuple[int, ...], nbytes: float) -> str:
    """The schedule's algorithm name for ``--algo``/``--proto`` at this size: ``auto``
    leaves to NCCL's tuner what is not given; an explicit algorithm runs Simple unless a
    protocol is given (``auto``: the tuner's best protocol for that algorithm)."""
    if op in collectives.DIRECT_OPS or (algo != Algorithm.AUTO and proto in (None, "simple")):
        return Algorithm.DIRECT if algo == Algorithm.AUTO else algo
    if algo != Algorithm.AUTO and proto != "auto":
        return f"{algo}:{proto}"
    domains = tuple(int(d) for d in topo.domains[list(group)])
    return tuner.pick(op, nbytes, domains, topo.fabric, algo=None if algo == Algorithm.AUTO else algo,
                      proto=None if proto in (None, "auto") else proto).name


def group_of(op: CollectiveOp, gpus: int) -> tuple[int, ...]:
    """The benchmark's group: the first ``gpus`` GPUs (send_recv: first and last)."""
    return tuple(range(gpus)) if op != SEND_RECV else (0, gpus - 1)


def measure(topo, op: CollectiveOp, algo: str, gpus: int, sizes: list[int],
            proto: str | None = None) -> list[Measurement]:
    """One Measurement per size on the first ``gpus`` GPUs of ``topo``."""
    group = group_of(op, gpus)
    rows = []
    for size in sizes:
        t = time_collective(topo, op, algorithm(topo, op, algo, proto, group, size), group, size)
        algbw = size / t / 1e9 if t > 0 else float("inf")
        rows.append(Measurement(size, t * 1e6, algbw, algbw * bus_factor(op, len(group))))
    return rows


def explain(topo, op: CollectiveOp, gpus: int, size: int) -> list[dict]:
    """Every (algorithm, protocol) NCCL's tuner weighs for one size: its predicted latency,
    bandwidth and time, and the time this simulator gives it; the first row is the pick."""
    group = group_of(op, gpus)
    domains = tuple(int(d) for d in topo.domains[list(group)])
    found = tuner.candidates(op, size, domains, topo.fabric)
    best = tuner.pick(op, size, domains, topo.fabric)
    rows = [{"algo": c.name, "chosen": c is best or c == best, "nccl_latency_us": c.latency_s * 1e6,
             "nccl_algbw_GBps": c.algbw / 1e9, "nccl_time_us": c.time_s * 1e6,
             "sim_time_us": time_collective(topo, op, c.name, group, size) * 1e6} for c in found]
    return sorted(rows, key=lambda r: (not r["chosen"], r["nccl_time_us"]))
