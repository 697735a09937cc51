"""A real BF16 Kineto trace (issue 33): examples/calibration/h200_llama3-8b-4layers_bf16.json.gz,
a Llama-3-8B-shaped model cut to 4 layers on one H200 (torch 2.11, record_shapes=True; how it was
made: the provenance JSON beside it). Read as PyTorch wrote it: the kernel classes, the GEMM shapes
against the closed-form FLOPs of the provenance's model, the traced step against the step the
provenance timed without the profiler, and the fitted GEMM level within what the trace's shapes ran at.

Run: ``python -m pytest tests/test_calibrate_real_trace.py``
"""

import json

import pytest

from conftest import REPO
from sim import load_scenario, simulate
from sim.calibrate import kernels, kineto
from sim.hardware.calibration import Calibration
from sim.hardware.gpus import gpu_preset
from sim.model.compute import SUSTAINED, ComputeModel

FOLDER = REPO / "examples" / "calibration"
TRACE = FOLDER / "h200_llama3-8b-4layers_bf16.json.gz"
PROVENANCE = json.loads((FOLDER / "h200_llama3-8b-4layers_bf16.provenance.json").read_text())
SCENARIO = FOLDER / "llama3-8b-4layers-h200.toml"


@pytest.fixture(scope="module")
def trace():
    return kineto.parse(TRACE)


def test_the_trace_is_what_its_provenance_says(trace):
    assert PROVENANCE["gpu"] == "NVIDIA H200" and PROVENANCE["torch"].startswith("2.11")
    assert "record_shapes=True" in PROVENANCE["profiler"] and "active=3" in PROVENANCE["profiler"]
    assert trace.steps == 3  # each ProfilerStep is recorded twice (CPU and gpu_user_annotation)


def test_kernel_classes_found(trace):
    """GEMMs (cuBLASLt nvjet), attention (cuDNN SDPA and its backward helpers), elementwise and
    memsets; no NCCL on one GPU; every nvjet kernel a GEMM, every kernel an SDPA op launched attention."""
    classes = {k.cls for k in trace.kernels}
    assert classes == {"gemm", "attention", "elementwise", "memory"}
    assert all(k.cls == "gemm" for k in trace.kernels if k.name.startswith("nvjet"))
    for part in ("compute_dot_do_o", "convert_dq_to_16bits", "fmha_reduce_head", "sdpa_sm90_flash_bprop",
                 "sdpa_sm90_flash_fprop"):
        found = [k for k in trace.kernels if part in k.name]
        assert found and all(k.cls == "attention" and k.flops > 0 for k in found), part


def test_bf16_gemm_shapes_are_the_models(trace):
    """Every traced GEMM has a shape (its launch, a cuLaunchKernelEx, found its aten::mm), BF16;
    the distinct FLOPs are the closed forms of the provenance's model at 2 x 4096 tokens: the
    head, the fused gate+up, the down projection, the fused QKV (GQA) and the output projection,
    each 3 times per layer and step (forward, input and weight gradients)."""
    gemms = [k for k in trace.kernels if k.cls == "gemm"]
    assert gemms and all(k.flops > 0 and k.half for k in gemms)
    t = PROVENANCE["batch"] * PROVENANCE["seq"]
    h, ffn, vocab, layers, heads, kv = 4096, 14336, 128256, 4, 32, 8
    assert f"hidden {h}, {heads} heads, {kv} KV heads, FFN {ffn}" in PROVENANCE["model"] and str(vocab) in PROVENANCE["model"]
    want = {2 * t * h * vocab: 3, 2 * t * h * 2 * ffn: 3 * layers, 2 * t * h * ffn: 3 * layers,
            2 * t * h * (h + 2 * kv * h // heads): 3 * layers, 2 * t * h * h: 3 * layers}
    got = {}
    for k in gemms:
        got[k.flops] = got.get(k.flops, 0) + 1
    assert got == {f: n * trace.steps for f, n in want.items()}
    assert len(kernels.gemm_points([trace])) >= 3


def test_attention_is_causal_with_the_queries_keys(trace):
    """is_causal stands at argument 6 of the cuDNN forward and 14 of its backward: each query
    attends half the 4,096 keys on average, in both directions."""
    for op in ("forward", "backward"):
        assert [p[0] for p in kernels.points([trace], "attention", op)] == [PROVENANCE["seq"] / 2]


def test_traced_step_is_the_unprofiled_step(trace):
    """Kernels launched before the trace began (the warm-up step's queue) are left out, so the
    traced GPU step is the step the provenance timed without the profiler (median of 10)."""
    assert trace.launched_before > 0
    step = kineto.traced_breakdown(trace)["step_s"]
    assert step == pytest.approx(PROVENANCE["step_s_median_unprofiled"], rel=0.03)


def test_fitted_gemm_level_lies_within_the_traced_shapes(trace):
    """Every shape's smallest dimension is 4096: the level is fitted (the half size stays), and
    the calibrated curve at 4096 lies between the slowest and fastest traced shape's share of
    the peak (FLOPs over duration, computed here from the kernels)."""
    peak = gpu_preset("h200").peak_flops
    by_shape = {}
    for k in trace.kernels:
        if k.cls == "gemm":
            by_shape.setdefault(k.flops, []).append(k.dur)
    shares = [f * len(d) / sum(d) / peak for f, d in by_shape.items()]
    found = kernels.gemm_changes(kernels.gemm_points([trace]), peak, "h200", SUSTAINED["h200"])
    assert found["gemm_half_size"] is None and found["points"] == len(by_shape) == 5
    calibrated = ComputeModel(gpu_preset("h200"), calibration=Calibration(gpu="h200", gemm_kernel=found["gemm_kernel"]))
    assert min(shares) < calibrated.efficiency(4096) < max(shares)
    assert ComputeModel(gpu_preset("h200")).efficiency(4096) < min(shares)  # (the preset is slower)


def test_the_calibrated_scenario_simulates_the_traced_step(trace):
    """The same work simulated with the fitted level: within 5% of the traced step."""
    peak = gpu_preset("h200").peak_flops
    found = kernels.gemm_changes(kernels.gemm_points([trace]), peak, "h200", SUSTAINED["h200"])
    s = load_scenario(str(SCENARIO))
    cal = Calibration(source="fit", gpu="h200", gemm_kernel=found["gemm_kernel"])
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"calibration": cal})})
    step = simulate(s).summary["step_time_s"]
    assert step == pytest.approx(kineto.traced_breakdown(trace)["step_s"], rel=0.05)


@pytest.mark.parametrize("kernel, sustained, ok", [(1.04, None, True), (1.2, 0.9, False), (4.5, None, False)])
def test_gemm_kernel_may_pass_one_but_not_the_peak(tmp_path, kernel, sustained, ok):
    """A traced level over the sustained factor may pass 1 (this trace: 1.043); a profile whose
    gemm_kernel x sustained passes the peak, or gemm_kernel past its bound, exits 2 naming the key."""
    from conftest import assert_input_error, clustersim

    profile = tmp_path / "p.toml"
    profile.write_text(f'[compute]\ngpu = "h200"\ngemm_kernel = {kernel}\n'
                       + (f"sustained = {sustained}\n" if sustained else ""))
    proc = clustersim("run", str(SCENARIO), "--calibration", str(profile), "--json")
    if ok:
        assert proc.returncode == 0, proc.stderr
    else:
        assert_input_error(proc, "calibration")
        assert ("past the GPU's peak" in proc.stderr) == (kernel < 4)
