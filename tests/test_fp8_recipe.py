"""Who quantizes the linears (training.fp8_recipe): torchao's compiled casts against
Transformer Engine's, Hopper's measured FP8 GEMM share, and the simulated FP8 / BF16 ratio
of one linear against the one measured on an H100 (bench/measured/h100-2026-11-26-fp8-moe.json).

Closed forms are written here from the bytes each recipe moves (sim/model/layers.py cites the
torchao code) and the roofline of sim/model/compute.py.

Run: ``python -m pytest tests/test_fp8_recipe.py``
"""

import json
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import assert_input_error, bench_module, clustersim
from sim.hardware.gpus import gpu_preset, low_peak
from sim.input.load import scenario_from_dict
from sim.model import layers as L
from sim.model.compute import GEMM_KERNEL, HBM_EFFICIENCY, LAUNCH_S, ComputeModel, gemm as gemm_kernel
from sim.model.gemm_sources import FP8_K_HALF
from sim.step import simulate

ROOT = Path(__file__).parents[1]
H100, B200 = gpu_preset("h100-sxm"), gpu_preset("b200")
M, N, K = 8192.0, 28672.0, 4096.0  # Llama 3 8B's FC1 on 8,192 tokens


def shard(quant: str, recipe: str) -> L.Shard:
    return L.Shard(tokens=8192, seq=8192, micro=1, tp=1, sp=False, flash=True, fp8=True, quant=quant, recipe=recipe)


def test_torchao_tensorwise_casts_move_six_bytes_per_element_of_x_w_and_g():
    """amax reads the BF16 tensor (2), the cast reads it again (2) and writes FP8 in both
    layouts (1 + 1): forward x (m k) and w (n k), backward g (m n), every micro-batch."""
    cast, gemm = L.linear(M, N, K, shard("fp8", "torchao"), fused=True)  # (no norm fusion under torchao)
    assert cast.bytes == 6 * (M * K + N * K) and cast.flops == 0
    assert cast.backward().bytes == pytest.approx(6 * M * N, rel=1e-12)
    assert gemm.fp8 and gemm.flops == 2 * M * N * K
    cm = ComputeModel(H100)
    hbm = H100.hbm_bw * HBM_EFFICIENCY
    assert cm.time([cast]) == pytest.approx(LAUNCH_S + 6 * (M * K + N * K) / hbm, rel=1e-12)
    assert cm.time([cast.backward()]) == pytest.approx(2 * LAUNCH_S + 6 * M * N / hbm, rel=1e-12)


def test_torchao_mx_quantizes_each_tensor_twice_from_bf16():
    """mx_mm: x, w and g each quantized along dim 0 and dim 1, each pass read 2, write 1 + 1/32."""
    cast, gemm = L.linear(M, N, K, shard("mxfp8", "torchao"))
    per = 2 * (2 + 1 + 1 / 32)
    assert cast.bytes == pytest.approx(per * (M * K + N * K), rel=1e-12)
    assert cast.backward().bytes == pytest.approx(per * M * N, rel=1e-12)
    assert gemm.bytes == pytest.approx((1 + 1 / 32) * (M * K + K * N) + 2 * M * N, rel=1e-12)
    # each pass at torchao's measured B200 cast rate, not HBM_EFFICIENCY: dim 0 5.5 TB/s, dim 1 3.9 TB/s
    cm = ComputeModel(B200, precision="mxfp8")
    per_pass = 2 + 1 + 1 / 32
    assert cm.time([cast]) == pytest.approx(LAUNCH_S + per_pass * (M * K + N * K) * (1 / 5.5e12 + 1 / 3.9e12),
                                            rel=1e-12)
    assert cm.time([cast.backward()]) == pytest.approx(2 * LAUNCH_S + per_pass * M * N * (1 / 5.5e12 + 1 / 3.9e12),
                                                       rel=1e-12)


def test_te_casts_are_unchanged_four_bytes_and_two_after_a_norm():
    cast, _ = L.linear(M, N, K, shard("fp8", "te"))
    assert cast.bytes == 4 * M * K and cast.backward().bytes == pytest.approx(4 * M * N, rel=1e-12)
    assert L.linear(M, N, K, shard("fp8", "te"), fused=True)[0].bytes == 2 * M * K


def test_fp8_gemm_keeps_the_measured_share_of_the_bf16_one():
    """H100: 0.804 of the FP8 peak where BF16 keeps 0.806 of its own (kernel level, at a GEMM
    so large that Hopper's reduction-dim term, FP8_K_HALF / K, vanishes too: the level fitted
    with that term, bench/measured_gemm_fit.py), H200 0.811; B200: 0.991 of the BF16 share
    (Transformer Engine's pre-quantized B300 layer, 13.102 / 6.812 / 2 x 4352 / 4224), 1.98x."""
    flops, big = 2 * 16384.0 ** 3, 1e9  # every dim large: both curves at their top
    for gpu, share in ((H100, 0.804 / 0.806), (gpu_preset("h200"), 0.811 / 0.806), (B200, 13.102 / 6.812 / 2 * 4352 / 4224)):
        want = share * low_peak(gpu, "fp8") / gpu.peak_flops  # H100: 1,979 / 989 TFLOP/s dense
        cm = ComputeModel(gpu, e_max=GEMM_KERNEL[gpu.name]["bf16"])
        bf16 = cm.flop_time(gemm_kernel(big, big, big)._replace(flops=flops))
        fp8 = cm.flop_time(gemm_kernel(big, big, big, fp8=True)._replace(flops=flops))
        c_k = FP8_K_HALF.get(gpu.name, 0.0)  # Hopper's per-output-element term: c_K / K of the time
        assert bf16 / fp8 == pytest.approx(want * (1 + 128 / big) / (1 + 256 / big + c_k / big), rel=1e-9)


def one_node(recipe: str | None, precision: str = "fp8") -> dict:
    training = {"seq_len": 2048, "global_batch": 8, "precision": precision, "compile": True}
    if recipe:
        training["fp8_recipe"] = recipe
    return {"name": "recipe", "model": {"layers": 2, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn_hidden": 8192,
                                        "vocab": 32000, "mlp": "swiglu"},
            "training": training, "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"dp": 8}}


@lru_cache(maxsize=None)
def optimizer_s(recipe: str | None) -> float:
    spans = simulate(scenario_from_dict(one_node(recipe))).spans
    op = spans[(spans.name == "optimizer") & (spans["rank"] == 0)]
    return float((op.end_s - op.start_s).iloc[0])


def test_only_transformer_engine_casts_the_weights_in_the_optimizer():
    """TE: FP8 weights and their transposes once per step (read 2, write 1 + 1 per weight, two
    launches); torchao casts them in every forward instead, so its optimizer lacks that kernel."""
    h = 2048  # (the existing TE model casts every local weight: embedding, norms and output layer too)
    weights = 2 * (h * (h + 2 * 1024) + h * h + 3 * h * 8192 + 2 * h) + 2 * 32000 * h + h
    cast = 2 * LAUNCH_S + 4 * weights / (H100.hbm_bw * HBM_EFFICIENCY)
    assert optimizer_s("te") - optimizer_s("torchao") == pytest.approx(cast, rel=1e-9)
    assert optimizer_s(None) == optimizer_s("te")  # the default is Transformer Engine's


def measured_fp8():
    return bench_module("measured_fp8")


def test_simulated_fp8_speedup_within_10pct_of_the_measured_one_at_whole_layers():
    """One linear's BF16 / FP8 time (forward + dgrad + wgrad; torchao tensor-wise, compiled),
    the committed H100 measurement against the model at kernel level (the benchmark ran its
    kernels back to back: no sustained factor), at the 70B/405B layers whole."""
    bench = measured_fp8()
    rows = [r for r in bench.rows() if bench.whole_layer(r)]
    measured = {r["shape"]: r["fp8_compiled_speedup"]
                for r in json.loads((ROOT / "bench/measured/h100-2026-11-26-fp8-moe.json").read_text())["fp8_linear"]["rows"]}
    assert len(rows) == 8 and all(r["measured"] == measured[r["shape"]] for r in rows)
    for r in rows:
        assert r["kernel"] == pytest.approx(r["measured"], rel=0.10), r["shape"]
        assert r["kernel_te"] > r["kernel"]  # TE's fused casts cost less than torchao's


def test_simulated_step_ratio_within_10pct_of_the_measured_4_layer_step():
    """The whole compiled step of bench/measured/h100-2026-11-26-fp8-step.json (BF16 vs torchao
    FP8 decoder linears), simulated through sim.step.simulate at the preset."""
    rows = measured_fp8().step_rows()
    assert len(rows) == 2 and all(1.05 < r["measured"] < 1.15 for r in rows)
    for r in rows:
        assert r["simulated"] == pytest.approx(r["measured"], rel=0.10)


def test_readme_quotes_what_the_fp8_comparison_prints():
    readme = (ROOT / "bench" / "measured" / "README.md").read_text()
    block = readme.split("`python bench/measured_fp8.py` prints")[1].split("```\n")[1]
    assert block == measured_fp8().report()


def scenario_file(tmp_path, **training) -> list[str]:
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in training.items())
    path = tmp_path / "s.toml"
    path.write_text('[model]\npreset = "llama3-8b"\n[cluster]\ntopology = "dgx-h100"\ngpu = "h100-sxm"\ngpus = 8\n'
                    f'[parallel]\ndp = 8\n[training]\nglobal_batch = 8\nseq_len = 2048\n{lines}')
    return ["run", str(path)]


@pytest.mark.parametrize("training", [
    {"precision": "fp8", "fp8_recipe": "apex"},  # not a recipe
    {"precision": "fp8", "fp8_recipe": 1},
    {"precision": "bf16", "fp8_recipe": "te"},  # nothing to quantize: a setting that would do nothing
    {"precision": "fp8", "fp8_recipe": "torchao"},  # torchao modelled compiled only
    {"precision": "fp8", "fp8_recipe": "torchao", "compile": False},
])
def test_bad_fp8_recipe_exits_2_naming_it(tmp_path, training):
    assert_input_error(clustersim(*scenario_file(tmp_path, **training)), "training.fp8_recipe")


def test_torchao_nvfp4_exits_2(tmp_path):
    proc = clustersim("run", *scenario_file(tmp_path, precision="nvfp4", fp8_recipe="torchao", compile=True)[1:],
                      "--set", "cluster.gpu=b200", "--set", "cluster.topology=dgx-b200")
    assert_input_error(proc, "training.fp8_recipe")
