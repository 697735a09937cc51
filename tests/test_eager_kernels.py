"""Plain PyTorch elementwise operators (``training.kernels = "pytorch"``, sim/model/layers.py
``EAGER_*``): torchtitan's Llama run eagerly moves more bytes and launches more kernels
than the fused stacks; torch.compile fuses them back.

Run: ``python -m pytest tests/test_eager_kernels.py``.
"""

import subprocess
import sys

import pytest

from sim import simulate
from sim.input.load import scenario_from_dict
from sim.model import compute, layers
from sim.hardware.gpus import gpu_preset
from sim.model.transformer import Dims
from sim.studies import frontier

SMALL = {"name": "eager", "model": {"name": "llama-2l", "layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2,
                                     "ffn_hidden": 3584, "vocab": 32000, "mlp": "swiglu"},
         "training": {"seq_len": 2048, "global_batch": 1}, "cluster": {"gpu": "h100-sxm", "gpus": 1}}


def run(**training) -> dict:
    """The small model's summary (less the simulator's own wall time)."""
    data = {**SMALL, "training": {**SMALL["training"], **training}}
    return {k: v for k, v in simulate(scenario_from_dict(data)).summary.items() if k != "sim_wall_s"}


def shard(eager: bool, tp: int = 1, sp: bool = False) -> layers.Shard:
    return layers.Shard(4096, 4096, 1, tp, sp, True, eager=eager)


LLAMA = Dims(layers=1, h=4096, a=32, g=8, f=14336, v=128256, mats=3)


def test_eager_norm_and_residual_are_the_operator_sums():
    """The eager norm moves 36 bytes per element forward in 7 launches, 76 backward; the
    residual add 6 each way; both on the sequence shard under SP."""
    n = 4096 * 4096 / 8
    norm, residual = layers.norm_and_residual(LLAMA, shard(True, tp=8, sp=True))
    assert (norm.bytes, norm.backward().bytes, norm.count) == (36 * n, 76 * n, 7)
    assert (residual.bytes, residual.backward().bytes, residual.count) == (6 * n, 6 * n, 1)


def test_eager_swiglu_and_rope_only_where_the_model_has_them():
    gated = layers._mlp(LLAMA, shard(True), LLAMA.f, 4096.0, False)
    assert gated[1].bytes == 10 * 4096 * LLAMA.f and gated[1].count == 2
    gelu = Dims(**{**LLAMA.__dict__, "mats": 2})
    assert layers._mlp(gelu, shard(True), gelu.f, 4096.0, False) == layers._mlp(gelu, shard(False), gelu.f, 4096.0, False)
    (rope,) = layers.rope(LLAMA, shard(True))
    assert rope.bytes == 20 * 4096 * (32 + 8) * 128 and rope.count == 6
    assert layers.rope(LLAMA, shard(False)) == []
    mla = Dims(**{**LLAMA.__dict__, "kv_lora": 512, "qk_nope": 128, "qk_rope": 64, "v_dim": 128})
    assert layers.rope(mla, shard(True))[0].bytes == 20 * 4096 * (32 * 64 + 64)


def test_extra_time_is_the_extra_bytes_over_hbm_when_gpu_bound(free_host):
    """On one GPU with nothing to overlap and a free host, the eager step is slower than the
    fused one by exactly the extra bytes at the streaming rate plus the extra launches."""
    t, h, f, qk = 2048, 1024, 3584, (8 + 2) * 128  # tokens, hidden, FFN, q and k widths
    fused_norm, fused_res, fused_act = 3 * 2, 5 * 2, 3 * 2  # bytes per element forward, backward 2x
    per_layer = (2 * (36 + 76 - 3 * fused_norm) * t * h + 2 * (6 + 6 - 3 * fused_res) * t * h
                 + (20 + 20) * t * qk + (10 + 18 - 3 * fused_act) * t * f)
    extra_bytes = 2 * per_layer + (36 + 76 - 3 * fused_norm) * t * h  # + the final norm
    launches = 2 * ((2 * 7 + 2 + 6 + 2 - 5) * 3) + (7 - 1) * 3  # forward count, backward twice it
    gpu = gpu_preset("h100-sxm")
    expected = extra_bytes / (gpu.hbm_bw * compute.HBM_EFFICIENCY) + launches * compute.LAUNCH_S
    extra = run(kernels="pytorch")["step_time_s"] - run()["step_time_s"]
    assert extra == pytest.approx(expected, rel=1e-9)


def test_compile_fuses_eager_code_back_to_the_fused_kernels():
    """With compile, "pytorch" and "fused" build the same kernels: byte-identical summaries."""
    assert run(kernels="pytorch", compile=True) == run(compile=True)
    assert run(kernels="pytorch")["step_time_s"] > run()["step_time_s"]


def test_torchtitan_compile_gain_matches_its_table():
    """torchtitan docs/performance.md Table 1 (Llama 3.1 8B, 8 H100 @500 W, FSDP, selective
    AC): eager 5,762 TPS/GPU, torch.compile 6,667 -- compile shortens the step to 0.864 of
    eager. The simulated pair (the frontier rows' scenarios) within 5% of that ratio."""
    rows = {r.id: r for r in frontier.frontier_rows()}
    eager = simulate(scenario_from_dict(rows["tt_h100_l8b_8g_bf16"].scenario)).summary["step_time_s"]
    compiled = simulate(scenario_from_dict(rows["tt_h100_l8b_8g_compile_bf16"].scenario)).summary["step_time_s"]
    assert compiled / eager == pytest.approx(5762 / 6667, rel=0.05)


def test_bad_kernels_value_exits_2_naming_the_key(tmp_path):
    p = subprocess.run([sys.executable, "-m", "sim", "run", "examples/calibration/llama3-8b-4layers-h200.toml",
                        "--set", "training.kernels=eager"], capture_output=True, text=True)
    assert p.returncode == 2 and "training.kernels" in p.stderr and "Traceback" not in p.stderr


def test_op_recompute_recomputes_every_second_mm_and_every_elementwise_kernel():
    """torchtitan's per-op checkpointing recomputes wk, wo and w3 (the even mm of wq wk wv wo
    w1 w3 w2), in FP8 too, and every elementwise kernel (FP8 casts included), never attention."""
    t = 4096
    block = layers.attention_pre(LLAMA, shard(True)) + layers.attention_post(LLAMA, shard(True)) \
        + layers.mlp_block(LLAMA, shard(True))
    again = layers.op_recompute(LLAMA, shard(True))
    assert sum(k.flops for k in again) == 2 * t * LLAMA.h * (LLAMA.g * LLAMA.dq + LLAMA.a * LLAMA.dv + LLAMA.f)
    assert sum(k.bytes for k in again if not k.flops) == sum(k.bytes for k in block if not k.flops and not k.attn)
    assert not any(k.attn for k in again)
    fp8 = layers.Shard(t, t, 1, 1, False, True, fp8=True)
    again8 = layers.op_recompute(LLAMA, fp8)
    assert all(k.fp8 for k in again8 if k.flops) and sum(k.flops for k in again8) == sum(k.flops for k in again)
    casts = [k for k in layers.attention_pre(LLAMA, fp8) + layers.attention_post(LLAMA, fp8)
             + layers.mlp_block(LLAMA, fp8) if not k.flops and not k.attn]
    assert [k for k in again8 if not k.flops] == casts and len(casts) > len([k for k in block if not k.flops])


def test_op_recompute_costs_its_kernels_once_per_block(free_host):
    """The step with per-op checkpointing is longer than without by the recomputed kernels'
    time, once per block and micro-batch: exact on one GPU with a free host."""
    model = compute.ComputeModel(gpu_preset("h100-sxm"))
    sh = layers.Shard(2048, 2048, 1, 1, False, True)
    d = Dims(layers=2, h=1024, a=8, g=2, f=3584, v=32000, mats=3)
    extra = run(recompute="op")["step_time_s"] - run()["step_time_s"]
    assert extra == pytest.approx(2 * model.time(layers.op_recompute(d, sh)), rel=1e-9)


def test_op_recompute_keeps_what_its_policy_saves():
    """Stored activations per layer: the block input, the SDPA output and the odd mm outputs
    (wq, wv, w1, w2), 2 bytes each, in FP8 too (the mm outputs are BF16)."""
    from sim.model.transformer import activation_bytes_per_layer
    d = LLAMA
    bf16 = activation_bytes_per_layer(d, 4096, 1, 1, False, "op", True)
    assert bf16 == 2 * 4096 * (d.h + d.a * d.dq + d.g * d.dv + d.a * d.dv + d.f + d.h)
    assert activation_bytes_per_layer(d, 4096, 1, 1, False, "op", True, fp8=True) == bf16


@pytest.mark.parametrize("sets, reason", [
    (["parallel.tp=8", "parallel.dp=1", "cluster.gpus=8"], "tp = 1"),
    (["model.preset=mixtral-8x7b"], "not MoE"),
])
def test_op_recompute_refused_where_not_modelled(sets, reason):
    args = [sys.executable, "-m", "sim", "run", "examples/calibration/llama3-8b-4layers-h200.toml",
            "--set", "training.recompute=op"]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 2 and "training.recompute" in p.stderr and reason in p.stderr, p.stderr
