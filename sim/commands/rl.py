"""``clustersim rl SCENARIO [--set k=v ...] [--json] [--trace F] [--timeline F [--timeline-window A:B]] [--steps F]``.

Example: ``clustersim rl scenarios/rl-llama3-8b-h100.toml --set rl.mode=sync``: simulates
the scenario's RL loop (section ``[rl]``, docs/rl.md) and prints per-pool utilization,
tokens/s, the long tail and staleness; ``--json`` prints CONTRACT.md's object.
"""

import csv
import json
import sys

from ..errors import InputError
from ..input.choices import RLMode
from ..input.load import load_scenario


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("rl", help="simulate an RL loop: generator and trainer pools, weight transfers")
    p.add_argument("scenario", help="scenario TOML file with an [rl] section, or a bundled example's name")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. rl.mode=sync (repeatable)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of both pools (JSON)")
    p.add_argument("--timeline", help="write a PNG timeline of both pools")
    p.add_argument("--timeline-window", metavar="START:END",
                   help="with --timeline: draw only this part of the run, e.g. 10s:60s or 10000:60000 (ms)")
    p.add_argument("--steps", dest="steps_csv", help="write one CSV row per training step")
    p.add_argument("--force", action="store_true", help="run even past the work budget (sim/rl/budget.py), "
                                                        "without the watchdog")
    p.set_defaults(func=run)


def run(args) -> int:
    """Load, check the output paths, simulate, print, export."""
    from ..rl.run import simulate_rl

    from ..input.bundled import scenario_file
    from ..outputs.paths import output_file

    for flag, value, ext in (("--trace", args.trace, ".json"), ("--timeline", args.timeline, ".png"),
                             ("--steps", args.steps_csv, ".csv")):
        if value is not None:
            output_file(value, flag, (ext,))
    from ..outputs.timeline_paint import parse_window

    args.window = parse_window(args.timeline_window)  # (bad text: exit 2 before anything is simulated)
    if args.window is not None and not args.timeline:
        raise InputError("--timeline-window", "selects the part of the run a timeline draws: "
                                              "give --timeline out.png too")
    scenario = load_scenario(scenario_file(args.scenario), args.overrides)
    if scenario.rl is None:
        raise InputError("rl", f"{args.scenario} has no [rl] section (CONTRACT.md: clustersim rl)")
    from ..rl import budget
    from ..work import watchdog

    limit = None if args.force else budget.watchdog_seconds(budget.check(scenario))
    with watchdog(scenario.name, limit):
        result = simulate_rl(scenario, record_links=bool(args.trace))
    _warn_underfull(result)
    print(json.dumps(result.summary) if args.json else summary_text(result.summary))
    _exports(args, result)
    return 0


def _warn_underfull(result) -> None:
    s = result.summary
    if not s["trainer_fits_in_memory"]:
        print(f"warning: the trainer pool needs {s['trainer_memory_per_gpu_bytes'] / 1e9:.1f} GB per GPU, more than "
              "the GPU's HBM", file=sys.stderr)
    share = result.scenario.training.global_batch / s["engines"]
    if s["mode"] == RLMode.SYNC and share < s["slots_per_engine"]:
        print(f"warning: each engine gets {share:.0f} of a step's sequences but holds {s['slots_per_engine']}: "
              "it never runs full (raise training.global_batch or lower rl.generator_gpus)", file=sys.stderr)


def _exports(args, result) -> None:
    from ..outputs.paths import written
    from ..rl import exports
    from ..rl.summary import step_table

    if args.trace:
        with written(args.trace, "--trace") as tmp:
            exports.write_trace(result, tmp)
    if args.timeline:
        with written(args.timeline, "--timeline") as tmp:
            exports.plot(result, tmp, args.window)
    if args.steps_csv:
        rows = step_table(result.loop.steps)
        with written(args.steps_csv, "--steps") as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def summary_text(s: dict) -> str:
    """A human-readable table of the summary."""
    rows = [("scenario", s["name"]), ("mode", f"{s['mode']} (staleness gate k = {s['max_staleness']})"),
            ("GPUs", f"{s['num_gpus']}: {s['trainer_gpus']} trainer, {s['generator_gpus']} generator "
                     f"({s['engines']} engines x {s['slots_per_engine']} sequences)"),
            ("simulated", f"{s['steps']} steps in {s['wall_s']:,.1f} s ({s['step_time_s']:.2f} s per step)"),
            ("generator utilization", f"{s['generator_utilization']:.1%} (batches {s['generating_utilization']:.1%} "
                                      "full while generating)"),
            ("  lost to the long tail", f"{s['long_tail_fraction']:.1%} ({s['long_tail_s']:,.1f} pool-seconds)"),
            ("  idle / weight sync", f"{s['generator_idle_fraction']:.1%} / {s['generator_weights_fraction']:.1%}"),
            ("trainer utilization", f"{s['trainer_utilization']:.1%} ({s['train_step_s']:.2f} s per step, "
                                    f"MFU {s['trainer_mfu']:.1%} over the run)"),
            ("tokens/s trained", f"{s['tokens_per_s']:,.0f} (generated {s['generated_tokens_per_s']:,.0f})"),
            ("responses trained", f"mean {s['response_length_mean']:,.0f} tokens, longest {s['response_length_max']:,}"),
            ("staleness (steps)", f"per token mean {s['mean_staleness_steps']:.2f}, max {s['max_staleness_steps']}; "
                                  f"per sequence mean {s['mean_sequence_staleness_steps']:.2f}"),
            ("weight transfer", f"{s['weight_bytes'] / 1e9:.1f} GB in {s['weight_transfer_s'] * 1e3:.1f} ms"),
            ("simulated in", f"{s['sim_wall_s']:.2f} s")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
