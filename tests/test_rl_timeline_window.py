"""``clustersim rl --timeline t.png --timeline-window START:END`` (issue 31): the RL loop's
timeline zoomed to a part of the run, as ``run`` and ``plan`` zoom a step, read from what the
picture draws in a subprocess: the title names the window and the run it is cut from, every bar
lies inside the window, and the trainer's drawn compute is its training step (``--steps``).
Bad values exit 2 in one line naming the flag.

Run: ``python -m pytest tests/test_rl_timeline_window.py``
"""

import csv
import json
from pathlib import Path
import subprocess
import sys

import pytest

from conftest import REPO, assert_input_error, cli_env, clustersim
from sim.units import format_duration

SCENARIO = ["scenarios/rl-llama3-8b-h100.toml", "--set", "rl.steps=2", "--set", "rl.generator_gpus=8"]
# Runs ``clustersim ARGS`` in a fresh interpreter with the timeline's figure read back before it is
# saved (tests/test_timeline_drawn.py's reader): its title, x label and bars go to a JSON file.
READER = """
import json, sys
sys.path.insert(0, {tests!r})
import matplotlib
matplotlib.use("Agg")
from dataclasses import asdict
from sim.outputs import timeline
from test_timeline_drawn import UNITS, read

real = timeline.timeline_figure

def figure(*a, **k):
    fig = real(*a, **k)
    ax = fig.axes[0]
    lo, hi = (x / UNITS[ax.get_xlabel()] for x in ax.get_xlim())
    drawn = read(ax, hi - lo, timeline.PX_WIDTH)
    with open(sys.argv[1], "w") as f:
        json.dump({{"title": ax.get_title(loc="left"), "xlabel": ax.get_xlabel(), "xlim": [lo, hi],
                   "bars": [asdict(b) for b in drawn.bars]}}, f)
    return fig

timeline.timeline_figure = figure
from sim.cli import main
sys.exit(main(sys.argv[2:]))
"""


def drawn_rl(tmp_path: Path, *flags: str) -> tuple[dict, dict, list[dict]]:
    """(what the picture says, the --json summary, the --steps rows) of one ``clustersim rl``."""
    said, steps = tmp_path / "drawn.json", tmp_path / "steps.csv"
    proc = subprocess.run([sys.executable, "-c", READER.format(tests=str(REPO / "tests")), str(said), "rl",
                           *SCENARIO, "--json", "--timeline", str(tmp_path / "rl.png"), "--steps", str(steps),
                           *flags], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rl.png").read_bytes().startswith(b"\x89PNG")
    with open(steps) as f:
        rows = list(csv.DictReader(f))
    return json.loads(said.read_text()), json.loads(proc.stdout), rows


def test_rl_timeline_window_draws_only_that_part_of_the_run(tmp_path):
    """Window 35-60 s of the 2-step run: the first training step (39.8 s + 12.55 s) lies
    inside it whole, so the trainer's drawn compute is that step's time; nothing is drawn
    outside the window; the title says 'window 35-60 s of the <wall> run'."""
    said, summary, steps = drawn_rl(tmp_path, "--timeline-window", "35s:60s")
    assert said["xlim"] == pytest.approx([35.0, 60.0]) and said["xlabel"] == "time (s)"
    title = " ".join(said["title"].split())
    assert f"window 35-60 s of the {format_duration(summary['wall_s'])} run" in title
    assert all(35.0 - 1e-9 <= b["x0"] <= b["x1"] <= 60.0 + 1e-9 for b in said["bars"])
    first = steps[0]
    start, train = float(first["start_s"]), float(first["train_s"])
    assert 35.0 < start and start + train < 60.0  # (the scenario's first step lies inside the window)
    trainer = [b for b in said["bars"] if b["row"].startswith("rank 0 ") and b["row"].endswith("compute")
               and b["kind"] in ("forward", "backward", "compute")]
    px = 25.0 / 1400  # at most a pixel of the window per block edge
    assert sum((b["x1"] - b["x0"]) * b["fill"] for b in trainer) == pytest.approx(train, abs=3 * px)
    assert min(b["x0"] for b in trainer) == pytest.approx(start, abs=px)


def test_rl_timeline_without_a_window_spans_the_run(tmp_path):
    """The same run without the flag: the axis spans the whole run and the title names no window."""
    said, summary, _ = drawn_rl(tmp_path)
    assert said["xlim"][0] == pytest.approx(0.0) and said["xlim"][1] == pytest.approx(summary["wall_s"])
    assert "window" not in said["title"]


@pytest.mark.parametrize("flags", [("--timeline", "t.png", "--timeline-window", "60:35"),
                                   ("--timeline", "t.png", "--timeline-window", "abc"),
                                   ("--timeline-window", "1:2"),
                                   ("--timeline", "t.png", "--timeline-window", "9999s:")])
def test_bad_rl_timeline_window_exits_2_naming_the_flag(flags, tmp_path):
    """Bad text, no --timeline to window, or a start past the run's end (96 s here): exit 2,
    one line naming --timeline-window; the first three before anything is simulated."""
    flags = tuple(str(tmp_path / f) if f == "t.png" else f for f in flags)
    proc = clustersim("rl", *SCENARIO, *flags)
    assert_input_error(proc, "--timeline-window")
    assert ("run's end" in proc.stderr) == ("9999s:" in flags)
    assert not (tmp_path / "t.png").exists()
