"""Jobs that share a fabric: several scenarios placed on one cluster, run together.

``clustersim run A.toml B.toml --shared-fabric [--placement packed|spread|nodes:0-3/4-7]
[--cluster-nodes N] [--json]`` prints each job's summary and its slowdown from the other
jobs' traffic (:mod:`.shared`, :mod:`.placement`; docs/collectives.md).
"""

import json

from .. import work
from ..errors import InputError
from ..work import watchdog
from ..input.bundled import scenario_file
from ..input.load import load_scenario
from .shared import run_shared

UNSUPPORTED = ("trace", "timeline", "timeline_window", "spans", "report", "trace_ranks", "steady")


def run_cli(args) -> int:
    """``clustersim run`` with several scenarios or ``--shared-fabric``."""
    if not args.shared_fabric:
        raise InputError("--shared-fabric", f"{len(args.scenario)} scenarios run together only with --shared-fabric")
    for flag in UNSUPPORTED:
        if getattr(args, flag, None):
            raise InputError(f"--{flag.replace('_', '-')}", "not available with --shared-fabric (one job at a time)")
    scenarios = [load_scenario(scenario_file(path), args.overrides) for path in args.scenario]
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        scenarios = [s.model_copy(update={"name": f"{s.name}#{i}"}) for i, s in enumerate(scenarios)]
    limit = None if args.force else check_work(scenarios)
    with watchdog("+".join(names), limit):
        result = run_shared(scenarios, args.placement or "packed", args.cluster_nodes)
    if args.json:
        print(json.dumps(result))
    else:
        print_shared(result)
    return 0


def check_work(scenarios) -> float:
    """The work budget of a shared run (sim/work.py): every rank of every job is simulated
    (no folding), together once and each job alone (twice when perturbed, for its
    straggler cost); refused past the budget naming the job's GPUs, else the watchdog's CPU limit."""
    from ..hardware.faults import perturbed

    seconds = nbytes = 0.0
    for s in scenarios:
        w = work.estimate(s.model_copy(update={"parallel": s.parallel.model_copy(update={"fold": False}),
                                               "stragglers": [], "jitter": type(s.jitter)()}))
        seconds += w.seconds * (2 + perturbed(s))
        nbytes += w.bytes
    if seconds > work.BUDGET_S or nbytes > work.BUDGET_BYTES:
        raise InputError("cluster.gpus", f"these {len(scenarios)} jobs on one fabric, every rank simulated, would need "
                                         f"~{seconds:,.0f} s of CPU and {nbytes / 2**30:,.1f} GiB, past this "
                                         f"machine's budget of {work.BUDGET_S:,.0f} s and "
                                         f"{work.BUDGET_BYTES / 2**30:,.1f} GiB; --force runs it anyway")
    return max(work.WATCHDOG_MIN_S, work.WATCHDOG_FACTOR * seconds)


def print_shared(result: dict) -> None:
    """One line per job: place, step time shared and alone, slowdown, exposed comm, MFU."""
    print(f"shared fabric: {result['num_gpus']} GPUs, placement {result['placement']}, every rank simulated "
          f"({result['sim_events']:,} events in {result['sim_wall_s']:.2f} s)")
    print(f"{'job':<28} {'nodes':<16} {'step shared':>12} {'step alone':>11} {'slowdown':>9} "
          f"{'exposed comm':>13} {'MFU':>7}")
    for job in result["jobs"]:
        s = job["summary"]
        print(f"{job['name']:<28} {_nodes(job['nodes']):<16} {s['step_time_s'] * 1e3:>9.1f} ms "
              f"{job['alone_step_time_s'] * 1e3:>8.1f} ms {job['slowdown']:>8.3f}x "
              f"{s['exposed_comm_s'] * 1e3:>10.1f} ms {s['mfu']:>7.1%}")


def _nodes(nodes: list[int]) -> str:
    """0-3,8 style."""
    runs, start = [], nodes[0]
    for a, b in zip(nodes, nodes[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ",".join(runs)
