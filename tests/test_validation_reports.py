"""The two reports of ``clustersim validate`` (issue 27): the scale trend's slope against its
closed form, the ranking groups and series of the shipped tables against what their columns
say, the ranking miss and Spearman's rho in closed form, the plot read back from its Axes,
and the command line through a subprocess (one real run of three 8-GPU rows; the rest reads
predictions from a file, so the whole file takes seconds).

Run: ``python -m pytest tests/test_validation_reports.py``
"""

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from sim.studies import validation  # noqa: E402
from sim.studies import validation_reports as vr  # noqa: E402
from sim.studies.rows import Row  # noqa: E402
from sim.studies.validation_plot import OVERALL, draw  # noqa: E402

from conftest import clustersim  # noqa: E402
from forked_cli import run_cli  # noqa: E402

ROWS = validation.load_rows()


def synthetic(rid: str, gpus: int, layers: int = 32, precision: str = "bf16", published: float = 1.0) -> Row:
    """A row of a model with ``layers`` layers, weak-scaled: 2 sequences per GPU."""
    scenario = {"name": rid, "model": {"layers": layers, "hidden": 4096},
                "training": {"seq_len": 8192, "global_batch": 2 * gpus, "precision": precision},
                "cluster": {"gpu": "h100-sxm", "gpus": gpus}, "parallel": {"tp": 1, "dp": gpus}}
    return Row(rid, "test", f"m{layers}", "h100-sxm", gpus, precision, published, scenario)


# --- scale trend ---------------------------------------------------------------------------------

def test_slope_of_known_errors_is_the_closed_form():
    # x = log2 GPUs = 3, 6, 9 with errors 1, -2, -8 points: slope = Sxy/Sxx = -27/18 = -1.5,
    # intercept 6, residuals -0.5, 1, -0.5: SSR 1.5, stderr = sqrt(1.5 / (3 - 2) / 18) = sqrt(1/12)
    rows = [synthetic("a", 8), synthetic("b", 64), synthetic("c", 512)]
    trend = vr.scale_trend([(r, 1 + e / 100) for r, e in zip(rows, (1, -2, -8))])
    assert trend.fit.slope == pytest.approx(-1.5, rel=1e-12)
    assert trend.fit.intercept == pytest.approx(6.0, rel=1e-12)
    assert trend.fit.stderr == pytest.approx(math.sqrt(1 / 12), rel=1e-12)
    assert trend.fit.n == 3
    assert [s.fit.slope for s in trend.series] == [pytest.approx(-1.5, rel=1e-12)]


def test_a_series_is_one_model_and_layout_scaled_out():
    rows = [synthetic("a", 8), synthetic("b", 64), synthetic("other-model", 64, layers=80),
            synthetic("fp8", 8, precision="fp8")]
    trend = vr.scale_trend([(r, 1.1) for r in rows])
    assert [[p.id for p in s.points] for s in trend.series] == [["a", "b"]]
    assert trend.series[0].fit.stderr is None and trend.fit.n == 4  # two points: no residual left
    assert trend.fit.slope == pytest.approx(0.0, abs=1e-12)  # every row +10%


def test_within_series_slope_is_the_fixed_effects_closed_form():
    # series A at 8, 16 GPUs (x 3, 4) with errors 0, -2; series B at 32, 128 (x 5, 7) with 1, 1.
    # Less their means: A (-0.5, 1), (0.5, -1); B (-1, 0), (1, 0): slope -1 / 2.5 = -0.4;
    # residuals 0.8, -0.8, 0.4, -0.4: SSR 1.6 over 4 - 2 - 1 = 1 dof: stderr sqrt(1.6 / 2.5) = 0.8
    rows = [synthetic("a8", 8), synthetic("a16", 16), synthetic("b32", 32, layers=80), synthetic("b128", 128, layers=80)]
    trend = vr.scale_trend([(r, 1 + e / 100) for r, e in zip(rows, (0, -2, 1, 1))])
    assert [s.fit.slope for s in trend.series] == [pytest.approx(-2.0), pytest.approx(0.0, abs=1e-12)]
    assert trend.within.slope == pytest.approx(-0.4, rel=1e-12)
    assert trend.within.stderr == pytest.approx(0.8, rel=1e-12) and trend.within.n == 4


def test_step_error_of_a_tokens_row_is_of_its_step_time():
    row = next(r for r in ROWS if r.metric == "tokens_per_s_per_gpu")
    c = validation.Comparison(row, row.published_step_s * 1.25)
    assert vr.step_error(row, c.predicted_step_s) == pytest.approx(0.25)
    assert c.error == pytest.approx(1 / 1.25 - 1)  # the table's error stays in tokens/s


def test_least_squares_needs_two_gpu_counts():
    assert vr.least_squares([3.0, 3.0], [1.0, 2.0]) is None


# --- layout ranking ------------------------------------------------------------------------------

SHIPPED_GROUPS = [  # same model, GPU, sequence length and sequences per GPU, read off the tables
    ["dg-l70-64", "dg-l70-2048", "dg-l70-fp8-64"],  # 128/64 = 4096/2048 = 2 per GPU
    ["dg-l405-512", "dg-l405-2048", "dg-l405-fp8-1024"],  # 1/2 per GPU
    ["dg-g175-128", "dg-g175-2048"],
    ["dg-n340-256", "dg-n340-2048"],
    ["dg-grok-512", "dg-grok-2048", "dg-grok-fp8-2048"],
    ["ms-g175-768", "ms-g175-6144"],  # MegaScale: 768/768 = 6144/6144 = 1 sequence per GPU
    ["ms-g175-1024", "ms-g175-8192"],  # 768/1024 = 6144/8192 = 3/4
    ["mz-q235-tp2pp8ep32", "mz-q235-tp2pp8ep32-ovl", "mz-q235-fsdp-ep8", "mz-q235-tp2pp32ep8",
     "mz-q235-tp4pp8ep8"],  # Qwen3-235B-A22B: five layouts on 256 H100, 8 sequences per GPU
    ["tt_h100_l8b_8g_bf16", "tt_h100_l8b_8g_compile_bf16", "tt_h100_l8b_8g_compile_fp8", "tt_h100_l8b_128g_bf16",
     "tt_h100_l8b_128g_compile_bf16", "tt_h100_l8b_128g_compile_fp8"],
    ["tt_h100_l70b_256g_2d", "tt_h100_l70b_256g_2d_asynctp"],
    ["tt_h100_l405b_512g_1f1b", "tt_h100_l405b_512g_interleaved"],
    ["tt_h200_l8b_32g_fp8", "tt_h200_l8b_64g_fp8"],
    ["tt_b200_l8b_8g_bf16", "tt_b200_l8b_8g_mxfp8", "tt_b200_l8b_8g_fp8tw"],
    ["tt_gb200_scout_256g_bf16", "tt_gb200_scout_256g_mxfp8"],
    ["amd_mi325x_l70b_64g_fp8_fsdp", "amd_mi325x_l70b_64g_bf16_fsdp"],  # batch assumed: 1024 on 64
    ["nb_b200_l8b_8g_fp8cs", "nb_b200_l8b_8g_mxfp8"],  # NVIDIA's own full-power Blackwell runs: precision pairs
    ["nb_gb200_l8b_8g_fp8cs", "nb_gb200_l8b_8g_mxfp8"],
    ["nb_gb200_l70b_64g_mxfp8", "nb_gb200_l70b_64g_nvfp4"],
    ["nb_gb300_l70b_64g_mxfp8", "nb_gb300_l70b_64g_nvfp4"],
    ["nb_gb200_l405b_128g_bf16", "nb_gb200_l405b_128g_fp8", "nb_gb200_l405b_256g_bf16",
     "nb_gb200_l405b_256g_fp8", "nb_gb200_l405b_512g_bf16",
     "nb_gb200_l405b_512g_fp8",  # dgxc-benchmarking v25.05: 1/2 sequence per GPU
     "nb_gb200_l405b_128g_mxfp8"],  # Megatron-Bridge 25.11's MXFP8 run of the same layout
    ["nb_b200_l405b_128g_mxfp8", "nb_b200_l405b_128g_fp8cs"],
    ["nb_gb300_l405b_256g_gbs1536_fp8cs", "nb_gb300_l405b_256g_gbs1536_mxfp8",
     "nb_gb300_l405b_256g_gbs1536_nvfp4"],  # Megatron-Bridge 26.02: 6 sequences per GPU, one layout per precision
    ["nb_gb200_l405b_256g_gbs1536_fp8cs", "nb_gb200_l405b_256g_gbs1536_mxfp8",
     "nb_gb200_l405b_256g_gbs1536_nvfp4"],
]

SHIPPED_SERIES = [  # scenarios equal but for GPUs, dp and global batch
    ["N21-T2-174.6B-384", "N21-T2-174.6B-768", "N21-T2-174.6B-1536"],  # fixed global batch
    ["dg-l70-64", "dg-l70-2048"], ["dg-l405-512", "dg-l405-2048"], ["dg-g175-128", "dg-g175-2048"],
    ["dg-n340-256", "dg-n340-2048"], ["dg-grok-512", "dg-grok-2048"],
    ["ms-g175-256", "ms-g175-512", "ms-g175-768", "ms-g175-1024",  # fixed global batch 768, then 6144
     "ms-g175-3072", "ms-g175-6144", "ms-g175-8192", "ms-g175-12288"],
    ["l3-405-8192", "l3-405-16384"],  # fixed 16M tokens (the cp 16 row differs in seq and cp)
    ["tt_h100_l8b_8g_bf16", "tt_h100_l8b_128g_bf16"], ["tt_h100_l8b_8g_compile_bf16", "tt_h100_l8b_128g_compile_bf16"],
    ["tt_h100_l8b_8g_compile_fp8", "tt_h100_l8b_128g_compile_fp8"],
    ["tt_h200_l8b_32g_fp8", "tt_h200_l8b_64g_fp8"],
    ["nb_gb200_l405b_128g_bf16", "nb_gb200_l405b_256g_bf16", "nb_gb200_l405b_512g_bf16"],  # weak-scaled, 1/2 seq/GPU
    ["nb_gb200_l405b_128g_fp8", "nb_gb200_l405b_256g_fp8", "nb_gb200_l405b_512g_fp8"],
]


def published_as_predicted():
    return [(r, r.published_step_s) for r in ROWS]


def test_ranking_groups_of_the_shipped_tables():
    groups = vr.layout_ranking(published_as_predicted())
    assert [[g.reference] + [p.id for p in g.pairs] for g in groups] == SHIPPED_GROUPS
    assert all(p.miss == pytest.approx(0.0, abs=1e-12) for g in groups for p in g.pairs)


def test_each_knob_pair_differs_in_its_knob_alone():
    pairs = {p.id: p.differs for g in vr.layout_ranking(published_as_predicted()) for p in g.pairs}
    assert pairs["tt_h100_l70b_256g_2d_asynctp"] == "tp_comm_overlap False->True"
    assert pairs["mz-q235-tp2pp8ep32-ovl"] == "ep_comm_overlap False->True"
    assert pairs["tt_b200_l8b_8g_fp8tw"] == "fp8_recipe default->torchao, precision bf16->fp8"  # (torchao's casts)
    assert pairs["tt_h100_l8b_8g_compile_fp8"] == "compile False->True, fp8_recipe default->torchao, precision bf16->fp8"
    assert pairs["tt_h100_l405b_512g_interleaved"] == ("schedule default->interleaved, "
                                                        "virtual_stages default->2")  # (torchtitan 9dec370: pp micro-batches)
    assert pairs["tt_h100_l8b_128g_bf16"] == "gpus 8->128, dp 8->128, global_batch 16->256"
    assert pairs["nb_gb200_l405b_512g_bf16"] == "gpus 128->512, dp 2->8, global_batch 64->256"  # weak-scaled
    # a list prints as runs: Megatron-Core's split of 126 layers over 16 x 8 chunks, embedding and loss alone
    assert pairs["nb_gb200_l405b_256g_gbs1536_mxfp8"] == ("stage_layers default->[0, 1 x 126, 0], "
                                                          "virtual_stages 4->8, precision fp8->mxfp8")
    assert vr._short([2, 3, 3, 3, 2]) == "[2, 3 x 3, 2]" and vr._short([1, 2]) == "[1, 2]" and vr._short(4) == "4"


def test_shipped_series():
    trend = vr.scale_trend(published_as_predicted())
    assert [[p.id for p in s.points] for s in trend.series] == SHIPPED_SERIES
    assert trend.fit.slope == pytest.approx(0.0, abs=1e-12) and trend.fit.n == len(ROWS)


def test_ranking_miss_and_spearman_in_closed_form():
    rows = [synthetic("ref", 8, published=2.0), synthetic("x", 8, precision="fp8", published=1.0),
            synthetic("y", 64, published=2.2)]  # 64 GPUs at 2 per GPU: the same group
    errors = {"ref": 0.10, "x": -0.20, "y": 0.0}
    (group,) = vr.layout_ranking([(r, r.published_step_s * (1 + errors[r.id])) for r in rows])
    misses = {p.id: p.miss for p in group.pairs}
    assert misses["x"] == pytest.approx(0.8 / 1.1 - 1, rel=1e-12)
    assert misses["y"] == pytest.approx(1.0 / 1.1 - 1, rel=1e-12)
    # published order x < ref < y; predicted 0.8 < 2.2 = 2.2: ranks (2, 1, 3) vs (2.5, 1, 2.5)
    assert group.spearman == pytest.approx(math.sqrt(3) / 2, rel=1e-12)
    assert vr.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and vr.spearman([1, 2], [5, 5]) is None


# --- the plot, read back -------------------------------------------------------------------------

def test_plot_shows_every_row_and_the_fitted_slope():
    rows = [synthetic("a", 8), synthetic("b", 64), synthetic("c", 512), synthetic("d", 16, layers=80)]
    trend = vr.scale_trend([(r, 1 + e / 100) for r, e in zip(rows, (1, -2, -8, 4))])
    fig, ax = plt.subplots()
    draw(ax, trend)
    dots = sorted(tuple(xy) for c in ax.collections for xy in c.get_offsets().tolist())
    want = sorted([(8, 1.0), (16, 4.0), (64, -2.0), (512, -8.0)])
    assert [x for x, _ in dots] == [x for x, _ in want]
    assert [y for _, y in dots] == pytest.approx([y for _, y in want], rel=1e-12)
    lines = {line.get_label().split(":")[0]: line for line in ax.get_lines()}
    overall = lines[OVERALL]
    (x0, x1), (y0, y1) = overall.get_xdata(), overall.get_ydata()
    assert (x0, x1) == (8, 512)
    assert (y1 - y0) / (math.log2(x1) - math.log2(x0)) == pytest.approx(trend.fit.slope, rel=1e-9)
    series = next(line for label, line in lines.items() if label.startswith("m32"))
    assert list(series.get_xdata()) == [8, 512]
    plt.close(fig)


# --- the command line ----------------------------------------------------------------------------

def test_cli_json_stays_the_contract_list_and_the_reports_go_to_a_file(tmp_path):
    report, png = tmp_path / "r.json", tmp_path / "t.png"
    p = clustersim("validate", "--rows", "tt_b200", "--json", "--report-json", str(report), "--plot", str(png))
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    b200 = next(g for g in SHIPPED_GROUPS if g[0] == "tt_b200_l8b_8g_bf16")
    assert isinstance(rows, list) and [r["id"] for r in rows] == b200
    data = json.loads(report.read_text())
    assert data["rows"] == rows
    (group,) = data["layout_ranking"]
    pred = {r["id"]: r["predicted_step_s"] for r in rows}
    for pair in group["pairs"]:
        assert pair["predicted_ratio"] == pytest.approx(pred[pair["id"]] / pred["tt_b200_l8b_8g_bf16"], rel=1e-12)
    assert data["scale_trend"]["overall"] is None  # one GPU count: no slope
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_from_predictions_file(tmp_path):
    # every shipped row at a known step error: +2 points per doubling of its GPUs from 0 at 8 GPUs
    errors = {r.id: 0.02 * (math.log2(r.num_gpus) - 3) for r in ROWS}
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"id": r.id, "predicted_step_s": r.published_step_s * (1 + errors[r.id])}
                                 for r in ROWS]))
    report = tmp_path / "r.json"
    p = clustersim("validate", "--predictions", str(preds), "--report-json", str(report))
    assert p.returncode == 0, p.stderr
    data = json.loads(report.read_text())
    overall = data["scale_trend"]["overall"]
    assert overall["slope_points_per_doubling"] == pytest.approx(2.0, rel=1e-9) and overall["n"] == len(ROWS)
    assert overall["stderr"] == pytest.approx(0.0, abs=1e-6)
    assert f"all rows: slope +2.00 +- 0.00 points per doubling (n = {len(ROWS)})" in p.stdout
    assert "NOT met  scale-trend slope within +-1 point per doubling: +2.00" in p.stdout
    assert "Spearman" in p.stdout and p.stdout.index("MAPE over") < p.stdout.index("Scale trend")


def test_cli_bad_report_flags_exit_2(tmp_path):
    """Refused before anything is simulated, one line naming the flag (forked: no interpreter
    start-up per case)."""
    preds, bad = tmp_path / "p.json", tmp_path / "bad.json"
    preds.write_text(json.dumps([{"id": "MH-16B-192", "predicted_step_s": 1.0}]))
    bad.write_text("[1, 2]")
    for args, flag in ((["--rows", "MH-1.7B", "--predictions", str(preds)], "--predictions"),  # row not in file
                       (["--rows", "MH-16B", "--predictions", str(preds), "--fit"], "--predictions"),
                       (["--rows", "MH-16B", "--predictions", str(bad)], "--predictions"),
                       (["--rows", "MH-16B", "--plot", str(tmp_path / "t.txt")], "--plot"),
                       (["--explain", "MH-16B-192", "--plot", str(tmp_path / "t.png")], "--plot"),
                       (["--rows", "MH-16B", "--report-json", str(tmp_path / "no" / "r.json")], "--report-json")):
        out = run_cli(["validate", *args])
        assert out.code == 2 and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
        assert flag in out.stderr and "Traceback" not in out.stderr and out.stdout == ""
