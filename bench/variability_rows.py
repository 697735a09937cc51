"""What ``variability.sigma`` would do to every shipped validation row, without re-running the table.

Run: ``python bench/variability_rows.py PRED.json [--measured OFF.jsonl ON.jsonl] [--sigma 0.015]
[--measured-sigma S] [--share 0.8]`` (``--measured-sigma``: the sigma ON ran with, if not ``--sigma``). ``PRED.json``: a whole-table ``clustersim validate --json``; ``OFF``/``ON``:
``python bench/rows.py ID,... [--set variability.sigma=S]`` outputs for the rows re-run without
and with the key (their predictions replace PRED's).

The mechanism is exactly the GPU's sustained factor divided by F = 1 + sigma E[max of N standard
normals] (tests/test_gpu_variability.py), so a row's step is ``a + b F`` in F: ``b`` the FLOP-
bound part, what ``validate --fit`` writes ``b / e`` (sim/commands/validate.py ``fit``). A row
re-run both ways gives ``b = (on - off) / (F - 1)``; any other row takes ``b = share x step``.
Printed: per row F, the step before and after, the errors; MAPE and the scale trend (all rows,
within series) before, after, and after refitting each GPU type's sustained factor to the new
steps (``validate --fit``'s loss, mean |log(predicted / published)|, on those ``a + b F / k``
lines; k: the factor's multiplier).
"""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.commands.validate_reports import report_data  # noqa: E402
from sim.hardware.variability import slowest_of  # noqa: E402
from sim.studies import validation  # noqa: E402


def read_jsonl(path: str) -> dict[str, float]:
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            out[d["row"]] = float(d["predicted_step_s"])
    return out


def lines(pred: dict, off: dict, on: dict, rows, sigma: float, share: float, at: float) -> dict[str, tuple]:
    """Row id -> (a, b, F, measured): the step is a + b F / k at sustained multiplier k (``at``:
    the sigma the ON rows ran with)."""
    out = {}
    for r in rows:
        f, f_on = slowest_of(r.num_gpus, sigma), slowest_of(r.num_gpus, at)
        if r.id in off and r.id in on and f_on > 1:
            b = (on[r.id] - off[r.id]) / (f_on - 1)
            out[r.id] = (off[r.id] - b, b, f, True)
        else:
            step = pred[r.id]
            out[r.id] = (step * (1 - share), step * share, f, False)
    return out


def comparisons(rows, steps: dict[str, float]):
    return [validation.Comparison(r, steps[r.id]) for r in rows]


def refit(rows, line: dict, use_f: bool) -> dict[str, float]:
    """Per GPU type, the sustained multiplier k minimizing mean |log(step / published)|."""
    out = {}
    for gpu in sorted({r.gpu for r in rows}):
        mine = [r for r in rows if r.gpu == gpu]

        def loss(k: float) -> float:
            return sum(abs(math.log(_step(line[r.id], k, use_f) / r.published_step_s)) for r in mine) / len(mine)

        out[gpu] = validation.golden_section(loss, 0.7, 1.4, tol=1e-5)
    return out


def _step(line: tuple, k: float, use_f: bool) -> float:
    a, b, f, _ = line
    return a + b * (f if use_f else 1.0) / k


def summary(label: str, rows, steps: dict[str, float]) -> dict:
    c = comparisons(rows, steps)
    rep = report_data(c)
    errors = [x.error for x in c]
    out = {"label": label, "mape_pct": 100 * sum(abs(e) for e in errors) / len(errors),
           "within_15": sum(abs(e) <= 0.15 for e in errors), "rows": len(errors),
           "slope": rep.trend.fit.slope, "slope_se": rep.trend.fit.stderr,
           "within_slope": rep.trend.within.slope, "within_se": rep.trend.within.stderr}
    print(f"{label:<34} MAPE {out['mape_pct']:.2f}%  within 15%: {out['within_15']}/{out['rows']}  "
          f"slope {out['slope']:+.2f} +- {out['slope_se']:.2f}  within series {out['within_slope']:+.2f} "
          f"+- {out['within_se']:.2f} points per doubling")
    for s in rep.trend.series:
        if s.fit.n > 2:
            print(f"    {s.label}: slope {s.fit.slope:+.2f} +- {s.fit.stderr:.2f} (n = {s.fit.n})")
    return out


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    pred = {x["id"]: x["predicted_step_s"] for x in json.loads(Path(argv[0]).read_text())}
    off, on, sigma, share, at, args = {}, {}, 0.015, 0.8, None, iter(argv[1:])
    for a in args:
        if a == "--measured":
            off, on = read_jsonl(next(args)), read_jsonl(next(args))
        elif a == "--sigma":
            sigma = float(next(args))
        elif a == "--measured-sigma":
            at = float(next(args))
        elif a == "--share":
            share = float(next(args))
        else:
            sys.exit(f"unknown argument {a!r}\n{__doc__}")
    rows = [r for r in validation.load_rows() if r.id in pred]
    line = lines(pred, off, on, rows, sigma, share, sigma if at is None else at)
    before = {r.id: _step(line[r.id], 1.0, False) for r in rows}
    after = {r.id: _step(line[r.id], 1.0, True) for r in rows}
    ks = refit(rows, line, True)
    refitted = {r.id: _step(line[r.id], ks[r.gpu], True) for r in rows}
    print(f"sigma {sigma}; rows not re-run take b = {share} x step\n")
    print(f"{'id':<34}{'gpus':>6}{'F':>8}{'b/step':>8}  {'before':>8}{'after':>8}{'refit':>8}  (error %)")
    for r in rows:
        a, b, f, measured = line[r.id]
        errs = [validation.Comparison(r, s[r.id]).error * 100 for s in (before, after, refitted)]
        print(f"{r.id:<34}{r.num_gpus:>6}{f:>8.4f}{b / before[r.id]:>8.3f}{'*' if measured else ' '} "
              + "".join(f"{e:>+8.1f}" for e in errs))
    print("\n(* re-run with and without the key; the others estimated)\n")
    base = refit(rows, line, False)
    summary("before (shipped factors)", rows, before)
    summary("before, factors refitted", rows, {r.id: _step(line[r.id], base[r.gpu], False) for r in rows})
    summary(f"sigma {sigma}, shipped factors", rows, after)
    summary(f"sigma {sigma}, factors refitted", rows, refitted)
    print("\nrefit multipliers of the sustained factor per GPU type, sigma on (off):")
    for gpu, k in ks.items():
        print(f"  {gpu:<20} x {k:.4f} ({base[gpu]:.4f})")


if __name__ == "__main__":
    main(sys.argv[1:])
