"""Fidelity: predicted vs published training throughput (sim/data/published_runs.csv),
each row converted to its own FLOPs convention by ``sim.studies.validation.compare``.

The wall time of a row grows with pipeline stages x micro-batches per step (every stage is
simulated, folded over tp and dp): rows with pp * m <= 1200 take under ~5 s each; the
others (GPT-3 on 384 and 768 GPUs, 530B on 2520) take 6-17 s and are marked ``slow``:
``python -m pytest -m slow tests/test_validation.py``.

Run: ``python -m pytest tests/test_validation.py``
"""

import pytest

from sim.studies import validation

ROWS = validation.load_rows()
FAST_COST = 1200  # pp * micro-batches per step
ROW_ERROR = 0.15  # every row within 15%
MAPE = 0.10  # and 10% on average


def is_fast(row: dict) -> bool:
    micro_batches = int(row["global_batch_seqs"]) // int(row["dp"])
    return int(row["pp"]) * micro_batches <= FAST_COST


def row_id(row: dict) -> str:
    return f"{row['source']}-{row['params']}-{row['num_gpus']}gpus"


_compared: dict = {}


def compared(row: dict) -> validation.Comparison:
    key = row_id(row)
    if key not in _compared:
        _compared[key] = validation.compare(row)
    return _compared[key]


@pytest.mark.parametrize("row", [pytest.param(r, id=row_id(r), marks=() if is_fast(r) else pytest.mark.slow)
                                 for r in ROWS])
def test_each_row_within_15_percent(row):
    c = compared(row)
    assert abs(c.error) <= ROW_ERROR, f"{row_id(row)}: predicted {c.predicted:.1f} vs published {c.published:.1f}"


def test_mape_over_the_fast_rows():
    fast = [compared(r) for r in ROWS if is_fast(r)]
    assert len(fast) >= 6
    assert validation.mape(fast) <= MAPE


@pytest.mark.slow
def test_mape_over_every_row():
    assert validation.mape([compared(r) for r in ROWS]) <= MAPE


def test_both_gpu_generations_are_covered_by_fast_rows():
    assert {r["gpu"] for r in ROWS if is_fast(r)} == {"a100-80gb", "h100-sxm"}
