"""The host's Python around each launch inside a training step (sim/model/host.py
``STEP_PYTHON_S``), against the eager 4-layer step measured on an H100 machine
(bench/measured/h100-2026-11-26.json, ``hostbound``: batch 1, 64 to 8,192 tokens)."""

import json
from pathlib import Path

import pytest

from sim.input.load import load_scenario
from sim.model import host
from sim.model.compute import Kernel, elementwise, gemm
from sim.step import simulate

REPO = Path(__file__).resolve().parent.parent
ROWS = json.loads((REPO / "bench/measured/h100-2026-11-26.json").read_text())["hostbound"]["rows"]
STEP = REPO / "examples/calibration/llama3-8b-4layers-h200.toml"


def _issue(seq: int) -> float:
    """Host seconds of the step's one rank at ``seq`` tokens: eager plain-PyTorch kernels, as
    measured, on the H100."""
    s = load_scenario(str(STEP), {"training.seq_len": seq, "training.global_batch": 1, "training.micro_batch": 1,
                                  "cluster.gpu": "h100-sxm", "training.kernels": "pytorch"})
    return sum(op.issue for op in simulate(s, force=True).facts.programs[0].ops)


def test_step_python_is_the_measured_steps_host_time_less_the_isolated_calls(monkeypatch):
    """At the host-bound end (64 tokens) the measured step's host time, less what the model's
    isolated call costs give that step, over the model's launches, is STEP_PYTHON_S (0.05 us:
    its rounding)."""
    measured = next(r for r in ROWS if r["seq"] == 64)["host_issue_s"]
    full = _issue(64)
    monkeypatch.setattr(host, "STEP_PYTHON_S", 0.0)
    isolated = _issue(64)
    monkeypatch.setattr(host, "STEP_PYTHON_S", 1.0)
    launches = _issue(64) - isolated  # one second per launch: the count
    assert launches == pytest.approx(round(launches)) and 300 < launches < 500
    assert (measured - isolated) / launches == pytest.approx(27.9e-6, abs=0.05e-6)
    assert full == pytest.approx(isolated + launches * 27.9e-6, rel=1e-9)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"seq{r['seq']}")
def test_the_measured_steps_host_time_is_reproduced_at_every_length(row):
    """The same step's host time at every measured length within 25% (the measured host time
    falls from 14.6 to 11.9 ms as the GPU work grows; the model's is one figure)."""
    assert _issue(row["seq"]) == pytest.approx(row["host_issue_s"], rel=0.25)


def test_each_launch_and_call_pays_it_once():
    """Closed forms: n launches of a kernel cost n x (isolated call + STEP_PYTHON_S); a c10d
    call its kind's measured cost + STEP_PYTHON_S."""
    mem, g = elementwise(1e6, count=3), gemm(1024, 1024, 1024)
    assert host.issue_s([mem]) == pytest.approx(3 * (host.KERNEL_ISSUE_S + host.STEP_PYTHON_S), rel=1e-12)
    assert host.issue_s([g, g]) == pytest.approx(2 * (host.GEMM_ISSUE_S + host.STEP_PYTHON_S), rel=1e-12)
    assert host.issue_cost(Kernel(1e9, 128, attn=1)) == host.GEMM_ISSUE_S + host.STEP_PYTHON_S
    for op in host.NCCL_CALL_S:
        assert host.collective_issue_s(op) == host.nccl_call_s(op) + host.STEP_PYTHON_S
