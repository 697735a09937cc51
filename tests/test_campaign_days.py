"""``clustersim campaign --days D`` (issue 31): train for D days of wall time and report the
tokens trained, against a closed form without failures, against the ``--tokens`` run it
inverts, and its bad input.

Run: ``python -m pytest tests/test_campaign_days.py``
"""

import json
import math

import numpy as np
import pytest

from sim.campaign.checkpoint import CheckpointCost
from sim.campaign.failures import SOFTWARE
from sim.campaign.trials import Campaign, run
from sim.cli import main

SMALL = "scenarios/llama3-8b-fsdp-h100.toml"  # 64 GPUs, 8 nodes
DAY = 86400.0


def test_without_failures_the_deadline_keeps_every_step_that_fits():
    """No failures: after the first launch (restart_s) cycles of k steps and a checkpoint
    stall follow each other; by the deadline T the run has floor((T - R) / L) cycles and
    then every whole step of the partial cycle (at most k)."""
    step, k, stall, restart, days = 60.0, 27, 45.0, 300.0, 2.0
    c = Campaign(step_s=step, steps=math.floor(days * DAY / step) + 2, interval=k,
                 ckpt=CheckpointCost(stall, 0.0, 30.0, 60.0), rates=np.array([0.0]), kinds=np.array([SOFTWARE]),
                 detect_s=60.0, restart_s=restart, deadline_s=days * DAY)
    o = run(c, 5, 0)
    cycle = k * step + stall
    avail = days * DAY - restart
    cycles = math.floor(avail / cycle)
    want = cycles * k + min(k, math.floor((avail - cycles * cycle) / step))
    assert o.steps_done.tolist() == [want] * 5 and o.wall_s.tolist() == [days * DAY] * 5


def _campaign(capsys, *args) -> dict:
    assert main(["campaign", SMALL, "--step-time-s", "1.5", "--trials", "40", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_days_inverts_tokens(capsys):
    """The --tokens run's mean days, given back as --days, trains that many tokens on
    average (within 1%); P10 <= P50 <= P90; the days are the deadline."""
    by_tokens = _campaign(capsys, "--tokens", "2e10")
    by_days = _campaign(capsys, "--days", repr(by_tokens["days"]))
    assert by_days["days"] == pytest.approx(by_tokens["days"], rel=1e-12)
    assert by_days["p10"] == by_days["p90"] == pytest.approx(by_tokens["days"], rel=1e-12)
    assert by_days["tokens"] == pytest.approx(2e10, rel=0.01)
    assert by_days["tokens_p10"] <= by_days["tokens_p50"] <= by_days["tokens_p90"]
    assert by_days["ettr"] == pytest.approx(by_tokens["ettr"], abs=0.01)
    assert by_days["interruptions"] > 0  # failures happened, and cost tokens


def test_failures_cost_tokens(capsys):
    """With failures the run trains fewer tokens than its failure-free steps would: tokens =
    ETTR x (days / step) x tokens per step, to the step."""
    s = _campaign(capsys, "--days", "3")
    per_step = s["tokens"] / s["steps"]
    assert s["tokens"] == pytest.approx(s["ettr"] * 3 * DAY / 1.5 * per_step, rel=1e-9)
    assert s["ettr"] < 0.99


@pytest.mark.parametrize("args, key", [(["--days", "0"], "--days"), (["--days", "nan"], "--days"),
                                       (["--days", "1", "--plot-run", "r.png"], "--plot-run")])
def test_bad_days_exit_2_in_one_line(args, key, capsys):
    code = main(["campaign", SMALL, "--step-time-s", "1.5", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and key in err, err
