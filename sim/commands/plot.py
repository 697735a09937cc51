"""``clustersim plot SCENARIO [--set k=v ...] [-o out.png] [--ranks SEL] [--start-ms A] [--end-ms B]``.

Simulates the scenario and draws its timeline (see :mod:`sim.outputs.timeline`). Examples:
``clustersim plot scenarios/gpt3-175b-ptd.toml -o gpt3.png --ranks 0,1,8`` and
``clustersim plot scenarios/llama3-405b-16k-h100.toml --start-ms 0 --end-ms 500``.
"""

import math

from .. import work
from ..errors import InputError
from ..input.bundled import scenario_file
from ..input.load import load_scenario
from ..outputs.paths import file_in, make_dir, output_dir, output_file
from ..outputs.progress import status
from ..units import format_duration


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("plot", help="simulate a scenario and draw its timeline (PNG)")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("-o", "--out", help="PNG path (default: plots/NAME.png, NAME the scenario's name made a safe "
                                       "file name; plots/ is created if missing)")
    p.add_argument("--ranks", help="'all', or ranks like 0,8,16-23 (default: representatives + stragglers; "
                                   "a folded rank shows as the simulated rank identical to it)")
    p.add_argument("--start-ms", type=float, default=None, help="window start (ms)")
    p.add_argument("--end-ms", type=float, default=None, help="window end (ms)")
    p.add_argument("--timeline-window", metavar="START:END", help="the window in one flag, as on run and plan: "
                                                                   "100:250 (ms) or 0.1s:0.25s")
    p.add_argument("--force", action="store_true", help="simulate even past the work budget (sim/work.py)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Load, simulate, draw."""
    from .. import simulate
    from ..outputs.timeline import plot_timeline
    from ..outputs.rank_selection import check_selector

    scenario = load_scenario(scenario_file(args.scenario), args.overrides)
    if args.out is not None:
        out = output_file(args.out, "--out", (".png",))
    else:  # the default folder plots/ (created, one level), a file named after the scenario
        out = file_in(output_dir("plots", "--out"), scenario.name, ".png")
    for flag, v in (("--start-ms", args.start_ms), ("--end-ms", args.end_ms)):
        if v is not None and (not math.isfinite(v) or v < 0):
            raise InputError(flag, f"expected a time >= 0 in ms, got {v}")
    check_selector(args.ranks, scenario.cluster.gpus, "--ranks")
    from ..outputs.timeline_paint import parse_window, resolve_window

    parsed = parse_window(args.timeline_window)
    if parsed is not None and (args.start_ms is not None or args.end_ms is not None):
        raise InputError("--timeline-window", "give either --timeline-window or --start-ms/--end-ms")
    estimate = None if args.force else work.check(scenario)  # (a refusal is one line: before any progress line)
    with status(f"simulating {scenario.name} on {scenario.cluster.gpus:,} GPUs"):
        result = simulate(scenario, force=args.force, estimate=estimate)
    window = resolve_window(parsed, float(result.spans.end_s.max()))
    if args.start_ms is not None or args.end_ms is not None:
        end = float(result.spans.end_s.max())
        window = ((args.start_ms or 0.0) / 1e3, args.end_ms / 1e3 if args.end_ms is not None else end)
        if window[1] <= window[0]:
            raise InputError("--end-ms", f"must be after --start-ms ({window[0] * 1e3:g} ms)")
    if not args.out:
        make_dir(out.parent, "--out")
    from ..outputs.paths import written

    with written(out, "--out") as tmp:
        plot_timeline(result, tmp, args.ranks, window)
    print(f"wrote {out} ({result.summary['name']}: step {format_duration(result.summary['step_time_s'])}, "
          f"MFU {result.summary['mfu']:.1%})")
    return 0
