"""The reports ``clustersim validate`` prints after its table, and their flags: the scale trend
and the layout ranking (:mod:`sim.studies.validation_reports`), ``--report-json FILE``,
``--plot PATH`` and ``--predictions FILE`` (predicted step times read back from an earlier
``--json`` or ``--report-json`` output instead of simulating). Run: ``clustersim validate``.
"""

import json
import math
from dataclasses import dataclass

from ..errors import InputError
from ..studies import validation
from ..studies import validation_reports as vr


@dataclass(frozen=True)
class Reports:
    trend: vr.ScaleTrend
    groups: tuple[vr.Group, ...]
    targets: tuple[vr.Target, ...]


def check_flags(args) -> None:
    """Output paths writable, an input file readable, no flag that would be ignored: before
    anything is simulated."""
    from ..outputs.paths import output_file, regular_file

    for flag, value in (("--report-json", args.report_json), ("--plot", args.plot), ("--predictions", args.predictions)):
        if value is not None and args.explain:
            raise InputError(flag, "reports on the table of rows: it cannot be combined with --explain")
    if args.report_json is not None:
        output_file(args.report_json, "--report-json", (".json",))
    if args.plot is not None:
        output_file(args.plot, "--plot", (".png",))
    if args.predictions is not None:
        if args.fit or args.calibration:
            raise InputError("--predictions", "reads predictions made earlier: it cannot be combined with "
                                              "--fit or --calibration, which change how rows are simulated")
        regular_file(args.predictions, "--predictions")


def read_predictions(path: str, rows: list) -> list[validation.Comparison]:
    """One Comparison per row from a file of ``validate --json`` row objects (or a
    ``--report-json`` object's ``rows``); every selected row must be in it."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError("--predictions", f"cannot read {path} as JSON: {exc}") from None
    items = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(items, list) or not all(isinstance(x, dict) and "id" in x for x in items):
        raise InputError("--predictions", f"{path} is not a validate --json list of rows (objects with 'id')")
    known = {x["id"]: x.get("predicted_step_s") for x in items}
    missing = [r.id for r in rows if r.id not in known]
    if missing:
        raise InputError("--predictions", f"{path} has no row {', '.join(missing[:5])}"
                                          f"{' ...' if len(missing) > 5 else ''} (select rows with --rows)")
    out = []
    for r in rows:
        pred = known[r.id]
        if pred is not None and not (isinstance(pred, (int, float)) and math.isfinite(pred) and pred > 0):
            raise InputError("--predictions", f"row {r.id}: predicted_step_s must be a number > 0, got {pred!r}")
        out.append(validation.Comparison(r, pred, failure="" if pred is not None else "no prediction in file"))
    return out


def report_data(results: list[validation.Comparison]) -> Reports:
    """Both reports and the targets over the rows that ran."""
    ran = [(c.row, c.predicted_step_s) for c in results if c.predicted_step_s is not None]
    trend, groups = vr.scale_trend(ran), vr.layout_ranking(ran)
    return Reports(trend, groups, vr.targets([c.error for c in results if c.error is not None], trend, groups))


def write(args, rows_json: list[dict], reports: Reports) -> None:
    """``--report-json`` and ``--plot``, each through the atomic writer."""
    from ..outputs.paths import written

    if args.report_json:
        data = {"rows": rows_json, "scale_trend": vr.trend_json(reports.trend),
                "layout_ranking": vr.ranking_json(reports.groups), "targets": vr.targets_json(reports.targets)}
        with written(args.report_json, "--report-json") as tmp, open(tmp, "w") as f:
            json.dump(data, f, indent=1)
    if args.plot:
        from ..studies.validation_plot import plot

        with written(args.plot, "--plot") as tmp:
            plot(reports.trend, tmp)


def _fit_text(fit: vr.Fit | None) -> str:
    if fit is None:
        return "-"
    if fit.stderr is None:
        return f"slope {fit.slope:+.2f} points per doubling (n = {fit.n}: no standard error)"
    return f"slope {fit.slope:+.2f} +- {fit.stderr:.2f} points per doubling (n = {fit.n})"


def print_reports(reports: Reports) -> None:
    """The trend, the ranking and the targets, after the table."""
    print("\nScale trend: step-time error (predicted / published - 1; negative = predicted faster) "
          "vs log2(GPUs)")
    print(f"  all rows: {_fit_text(reports.trend.fit)}")
    if reports.trend.within is not None:
        print(f"  within the series (one slope, an intercept each): {_fit_text(reports.trend.within)}")
    for s in reports.trend.series:
        errors = ", ".join(f"{p.gpus}: {p.error:+.1%}" for p in s.points)
        print(f"  {s.label}: {_fit_text(s.fit)}  [{errors}]")
    print("\nLayout ranking: step ratio to the group's reference row, published vs predicted "
          "(same model, GPU, sequence and sequences per GPU)")
    for g in reports.groups:
        rho = f"{g.spearman:+.2f}" if g.spearman is not None else "- (tied)"
        print(f"  {g.label}: reference {g.reference}, Spearman {rho} (n = {len(g.pairs) + 1})")
        for p in g.pairs:
            print(f"    {p.id:32} published {p.published_ratio:6.3f}  predicted {p.predicted_ratio:6.3f}  "
                  f"miss {p.miss:+6.1%}  ({p.differs})")
    print("\nTargets (issue 27):")
    for t in reports.targets:
        print(f"  {'met    ' if t.met else 'NOT met'}  {t.name}: {t.value}")
