"""``clustersim plan MODEL_OR_SCENARIO --gpus N --topology T --seq-len S --global-batch-tokens B
[--gpu G] [--precision P] [--top K] [--out plan.csv] [--json] [--timeline PNG]``.

Example: ``clustersim plan llama3.1-70b --gpus 1024 --topology dgx-h100 --seq-len 8192
--global-batch-tokens 8388608 --out plan.csv --timeline best.png`` (see docs/plan.md).
"""

import json
import sys

from ..errors import InputError


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("plan", help="find the best parallel layout of a model on a cluster, and say why it wins")
    p.add_argument("source", metavar="MODEL_OR_SCENARIO",
                   help="a model preset (llama3.1-70b, deepseek-v3, ...), a Hugging Face config.json, or a scenario "
                        "file / bundled example (its [model] and [training]; its [parallel] is replaced)")
    p.add_argument("--gpus", type=int, help="GPUs of the cluster (whole nodes of the topology)")
    p.add_argument("--topology", help="topology preset or file, e.g. dgx-h100")
    p.add_argument("--gpu", help="GPU preset (default: the topology's)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--global-batch-tokens", type=int, help="tokens per optimizer step (a multiple of --seq-len)")
    p.add_argument("--precision", choices=("bf16", "fp8", "mxfp8", "nvfp4"), help="training precision (default: the scenario's, bf16)")
    p.add_argument("--top", type=int, default=10, help="layouts shown and in --json (default 10)")
    p.add_argument("--out", help="write every evaluated layout, ranked, to this .csv or .parquet; its simulations "
                                 "are kept beside it (NAME.sims.csv) and reused when the search runs again")
    p.add_argument("--json", action="store_true", help="print one JSON object (CONTRACT.md)")
    p.add_argument("--timeline", help="simulate the winner again and draw its timeline (.png)")
    p.add_argument("--timeline-window", metavar="START:END",
                   help="with --timeline: draw only this part of the step, e.g. 100:250 (ms) or 0.1s:0.25s")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model.* or training.* key of the base (repeatable)")
    p.add_argument("--headroom", type=float, default=None,
                   help="share of HBM kept free for allocator fragmentation (default 0.05)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="predicted seconds of full simulation on one core (default 240; 0: estimate only)")
    p.add_argument("--workers", type=int, default=None, help="simulation processes (default: CPU count)")
    p.add_argument("--dask", metavar="ADDR", help="simulate on a dask.distributed scheduler")
    p.add_argument("--point-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a simulation running longer, in wall seconds (default: the budget, at most 600; each "
                        "also stops past 60 s of its own CPU); it keeps its estimate")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--force", action="store_true",
                   help="search even past the work budget of enumerating and estimating (sim/plan/budget.py)")
    p.add_argument("--calibration", metavar="PROFILE.toml", help="a calibration profile (clustersim calibrate)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Check every flag, search, print (and write) the result."""
    from ..outputs.paths import output_file
    from ..plan import request, search
    from ..plan.fit import HEADROOM
    from ..plan.report import print_text, summary, write_table
    from ..plan.driver import BUDGET_S, POINT_TIMEOUT_S
    from ..plan import budget as plan_budget
    from .. import work

    _check_numbers(args)
    if args.out is not None:
        from ..plan.driver import sims_path

        output_file(args.out, "--out", (".csv", ".parquet"))
        output_file(sims_path(args.out), "--out", (".csv", ".parquet"))  # the resume file, before any work
    if args.timeline is not None:
        output_file(args.timeline, "--timeline", (".png",))
    from ..outputs.timeline_paint import parse_window

    window = parse_window(args.timeline_window)
    if window is not None and not args.timeline:
        raise InputError("--timeline-window", "selects the part of the step a timeline draws: "
                                              "give --timeline best.png too")
    req = request(args.source, args.gpus, args.topology, args.gpu, args.seq_len, args.global_batch_tokens,
                  args.precision, args.overrides, args.calibration)
    watchdog_s = None if args.force else work.watchdog_seconds(plan_budget.check(req))  # (one line, before progress)
    budget = BUDGET_S if args.budget is None else args.budget
    timeout = args.point_timeout if args.point_timeout is not None else \
        (None if args.dask or not budget else min(budget, POINT_TIMEOUT_S))
    try:
        plan = _search(args, req, budget, timeout, HEADROOM if args.headroom is None else args.headroom, search,
                       watchdog_s)
    except KeyboardInterrupt:
        print(f"plan interrupted: finished simulations are kept"
              f"{' beside ' + args.out + '; run the same command again to resume' if args.out else ''}",
              file=sys.stderr)
        return 130
    if args.out:
        write_table(plan, args.out)
    if args.json:
        print(json.dumps(summary(plan, req, args.top)))
    else:
        print_text(plan, req, args.top)
    if args.timeline:
        _timeline(req, plan, args.timeline, args.quiet, window)
    return 0


def _search(args, req, budget, timeout, headroom, search, watchdog_s):
    from ..outputs.paths import output_file
    from ..sweeps.sinks import exclusive

    if not args.out:
        return search(req, args.top, budget, headroom, args.workers, args.dask, None, timeout, args.quiet, watchdog_s)
    with exclusive(output_file(args.out, "--out", (".csv", ".parquet"))):
        return search(req, args.top, budget, headroom, args.workers, args.dask, args.out, timeout, args.quiet,
                      watchdog_s)


def _check_numbers(args) -> None:
    from ..sweeps.pool import check_workers

    check_workers(args.workers)
    for flag, value, ok, need in (
            ("--top", args.top, lambda v: v >= 1, "a positive integer"),
            ("--headroom", args.headroom, lambda v: 0 <= v < 1, "a share of HBM in [0, 1)"),
            ("--budget", args.budget, lambda v: 0 <= v < float("inf"), "seconds >= 0"),
            ("--point-timeout", args.point_timeout, lambda v: 0 < v < float("inf"), "seconds > 0")):
        if value is not None and not ok(value):
            raise InputError(flag, f"expected {need}, got {value!r}")


def _timeline(req, plan, path: str, quiet: bool, window=None) -> None:
    """Simulate the winner again (the sweep keeps summaries, not spans) and draw it."""
    from ..input.load import scenario_from_dict
    from ..outputs.progress import status
    from ..outputs.timeline import plot_timeline
    from ..outputs.timeline_paint import resolve_window
    from ..plan.report import describe
    from ..plan.space import overrides
    from ..step import simulate

    best = plan.table.iloc[0]
    scenario = scenario_from_dict(req.data, overrides(best))
    with status(f"simulating the winner for its timeline: {describe(best)}", quiet):
        result = simulate(scenario)
    from ..outputs.paths import written

    with written(path, "--timeline") as tmp:
        plot_timeline(result, tmp, window=resolve_window(window, float(result.spans.end_s.max())),
                      title=f"{req.scenario.model.name} on {req.gpus:,} GPUs: {describe(best)}")
    if not quiet:
        print(f"timeline of the winner: {path}", file=sys.stderr)
