"""A published run as a table row in the scenario vocabulary (CONTRACT.md's keys as columns):
the row model the validation tables (:mod:`.validation`) and the frontier table
(:mod:`.frontier`) share, and how a row's cells become a scenario's sections.
"""

import csv
from dataclasses import dataclass, field
from pathlib import Path

from ..input.load import parse_value

DATA = Path(__file__).resolve().parents[1] / "data"


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
    metric: str = "step_s"  # what the source published: "step_s" | "tokens_per_s_per_gpu" (compared as such)
    published_value: float | None = None  # the published figure in its metric (None: published_step_s)

    @property
    def layout(self) -> str:
        """``tp/pp/dp`` (and cp, ep where used) as a short label."""
        p = self.scenario["parallel"]
        text = f"{p.get('tp', 1)}/{p.get('pp', 1)}/{p.get('dp', 1)}"
        extra = [f"{k}{p[k]}" for k in ("cp", "ep") if p.get(k, 1) != 1]
        return text + (" " + " ".join(extra) if extra else "")


def read_table(name: str) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(f, restval=""))  # rows older than a column leave it empty


SECTIONS = {  # column -> (section, scenario key)
    **{k: ("model", k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
                                  "mlp", "attention", "mtp_layers", "tied_embeddings")},
    **{k: ("model.moe", k) for k in ("experts", "top_k", "shared_experts", "dense_layers", "capacity_factor",
                                      "routing", "router_kernels")},
    "expert_ffn": ("model.moe", "expert_ffn_hidden"),
    **{k: ("training", k) for k in ("seq_len", "global_batch", "micro_batch", "precision", "recompute",
                                     "flash_attention", "attention_backend", "rope_fusion", "cuda_graphs",
                                     "fp8_params")},
    **{k: ("parallel", k) for k in ("tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_stages", "stage_layers",
                                     "zero", "sequence_parallel", "tp_comm_overlap", "ep_comm_overlap",
                                     "overlap_grad_reduce", "overlap_param_gather", "ddp_bucket_mb",
                                     "reshard_after_forward", "dp_shard", "moe_permute_fusion", "moe_grouped_gemm",
                                     "grad_reduce_in_fp32", "ep_dispatcher", "cp_impl",
                                     "tp_overlap_fp8_rs", "defer_embedding_wgrad_compute", "wgrad_deferral_limit",
                                     "mla_down_proj")},
    "topology": ("cluster", "topology"),  # empty: the GPU's DGX preset (sim/studies/validation.py)
    "slurm_segment": ("cluster", "segment"),  # sbatch --segment of the launcher (sim/data/README.md); empty: packed
}


def cell(text: str):
    """A CSV cell as a scenario value: True/False, numbers, [lists] or a;b;c lists, text."""
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if ";" in text and "=" not in text:
        return [parse_value(x) for x in text.split(";")]
    return parse_value(text)


def fill_sections(data: dict, row: dict) -> None:
    """Every non-empty cell of a table row written in the scenario vocabulary (:data:`SECTIONS`)
    into its section of ``data``."""
    for column, (section, key) in SECTIONS.items():
        if row.get(column, "").strip():
            node = data
            for part in section.split("."):
                node = node.setdefault(part, {})
            node[key] = cell(row[column])
