"""Calibrate sim/work.py: the work estimate against measured runs, one probe per cost.

Run: ``python bench/work.py`` (``--quick`` skips the two slowest probes). Each probe is
simulated with ``force=True`` in a forked child; its CPU seconds and peak RSS come from
``os.wait4`` (the child's own). Printed per probe: the estimate (CPU s, GiB), the
measurement, their ratio, and the per-unit figure the probe isolates (s and bytes per
op, per GPU, per fabric link, per router score, per expert kernel), which are what the
constants at the top of sim/work.py are rounded up from. CPU, not wall, time: on a
shared machine wall time measures the neighbours.
"""

import os
import resource
import sys
import time

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


def measure(scenario: str, overrides: list[str]) -> tuple[float, float, float]:
    """(CPU s, peak RSS bytes, wall s) of load + simulate in a forked child."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            sim.simulate(sim.load_scenario(scenario, overrides), force=True)
        except BaseException:  # noqa: BLE001 -- reported as a failed probe
            code = 1
        os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"probe failed: {scenario} {overrides}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024.0, time.perf_counter() - t0


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
    main("--quick" in sys.argv)
