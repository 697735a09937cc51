"""``clustersim validate [--rows PREFIX] [--no-pp] [--fit] [--explain ID] [--json] [--report-json FILE]
[--plot PATH] [--predictions FILE]``.

Prints each published run shipped in ``sim/data`` (the 2021/Megatron-LM table, the modern
NeMo runs and the frontier runs) beside the simulator's prediction: published and predicted
seconds per step (for a row published as tokens/s per GPU, the step time its assumed batch
gives, and the error in tokens/s), the error per row and the MAPE. ``--fit`` searches, for each GPU type, the one GEMM-efficiency
constant that minimizes the mean absolute log error over all of that GPU's rows together
(global calibration, never per row). ``--explain ID`` prints where one row's step goes.

After the table come two reports (:mod:`sim.studies.validation_reports`): the scale trend
(signed error against log2 GPUs, slope per doubling, overall and per series) and the layout
ranking (groups of rows at the same per-GPU work, each member's step ratio to the group's
reference, predicted vs published), then the issue-27 targets. ``--json`` stays the
contract's list of row objects on stdout; the reports as data go to ``--report-json FILE``
(an object: ``rows`` (the same list), ``scale_trend``, ``layout_ranking``, ``targets``), so a
script reading stdout never sees another shape. ``--plot PATH`` draws the trend (PNG).
``--predictions FILE`` takes the predicted step times from an earlier ``--json`` or
``--report-json`` output instead of simulating (the reports of a 15-minute run, again in a
second).
"""

import json
import math

from ..errors import InputError
from ..model.compute import GEMM_EFFICIENCY, GEMM_KERNEL
from ..outputs.progress import Progress
from ..studies import validation
from ..studies.rows import Row
from .calibrate import add_calibration_flag, calibration_path
from .validate_reports import check_flags, print_reports, read_predictions, report_data, write


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("validate", help="compare predicted with published training step times")
    p.add_argument("--rows", default="", help="only rows whose id or source starts with one of these (comma list)")
    p.add_argument("--no-pp", action="store_true", help="only rows without pipeline parallelism")
    p.add_argument("--fit", action="store_true", help="fit the sustained efficiency per GPU type on the rows (slow: "
                                                        "three simulations per row)")
    p.add_argument("--explain", metavar="ID", help="print one row's breakdown: compute, exposed comm per axis, bubble")
    p.add_argument("--json", action="store_true", help="print one JSON object per row, as a list")
    p.add_argument("--report-json", metavar="FILE", help="also write the rows, the scale-trend and layout-ranking "
                                                         "reports and the targets as one JSON object to FILE")
    p.add_argument("--plot", metavar="PATH", help="draw the scale trend (signed error vs GPUs) as a PNG")
    p.add_argument("--predictions", metavar="FILE", help="predicted step times from an earlier --json or "
                                                         "--report-json output instead of simulating")
    add_calibration_flag(p)
    p.set_defaults(func=run)


def selected_rows(prefixes: str, no_pp: bool) -> list[Row]:
    """Rows after the --rows and --no-pp filters."""
    rows = validation.load_rows()
    if prefixes:
        wanted = [p.strip() for p in prefixes.split(",") if p.strip()]
        rows = [r for r in rows if any(r.id.startswith(p) or r.source.startswith(p) for p in wanted)]
    if no_pp:
        rows = [r for r in rows if r.scenario["parallel"].get("pp", 1) == 1]
    if not rows:
        raise InputError("--rows", f"no published row matches {prefixes!r}")
    return rows


def run(args) -> int:
    """Compare (or fit, then compare; or explain one row)."""
    check_flags(args)
    if args.explain:
        return explain(args.explain, args.json)
    rows = selected_rows(args.rows, args.no_pp)
    fitted = fit(rows) if args.fit else {}
    if args.predictions:
        results = read_predictions(args.predictions, rows)
    else:
        with Progress("validate", len(rows), transient=True) as progress:
            results = []
            for row in rows:
                results.append(validation.compare(row, fitted.get(row.gpu), calibration=calibration_path(args)))
                progress.advance(row.id)
    reports = report_data(results)
    write(args, [_row_json(c) for c in results], reports)
    if args.json:
        print(json.dumps([_row_json(c) for c in results]))
        return 0
    _print_table(results)
    if not args.predictions:
        print(simulation_time_line(results))
    print_reports(reports)
    for gpu, e in fitted.items():
        kernel = GEMM_KERNEL[gpu]["bf16"]
        print(f"fitted e_max[{gpu}] = {e:.4f}, sustained factor {e / kernel:.4f} (in use: e_max "
              f"{GEMM_EFFICIENCY[gpu]:.4f}, sustained {GEMM_EFFICIENCY[gpu] / kernel:.4f})")
    return 0


def _print_table(results) -> None:
    print(f"{'id':18} {'model':18} {'gpus':>5} {'tp/pp/dp':>14} {'published':>10} {'predicted':>10} {'error':>7}"
          "   (seconds per step)")
    for c in results:
        r = c.row
        pred = f"{c.predicted_step_s:>10.3f}" if c.predicted_step_s is not None else f"{'-':>10}"
        err = f"{c.error:>+7.1%}" if c.error is not None else f"  {c.failure}"
        tokens = " (tokens/s per GPU: compared as such)" if r.metric == "tokens_per_s_per_gpu" else ""
        print(f"{r.id:18} {r.model[:18]:18} {r.num_gpus:>5} {r.layout:>14} {r.published_step_s:>10.3f} {pred} {err}"
              + tokens)
    ran = [c for c in results if c.error is not None]
    print(f"MAPE over {len(ran)} rows: {validation.mape(results):.1%}"
          + (f"; {len(results) - len(ran)} rows could not run" if len(ran) < len(results) else ""))


SLOW_ROW_S = 10.0  # issue 28's target: every row simulated in at most this many seconds


def simulation_time_line(results) -> str:
    """How long the rows took to simulate: the total, the slowest row, and how many rows
    took longer than :data:`SLOW_ROW_S` (wall-clock, so it differs run to run)."""
    ran = [c for c in results if c.predicted_step_s is not None]
    if not ran:
        return "simulation time: no row ran"
    slowest = max(ran, key=lambda c: c.sim_wall_s)
    over = sum(1 for c in ran if c.sim_wall_s > SLOW_ROW_S)
    return (f"simulation time: {sum(c.sim_wall_s for c in ran):.1f} s over {len(ran)} rows; slowest "
            f"{slowest.row.id} {slowest.sim_wall_s:.1f} s; {over} rows over {SLOW_ROW_S:.0f} s")


def _row_json(c) -> dict:
    r = c.row
    return {"id": r.id, "published_step_s": r.published_step_s, "predicted_step_s": c.predicted_step_s,
            "error": c.error, "metric": r.metric, "published": r.published_value or r.published_step_s,
            "predicted": c.predicted_value, "source": r.source, "model": r.model, "gpu": r.gpu,
            "num_gpus": r.num_gpus, "precision": r.precision, "layout": r.layout, "failure": c.failure or None,
            "sim_wall_s": c.sim_wall_s}


def explain(row_id: str, as_json: bool) -> int:
    """Where one row's step goes on its critical rank."""
    from ..outputs.attribution import exposed_by_axis
    from ..outputs.metrics import critical_rank, rank_breakdown, rank_times

    rows = {r.id: r for r in validation.load_rows()}
    if row_id not in rows:
        raise InputError("--explain", f"no row {row_id!r}; ids: {', '.join(rows)}")
    c = validation.compare(rows[row_id], keep=True)
    if c.result is None:
        raise InputError("--explain", f"row {row_id} cannot be simulated: {c.failure}")
    step = c.predicted_step_s
    rank = int(critical_rank(rank_times(c.result.spans, step))["rank"])
    parts = rank_breakdown(c.result.spans, rank, step)
    shares = exposed_by_axis(c.result.spans, rank)
    out = {**_row_json(c), "critical_rank": rank, "mfu": c.result.summary["mfu"],
           "bubble_fraction": c.result.summary["bubble_fraction"], "breakdown_s": parts,
           "exposed_shares_s": shares}
    if as_json:
        print(json.dumps(out))
        return 0
    print(f"{row_id}: {c.row.model} on {c.row.num_gpus} {c.row.gpu} ({c.row.layout}), {c.row.precision}")
    if c.row.metric == "tokens_per_s_per_gpu":
        print(f"  published {c.row.published_value:,.0f} tokens/s per GPU, predicted {c.predicted_value:,.0f} "
              f"({c.error:+.1%}; {step:.3f} s per step at the assumed batch)")
    else:
        print(f"  published {c.row.published_step_s:.3f} s, predicted {step:.3f} s ({c.error:+.1%})")
    print(f"  MFU {out['mfu']:.1%}, bubble {out['bubble_fraction']:.1%}")
    print("\n".join(breakdown_lines(rank, parts, shares, step)))
    return 0


def breakdown_lines(rank: int, parts: dict, shares: dict, step: float) -> list[str]:
    """The critical rank's step as subtotals (compute, exposed communication, idle) that add
    up to the step, each followed by its indented components, which add up to it: compute
    by phase, exposed communication by axis (a moment two axes are both exposed is shared
    between them: :func:`sim.outputs.attribution.exposed_by_axis`)."""
    def line(label: str, value: float, indent: int) -> str:
        return f"{' ' * indent}{label:{26 - indent}} {value:9.3f} s  {value / step:6.1%}"

    out = [f"  critical rank {rank}: where its step goes (indented lines add up to the line above them)"]
    out.append(line("compute", parts["compute"], 4))
    out += [line(phase, parts[f"compute_{phase}"], 6) for phase in ("forward", "backward", "recompute", "optimizer")
            if parts[f"compute_{phase}"] > 0]
    out.append(line("exposed communication", parts["exposed_comm"], 4))
    out += [line(axis, t, 6) for axis, t in sorted(shares.items(), key=lambda kv: -kv[1]) if t > 0]
    out.append(line("idle (nothing running)", parts["idle"], 4))
    out.append(line("step", parts["compute"] + parts["exposed_comm"] + parts["idle"], 4))
    return out


FIT_GRID = (0.60, 0.68, 0.76)  # training large-GEMM efficiencies each row is simulated at


def fit(rows: list) -> dict[str, float]:
    """The large-GEMM efficiency per GPU type (equivalently its sustained factor, see
    sim/model/compute.py) minimizing the mean |log(predicted/published)| over all of that
    GPU's rows together. A row's step time is a + b/e in the efficiency e to within the
    overlap of compute and communication (compute scales as 1/e, communication does not):
    each row is simulated at the three efficiencies of :data:`FIT_GRID`, a + b/e is fitted
    to them by least squares, and the loss is minimized on those curves (golden section)."""
    import numpy as np

    out = {}
    for gpu in sorted({r.gpu for r in rows}):
        mine = [r for r in rows if r.gpu == gpu]
        curves = []
        with Progress(f"fit {gpu}", len(mine) * len(FIT_GRID), transient=True) as progress:
            for row in mine:
                steps = []
                for e in FIT_GRID:
                    steps.append(validation.compare(row, e).predicted_step_s)
                    progress.advance(f"{row.id} at e_max {e}")
                if None not in steps:
                    a, b = np.linalg.lstsq(np.column_stack([np.ones(3), 1 / np.array(FIT_GRID)]), np.array(steps),
                                           rcond=None)[0]
                    curves.append((a, b, row.published_step_s))

        def loss(e: float) -> float:
            return sum(abs(math.log((a + b / e) / pub)) for a, b, pub in curves) / len(curves)

        out[gpu] = validation.golden_section(loss, 0.2, 0.95, tol=1e-4)  # (power-limited B200 rows sit near 0.28)
    return out

