"""Wall time of a campaign's trials: 1,000 trials of a 54-day Llama 3 405B run on 16,384 H100.

Run: ``python bench/campaign.py``. Target (issue 19): ``--trials 1000`` of a 54-day run in
under a minute. Measures the trials alone (the step time is injected: 9.844 s, what
``clustersim run scenarios/llama3-405b-16k-h100.toml`` simulates) and the whole command
(``clustersim campaign ... --trials 1000``, one step simulation included), best of three.
"""

import subprocess
import sys
import time

from sim import load_scenario
from sim.campaign.build import Options, build
from sim.campaign.trials import run

SCENARIO = "scenarios/llama3-405b-16k-h100.toml"
STEP_S = 9.844
TOKENS = 7.3e12  # ~54 days of wall time at the default settings
TARGET_S = 60.0


def trials_only() -> tuple[float, object, object]:
    c, _ = build(load_scenario(SCENARIO), STEP_S, Options(TOKENS))
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        out = run(c, 1000, seed=0)
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    return best, c, out


def whole_command() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sim", "campaign", SCENARIO, "--tokens", str(TOKENS), "--trials", "1000",
                    "--json"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    wall, c, out = trials_only()
    days = out.wall_s / 86400
    print(f"1,000 trials of a {days.mean():.1f}-day run ({out.interruptions.mean():.0f} interruptions each, "
          f"{out.interruptions.sum():,} in all): {wall:.2f} s (best of 3); target < {TARGET_S:.0f} s: "
          f"{'OK' if wall < TARGET_S else 'MISSED'}")
    cmd = whole_command()
    print(f"clustersim campaign {SCENARIO} --tokens {TOKENS:.3g} --trials 1000 (one 16k-GPU step simulation "
          f"included): {cmd:.1f} s wall; target < {TARGET_S:.0f} s: {'OK' if cmd < TARGET_S else 'MISSED'}")


if __name__ == "__main__":
    main()
