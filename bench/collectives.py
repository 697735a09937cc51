"""Speed of the network core: engine events per second, and one huge ring all-reduce.

Run: ``python bench/collectives.py`` (``--profile`` adds a cProfile of the engine run).
Prints, with targets (issue 2):
1. events/s of the engine on a training-like workload (64 H100 ranks, 2 streams each,
   thousands of compute ops and collectives) vs a bare SimPy timeout loop measured in
   the same run, in back-to-back pairs; target: median ratio >= 25%. A compute-only run
   of the same ranks shows the engine's floor cost per op.
2. wall time of one 1 GiB ring all-reduce over 1,024 and 16,384 H100 (dgx-h100),
   topology build included; targets < 1 s and < 10 s.
"""

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from sim.hardware import specs, topology  # noqa: E402
from sim.engine.clock import bare_simpy_rate  # noqa: E402
from sim.collectives.kinds import ALL_REDUCE, REDUCE_SCATTER  # noqa: E402
from sim.engine.core import Engine  # noqa: E402
from sim.engine.ops import Collective, Op, RankProgram  # noqa: E402
from sim.hardware.gpus import gpu_preset  # noqa: E402
from sim.studies.nccl_tests import bus_factor, time_collective  # noqa: E402

RANKS, PER_NODE, LAYERS = 64, 8, 1000
GIB = 2**30


def training_programs(collectives: bool = True) -> list[RankProgram]:
    """Per rank and layer: a compute op, then (TP-style) an all-reduce over the server
    that the next compute op waits for; every 4th layer also a reduce-scatter over the
    rank's rail (DP-style) on the same comm stream, which nothing waits for."""
    programs = []
    for rank in range(RANKS):
        node, local = divmod(rank, PER_NODE)
        tp = tuple(range(node * PER_NODE, (node + 1) * PER_NODE))
        dp = tuple(range(local, RANKS, PER_NODE))
        prog, prev = RankProgram(rank), ()
        for layer in range(LAYERS):
            c = prog.add(Op(f"fwd{layer}", "compute", "compute", duration=150e-6, deps=prev))
            if not collectives:
                continue
            call = Collective(("tp", node, layer), ALL_REDUCE, tp, 32 * 2**20, "ring")
            prev = (prog.add(Op(f"tp{layer}", "tp", "comm", comm=call, deps=(c,))),)
            if layer % 4 == 3:
                call = Collective(("dp", local, layer), REDUCE_SCATTER, dp, 256 * 2**20, "ring")
                prog.add(Op(f"dp{layer}", "dp", "comm", comm=call, deps=(c,)))
        programs.append(prog)
    return programs


def engine_rate(topo, programs, profile: bool = False) -> tuple[float, int, float]:
    """(events per wall second, events, wall seconds) of one engine run."""
    engine = Engine(topo, programs)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.runcall(engine.run)
    else:
        engine.run()
    wall = time.perf_counter() - t0
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return engine.events / wall, engine.events, wall


def bench_engine(profile: bool, pairs: int = 7) -> None:
    """Each pair runs the bare loop then the engine, back to back, so both see the same
    machine (a shared VM's speed drifts by tens of percent within a minute); the target is
    judged on the median of the pairs' ratios, the best-of figures are printed beside it."""
    spec = specs.load_spec("dgx-h100")
    topo = topology.build(spec, RANKS, gpu_preset(spec.gpu))
    for label, with_comm in (("training-like (compute + collectives)", True), ("compute only", False)):
        programs = training_programs(with_comm)
        ops = sum(len(p.ops) for p in programs)
        bares, runs = [], []
        for _ in range(pairs):
            bares.append(bare_simpy_rate())
            runs.append(engine_rate(topo, programs))
        ratio = statistics.median(r[0] / b for r, b in zip(runs, bares))
        rate, events, wall = max(runs)
        ok = "OK" if ratio >= 0.25 else "MISSED"
        print(f"engine, {label}: {RANKS} ranks, {ops:,} ops, {events:,} events; best {wall:.2f} s = "
              f"{rate:,.0f} events/s vs bare SimPy best {max(bares):,.0f} events/s ({rate / max(bares):.0%}); "
              f"median of {pairs} back-to-back pairs {ratio:.0%} (target >= 25%: {ok})")
    if profile:
        engine_rate(topo, training_programs(), profile=True)


def bench_ring(gpus: int, target: float) -> None:
    t0 = time.perf_counter()
    spec = specs.load_spec("dgx-h100")
    topo = topology.build(spec, gpus, gpu_preset(spec.gpu))
    built = time.perf_counter() - t0
    sim_s = time_collective(topo, ALL_REDUCE, "ring", tuple(range(gpus)), GIB)
    wall = time.perf_counter() - t0
    busbw = GIB / sim_s * bus_factor(ALL_REDUCE, gpus) / 1e9
    print(f"ring all-reduce 1 GiB on {gpus:,} H100: {wall:.2f} s wall (topology {built:.2f} s) "
          f"target < {target:.0f} s: {'OK' if wall < target else 'MISSED'}; "
          f"simulated {sim_s * 1e3:.2f} ms, busbw {busbw:.1f} GB/s")


def main() -> None:
    bench_engine(profile="--profile" in sys.argv)
    bench_ring(1024, 1.0)
    bench_ring(16384, 10.0)


if __name__ == "__main__":
    main()
