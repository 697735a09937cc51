"""The frontier table (``sim/data/frontier_runs.csv``) as validation rows: torchtitan on
H100/H200/B200/GB200, AMD's published MI325X/MI355X throughputs and NVIDIA's Megatron-Bridge
performance summary on full-power B200/GB200/GB300 (``nb_``; sources in sim/data/README.md).
Run ``clustersim validate --rows tt_,amd_,nb_``.

The columns are the scenario vocabulary (as ``modern_runs.csv``: empty = the key's default)
plus ``topology``; fixed rules fill what the sources state in words, never tuned per row:

- A row that states ``sequence_parallel`` or ``tp_comm_overlap`` keeps it (the ``nb_`` rows: their
  Megatron-Bridge recipes'); otherwise, torchtitan's rule:
  torchtitan applies sequence parallelism to the norms whenever tp > 1
  (torchtitan/models/llama3/infra/parallelize.py: ``SequenceParallel``); rows whose notes
  say AsyncTP overlap the TP collectives with the GEMMs (``tp_comm_overlap``); a row named
  ``_interleaved`` runs interleaved 1F1B with two stages per rank (torchtitan 9dec370
  pipelining_utils.py ``generate_split_points``: ``num_stages_per_rank = 2`` for a
  multi-stage schedule without split points), the others 1F1B.
- torchtitan runs attention through PyTorch's scaled_dot_product_attention, whose flash
  backend is FlashAttention-2 (PyTorch aten/src/ATen/native/transformers/cuda/flash_attn;
  the cuDNN backend is not SDPA's default on these releases): ``attention_backend =
  "flash2"`` on every ``tt_`` row, on the H100 at the rate PyTorch's causal FA2 call was measured
  at (sim/model/attention_rates.py ``ATTENTION_KERNEL``). AMD's Megatron runs keep the default.
- torchtitan's model code is plain PyTorch: a row whose notes say ``+ compile`` (or ``+ torch.compile``) runs
  torch.compile (``compile``), the others run it eagerly, one kernel per elementwise operator
  (``kernels = "pytorch"`` on every ``tt_`` row; sim/model/eager.py ``EAGER_*``). Its
  selective activation checkpointing is per-op (train_configs' ``selective_ac_option =
  'op'``): ``recompute = "op"`` (sim/model/layers.py ``op_recompute``).
- torchtitan's context parallelism is PyTorch's experimental one
  (torch/distributed/tensor/experimental/_attention.py, called from torchtitan 9dec370
  torchtitan/utils.py ``create_context_parallel_ctx``): ``cp_impl = "torch"`` on every
  ``tt_`` row with cp > 1 (sim/parallel/cp_torch.py).
- torchtitan rows in fp8 or mxfp8 quantize with torchao (torchtitan's
  float8 and mxfp8 converters swap the linears for torchao's Float8Linear / MXLinear:
  torchtitan docs/float8.md, docs/mxfp8.md): ``training.fp8_recipe = "torchao"``. AMD's
  Primus runs are Megatron-LM with Transformer Engine, the default recipe.
- Token permutation: AMD's Primus Mixtral runs keep Megatron-Core's default, unfused
  (``parallel.moe_permute_fusion`` false: AMD-AGI/Primus 24a4fdf
  primus/configs/models/megatron/language_model.yaml ``moe_permute_fusion: false``, which
  mixtral_base.yaml and the MI355X mixtral_8x22B_v0.1-BF16-pretrain.yaml leave; its
  ``turbo_sync_free_moe_stage`` stays 0, primus_turbo.yaml, so Primus-Turbo does not switch it
  on). torchtitan does not run Megatron's dispatcher: its own token reordering (compiled on the
  Scout rows) keeps the model's streaming kernels (``moe_permute_fusion`` true on every ``tt_``
  row); Megatron's unfused rate (sim/model/layers.py) was not measured for it.
- A pipelined torchtitan row that leaves the micro-batch out runs torchtitan's default
  number of micro-batches at the commit its table was measured with (docs/performance.md,
  "Versions used for performance testing": torchtitan 9dec370, 2024/12/26), where
  torchtitan/parallelisms/pipelining_utils.py ``build_pipeline_schedule`` sets
  ``n_microbatches = job_config.experimental.pipeline_parallel_degree`` when
  ``pipeline_parallel_microbatches`` is None: pp micro-batches, interleaved or not, so the
  DP rank's sequences / pp per micro-batch (405B: 4 under both schedules; torchtitan later
  changed the default to pp x local stages). Interleaving then shortens the bubble
  (pp - 1 of pp + pp - 1 chunks under 1F1B, (pp - 1) / 2 under two local stages) but not
  the micro-batch.
- A row published only as tokens/s per GPU (the AMD rows: the ROCm performance-results page
  gives micro-batch and sequence but no global batch) is compared as tokens/s. Its global
  batch is assumed from the Primus example configs the runs come from (AMD-AGI/Primus
  examples/megatron/configs/MI325X/llama3.1_8B-FP8-pretrain.yaml and
  mixtral_8x22B_v0.1-BF16-pretrain.yaml: ``global_batch_size: 128`` per 8-GPU node),
  weak-scaled with the nodes as Primus's projection assumes ("constant micro-batch size
  per GPU"): 128 sequences per 8 GPUs, 1024 on 64.
"""

import re

from ..input.choices import AttentionBackend, CpImpl, Precision, Recipe, Recompute, Schedule
from ..input.load import parse_value
from .rows import Row, fill_sections, read_table

COMPILED = re.compile(r"\+ ?(torch\.)?compile")  # "float8 + compile", "+ torch.compile", "FSDP+compile+Float8"
ASSUMED_SEQUENCES_PER_8_GPUS = 128  # Primus example configs: global_batch_size 128 per node


def frontier_rows() -> list[Row]:
    """Rows of ``frontier_runs.csv``."""
    return [_row(r) for r in read_table("frontier_runs.csv")]


def frontier_scenario(row: dict) -> dict:
    """The scenario a frontier row spells out, with the module docstring's rules."""
    gpus = int(row["num_gpus"])
    data = {"name": f"{row['id']} {row['model']}", "model": {"name": row["model"]}, "training": {},
            "parallel": {}, "cluster": {"gpu": row["gpu"], "topology": row["topology"], "gpus": gpus}}
    fill_sections(data, row)
    t, p = data["training"], data["parallel"]
    if "global_batch" not in t:
        t["global_batch"] = ASSUMED_SEQUENCES_PER_8_GPUS * gpus // 8
    if p.get("tp", 1) > 1:  # unless the row states them (the nb_ rows: Megatron-Bridge's recipes)
        p.setdefault("sequence_parallel", True)
        p.setdefault("tp_comm_overlap", "AsyncTP" in row["notes"])
    if row["id"].startswith("tt_"):
        t["attention_backend"] = AttentionBackend.FLASH2
        t["kernels"], t["compile"] = "pytorch", bool(COMPILED.search(row["notes"]))
        if p.get("cp", 1) > 1:  # PyTorch's experimental context parallelism (torchtitan/utils.py)
            p["cp_impl"] = CpImpl.TORCH
        if t.get("recompute") == Recompute.SELECTIVE:  # torchtitan's selective AC: per-op (selective_ac_option "op")
            t["recompute"] = Recompute.OP
        if t.get("precision") in (Precision.FP8, Precision.MXFP8):
            t["fp8_recipe"] = Recipe.TORCHAO
        p["moe_permute_fusion"] = True  # torchtitan's own token reordering, not Megatron's unfused one
    if row["id"].endswith("_interleaved"):
        p["virtual_stages"], p["schedule"] = 2, Schedule.INTERLEAVED
    if p.get("pp", 1) > 1 and "micro_batch" not in t:
        t["micro_batch"] = t["global_batch"] // (p.get("dp", 1) * p["pp"])
    return data


def _row(row: dict) -> Row:
    scenario = frontier_scenario(row)
    t = scenario["training"]
    step = row["published_step_s"].strip()
    if step:
        return Row(row["id"], row["source"], row["model"], row["gpu"], int(row["num_gpus"]),
                   row.get("precision") or "bf16", float(step), scenario)
    per_gpu = float(parse_value(row["published_tokens_per_s_per_gpu"]))
    tokens = t["global_batch"] * t["seq_len"]
    return Row(row["id"], row["source"], row["model"], row["gpu"], int(row["num_gpus"]),
               row.get("precision") or "bf16", tokens / (per_gpu * int(row["num_gpus"])), scenario,
               metric="tokens_per_s_per_gpu", published_value=per_gpu)
