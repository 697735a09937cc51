"""``clustersim validate [--rows N21,MH] [--no-pp] [--fit] [--json]``: predicted vs published.

Prints each published run (``sim/data/published_runs.csv``) beside the simulator's
prediction in the row's own FLOPs convention, the error per row and the MAPE.
``--fit`` searches the one GEMM-efficiency constant per GPU type that minimizes the mean
absolute log error over all of that GPU's rows together (global calibration).
"""

import json
import math

from ..studies import validation
from ..model.compute import GEMM_EFFICIENCY
from ..errors import InputError
from ..outputs.progress import Progress


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("validate", help="compare predictions with published training runs")
    p.add_argument("--rows", default="", help="only rows whose source starts with one of these (comma list)")
    p.add_argument("--no-pp", action="store_true", help="only rows without pipeline parallelism")
    p.add_argument("--fit", action="store_true", help="fit the GEMM efficiency per GPU type (slow)")
    p.add_argument("--json", action="store_true", help="print rows and MAPE as JSON")
    p.set_defaults(func=run)


def selected_rows(prefixes: str, no_pp: bool) -> list[dict]:
    """Rows after the --rows and --no-pp filters."""
    rows = validation.load_rows()
    if prefixes:
        wanted = [p.strip() for p in prefixes.split(",") if p.strip()]
        rows = [r for r in rows if any(r["source"].startswith(p) for p in wanted)]
    if no_pp:
        rows = [r for r in rows if int(r["pp"]) == 1]
    if not rows:
        raise InputError("--rows", f"no published row matches {prefixes!r}")
    return rows


def run(args) -> int:
    """Compare (or fit, then compare)."""
    rows = selected_rows(args.rows, args.no_pp)
    fitted = fit(rows) if args.fit else {}
    with Progress("validate", len(rows), transient=True) as progress:
        results = []
        for r in rows:
            results.append(validation.compare(r, fitted.get(r["gpu"])))
            progress.advance(f"{r['source']} {r['model']} {r['params']}")
    if args.json:
        print(json.dumps({"rows": [_row_json(c) for c in results], "mape": validation.mape(results),
                          "fitted_e_max": fitted}))
        return 0
    print(f"{'source':7} {'model':6} {'params':>7} {'gpus':>5} {'tp':>3} {'pp':>3} {'dp':>3} "
          f"{'published':>10} {'predicted':>10} {'error':>7}   (TFLOP/s per GPU, row's convention)")
    for c in results:
        r = c.row
        print(f"{r['source']:7} {r['model']:6} {r['params']:>7} {r['num_gpus']:>5} {r['tp']:>3} {r['pp']:>3} "
              f"{r['dp']:>3} {c.published:>10.1f} {c.predicted:>10.1f} {c.error:>+7.1%}")
    print(f"MAPE over {len(results)} rows: {validation.mape(results):.1%}")
    for gpu, e in fitted.items():
        print(f"fitted e_max[{gpu}] = {e:.3f} (in use: {GEMM_EFFICIENCY[gpu]:.3f})")
    return 0


def _row_json(c) -> dict:
    keys = ("source", "model", "params", "num_gpus", "tp", "pp", "dp", "gpu")
    return {**{k: c.row[k] for k in keys}, "published": c.published, "predicted": c.predicted, "error": c.error}


def fit(rows: list[dict]) -> dict[str, float]:
    """Golden-section search per GPU type on the mean |log(predicted/published)|."""
    out = {}
    for gpu in sorted({r["gpu"] for r in rows}):
        mine = [r for r in rows if r["gpu"] == gpu]

        def loss(e: float) -> float:
            return sum(abs(math.log(validation.compare(r, e).predicted / validation.published_tflops(r)))
                       for r in mine) / len(mine)

        out[gpu] = _golden(loss, 0.4, 0.95)
    return out


def _golden(f, lo: float, hi: float, tol: float = 0.005) -> float:
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > tol:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2
