"""Where the published layouts rank among the planner's (issue 16): every run shipped with
``clustersim validate``, planned with the same model, batch and cluster.

Run: ``python bench/plan_published.py`` (``--rows MH,dg-l70`` for some; ``--budget S`` per
search, default 30). For each row: the published layout simulated, the planner's best,
the published layout's rank among the evaluated layouts (1 + those faster), its rank among
those with the published ZeRO stage, recompute and micro-batch ("same knobs"), and whether
the best is at least as fast and the published layout in the top 10%; the planner's estimate of
the published layout, scaled as the table scales estimated rows, against its simulation ("est
err": > 0 ranks it lower than simulated).
"""

import argparse

from sim.errors import InputError
from sim.plan.published import place
from sim.sweeps.pool import one_line
from sim.studies.validation import load_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="ids or sources starting with one of these (comma list)")
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    wanted = [p for p in args.rows.split(",") if p]
    rows = [r for r in load_rows() if not wanted or any(r.id.startswith(p) or r.source.startswith(p) for p in wanted)]
    print(f"{'id':18} {'gpus':>5} {'published':>16} {'sim s':>7} {'best s':>7} {'rank':>12} {'top %':>6} {'same knobs':>12} {'top %':>6} {'est err':>7}  best layout")
    results = []
    skipped = []
    for row in rows:
        try:
            p = place(row, args.budget, args.workers)
        except InputError as exc:  # the published layout's own simulation is past the work budget
            skipped.append(row.id)
            print(f"{row.id:18} {row.num_gpus:>5} {row.layout:>16} skipped: {one_line(str(exc))}", flush=True)
            continue
        results.append(p)
        print(f"{p.id:18} {p.gpus:>5} {p.published_layout:>16} {p.published_s:>7.3f} {p.best_s:>7.3f} "
              f"{p.rank:>5}/{p.evaluated:<6} {p.percentile:>6.1%} {p.knob_rank:>5}/{p.knob_peers:<6} "
              f"{p.knob_percentile:>6.1%} {p.estimate_error:>+7.1%}  {p.best_layout}"
              f"{'' if p.best_simulated else ' (estimated)'}  [{p.simulated} simulated, rho "
              f"{'n/a' if p.rank_correlation is None else f'{p.rank_correlation:.2f}'}, published estimated "
              f"{p.published_estimate_s:.3f} s x scale {p.estimate_scale:.3f}, {p.wall_s:.0f} s]", flush=True)
    wins = sum(p.planner_wins for p in results)
    top = sum(p.percentile <= 0.10 for p in results)
    knob_top = sum(p.knob_percentile <= 0.10 for p in results)
    print(f"planner's best at least as fast as the published layout: {wins} of {len(results)}; published layout in "
          f"the top 10% of evaluated layouts: {top} of {len(results)} (of those with its knobs: {knob_top}); "
          f"{sum(p.wall_s for p in results):.0f} s" + (f"; skipped {', '.join(skipped)}" if skipped else ""))


if __name__ == "__main__":
    main()
