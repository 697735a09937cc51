"""The planner's simulation-cost predictor (sim/plan/cost.py) against measured simulations.

Run: ``python bench/plan_cost.py`` (``--only dsv3``, repeatable; ``--points N``: the first N
picks of each search; ``--cap S``: CPU seconds a point may take; ``--json FILE`` appends
each point). For each search of bench/plan.py it runs the analytic phase as ``clustersim
plan`` does (rules, memory, estimate), takes the layouts its first round would simulate
(the front and the spread, :mod:`sim.plan.select`, at the default budget) and simulates
each in a forked child as a planner worker does (scenario load, simulation, breakdown:
:func:`sim.plan.explain.simulate_point`), its CPU seconds from ``os.wait4``. Printed per
point: the predictor's counts (GPUs, ops, cross-domain flows, CP flows, cross-domain
all-to-alls), its prediction and the measurement; then the constants refitted to all
points (least squares on the relative error, each constant >= 0) and the refit's
predicted / measured range. A point past ``--cap`` is printed as a lower bound and left
out of the fit. ``--fit FILE ...`` refits to the points of earlier ``--json`` files alone;
``--scale F`` multiplies measured CPU seconds first (bench/work.py's load scale: the dense
rows' estimate / measured when they ran).

Measured 2026-11-26 on the 2-core VM at load 11-15 (``--only 70b --points 8 --cap 60``,
``--only dsv3 --points 3 --cap 90``; ``--fit ... --scale 0.523``): the 70B search's first 8
picks took 1.2-2.5 s of CPU (0.6-1.3 s scaled) where 0.4-0.6 s is predicted (0.47-0.68x of
the scaled figures); refitted to them alone SECONDS_PER_OP 2.75e-5 and SECONDS_PER_FLOW
6.1e-7 (the GPU term not identifiable: every point has 1,024 GPUs). The DeepSeek-V3
search's two best estimates (tp 4, ep 256, EP overlap, dp 512 / dp 256 x cp 2: 2,360
all-to-alls across NVLink domains, each over 1,024 GPUs) ran past 90 s of CPU (47 s scaled)
where 6.6 s is predicted: SECONDS_PER_A2A, one price whatever the group, is at least 8x too
low for all-to-alls over 256 expert ranks. So the predictor underrates; refitting it raises
the predictions and the same budget then simulates fewer DeepSeek-V3 layouts, not more. Not
refitted yet: the all-to-all term needs points that finish (and a price that grows with the
group), and the GPU term points of other sizes.

Issue 28 (2026-11-27, load 12-20): the all-to-all term is now per pair of ranks (``a2a_pairs``:
all-to-alls x stage ranks x (ep - 1)), 4e-8 s, from two DeepSeek-V3 points 1.2 s apart (ep 16
and 32, 2.52 and 3.73 s of CPU), and EP overlap's ops cost 8x (two points, 8.8x and 7.4x);
sim/plan/cost.py's docstring lists the five points measured.

Issue 28, later the same day: the GPU and op terms are the work estimate's own (sim/work.py's
``cluster_seconds`` and ``ops_seconds`` of the census's op count), so the refit fits
``WORK_SCALE`` (a planner point's CPU against that estimate) beside the flow, CP and pair terms.
"""

import argparse
import json
import os
import resource
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan import CASES  # noqa: E402 -- bench/plan.py's searches

from sim.input.load import scenario_from_dict  # noqa: E402
from sim.plan import cost, driver, fit, select  # noqa: E402
from sim.plan.cost import CONSTANTS, COUNTS, TERMS  # noqa: E402 -- TERMS: cost.sim_cost's terms, CONSTANTS their prices
from sim.plan.estimate import COUNTS_AT, LAYER_KEY, Estimator  # noqa: E402
from sim.plan.explain import simulate_point  # noqa: E402
from sim.plan.fit import keyed, lookup  # noqa: E402
from sim.plan.inputs import request  # noqa: E402
from sim.plan.space import overrides  # noqa: E402
from sim.plan.stages import Stages  # noqa: E402



def argv_request(argv: list[str]):
    """bench/plan.py's command line of one search as a :class:`sim.plan.inputs.Request`."""
    flags = dict(zip(argv[1::2], argv[2::2]))
    sets = [v for k, v in zip(argv[1::2], argv[2::2]) if k == "--set"]
    num = lambda k: int(flags[k]) if k in flags else None  # noqa: E731
    batch = num("--global-batch-tokens")
    return request(argv[0], num("--gpus"), flags.get("--topology", "dgx-h100"), flags.get("--gpu"),
                   num("--seq-len"), batch, overrides=sets)


def picks(req) -> tuple[pd.DataFrame, np.ndarray]:
    """The first round's layouts (ranked rows) and their predictor terms (rows x TERMS)."""
    stages = Stages(req.scenario)
    _, _, evaluated = driver._valid(req, stages, fit.HEADROOM)
    est = Estimator(req.scenario, stages, req.spec, req.gpu)
    ranked = pd.concat([evaluated, est.frame(evaluated)], axis=1)
    ranked = ranked.iloc[np.lexsort((ranked.index.to_numpy(), ranked["estimate_s"].to_numpy()))]
    ranked = ranked.reset_index(drop=True)
    front, _ = select.front(ranked, driver.BUDGET_S, max(driver.FRONT, driver.TOP))
    chosen = ranked.iloc[front + select.spread(ranked, driver.BUDGET_S, set(front))]
    c = chosen.assign(micro=est.micro_of(chosen).to_numpy())
    both = lookup(keyed(c), LAYER_KEY, est._layer_costs)
    layer = both[:, :, COUNTS_AT:COUNTS_AT + len(COUNTS)]
    terms = cost.terms(c, est.d, req.scenario, est.domain, layer, stages.split(1, 1))
    return chosen, terms


def measure(data: dict, point: dict, cap: float) -> float | None:
    """CPU seconds of one planner point in a forked child (None: past ``cap``)."""
    pid = os.fork()
    if pid == 0:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cap), int(cap) + 5))
        row, error = simulate_point(scenario_from_dict(data, point))
        os._exit(0 if row is not None else 3)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    if code == 3:
        raise SystemExit(f"point failed: {point}")
    return cpu if code == 0 else None


def refit(terms: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Non-negative constants minimizing the relative error (active set: drop a negative
    constant, refit the rest)."""
    a = terms / measured[:, None]
    active = [j for j in range(terms.shape[1]) if terms[:, j].any()]
    while True:
        x = np.zeros(terms.shape[1])
        x[active] = np.linalg.lstsq(a[:, active], np.ones(len(measured)), rcond=None)[0]
        if (x >= 0).all():
            return x
        active = [j for j in active if x[j] > 0]


def report(rows: list, measured: list, now: np.ndarray, scale: float) -> None:
    """The refit and the predicted / measured range before and after it."""
    terms, measured = np.array(rows), np.array(measured) * scale
    x = refit(terms, measured)
    print(f"refit (CPU x {scale:g}): " + ", ".join(f"{k} {v:.3g} (now {n:.3g})" for k, v, n in zip(CONSTANTS, x, now)))
    for label, c in (("now", now), ("refit", x)):
        ratio = terms @ c / measured
        print(f"predicted / measured, {label}: {ratio.min():.2f}-{ratio.max():.2f}x (median {np.median(ratio):.2f})")


def _layout(point: dict) -> str:
    """A point's layout in one short line."""
    keys = ("tp", "pp", "virtual_stages", "schedule", "dp", "cp", "ep", "expert_tp", "zero", "recompute", "micro_batch",
            "tp_comm_overlap", "ep_comm_overlap")
    short = {k.split(".")[-1]: v for k, v in point.items()}
    return " ".join(f"{k}={short[k]}" for k in keys if k in short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--exact", action="store_true",
                        help="simulate every micro-batch (--set simulation.micro_batches=all), not the planner's steady mode")
    parser.add_argument("--spread", action="store_true",
                        help="the N points evenly spaced over the first round's picks, not its first N")
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument("--json")
    parser.add_argument("--fit", nargs="+", metavar="FILE")
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    now = np.array([getattr(cost, k) for k in CONSTANTS])
    rows, measured = [], []
    if args.fit:
        for line in (line for path in args.fit for line in open(path)):
            r = json.loads(line)
            shown = f"{r['cpu_s'] * args.scale:.1f}" if r["cpu_s"] is not None else "past the cap"
            print(f"{r['case']}: " + ", ".join(f"{t} {v:,.0f}" for t, v in zip(TERMS, r["terms"]))
                  + f"; predicted {float(np.dot(r['terms'], now)):.1f} s, measured "
                  f"{shown} s (scaled)")
            if r["cpu_s"] is not None:
                rows.append(r["terms"])
                measured.append(r["cpu_s"])
        report(rows, measured, now, args.scale)
        return
    for name in args.only or ["70b", "405b", "dsv3"]:
        req = argv_request(CASES[name] + (["--set", "simulation.micro_batches=all"] if args.exact else []))
        chosen, terms = picks(req)
        n = min(args.points, len(chosen))
        at = np.unique(np.linspace(0, len(chosen) - 1, n).round().astype(int)) if args.spread else range(n)
        for i in at:
            point = overrides(chosen.iloc[i])
            cpu = measure(req.data, point, args.cap)
            pred = float(terms[i] @ now)
            shown = f"{cpu:.1f}" if cpu is not None else f">{args.cap:.0f}"
            print(f"{name} {i}: {_layout(point)}: " + ", ".join(f"{t} {v:,.0f}" for t, v in zip(TERMS, terms[i]))
                  + f"; predicted {pred:.1f} s, measured {shown} s CPU", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"case": name, "point": point, "terms": terms[i].tolist(), "predicted_s": pred,
                                        "cpu_s": cpu}) + "\n")
            if cpu is not None:
                rows.append(terms[i])
                measured.append(cpu)
    report(rows, measured, now, args.scale)


if __name__ == "__main__":
    main()
