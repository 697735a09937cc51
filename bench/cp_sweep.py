"""torchtitan's long-context CP sweep on 8 H100, published vs simulated (issue 27).

torchtitan docs/performance.md (commit eaea6f6, Table 2) trains Llama 3.1 8B on 8 H100 at
32k, 65k, 131k and 262k tokens with FSDP8 CP1, FSDP4 CP2, FSDP2 CP4 and FSDP1 CP8: every
rank holds 32k tokens. The 262k point is the shipped row ``tt_h100_l8b_cp8_262k``; the others
are in its notes (sim/data/frontier_runs.csv). This script simulates each point with the row's
scenario (only dp, cp, the sequence and the global batch changed) and prints published vs
predicted, plus each point's step ratio to the previous one: with a rank's tokens fixed, every
cost that grows linearly with the ring's steps, the attention blocks or the gathered tokens
gives step(2 cp) / step(cp) <= 2, whatever its size. The published 8B steps grow 1.53x, 2.37x and
1.95x; the same document's 405B CP sweep (Table 6: 76, 47, 31, 16 TPS/GPU, tokens per GPU
fixed likewise) 1.62x, 1.52x and 1.94x.

Run: ``python bench/cp_sweep.py`` (four 8-GPU simulations, a few minutes).
"""

import dataclasses
import re

from sim.studies.frontier import frontier_rows
from sim.studies.rows import read_table
from sim.studies.validation import compare

ROW = "tt_h100_l8b_cp8_262k"
POINT = re.compile(r"FSDP(\d+)CP(\d+)@(\d+)k=([\d,]+)")  # "FSDP4CP2@65k=2,540" in the row's notes


def points(row) -> list[tuple[int, int, int, float]]:
    """(dp, cp, tokens per sequence, published step seconds) of the sweep, the row last; a
    point of the notes steps dp sequences at its tokens/s per GPU."""
    p = row.scenario["parallel"]
    seq, cp = row.scenario["training"]["seq_len"], p["cp"]
    notes = next(r["notes"] for r in read_table("frontier_runs.csv") if r["id"] == ROW)
    found = []
    for d, c, _, tps in POINT.findall(notes):
        tokens = seq * int(c) // cp
        found.append((int(d), int(c), tokens, int(d) * tokens / (float(tps.replace(",", "")) * row.num_gpus)))
    return found + [(p["dp"], cp, seq, row.published_step_s)]


def main() -> None:
    row = next(r for r in frontier_rows() if r.id == ROW)
    print(f"{'layout':>10} {'tokens':>8} {'published s':>12} {'predicted s':>12} {'error':>7} "
          f"{'pub ratio':>9} {'pred ratio':>10}")
    last = None
    for dp, cp, seq, published in points(row):
        sc = {k: dict(v) if isinstance(v, dict) else v for k, v in row.scenario.items()}
        sc["parallel"].update(dp=dp, cp=cp)
        if cp == 1:
            sc["parallel"].pop("cp_impl", None)
        sc["training"].update(seq_len=seq, global_batch=dp)
        c = compare(dataclasses.replace(row, scenario=sc, published_step_s=published))
        ratios = ("", "") if last is None else (f"{published / last[0]:.2f}", f"{c.predicted_step_s / last[1]:.2f}")
        print(f"{f'FSDP{dp}CP{cp}':>10} {seq:>8} {published:>12.3f} {c.predicted_step_s:>12.3f} {c.error:>+7.1%} "
              f"{ratios[0]:>9} {ratios[1]:>10}", flush=True)
        last = (published, c.predicted_step_s)


if __name__ == "__main__":
    main()
