"""Wall time and peak memory of simulating one training step at scale.

Run: ``python bench/step.py`` (add ``--quick`` to skip the 16k scaling sweep). Each case
runs in its own subprocess so its peak RSS is its own. Prints figures and targets:
- Llama-3-70B FSDP on 1,024 H100 (seq 8192, 1 sequence per GPU): < 5 s, < 2 GB (issue 3)
- Llama-3-405B on 16,384 H100 (TP 8, PP 16, DP 128, seq 8192, 16M-token batch, 1F1B):
  < 60 s, < 4 GB (issue 4), and how wall time grows from 1k to 16k GPUs (log-log slope).
"""

import json
import math
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import sim
s = sim.load_scenario(sys.argv[1], sys.argv[2:])
r = sim.simulate(s)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "rss_bytes": rss, "events": r.summary["sim_events"],
                  "engine_s": r.summary["sim_wall_s"], "step_s": r.summary["step_time_s"],
                  "mfu": r.summary["mfu"], "gpus": r.summary["num_gpus"]}))
"""


def measure(scenario: str, *overrides: str) -> dict:
    """Load + simulate in a fresh interpreter; wall seconds and peak RSS."""
    out = subprocess.run([sys.executable, "-c", CHILD, scenario, *overrides], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(label: str, m: dict, wall_target: float, rss_target: float) -> None:
    ok = m["wall_s"] < wall_target and m["rss_bytes"] < rss_target
    print(f"{label}: {m['wall_s']:.2f} s wall (engine {m['engine_s']:.2f} s, {m['events']:,} events), "
          f"peak RSS {m['rss_bytes'] / 2**30:.2f} GiB; targets < {wall_target:.0f} s, "
          f"< {rss_target / 2**30:.0f} GiB: {'OK' if ok else 'MISSED'}; simulated step {m['step_s']:.3f} s, "
          f"MFU {m['mfu']:.1%}")


def scaling() -> None:
    """Llama-3-405B layout from 1k to 16k GPUs (16 micro-batches per pipeline throughout)."""
    rows = []
    for gpus in (1024, 2048, 4096, 8192, 16384):
        dp = gpus // 128
        m = measure("scenarios/llama3-405b-16k-h100.toml", f"cluster.nodes={gpus // 8}",
                    f"parallel.dp={dp}", f"training.global_batch={16 * dp}")
        rows.append((gpus, m["wall_s"]))
        print(f"  {gpus:>6} GPUs: {m['wall_s']:.2f} s wall, peak RSS {m['rss_bytes'] / 2**30:.2f} GiB")
    slope = (math.log(rows[-1][1]) - math.log(rows[0][1])) / (math.log(rows[-1][0]) - math.log(rows[0][0]))
    print(f"  log-log slope of wall time vs GPUs, 1k -> 16k: {slope:.2f} "
          f"(1.0 = linear in GPUs; the rest is topology build and sibling traffic)")


def main() -> None:
    show("Llama-3-70B FSDP, 1,024 H100", measure("scenarios/llama3-70b-fsdp-1k-h100.toml"), 5, 2 * 2**30)
    show("Llama-3-405B 4D, 16,384 H100", measure("scenarios/llama3-405b-16k-h100.toml"), 60, 4 * 2**30)
    if "--quick" not in sys.argv:
        print("Llama-3-405B layout, wall time vs GPU count:")
        scaling()


if __name__ == "__main__":
    main()
