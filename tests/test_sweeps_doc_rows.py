"""docs/sweeps.md's fsdp-crossover table against what the code computes now (issue 31: its
Mixtral row had drifted from the study's output): the Mixtral curve simulated point by point
through the study's own analysis, and the shipped plots/study-fsdp-crossover-summary.csv.

Run: ``python -m pytest tests/test_sweeps_doc_rows.py``
"""

import re
from pathlib import Path

import pandas as pd

from sim import load_scenario, simulate
from sim.studies import fsdp_crossover as fc
from sim.studies.base import scenario_path

ROOT = Path(__file__).resolve().parent.parent


def _doc_row(curve: str) -> tuple[int, int, float]:
    """(seeds' N*, crater, ratio) of a row of the fsdp-crossover table in docs/sweeps.md."""
    text = (ROOT / "docs" / "sweeps.md").read_text()
    m = re.search(rf"^\| {re.escape(curve)} \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|$", text, re.M)
    assert m, f"no row {curve!r} in docs/sweeps.md"
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")), float(m.group(3))


def test_mixtral_row_is_what_the_study_computes():
    label, extra, _ = fc.CURVES[3]
    assert label.startswith("Mixtral")
    rows = []
    for labels, over in fc.points(False):
        if labels["curve"] == label:
            s = load_scenario(str(scenario_path(fc.NAME)), [f"{k}={v}" for k, v in over.items()])
            summary = simulate(s).summary
            rows.append({**labels, **over, "error": None,
                         **{k: v for k, v in summary.items() if not isinstance(v, dict)}})
    _, got = fc.curve_analysis(label, pd.DataFrame(rows), extra)
    n_star, crater, ratio = _doc_row("Mixtral-8x7B, 2M tokens, ring")
    assert (n_star, crater, ratio) == (round(got["n_star_seeds"]), round(got["n_crater_sim"]),
                                       round(got["crater_over_n_star"], 2))
    shipped = pd.read_csv(ROOT / "plots" / "study-fsdp-crossover-summary.csv").set_index("curve").loc[label]
    assert round(shipped["n_star_seeds"]) == n_star and round(shipped["n_crater_sim"]) == crater
