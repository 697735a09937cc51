"""``clustersim campaign SCENARIO (--tokens T | --days D) [options] [--json]``: a whole training run with
failures, checkpoints and restarts (CONTRACT.md), over seeded trials.

Example: ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12
--gpu-hour-usd 2 --plot-run run.png --plot-interval interval.png``. The scenario's step
time comes from one step simulation (or ``--step-time-s``); see docs/campaign.md.
"""

import json
import math
import sys

from .calibrate import add_calibration_flag, calibration_overrides


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("campaign", help="days, cost and goodput of a whole training run with failures")
    p.add_argument("scenario", help="scenario TOML file, or the name of a bundled example")
    goal = p.add_mutually_exclusive_group(required=True)
    goal.add_argument("--tokens", type=float, help="tokens to train, e.g. 15e12: how many days it takes")
    goal.add_argument("--days", type=float, help="days of wall time to train, e.g. 30: how many tokens it trains")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--failures", help="failure table CSV (default: Llama 3 405B's, sim/data/llama3_interruptions.csv)")
    p.add_argument("--checkpoint-every", type=float, metavar="MIN", help="minutes of training between checkpoints "
                                                                          "(default: Young/Daly sqrt(2 C M))")
    p.add_argument("--checkpoint-mode", choices=("sync", "async"), default="sync",
                   help="sync: training waits for the write; async: only for the copy to host memory")
    p.add_argument("--storage-gbps", type=float, default=2000.0, help="storage bandwidth in GB/s (default 2000, "
                                                                      "Llama 3's Tectonic)")
    p.add_argument("--detect-min", type=float, default=2.0, help="minutes to detect a failure (default 2)")
    p.add_argument("--restart-min", type=float, default=10.0, help="minutes to relaunch, load excluded (default 10)")
    p.add_argument("--spares", type=int, help="spare nodes (default: a healthy node is always at hand)")
    p.add_argument("--repair-hours", type=float, help="hours a failed node is away, with --spares (default 48)")
    p.add_argument("--gpu-hour-usd", type=float, help="price of a GPU-hour, for cost_usd")
    p.add_argument("--trials", type=int, default=100, help="seeded trials (default 100)")
    p.add_argument("--force", action="store_true", help="run even past the work budget (sim/work.py)")
    p.add_argument("--seed", type=int, help="seed of the failure draws (default: the scenario's)")
    p.add_argument("--step-time-s", type=float, help="use this step time instead of simulating a step")
    p.add_argument("--plot-run", metavar="PNG", help="progress vs wall time of one run, failures and checkpoints")
    p.add_argument("--plot-interval", metavar="PNG", help="ETTR vs checkpoint interval, with the optimum")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_calibration_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Load, validate, simulate one step, run the trials, report."""
    from ..campaign.build import build, fleet_of
    from ..campaign.summary import report, summarize
    from ..campaign.trials import run as run_trials
    from ..work import watchdog
    from ..input.bundled import scenario_file
    from ..input.load import load_scenario
    from ..outputs.paths import output_file

    opts = options(args)
    for flag, path in (("--plot-run", args.plot_run), ("--plot-interval", args.plot_interval)):
        if path is not None:
            output_file(path, flag, (".png",))  # before the step simulation, not after it
    scenario = load_scenario(scenario_file(args.scenario), calibration_overrides(args))
    fleet_of(scenario, opts)  # bad --spares fails before the step simulation
    seed = scenario.seed if args.seed is None else args.seed
    step_s = args.step_time_s if args.step_time_s is not None else step_time(scenario)
    campaign, facts = build(scenario, step_s, opts)
    limit = None if args.force else work_budget(campaign, args)
    with watchdog(scenario.name, limit):
        outcome = run_trials(campaign, args.trials, seed, record=bool(args.plot_run))
    meta = {"name": scenario.name, "tokens": args.tokens if args.days is None else 0.0, "trials": args.trials, "seed": seed,
            "mode": opts.mode, "causes": opts.failures.causes, "gpu_hour_usd": args.gpu_hour_usd}
    summary = summarize(campaign, outcome, facts, meta)
    print(json.dumps(summary) if args.json else report(summary))
    _plots(args, campaign, outcome, facts, summary, seed)
    return 0


def work_budget(campaign, args) -> float:
    """Refuse a campaign past the work budget (sim/work.py) naming the flag that drives it:
    ``--trials`` when the per-trial part dominates, else ``--tokens`` (more steps, more
    failures, more rounds); the CPU limit of the watchdog otherwise."""
    from ..campaign.trials import ROUND_S, TRIAL_ROUND_S, cpu_seconds, rounds_expected
    from ..errors import InputError
    from ..work import BUDGET_S, WATCHDOG_FACTOR, WATCHDOG_MIN_S

    seconds = cpu_seconds(campaign, args.trials)
    if args.plot_interval:  # interval_curve: one run of min(trials, 200) per interval of its grid
        from ..campaign.optimum import interval_grid

        seconds += len(interval_grid(campaign.interval)) * cpu_seconds(campaign, min(args.trials, 200))
    if seconds > BUDGET_S:
        key = "--trials" if TRIAL_ROUND_S * args.trials > ROUND_S else "--tokens" if args.days is None else "--days"
        raise InputError(key, f"{args.trials:,} trials of ~{rounds_expected(campaign):,.0f} failures each would need "
                              f"~{seconds:,.0f} s of CPU, past this machine's budget of {BUDGET_S:,.0f} s; "
                              "--force runs it anyway")
    return max(WATCHDOG_MIN_S, WATCHDOG_FACTOR * seconds)


def options(args):
    """Check every flag at the edge and convert to SI units."""
    from ..campaign.build import REPAIR_S, Options
    from ..campaign.failures import load_table
    from ..errors import InputError

    for value, key, hi in ((args.tokens, "--tokens", 1e18), (args.days, "--days", 36_500),
                           (args.storage_gbps, "--storage-gbps", 1e7),
                           (args.checkpoint_every, "--checkpoint-every", 1e7), (args.step_time_s, "--step-time-s", 1e6),
                           (args.repair_hours, "--repair-hours", 1e5)):
        _in_range(value, key, 0, hi, low_inclusive=False)
    for value, key, hi in ((args.detect_min, "--detect-min", 1e5), (args.restart_min, "--restart-min", 1e5),
                           (args.gpu_hour_usd, "--gpu-hour-usd", 1e6)):
        _in_range(value, key, 0, hi)
    if not 1 <= args.trials <= 100_000:
        raise InputError("--trials", f"expected 1 to 100,000, got {args.trials:,}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise InputError("--seed", f"expected 0 to 2**63 - 1, got {args.seed}")
    if args.spares is not None and args.spares * args.trials > 50_000_000:
        raise InputError("--spares", f"{args.spares:,} spares x {args.trials:,} trials is more than 50 million "
                                     "pool slots to track; use fewer trials")
    if args.repair_hours is not None and args.spares is None:
        raise InputError("--repair-hours", "applies to a finite spare pool: give --spares N too")
    for path, key in ((args.plot_run, "--plot-run"), (args.plot_interval, "--plot-interval")):
        if path is not None and args.days is not None:
            raise InputError(key, "draws a run to a token count: give --tokens instead of --days")
        if path is not None and not path.endswith(".png"):
            raise InputError(key, f"expected a .png path, got {path!r}")
    return Options(args.tokens, load_table(args.failures),
                   None if args.checkpoint_every is None else args.checkpoint_every * 60, args.checkpoint_mode,
                   args.storage_gbps * 1e9, args.detect_min * 60, args.restart_min * 60, args.spares,
                   REPAIR_S if args.repair_hours is None else args.repair_hours * 3600, days=args.days)


def _in_range(value, key: str, lo: float, hi: float, low_inclusive: bool = True) -> None:
    """A finite number in [lo, hi] (or (lo, hi]); None passes (the flag was not given)."""
    from ..errors import InputError

    if value is None:
        return
    ok = math.isfinite(value) and (value >= lo if low_inclusive else value > lo) and value <= hi
    if not ok:
        raise InputError(key, f"expected a number {'>=' if low_inclusive else '>'} {lo:g} and <= {hi:g}, got {value}")


def step_time(scenario) -> float:
    """One simulated step (a few seconds for 16k GPUs; progress on stderr)."""
    from .. import simulate

    print(f"simulating one step of {scenario.name} ({scenario.cluster.gpus:,} GPUs) ...", file=sys.stderr,
          flush=True)
    result = simulate(scenario)
    if not result.summary["fits_in_memory"]:
        print(f"warning: {scenario.name} needs {result.summary['memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU, "
              "more than the GPU's HBM", file=sys.stderr)
    print(f"step time {result.summary['step_time_s']:.3f} s ({result.summary['sim_wall_s']:.1f} s to simulate)",
          file=sys.stderr)
    return result.summary["step_time_s"]


def _plots(args, campaign, outcome, facts, summary, seed) -> None:
    if not (args.plot_run or args.plot_interval):
        return
    from ..campaign import plots  # (matplotlib: seconds to import, only when a picture is asked for)
    from ..outputs.paths import written

    title = (f"{summary['name']}: {summary['tokens']:.3g} tokens on {summary['gpus']:,} GPUs, "
             f"{summary['interruptions_per_day']:.1f} interruptions/day, ETTR {summary['ettr']:.1%}")
    if args.plot_run:
        with written(args.plot_run, "--plot-run") as tmp:
            plots.plot_run(campaign, outcome.history, title + " (trial 0)", tmp)
        print(f"wrote {args.plot_run}", file=sys.stderr)
    if args.plot_interval:
        from ..campaign.optimum import best, interval_curve, interval_grid

        curve = interval_curve(campaign, interval_grid(campaign.interval), min(args.trials, 200), seed)
        with written(args.plot_interval, "--plot-interval") as tmp:
            plots.plot_interval(curve, best(curve), facts.young_s, facts.daly_s, campaign.step_s, title, tmp)
        print(f"wrote {args.plot_interval}", file=sys.stderr)
