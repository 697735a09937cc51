"""Predicted vs published training step times (``clustersim validate``).

Two tables ship in ``sim/data`` (sources in sim/data/README.md), both made into scenarios by
fixed rules, never tuned per row:

- ``published_runs.csv`` (Narayanan et al. 2021 on A100; the Megatron-LM README on H100):
  a row gives TFLOP/s per GPU in its own FLOPs convention, converted to a step time with
  step = F / (TFLOP/s * 1e12 * GPUs). Rules for every row: the row's layers, hidden, heads,
  ffn_hidden, vocab; GELU MLP; micro-batch 1. N21 rows (Megatron-LM 2021): full recompute,
  no flash attention, DDP all-reduce. MH rows (Megatron-Core): selective recompute, flash
  attention, sequence parallelism when tp > 1, distributed optimizer (ZeRO-1). Pipelines
  are interleaved where the row says so (N21 Table 1) or for Megatron-Core with pp > 1,
  with v = the smallest divisor > 1 of layers/pp (else plain 1F1B). Id: ``N21-T1-1.7B-32``.
- ``modern_runs.csv`` (NVIDIA DGX Cloud benchmarking recipes, NeMo on DGX H100): written in
  the scenario vocabulary itself, one column per scenario key (empty = the key's default),
  ``published_step_s`` the published seconds per step. Id: the row's ``id``.

Every row runs on the GPU's DGX topology with the row's GPU count.
"""

import csv
from dataclasses import dataclass, field
from pathlib import Path

from ..hardware.gpus import gpu_preset
from ..input.load import parse_value, scenario_from_dict

DATA = Path(__file__).resolve().parents[1] / "data"
TOPOLOGY = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h100"}


@dataclass(frozen=True)
class Row:
    """One published run as a scenario and the step time it measured."""

    id: str
    source: str
    model: str
    gpu: str
    num_gpus: int
    precision: str
    published_step_s: float
    scenario: dict = field(repr=False)

    @property
    def layout(self) -> str:
        """``tp/pp/dp`` (and cp, ep where used) as a short label."""
        p = self.scenario["parallel"]
        text = f"{p.get('tp', 1)}/{p.get('pp', 1)}/{p.get('dp', 1)}"
        extra = [f"{k}{p[k]}" for k in ("cp", "ep") if p.get(k, 1) != 1]
        return text + (" " + " ".join(extra) if extra else "")


def load_rows() -> list[Row]:
    """Every shipped row: the 2021/Megatron-LM table, then the modern NeMo runs."""
    return legacy_rows() + modern_rows()


def _read(name: str) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f))


# --- published_runs.csv ------------------------------------------------------------------------

def legacy_rows() -> list[Row]:
    """Rows of ``published_runs.csv``."""
    return [_legacy(r) for r in _read("published_runs.csv")]


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
                     "sequence_parallel": mcore and tp > 1, "virtual_stages": v,
                     "schedule": "interleaved" if v > 1 else "1f1b"},
    }


def _virtual_stages(layers: int, pp: int, micro: int) -> int:
    per = layers // pp
    divisors = [v for v in range(2, per + 1) if per % v == 0 and layers % pp == 0]
    return divisors[0] if divisors and micro % pp == 0 else 1


# --- modern_runs.csv ---------------------------------------------------------------------------

SECTIONS = {  # column -> (section, scenario key)
    **{k: ("model", k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
                                  "mlp", "attention", "mtp_layers")},
    **{k: ("model.moe", k) for k in ("experts", "top_k", "shared_experts", "dense_layers", "capacity_factor",
                                      "routing")},
    "expert_ffn": ("model.moe", "expert_ffn_hidden"),
    **{k: ("training", k) for k in ("seq_len", "global_batch", "micro_batch", "precision", "recompute",
                                     "flash_attention", "attention_backend")},
    **{k: ("parallel", k) for k in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_stages", "stage_layers",
                                     "zero", "sequence_parallel", "tp_comm_overlap", "ep_comm_overlap")},
}


def modern_rows() -> list[Row]:
    """Rows of ``modern_runs.csv``."""
    return [_modern(r) for r in _read("modern_runs.csv")]


def _cell(text: str):
    """A CSV cell as a scenario value: True/False, numbers, [lists] or a;b;c lists, text."""
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if ";" in text and "=" not in text:
        return [parse_value(x) for x in text.split(";")]
    return parse_value(text)


def modern_scenario(row: dict) -> dict:
    """The scenario a modern_runs.csv row spells out (empty cells keep the key's default)."""
    data = {"name": f"{row['id']} {row['model']}", "model": {"name": row["model"]}, "training": {},
            "parallel": {}, "cluster": {"gpu": row["gpu"], "topology": TOPOLOGY[row["gpu"]],
                                        "gpus": int(row["num_gpus"])}}
    for column, (section, key) in SECTIONS.items():
        if row.get(column, "").strip():
            node = data
            for part in section.split("."):
                node = node.setdefault(part, {})
            node[key] = _cell(row[column])
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
    sim_wall_s: float = 0.0
    failure: str = ""  # why the row could not be expressed or simulated
    result: object = field(default=None, repr=False, compare=False)

    @property
    def error(self) -> float | None:
        """Signed relative error of the predicted step time (None when it did not run)."""
        if self.predicted_step_s is None:
            return None
        return self.predicted_step_s / self.row.published_step_s - 1


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
    result = simulate(scenario, e_max=e_max, force=True)
    return Comparison(row, result.summary["step_time_s"], result.summary["sim_wall_s"],
                      result=result if keep else None)


def mape(comparisons: list[Comparison]) -> float:
    """Mean absolute relative error of the rows that ran."""
    errors = [abs(c.error) for c in comparisons if c.error is not None]
    return sum(errors) / len(errors) if errors else float("nan")
