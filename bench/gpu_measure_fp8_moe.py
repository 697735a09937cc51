"""What a quantized linear layer and a MoE expert layer really cost on one GPU.

Run on a machine with one NVIDIA Hopper/Blackwell GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_fp8_moe.py`` writes ``dir/measure.json``. It reuses
``bench/gpu_measure.py``'s timing (CUDA events, median) and adds two sections:

- ``fp8_linear``: one linear layer's training work (forward ``y = x w^T``, input gradient
  ``g w``, weight gradient ``g^T x``) in BF16 against the FP8 recipe torchao's ``Float8Linear``
  runs with dynamic tensor-wise scaling (torchao ``float8/float8_linear.py``: amax of x, w and
  the output gradient, scale, cast to e4m3 / e5m2, the transposed copies ``_scaled_mm``
  needs for the two backward GEMMs, three scaled GEMMs), eager and under ``torch.compile``
  (which fuses the amax and cast kernels, as torchtitan runs it). At the Llama 3 8B / 70B /
  405B layer shapes, 8,192 tokens, whole and as TP-8 shards: the BF16 / FP8 time ratio is
  the speed-up a run sees from FP8 linears, casts included.
- ``moe``: the expert layer of DeepSeek-V3 (hidden 7168, expert FFN 2048), Qwen3-235B-A22B
  (4096, 1536) and Mixtral 8x22B (6144, 16384): ``torch._grouped_mm`` over E local experts
  (Megatron-Core's GroupedMLP / TE grouped GEMM do the same on Hopper) at 64-16,384 tokens
  per expert, against one dense GEMM of the same total FLOPs and a Python loop of per-expert
  GEMMs (Megatron's SequentialMLP); and the token permutation (gather of ``topk`` copies of
  each token) and un-permutation (weighted scatter-add back), as bytes per second.
- ``fp8_step``: the 4-layer Llama-3-8B-shaped model of ``bench/gpu_measure.py`` (its
  ``trace`` setup) trained a step at a time with every decoder-layer linear in BF16 or in the
  FP8 recipe above (an autograd Function: forward casts x and w to e4m3, backward casts the
  output gradient to e5m2; the output head stays BF16, as torchtitan's float8 converter
  leaves ``output``), eager and with each layer under ``torch.compile``: the whole step's
  BF16 / FP8 ratio at 2 x 4,096 and 1 x 8,192 tokens.
- ``nccl_more``: c10d's host cost of an all-gather and a broadcast call (world of one), the two
  kinds ``bench/gpu_measure.py``'s ``nccl`` section left out.
``ONLY=moe`` runs a subset.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (timing, output and section helpers)

DEV = gm.DEV
E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # torch.finfo(float8_e4m3fn / float8_e5m2).max


def linear_shapes():
    """(label, tokens, out features n, in features k) of Llama 3 layers (gm.gemm_shapes)."""
    layers = {"8b": (4096, 6144, 4096, 28672, 14336), "70b": (8192, 10240, 8192, 57344, 28672),
              "405b": (16384, 18432, 16384, 106496, 53248)}
    out = []
    for name, (h, qkv, o_in, up, down_in) in layers.items():
        for tp in ((1,) if name == "8b" else (1, 8)):
            for what, n, k in (("qkv", qkv // tp, h), ("o", h, o_in // tp), ("up", up // tp, h),
                               ("down", h, down_in // tp)):
                out.append((f"{name}_tp{tp}_{what}", 8192, n, k))
    return out


def bf16_train(x, w, g):
    return F.linear(x, w), g @ w, g.t() @ x


def cast(t, fmax, dtype):
    """Dynamic tensor-wise scaling: amax, scale, saturated cast (torchao float8_utils)."""
    scale = fmax / t.abs().amax().float().clamp(min=1e-12)
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


def fp8_train(x, w, g):
    """torchao Float8Linear, tensor-wise dynamic: forward e4m3 x e4m3, backward e5m2 x e4m3."""
    x8, sx = cast(x, E4M3_MAX, torch.float8_e4m3fn)
    w8, sw = cast(w, E4M3_MAX, torch.float8_e4m3fn)
    g8, sg = cast(g, E5M2_MAX, torch.float8_e5m2)
    y = torch._scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.bfloat16)
    gx = torch._scaled_mm(g8, w8.t().contiguous().t(), sg, sw, out_dtype=torch.bfloat16)
    gw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), sg, sx, out_dtype=torch.bfloat16)
    return y, gx, gw


@gm.section
def fp8_linear():
    for knob in ("cache_size_limit", "recompile_limit"):  # one compile per shape, none falls back to eager
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    compiled = torch.compile(fp8_train, dynamic=False)
    rows = []
    for label, m, n, k in linear_shapes():
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02
        g = torch.randn(m, n, device=DEV, dtype=torch.bfloat16) * 1e-3
        flops = 6.0 * m * n * k
        row = {"shape": label, "m": m, "n": n, "k": k, "flops": flops,
               "bf16_s": gm.timed(lambda: bf16_train(x, w, g), reps=7)}
        row["fp8_eager_s"] = gm.timed(lambda: fp8_train(x, w, g), reps=7)
        try:
            row["fp8_compiled_s"] = gm.timed(lambda: compiled(x, w, g), reps=7)
        except Exception as e:  # noqa: BLE001
            row["compile_error"] = repr(e)[:300]
        for key in ("fp8_eager_s", "fp8_compiled_s"):
            if key in row:
                row[key.replace("_s", "_speedup")] = row["bf16_s"] / row[key]
        row["bf16_share_of_peak"] = flops / row["bf16_s"] / gm.BF16_PEAK
        rows.append(row)
        del x, w, g
    torch.cuda.empty_cache()
    return {"method": "one linear's forward + input-gradient + weight-gradient GEMMs; FP8 = torchao "
                      "Float8Linear tensor-wise dynamic recipe written out (amax, scale, cast, transposed "
                      "copies, torch._scaled_mm), eager and torch.compile(fp8_train); median of 7 CUDA-event "
                      "timings after 3 warm-ups", "rows": rows}


class Float8Linear(torch.autograd.Function):
    """fp8_train as autograd sees it: x and w cast in forward (kept in e4m3 for backward)."""

    @staticmethod
    def forward(ctx, x, w):
        x8, sx = cast(x, E4M3_MAX, torch.float8_e4m3fn)
        w8, sw = cast(w, E4M3_MAX, torch.float8_e4m3fn)
        ctx.save_for_backward(x8, sx, w8, sw)
        return torch._scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, g):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = cast(g, E5M2_MAX, torch.float8_e5m2)
        gx = torch._scaled_mm(g8, w8.t().contiguous().t(), sg, sw, out_dtype=torch.bfloat16)
        gw = torch._scaled_mm(g8.t().contiguous(), x8.t().contiguous().t(), sg, sx, out_dtype=torch.bfloat16)
        return gx, gw


class Fp8Linear(torch.nn.Linear):
    def forward(self, x):
        return Float8Linear.apply(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


def fp8_model(model):
    for layer in model.layers:
        for name in ("qkv", "o", "w13", "w2"):
            lin = getattr(layer, name)
            new = Fp8Linear(lin.in_features, lin.out_features, bias=False, device=DEV, dtype=torch.bfloat16)
            new.weight = lin.weight
            setattr(layer, name, new)
    return model


@gm.section
def fp8_step():
    rows = []
    for precision in ("bf16", "fp8"):
        for compiled in (False, True):
            torch.manual_seed(0)
            with torch.device(DEV):
                model = gm.Model().to(torch.bfloat16)
            if precision == "fp8":
                fp8_model(model)
            if compiled:
                for i, layer in enumerate(model.layers):
                    model.layers[i] = torch.compile(layer)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
            for b, seq in ((2, 4096), (1, 8192)):
                try:
                    fig = gm.step_figures(gm.small_model_step(model, opt, b, seq))
                except Exception as e:  # noqa: BLE001
                    fig = {"error": repr(e)[:300]}
                rows.append({"precision": precision, "compiled": compiled, "batch": b, "seq": seq, **fig})
            del model, opt
            torch.cuda.empty_cache()
    return {"model": gm.TRACE_SETUP["model"], "method": "as bench/gpu_measure.py hostbound/compiled; FP8: "
            "Float8Linear (tensor-wise dynamic, e4m3 forward / e5m2 gradients) on qkv, o, w13, w2 of every "
            "layer; embedding and head BF16", "rows": rows}


@gm.section
def nccl_more():
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29534", rank=0, world_size=1,
                            device_id=torch.device(DEV, 0))
    t = torch.ones(1024, device=DEV)
    out = torch.empty(1024, device=DEV)
    res = {"note": "world size 1: the c10d + NCCL host path per call; no data moves between GPUs"}
    for name, fn in (("all_gather_4KiB", lambda: dist.all_gather_into_tensor(out, t)),
                     ("broadcast_4KiB", lambda: dist.broadcast(t, 0)),
                     ("all_reduce_4KiB", lambda: dist.all_reduce(t))):
        for _ in range(50):
            fn()
        res[name] = dict(zip(("host_s", "wall_s"), gm.host_wall(fn, 2000)))
    dist.destroy_process_group()
    return res


MOE = {"dsv3": (7168, 2048), "qwen3_235b": (4096, 1536), "mixtral_8x22b": (6144, 16384)}


def grouped_rows(name, h, f, experts, tpe):
    """The gate+up GEMM of ``experts`` local experts, ``tpe`` tokens each (the largest of the
    expert layer's three GEMMs in FLOPs; down is its transpose)."""
    x = torch.randn(experts * tpe, h, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(experts, h, 2 * f, device=DEV, dtype=torch.bfloat16) * 0.02
    wt = w.transpose(1, 2).contiguous()
    offs = torch.arange(1, experts + 1, device=DEV, dtype=torch.int32) * tpe
    dense = torch.randn(2 * f, h, device=DEV, dtype=torch.bfloat16)
    flops = 2.0 * experts * tpe * h * 2 * f
    row = {"model": name, "experts": experts, "tokens_per_expert": tpe, "hidden": h, "ffn": f,
           "flops": flops, "dense_s": gm.timed(lambda: F.linear(x, dense), reps=7)}
    for label, b in (("grouped_s", wt.transpose(1, 2)), ("grouped_rowmajor_s", w)):
        try:  # torchtitan's GroupedExperts: torch._grouped_mm(x, w1.transpose(-2, -1), offs=offsets)
            row[label] = gm.timed(lambda: torch._grouped_mm(x, b, offs=offs, out_dtype=torch.bfloat16), reps=7)
        except Exception as e:  # noqa: BLE001
            row[label.replace("_s", "_error")] = repr(e)[:300]
    chunks = x.split(tpe)
    row["loop_s"] = gm.timed(lambda: [F.linear(c, wt[i]) for i, c in enumerate(chunks)], reps=7)
    for key in ("dense_s", "grouped_s", "grouped_rowmajor_s", "loop_s"):
        if key in row:
            row[key.replace("_s", "_share_of_peak")] = flops / row[key] / gm.BF16_PEAK
    return row


def permute_row(h, tokens, topk, experts):
    x = torch.randn(tokens, h, device=DEV, dtype=torch.bfloat16)
    idx = torch.randint(0, experts, (tokens, topk), device=DEV)
    order = idx.flatten().argsort(stable=True)
    src = order // topk
    probs = torch.rand(tokens * topk, 1, device=DEV, dtype=torch.bfloat16)
    y = x.index_select(0, src)
    out = torch.zeros_like(x)
    t_perm = gm.timed(lambda: x.index_select(0, src), reps=10)
    t_sort = gm.timed(lambda: idx.flatten().argsort(stable=True), reps=10)
    t_unperm = gm.timed(lambda: out.zero_().index_add_(0, src, y * probs), reps=10)
    moved = tokens * topk * h * 2
    return {"hidden": h, "tokens": tokens, "topk": topk, "experts": experts, "bytes_copied": 2 * moved,
            "permute_s": t_perm, "permute_bytes_per_s": 2 * moved / t_perm, "argsort_s": t_sort,
            "unpermute_s": t_unperm, "unpermute_bytes_per_s": 4 * moved / t_unperm,
            "note": "permute reads and writes topk copies (2 x tokens x topk x hidden x 2 B); unpermute "
                    "reads them, scales, and adds into the output (counted as 4 x that)"}


@gm.section
def moe():
    rows = []
    for name, (h, f) in MOE.items():
        for experts in ((4, 8, 32) if name != "mixtral_8x22b" else (1, 2, 4)):
            for tpe in (64, 256, 1024, 4096, 16384):
                if experts * tpe * max(h, 2 * f) * 2 > 6 << 30:
                    continue
                rows.append(grouped_rows(name, h, f, experts, tpe))
                torch.cuda.empty_cache()
    perm = [permute_row(h, 8192, topk, e) for h, topk, e in ((7168, 8, 256), (4096, 8, 128), (6144, 2, 8))]
    return {"method": "torch._grouped_mm(x[E*t, h], w[E, h, 2f], offs) BF16 vs F.linear of the same FLOPs "
                      "(one [E*t, h] x [h, 2f] GEMM) vs a loop of E F.linear; median of 7 CUDA-event timings",
            "grouped": rows, "permute": perm}


if __name__ == "__main__":
    gm.main("/tmp/gpu_measure_fp8_moe", (("env", gm.env), ("fp8_linear", fp8_linear), ("moe", moe), ("fp8_step", fp8_step),
                                       ("nccl_more", nccl_more)))
