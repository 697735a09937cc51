"""Measurements the model's constants are checked against, taken on one real GPU.

Run on a machine with one NVIDIA GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure.py`` writes ``dir/measure.json`` (every figure with its
shape and method) and ``dir/trace_llama8b_4l_bf16.json.gz`` (a ``torch.profiler`` Kineto
trace of a Llama-3-8B-shaped model cut to 4 layers, BF16, ``record_shapes=True``).
Sections, each independent (one that fails records its error and the rest still run):

- ``env``: torch / CUDA / cuDNN versions, GPU name, SMs, nvidia-smi's clocks and power limit.
- ``gemm``: BF16 ``F.linear`` and FP8 ``torch._scaled_mm`` (tensor-wise scales) at square
  sizes, a K sweep at m = n = 8192, and the training shapes of Llama 3 8B / 70B / 405B
  layers (whole and TP 8 shards) in forward and weight-gradient orientation:
  seconds, TFLOP/s and share of the dense peak (sim/model/compute.py's GEMM curve).
- ``attention``: ``scaled_dot_product_attention``, causal, head dim 128, 32 heads, 16k tokens
  per call, forward and backward, flash and cuDNN backends (the attention curves).
- ``host``: eager dispatch per op, a bare CUDA launch (CuPy), a CUDA graph replay, c10d NCCL
  call costs on a world of 1, a host-GPU sync round trip (sim/model/host.py's constants).
- ``hbm``: device copy bandwidth and fused / foreach AdamW step time per parameter
  (the optimizer step's closed form, sim/parallel/step_end.py).
- ``trace``: the model's step time unprofiled and its Kineto trace (issue 33's real input).
- ``hostbound`` / ``compiled``: the same model's step at 64..8192 tokens, eager and with
  each layer under ``torch.compile``: wall, host issue time and kernels launched per step.
``ONLY=hostbound,compiled`` runs a subset.
"""

import gzip
import json
import os
import shutil
import subprocess
import time
import traceback

import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", "/tmp/gpu_measure")
BF16_PEAK, FP8_PEAK = 989e12, 1979e12  # H100/H200 SXM dense (NVIDIA H100 datasheet)
RES: dict = {}
DEV = "cuda"


def save() -> None:
    with open(os.path.join(OUT, "measure.json"), "w") as f:
        json.dump(RES, f, indent=1)


def section(fn):
    def run():
        t0 = time.perf_counter()
        try:
            RES[fn.__name__] = fn()
        except Exception:  # noqa: BLE001 -- a measurement script: keep the other sections
            RES[fn.__name__] = {"error": traceback.format_exc()[-2000:]}
        RES.setdefault("section_wall_s", {})[fn.__name__] = round(time.perf_counter() - t0, 2)
        print(fn.__name__, RES["section_wall_s"][fn.__name__], "s", flush=True)
        save()
    return run


def timed(fn, reps: int = 10, warm: int = 3, inner: int = 1) -> float:
    """Median GPU seconds of one call of ``fn`` (CUDA events around ``inner`` calls)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / inner)
    times.sort()
    return times[len(times) // 2]


def graphed(fn, inner: int = 1):
    """``inner`` calls of ``fn`` captured once in a CUDA graph (after warm-ups on a side stream);
    returns the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return graph.replay


@section
def env():
    p = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                          "power.limit,memory.total", "--format=csv"], capture_output=True, text=True).stdout
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": p.name, "sms": p.multi_processor_count, "memory_bytes": p.total_memory, "nvidia_smi": smi,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def gemm_shapes():
    shapes = [("square", n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [("ksweep", 8192, 8192, k) for k in (128, 256, 512, 1024, 2048, 4096, 8192)]
    layers = {"8b": (4096, 6144, 4096, 28672, 14336), "70b": (8192, 10240, 8192, 57344, 28672),
              "405b": (16384, 18432, 16384, 106496, 53248)}
    for name, (h, qkv, o_in, up, down_in) in layers.items():
        for tp in (1, 8):
            if name == "8b" and tp == 8:
                continue
            for t in (4096, 8192):
                for what, n, k in (("qkv", qkv // tp, h), ("o", h, o_in // tp), ("up", up // tp, h),
                                   ("down", h, down_in // tp)):
                    shapes.append((f"{name}_tp{tp}_{what}_fwd_T{t}", t, n, k))
                    if t == 8192:
                        shapes.append((f"{name}_tp{tp}_{what}_wgrad_T{t}", k, n, t))
    return shapes


@section
def gemm():
    rows = []
    one = torch.ones((), device=DEV, dtype=torch.float32)
    for label, m, n, k in gemm_shapes():
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        inner = max(1, int(2e11 // flops))
        t = timed(lambda: F.linear(x, w), reps=7, inner=min(inner, 50))
        row = {"shape": label, "m": m, "n": n, "k": k, "min_dim": min(m, n, k), "bf16_s": t,
               "bf16_tflops": flops / t / 1e12, "bf16_share_of_peak": flops / t / BF16_PEAK}
        try:
            xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            tf = timed(lambda: torch._scaled_mm(xf, wf.t(), one, one, out_dtype=torch.bfloat16), reps=7,
                       inner=min(inner * 2, 100))
            row.update(fp8_s=tf, fp8_tflops=flops / tf / 1e12, fp8_share_of_peak=flops / tf / FP8_PEAK)
        except Exception as e:  # noqa: BLE001
            row["fp8_error"] = repr(e)[:200]
        rows.append(row)
        del x, w
    return {"method": "F.linear(x[m,k], w[n,k]) BF16 and torch._scaled_mm FP8 e4m3 tensor-wise scales, "
                      "random normal data, median of 7 CUDA-event timings after 3 warm-ups",
            "peaks": {"bf16": BF16_PEAK, "fp8": FP8_PEAK}, "rows": rows}


@section
def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    heads, dim, tokens = 32, 128, 16384
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            b = max(1, tokens // seq)
            q, k, v = (torch.randn(b, heads, seq, dim, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(b, heads, seq, dim, device=DEV, dtype=torch.bfloat16)
            fwd_flops = 4.0 * b * heads * seq * seq * dim / 2  # causal: half the score matrix
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    tf = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps=7)

                    def both():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(o, (q, k, v), g)
                    tb = timed(both, reps=7) - tf
                rows.append({"backend": backend, "seq": seq, "batch": b, "heads": heads, "head_dim": dim,
                             "fwd_s": tf, "bwd_s": tb, "fwd_share_of_peak": fwd_flops / tf / BF16_PEAK,
                             "bwd_share_of_peak": 2.5 * fwd_flops / tb / BF16_PEAK})
            except Exception as e:  # noqa: BLE001
                rows.append({"backend": backend, "seq": seq, "error": repr(e)[:300]})
    return {"method": "F.scaled_dot_product_attention(q,k,v,is_causal=True) BF16 [b,32,s,128], 16k tokens; "
                      "causal FLOPs 4*b*h*s^2*d/2 forward, 2.5x that backward (FlashAttention-3 paper's count); "
                      "backward = time(forward+grad) - time(forward)", "rows": rows}


def host_wall(fn, n: int) -> tuple[float, float]:
    """Host seconds per call while issuing ``n`` calls, and wall seconds per call to finish."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n, (time.perf_counter() - t0) / n


@section
def host():
    out = {}
    x = torch.zeros(1, device=DEV)
    for _ in range(1000):
        x.add_(1)
    out["eager_add_inplace"] = dict(zip(("host_s", "wall_s"), host_wall(lambda: x.add_(1), 20000)))
    y = torch.zeros(1024, 1024, device=DEV, dtype=torch.bfloat16)
    w = torch.zeros(1024, 1024, device=DEV, dtype=torch.bfloat16)
    out["eager_linear_1k"] = dict(zip(("host_s", "wall_s"), host_wall(lambda: F.linear(y, w), 5000)))
    try:
        import cupy
        kern = cupy.RawKernel('extern "C" __global__ void k() {}', "k")
        for _ in range(100):
            kern((1,), (1,), ())
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(20000):
            kern((1,), (1,), ())
        t1 = time.perf_counter()
        cupy.cuda.Device().synchronize()
        out["cupy_empty_kernel"] = {"host_s": (t1 - t0) / 20000, "wall_s": (time.perf_counter() - t0) / 20000}
    except Exception as e:  # noqa: BLE001
        out["cupy_empty_kernel"] = {"error": repr(e)[:300]}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(100):
            x.add_(1)
    host_s, wall_s = host_wall(graph.replay, 500)
    out["cuda_graph_100_adds"] = {"host_s_per_replay": host_s, "wall_s_per_replay": wall_s,
                                  "gpu_s_per_kernel": wall_s / 100}
    out["sync_round_trip"] = dict(zip(("host_s", "wall_s"), host_wall(lambda: x.add_(1).item(), 2000)))
    out["method"] = ("host_s: perf_counter seconds per call while issuing (GPU not waited for); wall_s: "
                     "per call including the final synchronize; tiny kernels so the host is the bottleneck")
    return out


@section
def nccl():
    """c10d + NCCL host cost per call on a world of one GPU (run last: the only section that
    starts a process group)."""
    import torch.distributed as dist
    try:
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1,
                                device_id=torch.device(DEV, 0))
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)[:300]}
    t = torch.ones(1024, device=DEV)
    big = torch.ones(64 << 20, device=DEV, dtype=torch.bfloat16)
    out_rs = torch.empty(1024, device=DEV)
    calls = {"all_reduce_4KiB": lambda: dist.all_reduce(t), "all_reduce_128MiB": lambda: dist.all_reduce(big),
             "reduce_scatter_4KiB": lambda: dist.reduce_scatter_tensor(out_rs, t),
             "all_to_all_4KiB": lambda: dist.all_to_all_single(out_rs, t)}
    res = {"note": "world size 1: the c10d + NCCL host path per call; no data moves between GPUs"}
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        res[name] = dict(zip(("host_s", "wall_s"), host_wall(fn, 2000 if "4KiB" in name else 200)))
    dist.destroy_process_group()
    return res


@section
def hbm():
    out = {}
    a = torch.empty(2 << 30, device=DEV, dtype=torch.uint8)
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), reps=10)
    out["copy_2GiB"] = {"s": t, "bytes_moved": 2 * a.numel(), "bytes_per_s": 2 * a.numel() / t}
    del a, b
    for label, dtype, fused in (("adamw_fused_fp32", torch.float32, True), ("adamw_foreach_fp32", torch.float32, False),
                                ("adamw_fused_bf16", torch.bfloat16, True)):
        params = [torch.zeros(4 << 20, device=DEV, dtype=dtype, requires_grad=True) for _ in range(64)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, fused=fused, foreach=None if fused else True)
        n = sum(p.numel() for p in params)
        t = timed(opt.step, reps=10)
        elem = params[0].element_size()
        out[label] = {"params": n, "s": t, "s_per_param": t / n, "bytes_model": 7 * elem * n,
                      "bytes_per_s_if_7_tensors": 7 * elem * n / t,
                      "note": "reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq"}
        del params, opt
        torch.cuda.empty_cache()
    return out


class Layer(torch.nn.Module):
    """A Llama 3 decoder layer (RMSNorm, GQA attention with RoPE, SwiGLU MLP)."""

    def __init__(self, h=4096, heads=32, kv=8, ffn=14336):
        super().__init__()
        self.h, self.heads, self.kv, self.hd = h, heads, kv, h // heads
        self.n1, self.n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.qkv = torch.nn.Linear(h, h + 2 * kv * self.hd, bias=False)
        self.o = torch.nn.Linear(h, h, bias=False)
        self.w13 = torch.nn.Linear(h, 2 * ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([self.h, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, self.h))
        g, u = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


def rope_tables(s: int):
    """RoPE's cos and sin for ``s`` positions (Llama 3's theta 500,000, head dim 128), BF16."""
    pos = torch.arange(s, device=DEV, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device=DEV, dtype=torch.float32) / 128))
    ang = torch.outer(pos, inv)
    return ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Model(torch.nn.Module):
    def __init__(self, layers=4, vocab=128256, h=4096):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.layers = torch.nn.ModuleList(Layer(h) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(h)
        self.head = torch.nn.Linear(h, vocab, bias=False)

    def forward(self, tokens, cos, sin):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


TRACE_SETUP = {"model": "Llama-3-8B shape cut to 4 layers: hidden 4096, 32 heads, 8 KV heads, FFN 14336 "
                        "(SwiGLU), vocab 128256, untied embedding and head, RMSNorm, RoPE",
               "batch": 2, "seq": 4096, "dtype": "bf16 parameters, gradients and AdamW states (no master copy)",
               "optimizer": "torch.optim.AdamW(fused=True)", "parallel": "one GPU, no collectives",
               "attention": "F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), default backend",
               "profiler": "torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True, "
                           "schedule(wait=1, warmup=2, active=3)): 3 ProfilerSteps traced"}


@section
def trace():
    torch.manual_seed(0)
    b, s, h = TRACE_SETUP["batch"], TRACE_SETUP["seq"], 4096
    with torch.device(DEV):
        model = Model().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    tokens = torch.randint(0, 128256, (b, s), device=DEV)
    labels = torch.randint(0, 128256, (b, s), device=DEV)
    cos, sin = rope_tables(s)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(tokens, cos, sin)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    walls.sort()
    params = sum(p.numel() for p in model.parameters())
    from torch.profiler import ProfilerActivity, profile, schedule
    raw = os.path.join(OUT, "trace_llama8b_4l_bf16.json")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=1, warmup=2, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for _ in range(6):
            step()
            prof.step()
    torch.cuda.synchronize()
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    return {**TRACE_SETUP, "params": params, "step_s_median_unprofiled": walls[len(walls) // 2],
            "step_s_all": walls, "trace_file": os.path.basename(raw) + ".gz",
            "trace_bytes_gz": os.path.getsize(raw + ".gz"),
            "params_layers": sum(p.numel() for p in model.layers.parameters()),
            "params_embedding": model.emb.weight.numel(), "params_head": model.head.weight.numel()}


def small_model_step(model, opt, b: int, s: int):
    """One training step of ``model`` on ``b`` x ``s`` random tokens (its inputs made once)."""
    tokens = torch.randint(0, 128256, (b, s), device=DEV)
    cos, sin = rope_tables(s)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(tokens, cos, sin)
        F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tokens.view(-1)).backward()
        opt.step()
    return step


def step_figures(step, reps: int = 10) -> dict:
    """Median wall seconds of a step, the host seconds to issue it (GPU not waited for), and
    the kernels it launches (one profiled step)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    walls.sort()
    hosts.sort()
    return {"wall_s": walls[reps // 2], "host_issue_s": hosts[reps // 2], "gpu_events": kernels}


@section
def hostbound():
    """The 4-layer model's step from host-bound (short sequences) to GPU-bound, eager."""
    torch.manual_seed(0)
    with torch.device(DEV):
        model = Model().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    rows = [{"batch": 1, "seq": s, **step_figures(small_model_step(model, opt, 1, s))}
            for s in (64, 256, 1024, 4096, 8192)]
    return {"model": TRACE_SETUP["model"], "method": "eager PyTorch; wall: step incl. synchronize; "
            "host_issue_s: until the step's Python returns; gpu_events: CUDA kernels+memcpy+memset "
            "of one profiled step", "rows": rows}


@section
def compiled():
    """The same steps with each decoder layer under torch.compile (inductor, default mode)."""
    torch.manual_seed(0)
    with torch.device(DEV):
        model = Model().to(torch.bfloat16)
    for i, layer in enumerate(model.layers):
        model.layers[i] = torch.compile(layer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    t0 = time.perf_counter()
    rows = []
    for s in (64, 1024, 4096):
        rows.append({"batch": 1, "seq": s, **step_figures(small_model_step(model, opt, 1, s))})
    return {"method": "torch.compile per decoder layer (dynamic=None), otherwise as hostbound",
            "rows": rows, "wall_incl_compile_s": time.perf_counter() - t0}


def main(default_out: str, sections: tuple) -> None:
    """Run the ``(name, section)`` pairs (``ONLY=a,b`` picks some) into ``$OUT/measure.json``
    (``default_out`` without ``OUT``), TF32 off; print each section's wall seconds."""
    global OUT
    OUT = os.environ.get("OUT", default_out)
    os.makedirs(OUT, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    only = set(os.environ.get("ONLY", "").split(",")) - {""}
    t0 = time.perf_counter()
    for name, fn in sections:
        if not only or name in only:
            fn()
    print("total", round(time.perf_counter() - t0, 1), "s", json.dumps(RES.get("section_wall_s")))


if __name__ == "__main__":
    main("/tmp/gpu_measure", (("env", env), ("trace", trace), ("host", host), ("gemm", gemm),
                              ("attention", attention), ("hbm", hbm), ("hostbound", hostbound),
                              ("compiled", compiled), ("nccl", nccl)))
