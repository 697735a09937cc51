"""Microscaling FP8 (training.precision = "mxfp8") and NVFP4 ("nvfp4") on Blackwell and
the MI355X, the 2026 GPU presets' cited rates, and the refusals where a GPU lacks them.

Closed forms from the datasheets: B200 2.25 PFLOP/s dense BF16, 4.5 dense FP8/MXFP8, 9 dense
NVFP4 (DGX B200: 72 PFLOP/s FP8 and 144 FP4 per 8 GPUs with sparsity).

Run: ``python -m pytest tests/test_mx_precision.py``
"""

from pathlib import Path
import re

import pytest

from conftest import assert_input_error, clustersim
from sim.hardware.gpus import GPUS, gpu_preset
from sim.model import layers as L
from sim.model.compute import ComputeModel

B200 = gpu_preset("b200")
NEW = ("h800", "gb300", "mi300x", "mi325x", "mi355x")


def shard(quant: str | None) -> L.Shard:
    return L.Shard(tokens=1 << 20, seq=8192, micro=128, tp=1, sp=False, flash=True, fp8=quant is not None,
                   quant=quant or "fp8")


def linear_time(precision: str | None, n: float) -> float:
    """Forward + backward of one linear layer k = n -> n on 2^20 tokens."""
    cm = ComputeModel(B200, precision=precision or "bf16")
    fwd = L.linear(1 << 20, n, n, shard(precision))
    return cm.time(fwd) + cm.time(L.backward(fwd))


def test_mxfp8_nearly_halves_linear_layers_in_the_compute_bound_limit_on_b200():
    """MXFP8 runs at 4.5 of 2.25 PFLOP/s with 0.991 of the BF16 kernel share (Transformer Engine's
    pre-quantized B300 layer, sim.model.gemm_sources.BLACKWELL_FP8_RATIO) times the MX kernel's 6.812 /
    7.161 of the FP8 one (the same layer): the linear layer's time tends to 0.5 / (0.991 x 0.951)
    of BF16's once its GEMMs bind (its quantize kernels, memory-bound,
    shrink relative to the GEMM as n grows)."""
    ratios = [linear_time("mxfp8", n) / linear_time(None, n) for n in (16384, 65536, 1 << 20)]
    assert ratios[0] > ratios[1] > ratios[2]
    assert ratios[-1] == pytest.approx(2250 / 4500 / (13.102 / 6.812 / 2 * 4352 / 4224 * 6.812 / 7.161), rel=3e-3)


def test_nvfp4_and_mxfp8_in_the_limit_run_at_the_measured_kernel_ratios():
    """In the compute-bound limit NVFP4 takes a quarter of BF16's time (the B200's 9 against 2.25
    PFLOP/s) over its kernel share, 0.720 of BF16's on a B200 (TE's pre-quantized B300 layer read as
    MMAs plus a rest, sim.model.gemm_sources.nvfp4_share_ratio, since 2026-11-28: the FP8 share
    13.102 / 6.812 / 2 x 4352 / 4224 times kappa / (kappa + rho), kappa = 0.5 x 4608 / 4352 on a part
    whose FP4 peak is 2x its FP8 one, rho = 3.764 / 6.812 - 4608 / 4352 / 3), and MXFP8 7.161 / 6.812
    of FP8's time: the two kernels' pre-quantized layer times on a B300 (NVIDIA/TransformerEngine
    gemm_profiling.rst)."""
    kappa, rho = 0.5 * 4608 / 4352, 3.764 / 6.812 - 4608 / 4352 / 3
    nvfp4_share = 13.102 / 6.812 / 2 * 4352 / 4224 * kappa / (kappa + rho)
    assert linear_time("nvfp4", 1 << 22) / linear_time(None, 1 << 22) == pytest.approx(2250 / 9000 / nvfp4_share, rel=2e-2)
    assert linear_time("mxfp8", 1 << 22) / linear_time("fp8", 1 << 22) == pytest.approx(7.161 / 6.812, rel=2e-3)


def test_mx_quantize_kernels_write_two_scaled_copies():
    """MX block scales run along K: the forward and the wgrad GEMM need the input quantized
    along different axes -- read 2 bytes, write 2 x (1 + 1/32) per element (NVFP4: 2 x 0.5625)."""
    m, n, k = 4096.0, 8192.0, 2048.0
    for quant, operand in (("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)):
        cast, gemm = L.linear(m, n, k, shard(quant), fused=True)
        assert cast.bytes == pytest.approx((2 + 2 * operand) * m * k)  # no norm fusion
        assert cast.backward().bytes == pytest.approx((2 + 2 * operand) * m * n)
        assert gemm.bytes == pytest.approx(operand * (m * k + k * n) + 2 * m * n) and gemm.fp8


@pytest.mark.parametrize("gpu, mx, fp4", [("b200", 4500, 9000), ("gb200", 5000, 10000), ("b300", 4500, 13500),
                                          ("gb300", 5000, 15000), ("mi355x", 5033.2, 0), ("mi300x", 0, 0),
                                          ("h800", 0, 0), ("h100-sxm", 0, 0)])
def test_low_precision_rates(gpu, mx, fp4):
    g = gpu_preset(gpu)
    assert g.mxfp8_flops == pytest.approx(mx * 1e12) and g.fp4_flops == pytest.approx(fp4 * 1e12)


def test_every_new_preset_is_cited():
    """The comment block above each new preset names its source (datasheet, paper, blog)."""
    text = (Path(__file__).resolve().parents[1] / "sim" / "hardware" / "gpus.py").read_text()
    for name in NEW:
        block = text[:text.index(f'_register(GPU("{name}"')].rsplit("\n\n", 1)[-1]
        assert re.search(r"datasheet|arXiv|whitepaper|ISCA", block), name
        assert name in GPUS


def test_amd_and_h800_presets_from_their_datasheets():
    mi300x, mi355x, h800 = gpu_preset("mi300x"), gpu_preset("mi355x"), gpu_preset("h800")
    assert (mi300x.peak_flops, mi300x.hbm_bytes, mi300x.peer_links) == (pytest.approx(1307.4e12), 192e9, 7)
    assert mi300x.link_bw == pytest.approx(64e9) and mi355x.link_bw == pytest.approx(153.6e9 / 2)
    assert gpu_preset("mi325x").hbm_bytes == 256e9 and gpu_preset("mi325x").hbm_bw == 6000e9
    assert h800.nvlink_bw == 200e9 and h800.fp8_flops == h800.fp8_flops == 1979e12  # 400 GB/s bidirectional


def scenario(tmp_path, gpu: str, topo: str, precision: str, batch: int = 8) -> list[str]:
    path = tmp_path / "s.toml"
    path.write_text(f'[model]\npreset = "llama3-8b"\n[cluster]\ntopology = "{topo}"\ngpu = "{gpu}"\ngpus = 8\n'
                    f'[parallel]\ndp = 8\n[training]\nglobal_batch = {batch}\nseq_len = 2048\n'
                    f'precision = "{precision}"\n')
    return ["run", str(path)]


@pytest.mark.parametrize("gpu, topo, precision", [("h100-sxm", "dgx-h100", "nvfp4"), ("a100-80gb", "dgx-a100", "mxfp8"),
                                                  ("h100-sxm", "dgx-h100", "mxfp8"), ("mi355x", "amd-xgmi", "nvfp4"),
                                                  ("mi300x", "amd-xgmi", "mxfp8")])
def test_precision_the_gpu_lacks_exits_2(tmp_path, gpu, topo, precision):
    assert_input_error(clustersim(*scenario(tmp_path, gpu, topo, precision)), "training.precision")


def test_mxfp8_runs_faster_than_bf16_on_mi355x(tmp_path):
    """16 micro-batches per step: the linears' time dominates the gradient all-reduce."""
    import json

    times = {}
    for p in ("bf16", "mxfp8"):
        proc = clustersim(*scenario(tmp_path, "mi355x", "amd-xgmi", p, batch=128), "--json")
        assert proc.returncode == 0, proc.stderr
        times[p] = json.loads(proc.stdout)["step_time_s"]
    assert 0.5 < times["mxfp8"] / times["bf16"] < 0.95
