"""``clustersim run SCENARIO [--set k=v ...] [--json] [--trace F] [--timeline F] [--spans F]``.

Example: ``clustersim run scenarios/llama3-8b-fsdp-h100.toml --set parallel.dp=64``.
"""

import json
import sys

from ..errors import InputError
from ..input.load import load_scenario


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("run", help="simulate one training step of a scenario")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. parallel.dp=8 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace (JSON)")
    p.add_argument("--trace-ranks", help="ranks in the trace: 'all', or a list like 0,8,16-23 (default: "
                                         "representatives + stragglers; a folded rank shows as the simulated "
                                         "rank identical to it)")
    p.add_argument("--timeline", help="write a PNG timeline")
    p.add_argument("--spans", help="write the spans table (.csv or .parquet)")
    p.add_argument("--report", action="store_true", help="print what held the step (critical path)")
    p.add_argument("--force", action="store_true", help="simulate even past the work budget (sim/work.py)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Load, simulate, print, export."""
    from .. import simulate

    scenario = load_scenario(args.scenario, args.overrides)
    _check_outputs(args, scenario)
    result = simulate(scenario, record_links=bool(args.trace), force=args.force)
    if not result.summary["fits_in_memory"]:
        print(f"warning: {scenario.name} needs {result.summary['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU, "
              f"more than the GPU's HBM", file=sys.stderr)
    if args.json:
        print(json.dumps(result.summary))
    else:
        print_summary(result)
    _exports(args, result)
    return 0


def _check_outputs(args, scenario) -> None:
    """Bad output flags fail before the simulation, not after it."""
    if args.spans and not args.spans.endswith((".csv", ".parquet")):
        raise InputError("--spans", f"expected a .csv or .parquet path, got {args.spans!r}")
    if args.spans and args.spans.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError("--spans", "writing .parquet needs pyarrow (pip install pyarrow); "
                                        "or give a .csv path") from None
    if args.timeline and not args.timeline.endswith(".png"):
        raise InputError("--timeline", f"expected a .png path, got {args.timeline!r}")
    if args.trace and not args.trace.endswith(".json"):
        raise InputError("--trace", f"expected a .json path, got {args.trace!r}")
    if args.trace_ranks and not args.trace:
        raise InputError("--trace-ranks", "selects the ranks of a trace: give --trace out.json too")
    from ..outputs.rank_selection import check_selector

    check_selector(args.trace_ranks, scenario.cluster.gpus)


def _exports(args, result) -> None:
    if args.spans:
        if args.spans.endswith(".csv"):
            result.spans.to_csv(args.spans, index=False)
        else:
            result.spans.to_parquet(args.spans, index=False)
    if args.trace:
        from ..outputs.trace import write_trace

        write_trace(result, args.trace, args.trace_ranks)
    if args.timeline:
        from ..outputs.timeline import plot_timeline

        plot_timeline(result, args.timeline)
    if args.report:
        from ..outputs.attribution import report

        print(report(result))


def print_summary(result) -> None:
    """A human-readable table of the summary."""
    s = result.summary
    rows = [("scenario", s["name"]), ("GPUs", s["num_gpus"]),
            ("step time", f"{s['step_time_s'] * 1e3:.1f} ms"),
            ("tokens/s", f"{s['tokens_per_s']:,.0f}"),
            ("TFLOP/s per GPU", f"{s['tflops_per_gpu']:.1f}"), ("MFU", f"{s['mfu']:.1%}"),
            ("pipeline bubble", f"{s['bubble_fraction']:.1%}"),
            ("exposed comm", f"{s['exposed_comm_s'] * 1e3:.1f} ms"),
            ("memory per GPU", f"{s['memory_per_gpu_bytes'] / 1e9:.1f} GB"
                               + ("" if s["fits_in_memory"] else "  (DOES NOT FIT)"))]
    rows += [(f"sent per GPU ({k})", f"{v / 1e9:.2f} GB") for k, v in s["comm_bytes_per_gpu"].items() if v]
    if "straggler_cost_s" in s:
        rows.append(("straggler cost", f"{s['straggler_cost_s'] * 1e3:.1f} ms"))
    rows.append(("simulated", f"{s['sim_events']:,} events in {s['sim_wall_s']:.2f} s"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
