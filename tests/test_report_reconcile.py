"""``clustersim run --report`` and the summary agree on communication (issue 31): the
report's exposed-communication lines, one per axis on the critical rank, sum to the
summary's ``exposed_comm_s``; the critical path's own communication lines say what else
they count. (The CLI's text is checked against docs/out by tests/test_docs.py.)

Run: ``python -m pytest tests/test_report_reconcile.py``
"""

import re
from pathlib import Path

import pytest

from sim import load_scenario, simulate
from sim.outputs.attribution import exposed_by_axis, report
from sim.outputs.metrics import critical_rank, rank_times

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def interleaved():
    """TP, PP and DP communication, exposed in hundreds of short gaps."""
    return simulate(load_scenario(str(ROOT / "scenarios" / "gpt-1.7b-ptd-interleaved-a100.toml")))


def test_exposed_by_axis_sums_to_each_ranks_exposed_comm(interleaved):
    sp = interleaved.spans
    step = float(sp.end_s.max())
    per_rank = rank_times(sp, step).set_index("rank")
    for rank in interleaved.facts.simulated_ranks:
        parts = exposed_by_axis(sp, rank)
        assert set(parts) <= {"tp", "pp", "dp", "cp", "ep"} and min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(per_rank.exposed_comm_s[rank], rel=1e-9, abs=1e-15)
    crit = int(critical_rank(per_rank.reset_index())["rank"])
    assert sum(exposed_by_axis(sp, crit).values()) == pytest.approx(interleaved.summary["exposed_comm_s"], rel=1e-9)
    assert sum(v > 0 for v in exposed_by_axis(sp, crit).values()) >= 2  # more than one axis to reconcile


def test_overlapping_axes_share_the_time_they_are_both_exposed():
    """Closed form: dp in flight over [0, 4], tp over [2, 6], compute over [5, 8]: exposed
    [0, 5]; [2, 4] has both in flight, so dp = 2 + 1, tp = 1 + 1 (sum 5 = the union)."""
    import pandas as pd

    sp = pd.DataFrame({"rank": [0, 0, 0], "category": ["dp", "tp", "compute"],
                       "start_s": [0.0, 2.0, 5.0], "end_s": [4.0, 6.0, 8.0]})
    assert exposed_by_axis(sp, 0) == {"dp": pytest.approx(3.0), "tp": pytest.approx(2.0)}


def test_report_lines_sum_to_the_summarys_exposed_comm(interleaved):
    text = report(interleaved)
    head, _, rest = text.partition("exposed communication on rank ")
    block = rest.split("\n")
    total = float(re.search(r"the summary's ([\d.]+) ms", block[0]).group(1))
    lines = [ln for ln in block[1:] if re.match(r"  \w+: [\d.]+ ms$", ln)]
    parts = [float(re.search(r"([\d.]+) ms", ln).group(1)) for ln in lines]
    assert total == pytest.approx(interleaved.summary["exposed_comm_s"] * 1e3, abs=0.005)
    assert len(parts) >= 2 and abs(sum(parts) - total) <= 0.005 * len(parts) + 1e-9
    assert "waits included" in head  # the path's own comm lines say why they differ
