"""``clustersim collective``: nccl-tests-style table of one simulated collective.

Example: ``clustersim collective --op all_reduce --algo ring --gpus 64 --topology dgx-a100``.
"""

import json

from .. import collectives
from ..errors import InputError
from ..studies.nccl_tests import build_topology, measure
from ..units import parse_sizes
from ..work import check_gpus

CLI_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("collective", help="nccl-tests-style benchmark of one collective")
    p.add_argument("--op", required=True, help="|".join(CLI_OPS))
    p.add_argument("--algo", default="auto", help="|".join(collectives.ALGOS))
    p.add_argument("--gpus", required=True, type=int, help="number of GPUs in the group")
    p.add_argument("--topology", required=True, help="preset name or TOML path")
    p.add_argument("--gpu", default=None, help="GPU preset (default: the topology's)")
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,256M,1G",
                   help="comma list (1M,1G) or range lo:hi doubling")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def run(args) -> int:
    """Validate, simulate each size, print."""
    if args.op not in CLI_OPS:
        raise InputError("--op", f"unknown collective {args.op!r}; known: {', '.join(CLI_OPS)}")
    if args.algo not in collectives.ALGOS:
        raise InputError("--algo", f"unknown algorithm {args.algo!r}; known: {', '.join(collectives.ALGOS)}")
    if args.gpus < 2:
        raise InputError("--gpus", f"a collective needs at least 2 GPUs, got {args.gpus}")
    sizes = parse_sizes(args.sizes)
    if not sizes or min(sizes) < 1:  # e.g. "0.5" rounds down to 0 bytes
        raise InputError("--sizes", f"{args.sizes!r}: give sizes of at least 1 byte (e.g. 8,1M,1G)")
    check_gpus("--gpus", args.gpus, len(sizes))
    topo = build_topology(args.topology, args.gpus, args.gpu)
    collectives.schedule(args.op, args.algo, (0, 1), 1.0, (0, 0))  # validates op x algo
    rows = measure(topo, args.op, args.algo, args.gpus, sizes)
    if args.json:
        print(json.dumps([{k: _num(v) for k, v in vars(r).items()} for r in rows]))
    else:
        _print_table(args, rows)
    return 0


def _num(v):
    return int(v) if isinstance(v, int) else round(float(v), 6)


def _print_table(args, rows) -> None:
    print(f"# {args.op} algo={args.algo} gpus={args.gpus} topology={args.topology}")
    print(f"{'bytes':>14} {'time_us':>12} {'algbw_GBps':>11} {'busbw_GBps':>11}")
    for r in rows:
        print(f"{r.bytes:>14} {r.time_us:>12.2f} {r.algbw_GBps:>11.2f} {r.busbw_GBps:>11.2f}")
