"""What ``sim.step.trim_freed_memory`` gives back on the ``405b-1k`` case of bench/step.py
(Llama 3.1 405B on 1,024 H100): the RSS right before and after its call, and the run's peak
RSS, with the trim done (``trim``) or skipped (``skip``), each in a fresh interpreter.

Run: ``python bench/trim_memory.py`` (both, in turn: ``skip trim``; or name them, e.g.
``python bench/trim_memory.py trim skip trim skip``). One JSON line per run.
"""

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from step import LLAMA_405B_1K
import sim, sim.step as step
from sim.input.load import scenario_from_dict

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

seen, real = [], step.trim_freed_memory

def measured():
    before = rss()
    if sys.argv[1] == "trim":
        real()
    seen.append((before, rss()))

step.trim_freed_memory = measured  # (execute() calls it by its module global)
t0 = time.perf_counter()
r = sim.simulate(scenario_from_dict(LLAMA_405B_1K))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"mode": sys.argv[1], "rss_before_GB": seen[0][0] / 1e9, "rss_after_GB": seen[0][1] / 1e9,
                  "peak_rss_GB": peak / 1e9, "wall_s": round(time.perf_counter() - t0, 1),
                  "step_s": r.summary["step_time_s"]}))
"""


def main() -> None:
    bench = str(Path(__file__).resolve().parent)
    for mode in sys.argv[1:] or ["skip", "trim"]:
        if mode not in ("skip", "trim"):
            sys.exit(f"bench/trim_memory.py: mode {mode!r}: 'skip' or 'trim'")
        out = subprocess.run([sys.executable, "-c", CHILD, mode, bench], check=True, capture_output=True, text=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
