"""bench/compare_fingerprints.py: how far two runs' summaries and spans are apart, number by number,
and every discrete change (a string, an integer, a list's length, a key in one run only), through its
command line. Run ``python -m pytest -q tests/test_compare_fingerprints.py``."""

import json
import subprocess
import sys

import numpy as np

from conftest import REPO, bench_module

SCRIPT = str(REPO / "bench" / "compare_fingerprints.py")
SUMMARY = {"step_time_s": 9.057845962637836, "mfu": 0.29, "last_rank": 7, "bottleneck": "pp",
           "comm_bytes_per_gpu": {"dp": 6.7e9, "tp": 9.2e10}, "order": [3, 1, 2], "sim_events": 3584781}


def _dump(folder, summary, starts=None) -> None:
    folder.mkdir()
    (folder / "row.6B-1.json").write_text(json.dumps(summary))  # (a dotted row id, as N21-T1-529.6B-2520)
    if starts is not None:
        np.savez(folder / "row.6B-1.npz", start=np.asarray(starts), rank=np.arange(len(starts)),
                 op=np.array("a1b2c3"))


def _compare(tmp_path, before, after, *args) -> tuple[int, str]:
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path / before), str(tmp_path / after), *args],
                         capture_output=True, text=True)
    return out.returncode, out.stdout


def test_the_largest_relative_change_is_found_and_held_to_the_tolerance(tmp_path):
    moved = {**SUMMARY, "comm_bytes_per_gpu": {"dp": 6.7e9 * (1 + 3e-13), "tp": 9.2e10}, "sim_events": 1787990}
    _dump(tmp_path / "a", SUMMARY, [0.0, 1.0, 2.0])
    _dump(tmp_path / "b", moved, [0.0, 1.0, 2.0 * (1 + 5e-14)])
    rc, out = _compare(tmp_path, "a", "b")
    assert rc == 0 and "largest relative change 3e-13 (/comm_bytes_per_gpu/dp)" in out and "discrete changes: 0" in out
    rc, out = _compare(tmp_path, "a", "b", "--tolerance", "1e-13")
    assert rc == 1


def test_discrete_changes_are_each_named(tmp_path):
    changed = {**SUMMARY, "last_rank": 6, "bottleneck": "dp", "order": [3, 1]}
    del changed["mfu"]
    _dump(tmp_path / "a", SUMMARY, [0.0, 1.0])
    _dump(tmp_path / "b", changed, [0.0, 1.0, 2.0])
    rc, out = _compare(tmp_path, "a", "b")
    assert rc == 1 and "discrete changes: 6" in out
    for line in ("/bottleneck: 'pp' -> 'dp'", "/last_rank: 7 -> 6", "/mfu: only in before", "/order: 3 items -> 2",
                 "spans.start: differs", "spans.rank: differs"):
        assert line in out


def test_relative_change_of_two_numbers():
    relative = bench_module("compare_fingerprints").relative
    assert relative(2.0, 2.0) == 0.0 and relative(0.0, 0.0) == 0.0
    assert relative(1.0, 1.5) == 0.5 / 1.5
    assert relative(float("nan"), float("nan")) == 0.0 and relative(0.0, float("inf")) == float("inf")
