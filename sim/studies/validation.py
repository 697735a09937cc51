"""Predicted vs published training throughput (``clustersim validate``).

Every row of ``sim/data/published_runs.csv`` becomes a scenario by the same rules (no
per-row tuning), is simulated, and its step time is converted to the row's own FLOPs
convention so predicted and published figures compare like for like.

Rules, applied to every row alike:
- model: the row's layers, hidden, heads, ffn_hidden, vocab; GELU MLP; no GQA.
- micro-batch 1. N21 rows (2021 Megatron-LM): full recompute, no flash attention, DDP
  gradient all-reduce (no distributed optimizer yet). MH rows (Megatron-Core): selective
  recompute, flash attention, sequence parallelism when tp > 1, distributed optimizer (ZeRO-1).
- pipeline: interleaved when the row says so (N21 Table 1) or for Megatron-Core with pp > 1,
  with v = the smallest divisor > 1 of layers/pp (else plain 1F1B).
- cluster: dgx-a100 or dgx-h100 topology with the row's GPU count.
"""

import csv
from dataclasses import dataclass
from pathlib import Path

from ..hardware.gpus import gpu_preset
from ..input.load import scenario_from_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"
TOPOLOGY = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100"}


def load_rows(path: Path = DATA) -> list[dict]:
    """Rows of the published-runs table."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def step_flops(row: dict) -> float:
    """FLOPs per step in the row's convention (see sim/data/README.md)."""
    B, s, l, h, V = (float(row[k]) for k in ("global_batch_seqs", "seq_len", "layers", "hidden", "vocab"))
    if row["flops_convention"] == "n21_eq3_with_recompute":
        return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))


def published_tflops(row: dict) -> float:
    """The row's TFLOP/s per GPU (mfu rows: mfu * peak)."""
    value = float(row["value"])
    return value * gpu_preset(row["gpu"]).peak_flops / 1e12 if row["metric"] == "mfu" else value


def scenario_dict(row: dict) -> dict:
    """The scenario the rules above make of a row."""
    mcore = row["source"] == "MH"
    layers, pp, tp = int(row["layers"]), int(row["pp"]), int(row["tp"])
    micro = int(row["global_batch_seqs"]) // int(row["dp"])
    v = _virtual_stages(layers, pp, micro) if (mcore or "interleaved" in row["notes"]) and pp > 1 else 1
    return {
        "name": f"{row['source']} {row['model']} {row['params']} on {row['num_gpus']}",
        "model": {"name": row["model"], "layers": layers, "hidden": int(row["hidden"]), "heads": int(row["heads"]),
                  "ffn_hidden": int(row["ffn_hidden"]), "vocab": int(row["vocab"])},
        "training": {"seq_len": int(row["seq_len"]), "global_batch": int(row["global_batch_seqs"]),
                     "micro_batch": 1, "recompute": "selective" if mcore else "full",
                     "flash_attention": mcore},
        "cluster": {"gpu": row["gpu"], "topology": TOPOLOGY[row["gpu"]], "gpus": int(row["num_gpus"])},
        "parallel": {"tp": tp, "pp": pp, "dp": int(row["dp"]), "zero": 1 if mcore else 0,
                     "sequence_parallel": mcore and tp > 1, "virtual_stages": v,
                     "schedule": "interleaved" if v > 1 else "1f1b"},
    }


def _virtual_stages(layers: int, pp: int, micro: int) -> int:
    per = layers // pp
    divisors = [v for v in range(2, per + 1) if per % v == 0 and layers % pp == 0]
    return divisors[0] if divisors and micro % pp == 0 else 1


@dataclass(frozen=True)
class Comparison:
    """One row: published vs predicted TFLOP/s per GPU in the row's convention."""

    row: dict
    published: float
    predicted: float
    sim_wall_s: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return self.predicted / self.published - 1


def compare(row: dict, e_max: float | None = None) -> Comparison:
    """Simulate one row."""
    from ..step import simulate

    scenario = scenario_from_dict(scenario_dict(row))
    result = simulate(scenario, e_max=e_max)
    step = result.summary["step_time_s"]
    predicted = step_flops(row) / (step * int(row["num_gpus"])) / 1e12
    return Comparison(row, published_tflops(row), predicted, result.summary["sim_wall_s"])


def mape(comparisons: list[Comparison]) -> float:
    """Mean absolute percentage error."""
    return sum(abs(c.error) for c in comparisons) / len(comparisons)
