"""What a simulation's cost grows with: wall time, CPU time and peak memory of one step
against micro-batches, chunks (virtual pipeline stages), experts and GPUs, one factor at a
time, each point in its own process (bench/step.py's ``measure``: peak RSS is its own).

Run: ``python bench/scaling.py`` (``--axis NAME``: one axis, repeatable; ``--markdown``:
the rows as docs/scaling.md's table). Each point is kept under a minute on a loaded 2-core
machine. The axes:

- micro-batches: Llama-3-405B's layout (tp 8, pp 16, 1F1B) on 1,024 H100 (dp 8), 16 to 128
  micro-batches per pipeline (``training.global_batch``);
- chunks: the same at 16 micro-batches, 1F1B and interleaved with v = 2, 4 and 7 chunks per
  rank (``parallel.virtual_stages``: 126 layers over 16 x v);
- GPUs: the same at 16 micro-batches, 1,024 to 16,384 H100 (``parallel.dp`` 8 to 128);
- experts: Mixtral 8x7B (scenarios/mixtral-8x7b-ep-h100.toml: tp 2, dp 32, ep 8 on 64 H100)
  with token-choice routing, whose uneven loads make every rank of an expert group
  simulated, 8 to 64 experts (top 2), and the same at 8 experts with 8 to 32 micro-batches.

Printed per point: the work estimate (sim/work.py: ranks simulated, ops, CPU s, GiB) and
the measurement (wall and CPU s, peak RSS, engine events).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step  # noqa: E402 -- bench/step.py: one scenario per process, wall, CPU, peak RSS

import sim  # noqa: E402
from sim import work  # noqa: E402

DENSE = "scenarios/llama3-405b-16k-h100.toml"
MOE = "scenarios/mixtral-8x7b-ep-h100.toml"
ON_1K = ("cluster.nodes=128", "parallel.dp=8")
TOKEN_CHOICE = ("model.moe.routing='token_choice'",)
AXES = {  # axis -> [(value shown, scenario, overrides)]
    "micro-batches": [(m, DENSE, (*ON_1K, f"training.global_batch={8 * m}")) for m in (16, 32, 64, 128)],
    "chunks": [(v, DENSE, (*ON_1K, "training.global_batch=128") + (
        () if v == 1 else ("parallel.schedule='interleaved'", f"parallel.virtual_stages={v}"))) for v in (1, 2, 4, 7)],
    "GPUs": [(g, DENSE, (f"cluster.nodes={g // 8}", f"parallel.dp={g // 128}", f"training.global_batch={g // 8}"))
             for g in (1024, 2048, 4096, 8192, 16384)],
    "experts": [(e, MOE, (*TOKEN_CHOICE, f"model.moe.experts={e}")) for e in (8, 16, 32, 64)],
    "MoE micro-batches": [(m, MOE, (*TOKEN_CHOICE, f"training.global_batch={32 * m}")) for m in (8, 16, 32)],
}


def row(axis: str, value: int, scenario: str, overrides: tuple) -> str:
    """One point: estimated and measured, as a markdown table row."""
    w = work.estimate(sim.load_scenario(scenario, list(overrides)))
    m = step.measure(scenario, *overrides)
    return (f"| {axis} | {value:,} | {m['gpus']:,} | {m['simulated']:,} | {w.ops:,} | {m['events']:,} | "
            f"{m['wall_s']:.2f} | {m['cpu_s']:.2f} | {m['rss_bytes'] / 2**30:.2f} | {w.seconds:.1f} | "
            f"{w.bytes / 2**30:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--axis", choices=sorted(AXES), action="append", help="one axis (repeatable)")
    args = parser.parse_args()
    print(f"load average (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| axis | value | GPUs | ranks simulated | ops (estimated) | events | wall s | CPU s | peak RSS GiB "
          "| estimated CPU s | estimated GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for axis in args.axis or list(AXES):
        for value, scenario, overrides in AXES[axis]:
            print(row(axis, value, scenario, overrides), flush=True)
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
