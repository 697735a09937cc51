"""The frontier table (sim/data/frontier_runs.csv): torchtitan on H100 (500 W Grand Teton),
H200, B200 and GB200, AMD's MI325X / MI355X throughputs. Rows are made into scenarios by the
fixed rules of sim/studies/frontier.py, never per row; rows published as tokens/s per GPU
are compared as tokens/s.

Run: ``python -m pytest tests/test_frontier.py`` (slow rows: ``-m slow``).
"""

import json
import re

import pytest

from conftest import clustersim
from sim.studies import frontier, validation

ROWS = {r.id: r for r in frontier.frontier_rows()}
ROW_ERROR, MAPE = 0.15, 0.08
SLOW = ("tt_h100_l405b", "tt_h100_l70b", "tt_h100_l8b_cp8", "tt_gb200", "nb_gb200_l70b", "nb_gb200_l405b",
        "nb_b200_l405b", "nb_gb300_l405b")  # 10-300 s each
NB = {i: r for i, r in ROWS.items() if i.startswith("nb_")}  # NVIDIA's own published runs on full-power Blackwell


def test_forty_seven_rows_on_nine_gpu_types():
    assert len(ROWS) == 47
    assert {r.gpu for r in ROWS.values()} == {"h100-500w", "h200", "b200-power-limited", "gb200-torchtitan", "mi325x",
                                               "mi355x", "b200", "gb200", "gb300"}


def test_every_shipped_row_id_is_unique_and_every_nb_row_cites_its_commit_and_line():
    ids = [r.id for r in validation.load_rows()]
    assert len(ids) == len(set(ids))
    assert len(NB) == 25 and {r.gpu for r in NB.values()} == {"b200", "gb200", "gb300"}
    notes = {x["id"]: x["notes"] for x in frontier.read_table("frontier_runs.csv")}
    cited = r"(NVIDIA-NeMo/Megatron-Bridge@[0-9a-f]{8} docs/performance-summary|NVIDIA/dgxc-benchmarking@[0-9a-f]{8} \(v25\.05\) llama3\.1/README)\.md.* line \d+"
    for r in NB.values():
        assert re.search(cited, r.source), r.source
        if r.metric == "tokens_per_s_per_gpu":  # Megatron-Bridge's summary
            assert f"{r.published_value:,.0f} tokens/s/GPU" in notes[r.id]
        else:  # dgxc-benchmarking's README: seconds per step
            assert f"{r.published_step_s} s per step" in notes[r.id]
    assert {r.precision for r in NB.values()} == {"bf16", "fp8", "mxfp8", "nvfp4"}


def test_nb_rows_keep_the_settings_their_recipes_state():
    """A row that states sequence parallelism or TP overlap keeps it (NVFP4 on GB200 runs TP 2
    without TP overlap: llama3_llm_pretrain.py sets tp_comm_overlap False for nvfp4); the 8B rows
    run Megatron-Core's full-iteration CUDA graph; TE quantizes every nb_ row."""
    mx, fp4 = NB["nb_gb200_l70b_64g_mxfp8"].scenario, NB["nb_gb200_l70b_64g_nvfp4"].scenario
    assert mx["parallel"]["tp_comm_overlap"] is True and fp4["parallel"]["tp_comm_overlap"] is False
    assert mx["parallel"]["sequence_parallel"] and fp4["parallel"]["virtual_stages"] == 5
    graphs = {i for i, r in NB.items() if r.scenario["training"].get("cuda_graphs")}
    assert graphs == {i for i in NB if "_l8b_" in i}
    assert all("fp8_recipe" not in r.scenario["training"] for r in NB.values())  # the default: Transformer Engine
    fp4 = [r.scenario["parallel"] for i, r in NB.items() if "_l405b_256g_gbs1536_nvfp4" in i]
    assert len(fp4) == 2 and all(p["tp_comm_overlap"] is False for p in fp4)  # llama31_llm_pretrain.py: off for nvfp4
    moe = NB["nb_b200_q30b_8g_mxfp8"].scenario  # qwen3_moe.py + qwen3_llm_pretrain.py's B200 function
    assert moe["parallel"]["moe_grouped_gemm"] is True and moe["parallel"]["moe_permute_fusion"] is True
    assert moe["parallel"]["ep"] == 8 and "ep_dispatcher" not in moe["parallel"]  # alltoall, the default
    assert "routing" not in moe["model"].get("moe", {}) and moe["model"]["moe"]["experts"] == 128  # uniform: forced


def test_nb_405b_chunks_hold_what_megatron_core_splits():
    """Megatron-Bridge's and NeMo's 405B recipes count the embedding and the loss as one layer
    each in the pipeline split (account_for_embedding_in_pipeline_split, ..._loss_...): 128 units
    over pp x vp chunks, the first and last chunk one layer less. Every nb_ 405B row's chunks
    (stage_layers where written, else the simulator's default split) hold exactly that."""
    from sim.parallel.pp import split_layers

    for i, r in NB.items():
        if "_l405b_" not in i:
            continue
        p = r.scenario["parallel"]
        chunks = p["pp"] * p.get("virtual_stages", 1)
        per = 128 // chunks
        want = [per - 1] + [per] * (chunks - 2) + [per - 1]
        assert [len(x) for x in split_layers(126, chunks, p.get("stage_layers"))] == want, i


def test_torchtitan_rules():
    """SDPA's FlashAttention-2, sequence parallelism and AsyncTP with tp, torchtitan's default
    micro-batch count at the table's commit (9dec370: pp micro-batches, interleaved or not)."""
    assert all(r.scenario["training"]["attention_backend"] == "flash2" for i, r in ROWS.items() if i.startswith("tt_"))
    two_d, asynctp = ROWS["tt_h100_l70b_256g_2d"].scenario, ROWS["tt_h100_l70b_256g_2d_asynctp"].scenario
    assert two_d["parallel"]["sequence_parallel"] and not two_d["parallel"]["tp_comm_overlap"]
    assert asynctp["parallel"]["tp_comm_overlap"]
    one, inter = ROWS["tt_h100_l405b_512g_1f1b"].scenario, ROWS["tt_h100_l405b_512g_interleaved"].scenario
    assert one["training"]["micro_batch"] == 256 // (8 * 8) and inter["training"]["micro_batch"] == 256 // (8 * 8)
    assert inter["parallel"]["virtual_stages"] == 2 and inter["parallel"]["schedule"] == "interleaved"


def test_torchtitan_runs_plain_pytorch_compiled_where_its_notes_say():
    """Every tt_ row runs torchtitan's plain-PyTorch model code, compiled where the table says
    torch.compile; its selective checkpointing is per-op."""
    tt = {i: r.scenario["training"] for i, r in ROWS.items() if i.startswith("tt_")}
    assert all(t["kernels"] == "pytorch" for t in tt.values())
    eager = {i for i, t in tt.items() if not t["compile"]}
    assert eager == {"tt_h100_l8b_8g_bf16", "tt_h100_l8b_128g_bf16"}
    per_op = {i for i, t in tt.items() if t.get("recompute") == "op"}
    assert per_op == {i for i in tt if "_l8b_" in i and "cp8" not in i}  # every 8B FSDP row: selective AC
    assert tt["tt_h100_l70b_256g_2d"]["recompute"] == "full" and "recompute" not in tt["tt_gb200_scout_256g_bf16"] \
        or tt["tt_gb200_scout_256g_bf16"]["recompute"] == "none"


def test_tokens_rows_assume_128_sequences_per_node_and_compare_as_tokens():
    row = ROWS["amd_mi325x_l8b_64g_fp8"]
    assert row.metric == "tokens_per_s_per_gpu" and row.published_value == 16186
    assert row.scenario["training"]["global_batch"] == 128 * 64 // 8
    assert row.published_step_s == pytest.approx(1024 * 8192 / (16186 * 64))
    faster = validation.Comparison(row, row.published_step_s / 1.25)  # 25% more tokens/s than published
    assert faster.error == pytest.approx(0.25) and faster.predicted_value == pytest.approx(16186 * 1.25)
    step_row = ROWS["tt_b200_l8b_8g_bf16"]
    assert step_row.metric == "step_s" and validation.Comparison(step_row, 0.986 * 1.1).error == pytest.approx(0.1)


def test_validate_json_rows_carry_their_metric():
    proc = clustersim("validate", "--rows", "amd_mi325x_l8b,tt_b200_l8b_8g_bf16", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in json.loads(proc.stdout)}
    amd, tt = rows["amd_mi325x_l8b_64g_fp8"], rows["tt_b200_l8b_8g_bf16"]
    assert amd["metric"] == "tokens_per_s_per_gpu" and amd["published"] == 16186
    assert amd["predicted"] == pytest.approx(16186 * (1 + amd["error"]))
    assert tt["metric"] == "step_s" and tt["published"] == 0.986


_compared: dict = {}


def compared(row_id: str) -> validation.Comparison:
    if row_id not in _compared:
        _compared[row_id] = validation.compare(ROWS[row_id])
    return _compared[row_id]


# Known gaps, kept visible (strict: the test fails the day it passes). (The 405B interleaved
# row, -16.6% with 16 micro-batches of 2, is within 15% with the 8 micro-batches of 4
# torchtitan 9dec370 ran by default.)
# Megatron-Bridge 25.11's 405B MXFP8 runs on GB200 and GB300: the Grace host (sim.hardware.gpus.
# GRACE_HOST_ISSUE) brought them within 15% only while userbuffers' chunks were charged as eager launches;
# issued as TE issues them (one C++ call a GEMM: sim/parallel/tp_overlap.py), with MXFP8's scale gathers,
# the layers are GPU-bound again and the gap is back (docs/precision.md, "Userbuffers on the host"). With
# Transformer Engine's ring copies and merges of context parallelism (sim/model/cp_merge.py) the GB300's
# layer is bound by its Grace host and the row is within 15% (+12.9%); the GB200's layer stays GPU-bound
# (docs/precision.md, "Context parallelism's copies and merges"). Placed in the launcher's Slurm segments
# of 16 nodes (cluster.segment, sim/data/README.md "slurm_segment"), the GB200 row is +19.2%, the GB300 +14.4%.
_MX405 = "25.11's 405B MXFP8 recipe at TP4 PP8 CP2 on GB200 is 9.8% below the B200's (not a GPU property)"
GAP: dict = {"nb_gb200_l405b_128g_mxfp8": _MX405 + ": +19.2%",
             # an unseen MoE row (issue 29): 9,691 published against 13,193 tokens/s/GPU predicted (20,941
             # before its grouped GEMM's per-expert Python and MXFP8's per-expert quantize launches were
             # charged: docs/moe_costs.md, "A grouped GEMM's experts on the host"). Its GPU runs at 223 TFLOP/s
             # (the table's own figure), a third of the GB200's 600 at MBS 4 with HybridEP; the simulated
             # step is host-bound, the rest of the host's time per layer is not found
             "nb_b200_q30b_8g_mxfp8": "Qwen3-30B-A3B on 8 B200, MXFP8, MBS 1, alltoall: +36.1%"}
# (26.02's 405B NVFP4 on GB200 at PP 16 x VP 8, -18.6% with the B300's NVFP4 share, is within 15% since
# the B200 / GB200 take their own: sim.model.gemm_sources.nvfp4_share_ratio, docs/precision.md "NVFP4 on
# Blackwell and Blackwell Ultra".)


def _marks(row_id: str) -> tuple:
    marks = (pytest.mark.slow,) if row_id.startswith(SLOW) else ()
    return marks + ((pytest.mark.xfail(reason=GAP[row_id], strict=True),) if row_id in GAP else ())


@pytest.mark.parametrize("row_id", [pytest.param(i, marks=_marks(i)) for i in ROWS])
def test_each_frontier_row_within_15_percent(row_id):
    c = compared(row_id)
    assert abs(c.error) <= ROW_ERROR, f"{row_id}: {c.error:+.1%}"


@pytest.mark.slow
def test_mape_over_every_frontier_row():
    assert validation.mape([compared(i) for i in ROWS]) <= MAPE


def test_cp_sweep_reads_torchtitans_table_2():
    """bench/cp_sweep.py's points: the three of the row's notes and the row, 32k tokens a rank,
    each published step dp x tokens / (TPS/GPU x 8) (torchtitan Table 2: 3,890, 2,540, 1,071)."""
    from conftest import bench_module
    sweep = bench_module("cp_sweep")
    got = sweep.points(ROWS["tt_h100_l8b_cp8_262k"])
    assert [(dp, cp, seq) for dp, cp, seq, _ in got] == [(8, 1, 32768), (4, 2, 65536), (2, 4, 131072), (1, 8, 262144)]
    assert [s for *_, s in got] == pytest.approx([8 * 32768 / (3890 * 8), 4 * 65536 / (2540 * 8),
                                                  2 * 131072 / (1071 * 8), 59.796], rel=1e-12)
    assert got[2][3] / got[1][3] > 2  # the step ratio no cost linear in the ring's steps reaches
