"""A layout that does not fit names the single knobs that would (sim/outputs/fit_hints.py), and
each suggestion, run, fits with the memory the hint quoted. Through the CLI."""

import re

from conftest import clustersim

BASE = ("run", "scenarios/straggler-dp.toml", "--set", "model.preset=llama3.1-8b")


def test_does_not_fit_suggests_knobs_that_do():
    proc = clustersim(*BASE)
    assert proc.returncode == 0, proc.stderr
    assert "DOES NOT FIT" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("to fit"))
    hints = re.findall(r"((?:--set \S+ ?)+)\(([\d.]+ GiB)\)", line)
    assert [h[0].split()[1] for h in hints][:3] == ["parallel.zero=1", "parallel.zero=2", "parallel.zero=3"]
    sets, memory = hints[0][0].split(), hints[0][1]
    fixed = clustersim(*BASE, *sets)
    assert fixed.returncode == 0, fixed.stderr
    row = next(x for x in fixed.stdout.splitlines() if x.startswith("memory per GPU"))
    assert row.split()[3] + " GiB" == memory and "DOES NOT FIT" not in row and "to fit" not in fixed.stdout
