"""Predicted vs published training step times (``clustersim validate``).

Two tables ship in ``sim/data`` (sources in sim/data/README.md), both made into scenarios by
fixed rules, never tuned per row:

- ``published_runs.csv`` (Narayanan et al. 2021 on A100; the Megatron-LM README on H100):
  a row gives TFLOP/s per GPU in its own FLOPs convention, converted to a step time with
  step = F / (TFLOP/s * 1e12 * GPUs). Rules for every row: the row's layers, hidden, heads,
  ffn_hidden, vocab; GELU MLP; micro-batch 1. N21 rows (Megatron-LM 2021): full recompute,
  no flash attention, DDP all-reduce after the whole backward (``overlap_grad_reduce =
  false``: Megatron-LM v2's default ``--DDP-impl local`` all-reduced the gradients in
  ``train_step`` once ``forward_backward_func`` had returned, NVIDIA/Megatron-LM fda81a2 (May
  2021) megatron/training.py, arguments.py ``--DDP-impl`` default "local"; bucketed overlap came with
  Megatron-Core's DistributedDataParallel). MH rows (Megatron-Core): selective recompute, flash
  attention, sequence parallelism when tp > 1, distributed optimizer (ZeRO-1). Pipelines
  are interleaved where the row says so (N21 Table 1) or for Megatron-Core with pp > 1,
  with v = the smallest divisor > 1 of layers/pp (else plain 1F1B). Id: ``N21-T1-1.7B-32``.
- ``modern_runs.csv`` (NVIDIA DGX Cloud benchmarking recipes, NeMo on DGX H100): written in
  the scenario vocabulary itself, one column per scenario key (empty = the key's default),
  ``published_step_s`` the published seconds per step. Id: the row's ``id``. Its last rows hold
  a fixed global batch while the GPUs grow (MegaScale's Megatron-LM baseline, Llama 3 405B:
  docs/strong_scaling.md); a column older rows lack reads as empty.
- ``frontier_runs.csv`` (torchtitan on H100/H200/B200/GB200, AMD Instinct MI325X/MI355X):
  the same vocabulary plus ``topology``; rows published only as tokens/s per GPU are
  compared as tokens/s (:mod:`.frontier` states the batch assumed and its other rules).

The first two tables run on the GPU's DGX topology with the row's GPU count (a
modern_runs.csv row may name another preset in its ``topology`` column: MegaScale's fabric).
"""

import math
import time
from dataclasses import dataclass, field

from ..hardware.gpus import gpu_preset
from ..input.load import parse_value, scenario_from_dict
from .frontier import frontier_rows
from .rows import Row, fill_sections, read_table

TOPOLOGY = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h100"}


def load_rows() -> list[Row]:
    """Every shipped row: the 2021/Megatron-LM table, the modern NeMo runs, then the
    frontier runs (torchtitan, AMD Instinct: sim/studies/frontier.py)."""
    return legacy_rows() + modern_rows() + frontier_rows()


# --- published_runs.csv ------------------------------------------------------------------------

def legacy_rows() -> list[Row]:
    """Rows of ``published_runs.csv``."""
    return [_legacy(r) for r in read_table("published_runs.csv")]


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


def _legacy(row: dict) -> Row:
    gpus = int(row["num_gpus"])
    step = step_flops(row) / (published_tflops(row) * 1e12 * gpus)
    return Row(f"{row['source']}-{row['params']}-{gpus}", row["source"], f"{row['model']} {row['params']}",
               row["gpu"], gpus, "bf16", step, legacy_scenario(row))


def legacy_scenario(row: dict) -> dict:
    """The scenario the rules of the module docstring make of a published_runs.csv row."""
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
                     **({} if mcore else {"overlap_grad_reduce": False}),
                     "sequence_parallel": mcore and tp > 1, "virtual_stages": v,
                     "schedule": "interleaved" if v > 1 else "1f1b"},
    }


def _virtual_stages(layers: int, pp: int, micro: int) -> int:
    per = layers // pp
    divisors = [v for v in range(2, per + 1) if per % v == 0 and layers % pp == 0]
    return divisors[0] if divisors and micro % pp == 0 else 1


# --- modern_runs.csv ---------------------------------------------------------------------------

def modern_rows() -> list[Row]:
    """Rows of ``modern_runs.csv``."""
    return [_modern(r) for r in read_table("modern_runs.csv")]


def modern_scenario(row: dict) -> dict:
    """The scenario a modern_runs.csv row spells out (empty cells keep the key's default)."""
    data = {"name": f"{row['id']} {row['model']}", "model": {"name": row["model"]}, "training": {},
            "parallel": {}, "cluster": {"gpu": row["gpu"], "topology": TOPOLOGY[row["gpu"]],
                                        "gpus": int(row["num_gpus"])}}
    fill_sections(data, row)
    for pair in filter(None, row.get("mla", "").split(";")):  # MLA ranks, Hugging Face names
        key, _, value = pair.partition("=")
        data["model"][key.strip()] = parse_value(value.strip())
    return data


def _modern(row: dict) -> Row:
    return Row(row["id"], row["source"], row["model"], row["gpu"], int(row["num_gpus"]),
               row.get("precision") or "bf16", float(row["published_step_s"]), modern_scenario(row))


# --- comparing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """One row simulated: published vs predicted step time, or why it could not run."""

    row: Row
    predicted_step_s: float | None
    sim_wall_s: float = 0.0  # wall seconds simulate() took (building the programs, the engine, outputs)
    failure: str = ""  # why the row could not be expressed or simulated
    result: object = field(default=None, repr=False, compare=False)

    @property
    def error(self) -> float | None:
        """Signed relative error in the row's published metric: of the predicted step time, or
        of the predicted tokens/s per GPU for a row published as tokens/s (None when it did
        not run)."""
        if self.predicted_step_s is None:
            return None
        if self.row.metric == "tokens_per_s_per_gpu":
            return self.row.published_step_s / self.predicted_step_s - 1
        return self.predicted_step_s / self.row.published_step_s - 1

    @property
    def predicted_value(self) -> float | None:
        """The prediction in the row's metric (seconds per step, or tokens/s per GPU)."""
        if self.predicted_step_s is None or self.row.metric == "step_s":
            return self.predicted_step_s
        return self.row.published_value * self.row.published_step_s / self.predicted_step_s


def compare(row: Row, e_max: float | None = None, keep: bool = False, calibration: str | None = None) -> Comparison:
    """Simulate one row (``keep``: hold on to the Result, for --explain; ``calibration``: a
    profile's path, as ``cluster.calibration``)."""
    from ..errors import InputError
    from ..step import simulate

    try:
        scenario = scenario_from_dict(row.scenario, {"cluster.calibration": calibration} if calibration else None)
    except InputError as exc:
        return Comparison(row, None, failure=str(exc))
    # the shipped rows are trusted data, run past the interactive work budget: the largest,
    # N21-T1-529.6B-2520, simulates 315 ranks exactly (dp replicas see different SU
    # boundaries) in ~220 s and 5 GB
    t0 = time.perf_counter()
    result = simulate(scenario, e_max=e_max, force=True)
    return Comparison(row, result.summary["step_time_s"], time.perf_counter() - t0,
                      result=result if keep else None)


def mape(comparisons: list[Comparison]) -> float:
    """Mean absolute relative error of the rows that ran."""
    errors = [abs(c.error) for c in comparisons if c.error is not None]
    return sum(errors) / len(errors) if errors else float("nan")


def golden_section(f, lo: float, hi: float, tol: float, relative: bool = False) -> float:
    """The minimum of a unimodal ``f`` on [lo, hi] by golden-section search, to within ``tol``
    (``relative``: of the bracket's mean, ``tol * (lo + hi)``); what ``validate --fit`` and
    ``calibrate`` fit a sustained factor with."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > (tol * (lo + hi) if relative else tol):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2
