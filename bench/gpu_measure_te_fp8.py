"""Transformer Engine's FP8 recipe, written out in PyTorch, at the shipped FP8 rows' GEMM shapes.

Run on a machine with one NVIDIA Hopper GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_te_fp8.py`` writes ``dir/measure.json``. It reuses
``bench/gpu_measure.py``'s timing (CUDA events, median after warm-ups) and measures:

- ``te_linear``: one training linear (forward ``y = x w^T``, input gradient ``g w``, weight
  gradient ``g^T x``) at the per-GPU GEMM shapes of NeMo's H100 FP8 rows (sim/data/
  modern_runs.csv: dg-grok-fp8-2048 Grok-1 tp 4 cp 2, dg-l70-fp8-64 Llama 3.1 70B tp 4,
  dg-l405-fp8-1024 Llama 3.1 405B tp 8 cp 2; and GPT-3 175B tp 4, whose FP8 row NVIDIA
  publishes beside the BF16 one), each GEMM timed alone in BF16 and in FP8, and Transformer
  Engine's delayed-scaling recipe as PyTorch can write it: the scale comes from the amax
  history (an input, no amax pass before the cast), one fused kernel casts a tensor and writes
  its transpose (TE ``cast_transpose``, here ``torch.compile`` of cast + transpose + amax),
  the weight is cast and transposed once per step (not per micro-batch: timed apart), and the
  forward GEMM runs with fast accumulation while the two backward GEMMs accumulate in split
  precision (TE ``module/base.py``: ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = True``,
  ``_2X_ACC_WGRAD = True``; ``torch._scaled_mm(use_fast_accum=...)``). Hopper's FP8 tensor
  cores read both operands K-major, which is why the transposes exist at all. The casts and the
  whole micro-batch are timed twice: as called (``*_s``: the compiled wrapper's host cost, tens
  of us a call, shows at small shapes) and replayed as a CUDA graph (``*_graph_s``: the GPU's
  own time, what TE's single C++ kernel launch approaches).
- ``mla_attention``: causal SDPA forward + backward at DeepSeek-V3's MLA head dims (q/k 192,
  v 128; 64 heads = 128 / tp 2, 4,096 tokens) against head dim 128, per SDPA backend.
- ``kernel_jitter``: 2,000 back-to-back 8192^3 BF16 GEMMs, each timed by its own CUDA events:
  the spread of one GPU's kernel times (percentiles), the run-to-run jitter of ``[jitter]``.
``ONLY=te_linear`` runs a subset.
"""

import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (timing, output and section helpers)

DEV = gm.DEV
E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # torch.finfo(float8_e4m3fn / float8_e5m2).max
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def row_shapes():
    """(label, m tokens per GEMM, n out features, k in features) of one GPU's linears."""
    out = []
    rows = {  # name: (tokens per GEMM = seq x micro-batch / cp, [(what, n, k)])
        "grok_tp4_cp2": (4096, [("qkv", (48 + 2 * 8) * 128 // 4, 6144), ("o", 6144, 48 * 128 // 4)]),
        "l70_tp4": (8192, [("qkv", (64 + 2 * 8) * 128 // 4, 8192), ("o", 8192, 8192 // 4),
                           ("up", 2 * 28672 // 4, 8192), ("down", 8192, 28672 // 4)]),
        "l405_tp8_cp2": (4096, [("qkv", (128 + 2 * 8) * 128 // 8, 16384), ("o", 16384, 16384 // 8),
                                ("up", 2 * 53248 // 8, 16384), ("down", 16384, 53248 // 8)]),
        "g175_tp4": (2048, [("qkv", 3 * 12288 // 4, 12288), ("o", 12288, 12288 // 4),
                            ("up", 49152 // 4, 12288), ("down", 12288, 49152 // 4)]),
    }
    for name, (m, linears) in rows.items():
        for what, n, k in linears:
            out.append((f"{name}_{what}", m, n, k))
    for m in (8192, 16384):  # Grok-1's expert (GeGLU 32768) under expert TP 4 and 1
        out += [(f"grok_expert_etp4_up_T{m}", m, 2 * 32768 // 4, 6144),
                (f"grok_expert_etp4_down_T{m}", m, 6144, 32768 // 4),
                (f"grok_expert_etp1_up_T{m}", m, 2 * 32768, 6144),
                (f"grok_expert_etp1_down_T{m}", m, 6144, 32768)]
    return out


def cast_transpose(t, scale, fmax: float, dtype):
    """TE's fused cast + transpose with a given (delayed) scale; the amax is recorded on the way."""
    q = (t.float() * scale).clamp(-fmax, fmax).to(dtype)
    return q, q.t().contiguous(), t.abs().amax()


def mm8(a, b, sa, sb, fast: bool):
    return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)


def fp8_gemms(x8, x8t, w8, w8t, g8, g8t, inv, fast=(True, False, False)):
    """Forward a(m,k) x b(k,n); dgrad g(m,n) x w(n,k); wgrad g^T(n,m) x x(m,k); b column-major."""
    y = mm8(x8, w8.t(), inv, inv, fast[0])
    gx = mm8(g8, w8t.t(), inv, inv, fast[1])
    gw = mm8(g8t, x8t.t(), inv, inv, fast[2])
    return y, gx, gw


def one_shape(label, m, n, k, ct):
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02
    g = torch.randn(m, n, device=DEV, dtype=torch.bfloat16) * 1e-3
    one = torch.ones((), device=DEV)
    row = {"shape": label, "m": m, "n": n, "k": k, "flops_per_gemm": 2.0 * m * n * k}
    row["bf16_fwd_s"] = gm.timed(lambda: F.linear(x, w))
    row["bf16_dgrad_s"] = gm.timed(lambda: g @ w)
    row["bf16_wgrad_s"] = gm.timed(lambda: g.t() @ x)
    x8, x8t, _ = ct(x, one, E4M3_MAX, E4M3)
    w8, w8t, _ = ct(w, one, E4M3_MAX, E4M3)
    g8, g8t, _ = ct(g, one, E5M2_MAX, E5M2)
    for fast in (True, False):
        tag = "fast" if fast else "split"
        row[f"fp8_fwd_{tag}_s"] = gm.timed(lambda: mm8(x8, w8.t(), one, one, fast))
        row[f"fp8_dgrad_{tag}_s"] = gm.timed(lambda: mm8(g8, w8t.t(), one, one, fast))
        row[f"fp8_wgrad_{tag}_s"] = gm.timed(lambda: mm8(g8t, x8t.t(), one, one, fast))
    row["cast_transpose_x_s"] = gm.timed(lambda: ct(x, one, E4M3_MAX, E4M3))
    row["cast_transpose_g_s"] = gm.timed(lambda: ct(g, one, E5M2_MAX, E5M2))
    row["cast_transpose_w_s"] = gm.timed(lambda: ct(w, one, E4M3_MAX, E4M3))

    def te_micro_batch():  # per micro-batch: x and g cast+transposed, three GEMMs (weight cached)
        a8, a8t, _ = ct(x, one, E4M3_MAX, E4M3)
        b8, b8t, _ = ct(g, one, E5M2_MAX, E5M2)
        return fp8_gemms(a8, a8t, w8, w8t, b8, b8t, one)

    row["te_micro_batch_s"] = gm.timed(te_micro_batch)
    row["bf16_s"] = row["bf16_fwd_s"] + row["bf16_dgrad_s"] + row["bf16_wgrad_s"]
    row["te_speedup"] = row["bf16_s"] / row["te_micro_batch_s"]
    gemm8 = row["fp8_fwd_fast_s"] + row["fp8_dgrad_split_s"] + row["fp8_wgrad_split_s"]
    row["gemm_only_speedup"] = row["bf16_s"] / gemm8
    for key in ("bf16_fwd_s", "bf16_dgrad_s", "bf16_wgrad_s"):
        row[key[:-2] + "_share_of_peak"] = row["flops_per_gemm"] / row[key] / gm.BF16_PEAK
    for key in ("fp8_fwd_fast_s", "fp8_dgrad_split_s", "fp8_wgrad_split_s"):
        row[key[:-2] + "_share_of_peak"] = row["flops_per_gemm"] / row[key] / gm.FP8_PEAK
    for key, fn in (("cast_transpose_x", lambda: ct(x, one, E4M3_MAX, E4M3)),
                    ("cast_transpose_g", lambda: ct(g, one, E5M2_MAX, E5M2)),
                    ("cast_transpose_w", lambda: ct(w, one, E4M3_MAX, E4M3)), ("te_micro_batch", te_micro_batch)):
        try:  # the GPU's own time: replayed as a CUDA graph, without the compiled wrapper's host cost
            row[key + "_graph_s"] = gm.timed(gm.graphed(fn))
        except Exception as e:  # noqa: BLE001
            row[key + "_graph_error"] = repr(e)[:300]
    if "te_micro_batch_graph_s" in row:
        row["te_graph_speedup"] = row["bf16_s"] / row["te_micro_batch_graph_s"]
    return row



@gm.section
def te_linear():
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    ct = torch.compile(cast_transpose, dynamic=False)
    rows = []
    for label, m, n, k in row_shapes():
        try:
            rows.append(one_shape(label, m, n, k, ct))
        except Exception as e:  # noqa: BLE001 -- keep the other shapes
            rows.append({"shape": label, "m": m, "n": n, "k": k, "error": repr(e)[:400]})
        torch.cuda.empty_cache()
        print(" ", label, {k: round(v, 3) for k, v in rows[-1].items() if k.endswith("speedup")}, flush=True)
    return {"method": "each GEMM alone (F.linear / matmul in BF16; torch._scaled_mm e4m3 x e4m3 forward, "
                      "e5m2 x e4m3 backward, fast accumulation and split each); TE delayed scaling per "
                      "micro-batch = cast_transpose(x) + cast_transpose(g) (torch.compile of cast, transpose "
                      "and amax with a given scale) + forward (fast) + dgrad + wgrad (split), the weight's "
                      "cast_transpose once per step apart; median of 10 CUDA-event timings after 3 warm-ups",
            "rows": rows}


@gm.section
def mla_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    b, h, s = 1, 64, 4096
    for dqk, dv in ((192, 128), (128, 128)):
        q = torch.randn(b, h, s, dqk, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, h, s, dqk, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, h, s, dv, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        flops_fwd = 4.0 * b * h * s * s * (dqk + dv) / 2 / 2  # causal: half of 2*s*s*(dqk+dv) per head
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            row = {"backend": name, "d_qk": dqk, "d_v": dv, "heads": h, "seq": s, "flops_fwd": flops_fwd}
            try:
                with sdpa_kernel(backend):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                    o = fwd()
                    go = torch.randn_like(o)
                    row["fwd_s"] = gm.timed(fwd)
                    row["fwd_bwd_s"] = gm.timed(lambda: torch.autograd.grad(fwd(), (q, k, v), go))
                row["bwd_s"] = row["fwd_bwd_s"] - row["fwd_s"]
                row["fwd_share_of_peak"] = flops_fwd / row["fwd_s"] / gm.BF16_PEAK
                row["bwd_share_of_peak"] = 2.5 * flops_fwd / row["bwd_s"] / gm.BF16_PEAK
            except Exception as e:  # noqa: BLE001 -- a backend that refuses these head dims
                row["error"] = repr(e)[:300]
            rows.append(row)
        del q, k, v
    return {"method": "F.scaled_dot_product_attention(is_causal=True), BF16, batch 1, per backend; backward "
                      "= forward+backward minus forward; FLOPs: causal half of 4 s^2 (d_qk + d_v)/2 per head "
                      "forward, 2.5x that backward", "rows": rows}


@gm.section
def kernel_jitter():
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    for _ in range(50):
        a @ b
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2000)]
    torch.cuda.synchronize()
    for s, e in events:
        s.record()
        a @ b
        e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) / 1e3 for s, e in events)
    q = lambda p: t[min(len(t) - 1, int(p * len(t)))]  # noqa: E731
    med = statistics.median(t)
    return {"method": "2,000 back-to-back 8192^3 BF16 GEMMs, each between its own CUDA events, after 50 warm-ups",
            "median_s": med, "mean_s": statistics.fmean(t), "stdev_over_median": statistics.pstdev(t) / med,
            "p01": q(0.01) / med, "p10": q(0.10) / med, "p90": q(0.90) / med, "p99": q(0.99) / med,
            "max": t[-1] / med, "min": t[0] / med}


if __name__ == "__main__":
    gm.main("/tmp/gpu_measure_te_fp8", (("env", gm.env), ("kernel_jitter", kernel_jitter),
                                     ("mla_attention", mla_attention), ("te_linear", te_linear)))
