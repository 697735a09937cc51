"""``clustersim run SCENARIO [--set k=v ...] [--json] [--trace F] [--timeline F] [--spans F]``.

Example: ``clustersim run scenarios/llama3-8b-fsdp-h100.toml --set parallel.dp=64``.
"""

import json
import sys

from .. import work
from ..errors import InputError
from ..hardware.gpus import gpu_preset
from ..input.bundled import scenario_file
from ..input.load import load_scenario
from .calibrate import add_calibration_flag, calibration_overrides
from ..units import format_bytes, format_duration
from ..outputs.echo import echo_rows, mfu_text
from ..outputs.fit_hints import hint


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("run", help="simulate one training step of a scenario")
    p.add_argument("scenario", nargs="+", help="scenario TOML file, or the name of a bundled example (e.g. llama3-8b-fsdp-h100); several with --shared-fabric")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. parallel.dp=8 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace (JSON)")
    p.add_argument("--trace-ranks", help="ranks in the trace: 'all', or a list like 0,8,16-23 (default: "
                                         "representatives + stragglers; a folded rank shows as the simulated "
                                         "rank identical to it)")
    p.add_argument("--timeline", help="write a PNG timeline")
    p.add_argument("--timeline-window", metavar="START:END",
                   help="with --timeline: draw only this part of the step, e.g. 100:250 (ms) or 0.1s:0.25s")
    p.add_argument("--spans", help="write the spans table (.csv or .parquet)")
    p.add_argument("--report", action="store_true", help="print what held the step (critical path)")
    p.add_argument("--shared-fabric", action="store_true",
                   help="run the scenarios together on one cluster; report each job's slowdown (sim/fabric/)")
    p.add_argument("--placement", default=None, help="with --shared-fabric: packed (default) | spread | nodes:0-3/4-7")
    p.add_argument("--cluster-nodes", type=int, default=None,
                   help="with --shared-fabric: nodes of the shared cluster (default: what the jobs need)")
    p.add_argument("--force", action="store_true", help="simulate even past the work budget (sim/work.py)")
    p.add_argument("--steady", action="store_true",
                   help="simulate a few micro-batch counts and extrapolate the step, checked linear (sim/steady.py); "
                        "the same as --set simulation.micro_batches=steady")
    add_calibration_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Load, simulate, print, export."""
    from .. import simulate
    from ..outputs.progress import status

    args.overrides = calibration_overrides(args)
    if args.steady:
        args.overrides = [*args.overrides, "simulation.micro_batches=steady"]
    if args.shared_fabric or len(args.scenario) > 1:
        from ..fabric import run_cli

        return run_cli(args)
    for flag, value in (("--placement", args.placement), ("--cluster-nodes", args.cluster_nodes)):
        if value is not None:  # (it used to be ignored without a word)
            raise InputError(flag, "applies to several jobs on one fabric: add --shared-fabric")
    scenario = load_scenario(scenario_file(args.scenario[0]), args.overrides)
    _check_outputs(args, scenario)
    estimate = None if args.force else work.check(scenario)  # (a refusal is one line: before any progress line)
    with status(f"simulating {scenario.name} on {scenario.cluster.gpus:,} GPUs"):
        result = simulate(scenario, record_links=bool(args.trace), force=args.force, estimate=estimate)
    steady_note(result.summary)
    if not result.summary["fits_in_memory"]:
        gpu = gpu_preset(result.facts.gpu)
        print(f"warning: {scenario.name} needs {format_bytes(result.summary['memory_per_gpu_bytes'], gpu.hbm_unit)} "
              f"per GPU, more than the {gpu.name}'s {format_bytes(gpu.hbm_bytes, gpu.hbm_unit)} of HBM", file=sys.stderr)
    if args.json:
        print(json.dumps(result.summary))
    else:
        print_summary(result)
    _exports(args, result)
    return 0


def steady_note(summary: dict) -> None:
    """On stderr, what a steady-state run did (sim/steady.py): extrapolated, or why not."""
    if "extrapolated" not in summary:
        return
    if summary["extrapolated"]:
        print(f"note: step extrapolated from {summary['micro_batches_simulated']} to {summary['micro_batches']} "
              f"micro-batches per pipeline (steady state; residual {summary['steady_residual']:.1e} of the step); "
              "spans, trace and timeline show the largest simulated run", file=sys.stderr)
    else:
        print(f"note: steady state not used, the exact step ran: {summary['steady_fallback']}", file=sys.stderr)


def _check_outputs(args, scenario) -> None:
    """Bad output flags fail before the simulation, not after it: each path must be writable
    where the user pointed, with the right suffix (:mod:`sim.outputs.paths`)."""
    from ..outputs.paths import output_file

    for flag, path, suffixes in (("--spans", args.spans, (".csv", ".parquet")), ("--timeline", args.timeline, (".png",)),
                                 ("--trace", args.trace, (".json",))):
        if path is not None:  # ('' is a path that cannot be written, not "no output")
            output_file(path, flag, suffixes)
    if args.spans and args.spans.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError("--spans", "writing .parquet needs pyarrow (pip install pyarrow); "
                                        "or give a .csv path") from None
    from ..outputs.timeline_paint import parse_window

    args.window = parse_window(args.timeline_window)
    if args.window is not None and not args.timeline:
        raise InputError("--timeline-window", "selects the part of the step a timeline draws: "
                                              "give --timeline out.png too")
    if args.trace_ranks and not args.trace:
        raise InputError("--trace-ranks", "selects the ranks of a trace: give --trace out.json too")
    from ..outputs.rank_selection import check_selector

    check_selector(args.trace_ranks, scenario.cluster.gpus)


def _exports(args, result) -> None:
    """Each output through :func:`sim.outputs.paths.written`: a failed write exits 2 naming
    the flag and leaves any old file intact."""
    from ..outputs.paths import written

    result = result.shown or result  # (a steady run's spans are its largest simulated run's)
    if args.spans:
        with written(args.spans, "--spans") as tmp:
            if args.spans.endswith(".csv"):
                result.spans.to_csv(tmp, index=False)
            else:
                result.spans.to_parquet(tmp, index=False)
    if args.trace:
        from ..outputs.trace import write_trace

        with written(args.trace, "--trace") as tmp:
            write_trace(result, tmp, args.trace_ranks)
    if args.timeline:
        from ..outputs.timeline import plot_timeline
        from ..outputs.timeline_paint import resolve_window

        window = resolve_window(getattr(args, "window", None), float(result.spans.end_s.max()))
        with written(args.timeline, "--timeline") as tmp:
            plot_timeline(result, tmp, window=window)
    if args.report:
        from ..outputs.attribution import report

        print(report(result))


def print_summary(result) -> None:
    """A human-readable table of the summary, with the GPU and the layout it ran on; times
    in the unit that reads best, memory in the unit the GPU's capacity is quoted in."""
    s, sc = result.summary, result.scenario
    gpu = gpu_preset(result.facts.gpu)
    rows = [("scenario", s["name"]), ("GPUs", f"{s['num_gpus']:,} x {gpu.name}"),
            ("layout", layout_text(sc)), ("schedule", schedule_text(sc)), *echo_rows(result),
            ("step time", format_duration(s["step_time_s"])),
            ("tokens/s", f"{s['tokens_per_s']:,.0f}"),
            ("TFLOP/s per GPU", f"{s['tflops_per_gpu']:.1f}"), ("MFU", mfu_text(s, sc, gpu)),
            ("pipeline bubble", f"{s['bubble_fraction']:.1%}"),
            ("exposed comm", format_duration(s["exposed_comm_s"])),
            ("memory per GPU", f"{format_bytes(s['memory_per_gpu_bytes'], gpu.hbm_unit)} of "
                               f"{format_bytes(gpu.hbm_bytes, gpu.hbm_unit)}"
                               + ("" if s["fits_in_memory"] else "  (DOES NOT FIT)"))]
    fix = hint(result)
    if fix:
        rows.append(("to fit", fix))
    rows += [(f"sent per GPU ({k})", f"{v / 1e9:.2f} GB") for k, v in s["comm_bytes_per_gpu"].items() if v]
    if "straggler_cost_s" in s:
        rows.append(("straggler cost", format_duration(s["straggler_cost_s"])))
    rows.append(("simulated", f"{s['sim_events']:,} events in {s['sim_wall_s']:.2f} s"))
    if s.get("extrapolated"):
        rows.append(("steady state", f"extrapolated from {s['micro_batches_simulated']} to {s['micro_batches']} "
                                     "micro-batches per pipeline"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def layout_text(sc) -> str:
    """``tp 8 x pp 16 x dp 128 x cp 1, ep 1, zero 1``."""
    p = sc.parallel
    return f"tp {p.tp} x pp {p.pp} x dp {p.dp} x cp {p.cp}, ep {p.ep}, zero {p.zero}"


def schedule_text(sc) -> str:
    """``1f1b, 1 virtual stage, 16 micro-batches of 1 sequence per step`` (``no pipeline, ...``
    when pp = 1)."""
    p, t = sc.parallel, sc.training
    micro = t.global_batch // (p.dp * t.micro_batch)
    pipeline = "no pipeline" if p.pp == 1 else \
        f"{p.schedule}, {p.virtual_stages} virtual stage{'s' if p.virtual_stages > 1 else ''}"
    return (f"{pipeline}, {micro} micro-batch{'es' if micro > 1 else ''} of {t.micro_batch} sequence"
            f"{'s' if t.micro_batch > 1 else ''} per step")
