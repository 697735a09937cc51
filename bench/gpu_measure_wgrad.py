"""The weight-gradient GEMM split out, and the optimizer step's tail, on one real GPU.

Run on a machine with one NVIDIA GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_wgrad.py`` writes ``dir/measure.json``. It reuses
bench/gpu_measure.py's timing, output and section helpers (TF32 off, medians of CUDA-event
timings). Sections:

- ``env``: as bench/gpu_measure.py.
- ``wgrad``: one linear's three GEMMs timed apart -- forward ``x W^T``, input gradient
  ``dy W``, weight gradient ``dy^T x`` -- at the per-GPU linears of the shipped rows (Llama 3.1
  70B tp 4, 405B tp 8 cp 2, GPT-3 175B tp 4, Qwen3-235B-A22B's attention at tp 4) and at one
  expert's GEMMs of Qwen3-235B-A22B, DeepSeek-V3 and Grok-1 over a sweep of tokens per expert.
  The weight gradient four ways: BF16 out (what the model's ``bwd = 2 x forward`` work
  assumes), FP32 out, FP32 accumulated into a ``main_grad`` in the GEMM (Megatron's
  ``gradient_accumulation_fusion``: APEX ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``,
  Transformer Engine ``fuse_wgrad_accumulation`` -- cuBLAS with an FP32 C and beta = 1), and
  BF16 out then ``main_grad.add_`` (Megatron's DDP hook when the fusion is off).
- ``wgrad_cold``: the accumulating weight gradient again with its main_grad cold in L2 (each
  call into the next of several main_grads totalling >= 400 MB), at the expert shapes' 64-4,096
  tokens and GPT-3 175B's / Qwen3's attention linears.
- ``grouped_wgrad``: E experts x T tokens each, the weight gradients as E GEMMs in a loop
  (Transformer Engine's GroupedLinear issues one cuBLAS call per expert), BF16 out against
  FP32 accumulation, and ``torch._grouped_mm`` forward for reference.
- ``step_tail``: the optimizer step's kernels on P parameters in T tensors: the gradient
  buffer's memset, the BF16 -> FP32 gradient cast, the multi-tensor L2 norm, the clip scale,
  fused AdamW, the FP32 master -> BF16 copy: GPU time (CUDA events) and host time per call.

Stored: bench/measured/h100-2026-11-27-wgrad.json and h200-2026-11-27-wgrad.json (every section but wgrad_cold), h100-2026-11-27-wgrad-cold.json (ONLY=env,wgrad_cold) (see bench/measured/README.md).
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (timing, output and section helpers)

BF, F32 = torch.bfloat16, torch.float32
TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


def dense_shapes():
    """(name, tokens m, out n, in k) of the per-GPU linears of the shipped rows."""
    rows = [("l70_tp4", 8192, ((2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168))),
            ("l405_tp8_cp2", 4096, ((2304, 16384), (16384, 2048), (13312, 16384), (16384, 6656))),
            ("g175_tp4", 2048, ((9216, 12288), (12288, 3072), (12288, 12288), (12288, 12288))),
            ("q235_tp4", 4096, ((2304, 4096), (4096, 2048)))]
    names = ("qkv", "o", "up", "down")
    return [(f"{r}_{names[i]}", m, n, k) for r, m, sh in rows for i, (n, k) in enumerate(sh)]


def expert_shapes():
    experts = (("q235_up", 3072, 4096), ("q235_down", 4096, 1536), ("dsv3_up", 4096, 7168),
               ("dsv3_down", 7168, 2048), ("grok_etp4_up", 16384, 6144), ("grok_etp4_down", 6144, 8192))
    return [(f"{e}_T{t}", t, n, k) for e, n, k in experts for t in TOKENS]


def accum_fn(mg, a, b):
    """The first of the FP32-accumulating forms this PyTorch accepts: ``mg += a @ b`` in one
    GEMM (FP32 C, beta 1), or None."""
    forms = (("addmm_out_dtype", lambda: torch.addmm(mg, a, b, out_dtype=F32, out=mg)),
             ("addmm_", lambda: mg.addmm_(a, b)),
             ("baddbmm_out_dtype", lambda: torch.baddbmm(mg[None], a[None], b[None], out_dtype=F32, out=mg[None])))
    for name, fn in forms:
        try:
            fn()
            torch.cuda.synchronize()
            return name, fn
        except Exception:  # noqa: BLE001 -- probing which form this build has
            continue
    return None, None


def graph_timed(fn, inner: int = 20) -> float:
    """GPU seconds of one call of ``fn``: ``inner`` calls captured in one CUDA graph and replayed
    (CUDA events around the replay, median of 15), so that the host's issue time (~15-20 us a
    PyTorch call) cannot bound a small GEMM's figure; eager CUDA events when capture fails."""
    try:
        replay = gm.graphed(fn, inner)
    except Exception:  # noqa: BLE001 -- fall back to eager timing
        torch.cuda.synchronize()
        return gm.timed(fn, reps=15, inner=inner)
    return gm.timed(replay, reps=15) / inner


def one_linear(name, m, n, k):
    x, dy = torch.randn(m, k, device="cuda", dtype=BF), torch.randn(m, n, device="cuda", dtype=BF)
    w = torch.randn(n, k, device="cuda", dtype=BF)
    mg = torch.zeros(n, k, device="cuda", dtype=F32)
    inner = 20 if m * n * k < 2 ** 34 else 3
    t = lambda fn: graph_timed(fn, inner)  # noqa: E731
    r = {"name": name, "m": m, "n": n, "k": k,
         "fwd_s": t(lambda: torch.mm(x, w.t())), "dgrad_s": t(lambda: torch.mm(dy, w)),
         "wgrad_bf16_s": t(lambda: torch.mm(dy.t(), x))}
    try:
        r["wgrad_fp32_out_s"] = t(lambda: torch.mm(dy.t(), x, out_dtype=F32))
    except Exception as e:  # noqa: BLE001
        r["wgrad_fp32_out_error"] = repr(e)[:200]
    form, fn = accum_fn(mg, dy.t(), x)
    r["accum_form"] = form
    if fn is not None:
        r["wgrad_fp32_accum_s"] = t(fn)
    r["wgrad_bf16_then_add_s"] = t(lambda: mg.add_(torch.mm(dy.t(), x)))
    flops = 2.0 * m * n * k
    r["wgrad_bf16_share_of_peak"] = flops / r["wgrad_bf16_s"] / gm.BF16_PEAK
    return r


@gm.section
def wgrad():
    rows = [one_linear(*s) for s in dense_shapes() + expert_shapes()]
    return {"method": "CUDA graph of 20 calls (3 at m*n*k >= 2^34) replayed between CUDA events, median of 15; "
                      "x, dy, W BF16 random; "
                      "main_grad FP32 [n, k]", "rows": rows}


@gm.section
def wgrad_cold():
    """The accumulating wgrad with its main_grad cold in L2: each call of the graph accumulates into
    the next of R main_grads (R x the C bytes >= 400 MB, 8x the 50 MB L2), as a training step's
    layers do (other work runs between two wgrads of one weight)."""
    rows = []
    cases = [s for s in expert_shapes() if s[1] in (64, 256, 1024, 4096)] + \
        [s for s in dense_shapes() if s[0].startswith(("g175", "q235_tp4"))]
    for name, m, n, k in cases:
        reps = max(2, -(-400 * 2 ** 20 // (8 * n * k)))
        x, dy = torch.randn(m, k, device="cuda", dtype=BF), torch.randn(m, n, device="cuda", dtype=BF)
        mgs = [torch.zeros(n, k, device="cuda", dtype=F32) for _ in range(reps)]
        acc = graph_timed(lambda: [torch.addmm(g, dy.t(), x, out_dtype=F32, out=g) for g in mgs], inner=1) / reps
        bf = graph_timed(lambda: [torch.mm(dy.t(), x) for _ in mgs], inner=1) / reps
        rows.append({"name": name, "m": m, "n": n, "k": k, "main_grads": reps,
                     "wgrad_fp32_accum_cold_s": acc, "wgrad_bf16_s": bf})
        del mgs
    return {"method": "one CUDA graph of R accumulating wgrads, each into its own main_grad (R x 8 n k bytes "
                      ">= 400 MB), replayed between CUDA events, median of 15, per wgrad", "rows": rows}


@gm.section
def grouped_wgrad():
    rows = []
    for e_name, n, k in (("q235_up", 3072, 4096), ("q235_down", 4096, 1536), ("dsv3_up", 4096, 7168)):
        for experts in (4, 16):
            for tok in (128, 256, 512, 1024, 2048):
                xs = [torch.randn(tok, k, device="cuda", dtype=BF) for _ in range(experts)]
                dys = [torch.randn(tok, n, device="cuda", dtype=BF) for _ in range(experts)]
                mgs = [torch.zeros(n, k, device="cuda", dtype=F32) for _ in range(experts)]
                form, _ = accum_fn(mgs[0], dys[0].t(), xs[0])
                r = {"name": f"{e_name}_E{experts}_T{tok}", "experts": experts, "tokens_per_expert": tok,
                     "n": n, "k": k, "accum_form": form,
                     "loop_bf16_s": graph_timed(lambda: [torch.mm(d.t(), x) for d, x in zip(dys, xs)], inner=5)}
                if form == "addmm_out_dtype":
                    r["loop_fp32_accum_s"] = graph_timed(lambda: [torch.addmm(g, d.t(), x, out_dtype=F32, out=g)
                                                               for g, d, x in zip(mgs, dys, xs)], inner=5)
                elif form == "addmm_":
                    r["loop_fp32_accum_s"] = graph_timed(lambda: [g.addmm_(d.t(), x) for g, d, x in zip(mgs, dys, xs)],
                                                      inner=5)
                try:
                    xa = torch.cat(xs)
                    wt = torch.randn(experts, k, n, device="cuda", dtype=BF)
                    offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * tok
                    r["grouped_mm_fwd_s"] = graph_timed(lambda: torch._grouped_mm(xa, wt, offs=offs), inner=5)
                    r["loop_fwd_s"] = graph_timed(lambda: [torch.mm(x, wt[i]) for i, x in enumerate(xs)], inner=5)
                except Exception as e:  # noqa: BLE001
                    r["grouped_error"] = repr(e)[:200]
                rows.append(r)
    return {"method": "E experts' GEMMs issued in a Python loop (one cuBLAS call each, as Transformer Engine's "
                      "GroupedLinear on Hopper), 5 loops captured in a CUDA graph and replayed, median of 15",
            "rows": rows}


def host_and_gpu(fn, reps: int = 10) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    host.sort()
    return {"gpu_s": gm.timed(fn, reps=reps, warm=1), "host_s": host[len(host) // 2]}


@gm.section
def step_tail():
    rows = []
    for params, tensors in ((2 ** 28, 64), (2 ** 28, 1024), (2 ** 30, 256)):
        size = params // tensors
        flat = torch.zeros(params, device="cuda", dtype=F32)
        grads = list(flat.view(tensors, size).unbind(0))
        gbf = [torch.randn(size, device="cuda", dtype=BF) for _ in range(tensors)]
        ps = [torch.randn(size, device="cuda", dtype=F32).requires_grad_() for _ in range(tensors)]
        for p, g in zip(ps, grads):
            p.grad = g
        pbf = [torch.empty(size, device="cuda", dtype=BF) for _ in range(tensors)]
        opt = torch.optim.AdamW(ps, lr=1e-4, fused=True)
        r = {"params": params, "tensors": tensors,
             "zero_grad_buffer": host_and_gpu(lambda: flat.zero_()),
             "grad_cast_bf16_to_fp32": host_and_gpu(lambda: torch._foreach_copy_(grads, gbf)),
             "l2norm": host_and_gpu(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))),
             "clip_scale": host_and_gpu(lambda: torch._foreach_mul_(grads, 1.0)),
             "adamw_fused": host_and_gpu(opt.step),
             "master_to_bf16": host_and_gpu(lambda: torch._foreach_copy_(pbf, ps))}
        rows.append(r)
        torch.cuda.empty_cache()
    return {"method": "PyTorch foreach / fused kernels standing for Megatron's multi_tensor_applier ones; "
                      "gpu_s CUDA events (median of 10), host_s wall of the call after a synchronize",
            "rows": rows}


if __name__ == "__main__":
    gm.main("/tmp/gpu_measure_wgrad", (("env", gm.env), ("wgrad", wgrad), ("wgrad_cold", wgrad_cold),
                                       ("grouped_wgrad", grouped_wgrad),
                                       ("step_tail", step_tail)))
