"""Calibrate sim/work.py: the work estimate against measured runs, one probe per cost.

Run: ``python bench/work.py`` (``--quick`` skips the two slowest probes). Each probe is
simulated with ``force=True`` in a forked child; its CPU seconds and peak RSS come from
``os.wait4`` (the child's own resource usage, as ``resource.getrusage`` in it would say). Printed per probe: the estimate (CPU s, GiB), the
measurement, their ratio, and the per-unit figure the probe isolates (s and bytes per
op, per GPU, per fabric link, per router score, per expert kernel), which are what the
constants at the top of sim/work.py are rounded up from. CPU, not wall, time: on a
shared machine wall time measures the neighbours.

``python bench/work.py --cases`` (or ``--case NAME``, repeatable) checks the estimate's
accuracy across whole cases instead: dense and MoE scenarios of several sizes (issue 28's
``bench/step.py`` cases, scaled down to fewer sequences where the whole case takes minutes),
one table row each (:data:`LONG` ones only when named): estimated vs measured CPU seconds
and peak memory, and the counts the
estimate prices (ranks simulated, ops, expert kernels). ``--json FILE`` appends each row;
``--fit FILE`` fits sim/work.py's all-to-all constants to such rows (:func:`fit`).
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

import sim
from sim import work

PROBES = [  # (what it isolates, scenario, overrides, the unit count's name in Work)
    ("ops", "scenarios/gpt3-175b-ptd.toml", [], "ops"),
    ("ops, every rank", "scenarios/jitter-dp-1k.toml", [], "ops"),
    ("ops, folded", "scenarios/llama3-405b-16k-h100.toml",  # a straggler splits the classes: 64 ranks
     ["stragglers=[{ranks = [1234], slowdown = 1.2}]"], "ops"),
    ("ops, sampled", "scenarios/llama3-405b-16k-h100.toml", ["jitter.sigma=0.05"], "ops"),  # 512 ranks
    ("GPUs", "scenarios/llama3-70b-fsdp-1k-h100.toml",
     ["cluster.nodes=2048", "parallel.dp=16384", "training.global_batch=16384"], "gpus"),
    ("fabric links", "scenarios/llama3-8b-fsdp-h100.toml",
     ["cluster.topology=generic", "cluster.topology_overrides.spines=2048",
      "cluster.topology_overrides.nodes_per_su=1"], "fabric_links"),
    ("router scores", "scenarios/mixtral-small-ep-h100.toml",
     ["model.moe.routing='token_choice'", "model.moe.experts=4096"], "scores"),
    ("expert kernels", "scenarios/mixtral-small-ep-h100.toml",
     ["model.moe.experts=16384", "parallel.ep=1", "model.layers=32", "training.global_batch=256"],
     "expert_kernels"),
]
QUICK_SKIPS = ("ops", "ops, sampled", "router scores")
# Whole cases (--cases): name -> (bench/step.py case or scenario file, overrides). "-N": N
# sequences instead of the case's (the whole case takes minutes of CPU on this machine).
CASES = {
    "gpt3-175b": ("scenarios/gpt3-175b-ptd.toml", []),
    "70b-fsdp-1k": ("scenarios/llama3-70b-fsdp-1k-h100.toml", []),
    "405b-straggler": ("405b-straggler", []),
    "405b-straggler-v4": ("405b-straggler-v4", []),
    "405b-1k-192": ("405b-1k", ["training.global_batch=192"]),
    "gpt-1t-384": ("gpt-1t", ["training.global_batch=384"]),
    "mixtral-8x7b": ("scenarios/mixtral-8x7b-ep-h100.toml", []),
    "mixtral-8x7b-tc": ("scenarios/mixtral-8x7b-ep-h100.toml", ["model.moe.routing='token_choice'"]),
    "mixtral-8x7b-tc-1k": ("scenarios/mixtral-8x7b-ep-h100.toml",
                           ["model.moe.routing='token_choice'", "training.global_batch=1024"]),
    **{f"mixtral-e32-ep{ep}": ("scenarios/mixtral-8x7b-ep-h100.toml",  # expert groups of 8 to 32 ranks
                               ["model.moe.routing='token_choice'", "model.moe.experts=32", f"parallel.ep={ep}"])
       for ep in (8, 16, 32)},
    # MoE cases on 128 GPUs (issue 28, i28-moe: est vs measured memory after the memos were bounded)
    **{f"qwen-128gpu-{n}": ("qwen", [f"training.global_batch={n}", "model.layers=32", "cluster.gpus=128",
                                     "parallel.dp=8", "parallel.ep=16"]) for n in (64, 128)},
    "dsv3-128gpu-64": ("dsv3", ["cluster.gpus=128", "parallel.dp=8", "parallel.ep=16", "training.global_batch=64"]),
    "qwen-128": ("qwen", ["training.global_batch=128"]),
    "qwen-256": ("qwen", ["training.global_batch=256"]),
    "dsv3-512": ("dsv3", ["training.global_batch=512"]),
}
LONG = ("qwen-256", "dsv3-512")  # --case only: estimated ~260 s of CPU each (not measured yet)


def load(scenario, overrides: list[str]):
    """A scenario file, or the sections of a bench/step.py case (a dict), with overrides."""
    if isinstance(scenario, str):
        return sim.load_scenario(scenario, overrides)
    from sim.input.load import scenario_from_dict
    return scenario_from_dict(dict(scenario), overrides)


def measure(scenario, overrides: list[str]) -> tuple[float, float, float]:
    """(CPU s, peak RSS bytes, wall s) of load + simulate in a forked child."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            sim.simulate(load(scenario, overrides), force=True)
        except BaseException:  # noqa: BLE001 -- reported as a failed probe
            code = 1
        os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"probe failed: {scenario} {overrides}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024.0, time.perf_counter() - t0


def case_source(name: str):
    """(scenario, overrides) of one of :data:`CASES`."""
    source, overrides = CASES[name]
    if source.startswith("scenarios/"):
        return source, list(overrides)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import step  # bench/step.py: issue 28's cases
    _label, scenario, base, extra = step.CASES[source]
    if extra:  # extra sections (stragglers) as overrides
        base = (*base, *(f"{k}={_toml(v)}" for k, v in extra.items()))
    return scenario, [*base, *overrides]


def _toml(value) -> str:
    """A list of tables as a TOML inline value (``--set`` syntax)."""
    items = ", ".join("{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in row.items()) + "}" for row in value)
    return f"[{items}]"


def cases(names: list[str], out: str | None) -> None:
    """One row per case: estimated vs measured CPU seconds and peak memory."""
    print(f"{'case':<18} {'ranks':>5} {'ops':>11} {'kernels':>11} {'est CPU s':>9} {'CPU s':>7} {'ratio':>6} "
          f"{'est GiB':>7} {'GiB':>6} {'ratio':>6}")
    for name in names:
        scenario, overrides = case_source(name)
        w = work.estimate(load(scenario, overrides))
        cpu, rss, wall = measure(scenario, overrides)
        print(f"{name:<18} {w.ranks:>5,} {w.ops:>11,} {w.expert_kernels:>11,} {w.seconds:>9.1f} {cpu:>7.1f} "
              f"{w.seconds / cpu:>6.2f} {w.bytes / 2**30:>7.2f} {rss / 2**30:>6.2f} {w.bytes / rss:>6.2f}", flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"case": name, "overrides": overrides, "cpu_s": cpu, "rss_bytes": rss,
                                    "wall_s": wall, "est_s": w.seconds, "est_bytes": w.bytes,
                                    **dict(zip(("est_a2a_s", "est_a2a_bytes"), work.alltoall_part(w.alltoalls, w.ranks))),
                                    **{k: getattr(w, k) for k in ("ranks", "ops", "gpus", "fabric_links", "scores",
                                                                  "expert_kernels", "alltoalls")}}) + "\n")


def fit(path: str) -> None:
    """The all-to-all term of sim/work.py from measured rows (``--json``): CPU seconds are
    first scaled by the dense rows' median estimate / measured (the load of the machine
    when they ran: the dense constants stay as calibrated), the dense part of the estimate
    taken off, and what remains per uneven all-to-all fitted as A2A_S x (ranks / A2A_RANKS)
    ^ A2A_EXP (least squares on logarithms); bytes per all-to-all likewise, of peak RSS
    past the estimate's other parts."""
    rows = [json.loads(line) for line in open(path)]
    for r in rows:  # rows measured before the all-to-all term: their counts now, that term then 0
        if "alltoalls" not in r:
            scenario, overrides = case_source(r["case"])
            r.update(alltoalls=work.estimate(load(scenario, overrides)).alltoalls, est_a2a_s=0.0, est_a2a_bytes=0.0)
    dense = [r["est_s"] / r["cpu_s"] for r in rows if not r.get("alltoalls") and r["ops"] >= 100_000]
    scale = float(np.median(dense))
    moe = [r for r in rows if r.get("alltoalls")]
    x = np.log([r["ranks"] / work.A2A_RANKS for r in moe])
    y = [(r["cpu_s"] * scale - r["est_s"] + r["est_a2a_s"]) / r["alltoalls"] for r in moe]
    b = [max(r["rss_bytes"] - r["est_bytes"] + r["est_a2a_bytes"], 1.0) / r["alltoalls"] for r in moe]
    k, a = np.polyfit(x, np.log(y), 1)
    held = np.array(b) > 1.0  # rows whose peak RSS the rest of the estimate already covers say nothing
    kb, ab = np.polyfit(x[held], np.log(np.array(b)[held]), 1)
    print(f"dense rows' estimate / measured CPU: {', '.join(f'{v:.2f}' for v in dense)}; scale {scale:.3f}")
    for r, per, nb in zip(moe, y, b):
        print(f"  {r['case']:<18} {r['ranks']:>4} ranks, {r['alltoalls']:>7,} all-to-alls: {per * 1e6:,.0f} us and "
              f"{nb:,.0f} B each (scaled CPU)")
    print(f"A2A_S {np.exp(a):.3g} s, A2A_EXP {k:.2f}; A2A_BYTES {np.exp(ab):.3g}, A2A_BYTES_EXP {kb:.2f}")
    print(f"sim/work.py now, every row: {'case':<18} {'est CPU s':>9} {'CPU s':>7} {'scaled':>7} {'ratio':>6} "
          f"{'est GiB':>7} {'GiB':>6} {'ratio':>6}")
    for r in rows:
        scenario, overrides = case_source(r["case"])
        w = work.estimate(load(scenario, overrides))
        print(f"{'':<27}{r['case']:<18} {w.seconds:>9.1f} {r['cpu_s']:>7.1f} {r['cpu_s'] * scale:>7.1f} "
              f"{w.seconds / (r['cpu_s'] * scale):>6.2f} {w.bytes / 2**30:>7.2f} {r['rss_bytes'] / 2**30:>6.2f} "
              f"{w.bytes / r['rss_bytes']:>6.2f}")


def main(quick: bool = False) -> None:
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    print(f"interpreter with the package loaded: {base_rss / 2**20:.0f} MiB (sim/work.py BASE_BYTES "
          f"{work.BASE_BYTES / 2**20:.0f} MiB)")
    print(f"{'probe':<16} {'est CPU s':>9} {'CPU s':>7} {'ratio':>6} {'est GiB':>8} {'GiB':>6} {'ratio':>6}  per unit")
    for label, scenario, overrides, unit in PROBES:
        if quick and label in QUICK_SKIPS:
            continue
        w = work.estimate(sim.load_scenario(scenario, overrides))
        cpu, rss, wall = measure(scenario, overrides)
        n = getattr(w, unit)
        print(f"{label:<16} {w.seconds:>9.1f} {cpu:>7.1f} {w.seconds / cpu:>6.2f} {w.bytes / 2**30:>8.2f} "
              f"{rss / 2**30:>6.2f} {w.bytes / rss:>6.2f}  {cpu / n * 1e6:.3g} us and "
              f"{(rss - base_rss) / n:.3g} B per {unit} ({n:,}; wall {wall:.1f} s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the slowest probes")
    parser.add_argument("--cases", action="store_true", help="every whole case: estimate vs measured")
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="one whole case (repeatable)")
    parser.add_argument("--json", help="append each case's row to this file (JSON lines)")
    parser.add_argument("--fit", metavar="FILE", help="fit the all-to-all constants to the rows of FILE")
    args = parser.parse_args()
    if args.fit:
        fit(args.fit)
    elif args.cases or args.case:
        cases(args.case or [c for c in CASES if c not in LONG], args.json)
    else:
        main(args.quick)
