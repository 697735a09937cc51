"""``clustersim collective``: nccl-tests-style table of one simulated collective.

Example: ``clustersim collective --op all_reduce --algo ring --gpus 64 --topology dgx-a100``;
``--algo auto --explain`` prints what NCCL's tuner weighs at each size and what it picks.
"""

import json

from .. import collectives
from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE_SCATTER, Algorithm, CollectiveOp
from ..collectives.protocols import PROTOCOLS, WITH_PROTOCOLS
from ..errors import InputError
from ..studies.nccl_tests import algorithm, build_topology, explain, group_of, measure
from ..units import parse_sizes
from ..work import check_gpus
from .calibrate import add_calibration_flag, calibration_profile

CLI_OPS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST)


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("collective", help="nccl-tests-style benchmark of one collective")
    p.add_argument("--op", required=True, help="|".join(CLI_OPS))
    p.add_argument("--algo", default="auto", help="|".join(collectives.ALGOS))
    p.add_argument("--proto", default=None, help="auto|" + "|".join(PROTOCOLS) + " (default: the tuner's with "
                                                 "--algo auto, else simple)")
    p.add_argument("--gpus", required=True, type=int, help="number of GPUs in the group")
    p.add_argument("--topology", required=True, help="preset name or TOML path")
    p.add_argument("--gpu", default=None, help="GPU preset (default: the topology's)")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,256M,1G",
                   help="comma list (1M,1G) or range lo:hi doubling")
    p.add_argument("--explain", action="store_true",
                   help="per size: every algorithm x protocol NCCL's tuner weighs, its prediction, the simulated time")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    add_calibration_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Validate, simulate each size, print."""
    _check_args(args)
    sizes = parse_sizes(args.sizes)
    if not sizes or min(sizes) < 1:  # e.g. "0.5" rounds down to 0 bytes
        raise InputError("--sizes", f"{args.sizes!r}: give sizes of at least 1 byte (e.g. 8,1M,1G)")
    check_gpus("--gpus", args.gpus, len(sizes), all_pairs=args.op is ALL_TO_ALL)
    topo = build_topology(args.topology, args.gpus, args.gpu, calibration_profile(args))
    group = group_of(args.op, args.gpus)
    domains = tuple(int(d) for d in topo.domains[list(group)])
    collectives.check(args.op, args.algo, domains, topo.fabric)  # op x algo, and what this fabric can run
    rows = measure(topo, args.op, args.algo, args.gpus, sizes, args.proto)
    algos = [algorithm(topo, args.op, args.algo, args.proto, group, size) for size in sizes]
    if args.json:
        out = [{k: _num(v) for k, v in vars(r).items()} for r in rows]
        if args.explain:
            for row, algo, size in zip(out, algos, sizes):
                row.update(algo=algo, candidates=_candidates(topo, args, size))
        print(json.dumps(out))
    else:
        _print_table(args, rows)
        if args.explain:
            for size in sizes:
                _print_explain(args, size, _candidates(topo, args, size))
    return 0


def _check_args(args) -> None:
    if ":" in args.algo:  # CONTRACT.md: ALGO may carry a protocol, ring:ll, tree:ll128
        algo, proto = args.algo.split(":", 1)
        if args.proto not in (None, proto):
            raise InputError("--proto", f"{args.proto!r} disagrees with --algo {args.algo!r}; give the protocol once")
        args.algo, args.proto = algo, proto
    if args.op not in CLI_OPS:
        raise InputError("--op", f"unknown collective {args.op!r}; known: {', '.join(CLI_OPS)}")
    args.op = CollectiveOp(args.op)  # the one place the command line's text becomes the collective
    if args.algo not in collectives.ALGOS:
        raise InputError("--algo", f"unknown algorithm {args.algo!r}; known: {', '.join(collectives.ALGOS)}")
    args.algo = Algorithm(args.algo)  # (and the algorithm)
    if args.proto not in (None, "auto") + PROTOCOLS:
        raise InputError("--proto", f"unknown protocol {args.proto!r}; known: auto, {', '.join(PROTOCOLS)}")
    if args.proto not in (None, "auto", "simple") and args.algo not in WITH_PROTOCOLS + ("auto",):
        raise InputError("--proto", f"{args.algo} runs Simple only (NCCL runs LL and LL128 for ring and tree)")
    if args.gpus < 2:
        raise InputError("--gpus", f"a collective needs at least 2 GPUs, got {args.gpus}")
    if args.explain and args.op is ALL_TO_ALL:
        raise InputError("--explain", "all_to_all is a direct exchange: NCCL's tuner does not choose it")


def _candidates(topo, args, size: int) -> list[dict]:
    return [{k: _num(v) for k, v in row.items()} for row in explain(topo, args.op, args.gpus, size)]


def _num(v):
    if isinstance(v, (bool, str)):
        return v
    return int(v) if isinstance(v, int) else round(float(v), 6)


def _print_table(args, rows) -> None:
    proto = f" proto={args.proto}" if args.proto else ""
    print(f"# {args.op} algo={args.algo}{proto} gpus={args.gpus} topology={args.topology}")
    print(f"{'bytes':>14} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    for r in rows:
        print(f"{r.bytes:>14} {r.time_us:>12.2f} {r.algbw_GBps:>11.2f} {r.busbw_GBps:>11.2f}")


def _print_explain(args, size: int, rows: list[dict]) -> None:
    print(f"\n# {size} bytes: NCCL's tuner (time = latency + bytes / bandwidth) over what this fabric runs")
    print(f"  {'algorithm':<14} {'latency_us':>10} {'algbw_GBps':>10} {'nccl_us':>10} {'simulated_us':>12}")
    for r in rows:
        mark = "  <- auto" if r["chosen"] else ""
        print(f"  {r['algo']:<14} {r['nccl_latency_us']:>10.1f} {r['nccl_algbw_GBps']:>10.1f} "
              f"{r['nccl_time_us']:>10.1f} {r['sim_time_us']:>12.1f}{mark}")
