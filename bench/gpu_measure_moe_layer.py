"""What one rank's MoE decoder layer of a published layout costs on one GPU, communication left out.

Run on a machine with one NVIDIA Hopper GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_moe_layer.py`` writes ``dir/measure.json`` (``ONLY=a,b`` runs
a subset). It reuses ``bench/gpu_measure.py``'s timing (CUDA events, median) and measures what
the MoE validation rows (DeepSeek-V3 on 1,024 H100: tp 2, ep 64; Qwen3-235B-A22B: tp 2, ep 32;
Grok-1: tp 4, expert tp 4, ep 8) run on each GPU:

- ``layer_gemms``: every GEMM of one rank's decoder layer at its per-rank shape (MLA's down and
  up projections, GQA's fused QKV, the output projection, the router, the shared expert, the
  local experts as ``torch._grouped_mm``), forward, input-gradient and weight-gradient
  orientation, BF16 (``F.linear``) and FP8 tensor-wise (``torch._scaled_mm``).
- ``attention``: causal SDPA at MLA's head dims (q/k 192, v 128: DeepSeek-V3's
  ``qk_nope_head_dim`` 128 + ``qk_rope_head_dim`` 64, ``v_head_dim`` 128) against head dim 128,
  on each backend PyTorch offers (flash needs equal dims: v padded to 192, as Megatron-Core
  does for FlashAttention), 64 heads (128 / tp 2), 4,096 and 8,192 tokens.
- ``layers``: the whole layer forward + backward (eager PyTorch, the all-gathers,
  reduce-scatters and all-to-alls replaced by the local copies of the same sizes, so the
  expert GEMMs see the tokens an EP rank receives on average), CUDA-event time, kernel count
  and the profiler's device time per kernel class (GEMM, attention, other); in BF16 and with
  the dense linears in FP8 (tensor-wise dynamic; the grouped expert GEMMs stay BF16), with
  ``torch._grouped_mm`` and with a loop of per-expert GEMMs (Megatron's SequentialMLP).
- ``compiled_layers``: the same under ``torch.compile`` (elementwise work and FP8 casts fused).

Each row says its shape; nothing is fitted here. Stored: bench/measured/ (README there).
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (timing, output and section helpers)

DEV = gm.DEV
E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # torch.finfo(float8_e4m3fn / float8_e5m2).max

# Per-rank layer shapes of the published layouts (model configs: DeepSeek-V3 config.json,
# Qwen3-235B-A22B config.json, Grok-1 model card; layouts: sim/data/modern_runs.csv rows).
#   tokens: a TP region's tokens (sequence after the SP all-gather); sp = tokens / tp.
LAYOUTS = {
    "dsv3_tp2_ep64": dict(h=7168, attn="mla", heads=64, q_rank=1536, kv_rank=512, nope=128, rope=64, v=128,
                          tokens=4096, tp=2, experts=4, per_expert=4096, ffn=2048, topk=8, n_experts=256,
                          shared=1024, etp=1),
    "qwen3_tp2_ep32": dict(h=4096, attn="gqa", heads=32, kv_heads=2, hd=128, tokens=4096, tp=2, experts=4,
                           per_expert=4096, ffn=1536, topk=8, n_experts=128, shared=0, etp=1),
    "grok1_tp4_etp4_ep8": dict(h=6144, attn="gqa", heads=12, kv_heads=2, hd=128, tokens=4096, tp=4, experts=1,
                               per_expert=8192, ffn=8192, topk=2, n_experts=8, shared=0, etp=4),
}


def linear_shapes(name: str, d: dict) -> list[tuple[str, int, int, int]]:
    """(label, m, n, k) of the dense linears of one rank's layer, forward orientation."""
    t, h = d["tokens"], d["h"]
    if d["attn"] == "mla":
        hd = d["nope"] + d["rope"]
        out = [("q_down", t, d["q_rank"], h), ("q_up", t, d["heads"] * hd, d["q_rank"]),
               ("kv_down", t, d["kv_rank"] + d["rope"], h), ("kv_up", t, d["heads"] * (d["nope"] + d["v"]), d["kv_rank"]),
               ("o", t, h, d["heads"] * d["v"])]
    else:
        out = [("qkv", t, (d["heads"] + 2 * d["kv_heads"]) * d["hd"], h), ("o", t, h, d["heads"] * d["hd"])]
    out.append(("router", t // d["tp"], d["n_experts"], h))
    if d["shared"]:
        out += [("shared_up", t, 2 * d["shared"], h), ("shared_down", t, h, d["shared"])]
    if d["experts"] == 1:
        out += [("expert_up", d["per_expert"], 2 * d["ffn"], h), ("expert_down", d["per_expert"], h, d["ffn"])]
    return [(f"{name}_{what}", m, n, k) for what, m, n, k in out]


def gemm_row(label, m, n, k, one):
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
    flops = 2.0 * m * n * k
    t = gm.timed(lambda: F.linear(x, w), reps=7)
    row = {"shape": label, "m": m, "n": n, "k": k, "min_dim": min(m, n, k), "bf16_s": t,
           "bf16_share_of_peak": flops / t / gm.BF16_PEAK}
    try:
        xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        tf = gm.timed(lambda: torch._scaled_mm(xf, wf.t(), one, one, out_dtype=torch.bfloat16), reps=7)
        row.update(fp8_s=tf, fp8_share_of_peak=flops / tf / gm.FP8_PEAK)
    except Exception as e:  # noqa: BLE001
        row["fp8_error"] = repr(e)[:200]
    return row


def grouped_rows(name, d):
    """The local experts' three grouped GEMMs (gate+up forward, its input gradient, its
    weight gradient; down is the same shapes transposed) as torch._grouped_mm."""
    e, tpe, h, f = d["experts"], d["per_expert"], d["h"], d["ffn"]
    x = torch.randn(e * tpe, h, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(e, 2 * f, h, device=DEV, dtype=torch.bfloat16) * 0.02
    g = torch.randn(e * tpe, 2 * f, device=DEV, dtype=torch.bfloat16)
    offs = torch.arange(1, e + 1, device=DEV, dtype=torch.int32) * tpe
    flops = 2.0 * e * tpe * h * 2 * f
    rows = []
    for what, fn in (("fwd", lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs)),
                     ("dgrad", lambda: torch._grouped_mm(g, w, offs=offs)),
                     ("wgrad", lambda: torch._grouped_mm(g.t(), x, offs=offs))):
        row = {"shape": f"{name}_experts_up_{what}", "experts": e, "tokens_per_expert": tpe, "h": h,
               "out": 2 * f, "flops": flops}
        try:
            row["bf16_s"] = gm.timed(fn, reps=7)
            row["bf16_share_of_peak"] = flops / row["bf16_s"] / gm.BF16_PEAK
        except Exception as ex:  # noqa: BLE001
            row["error"] = repr(ex)[:300]
        rows.append(row)
    return rows


@gm.section
def layer_gemms():
    one = torch.ones((), device=DEV, dtype=torch.float32)
    rows = []
    for name, d in LAYOUTS.items():
        for label, m, n, k in linear_shapes(name, d):
            rows.append(gemm_row(label + "_fwd", m, n, k, one))
            rows.append(gemm_row(label + "_dgrad", m, k, n, one))
            rows.append(gemm_row(label + "_wgrad", n, k, m, one))
        if d["experts"] > 1:
            rows += grouped_rows(name, d)
        torch.cuda.empty_cache()
    return {"method": "F.linear(x[m,k], w[n,k]) BF16 and torch._scaled_mm FP8 e4m3 tensor-wise; "
                      "dgrad = (m, k, n), wgrad = (n, k, m) of the forward (m, n, k); grouped: "
                      "torch._grouped_mm over the local experts; median of 7 CUDA-event timings",
            "layouts": LAYOUTS, "rows": rows}


@gm.section
def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    heads = 64
    for seq in (4096, 8192):
        for dqk, dv in ((192, 128), (128, 128)):
            q, k = (torch.randn(1, heads, seq, dqk, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
            v = torch.randn(1, heads, seq, dv, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(1, heads, seq, dv, device=DEV, dtype=torch.bfloat16)
            flops = 2.0 * heads * seq * seq * (dqk + dv) / 2  # causal: QK^T and PV over half the scores
            for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
                pad = backend == "FLASH_ATTENTION" and dv != dqk
                row = {"backend": backend, "seq": seq, "heads": heads, "qk_dim": dqk, "v_dim": dv,
                       "v_padded_to_qk": pad, "fwd_flops": flops}

                def fwd():
                    vv = F.pad(v, (0, dqk - dv)) if pad else v
                    o = F.scaled_dot_product_attention(q, k, vv, is_causal=True)
                    return o[..., :dv] if pad else o

                def both():
                    torch.autograd.grad(fwd(), (q, k, v), g)
                try:
                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        row["fwd_s"] = gm.timed(fwd, reps=7)
                        row["bwd_s"] = gm.timed(both, reps=7) - row["fwd_s"]
                    row["fwd_share_of_peak"] = flops / row["fwd_s"] / gm.BF16_PEAK
                    row["bwd_share_of_peak"] = 2.5 * flops / row["bwd_s"] / gm.BF16_PEAK
                except Exception as e:  # noqa: BLE001
                    row["error"] = repr(e)[:300]
                rows.append(row)
            del q, k, v, g
    return {"method": "F.scaled_dot_product_attention(is_causal=True), BF16, batch 1; FLOPs 2*h*s^2*(dqk+dv)/2 "
                      "forward, 2.5x backward; backward = time(forward+grad) - time(forward)", "rows": rows}


def fp8_linear(x, w):
    """Tensor-wise dynamic FP8 linear (bench/gpu_measure_fp8_moe.py Float8Linear), any leading dims."""
    import gpu_measure_fp8_moe as f8
    return f8.Float8Linear.apply(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)


class RankLayer(torch.nn.Module):
    """One rank's decoder layer of a LAYOUTS entry: norm, SP gather (a copy), attention (MLA or
    GQA) on the rank's heads, output projection, reduce-scatter (a slice), norm, router,
    permute, the EP rank's local experts on the tokens it receives on average, un-permute,
    shared expert."""

    def __init__(self, d: dict, fp8: bool = False):
        super().__init__()
        self.d, self.fp8, self.grouped = d, fp8, True
        h = d["h"]
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, device=DEV, dtype=torch.bfloat16) * 0.02)  # noqa: E731
        self.n1, self.n2 = torch.nn.RMSNorm(h, device=DEV, dtype=torch.bfloat16), torch.nn.RMSNorm(h, device=DEV, dtype=torch.bfloat16)
        self.w = torch.nn.ParameterDict()
        for what, _m, n, k in linear_shapes("", d):
            self.w[what.lstrip("_")] = p(n, k)
        if d["experts"] > 1:
            self.w["experts_up"] = p(d["experts"], 2 * d["ffn"], h)
            self.w["experts_down"] = p(d["experts"], h, d["ffn"])
        if d["attn"] == "mla":
            self.qn = torch.nn.RMSNorm(d["q_rank"], device=DEV, dtype=torch.bfloat16)
            self.kvn = torch.nn.RMSNorm(d["kv_rank"], device=DEV, dtype=torch.bfloat16)

    def lin(self, x, name):
        w = self.w[name]
        return fp8_linear(x, w) if self.fp8 and name != "router" else F.linear(x, w)

    def attention(self, x):
        d, t = self.d, x.shape[0]
        if d["attn"] == "mla":
            hd, nope, rope, dv = d["nope"] + d["rope"], d["nope"], d["rope"], d["v"]
            q = self.lin(self.qn(self.lin(x, "q_down")), "q_up").view(t, d["heads"], hd)
            kv_a = self.lin(x, "kv_down")
            kv = self.lin(self.kvn(kv_a[:, :d["kv_rank"]]), "kv_up").view(t, d["heads"], nope + dv)
            k_rope = kv_a[:, d["kv_rank"]:].unsqueeze(1).expand(t, d["heads"], rope)
            k = torch.cat((kv[..., :nope], k_rope), dim=-1)
            v = F.pad(kv[..., nope:], (0, hd - dv))
            o = F.scaled_dot_product_attention(*(z.transpose(0, 1).unsqueeze(0) for z in (q, k, v)), is_causal=True)
            o = o[..., :dv].squeeze(0).transpose(0, 1).reshape(t, d["heads"] * dv)
        else:
            hq, hk, hd = d["heads"], d["kv_heads"], d["hd"]
            q, k, v = self.lin(x, "qkv").split([hq * hd, hk * hd, hk * hd], dim=-1)
            q, k, v = (z.view(t, -1, hd).transpose(0, 1).unsqueeze(0) for z in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            o = o.squeeze(0).transpose(0, 1).reshape(t, hq * hd)
        return self.lin(o, "o")

    def experts(self, x):
        d = self.d
        if d["experts"] == 1:
            gate, up = self.lin(x, "expert_up").chunk(2, dim=-1)
            return self.lin(F.silu(gate) * up, "expert_down")
        if not self.grouped:  # Megatron's SequentialMLP: one GEMM per local expert
            outs = []
            for i, c in enumerate(x.split(d["per_expert"])):
                gate, up = F.linear(c, self.w["experts_up"][i]).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, self.w["experts_down"][i]))
            return torch.cat(outs)
        offs = torch.arange(1, d["experts"] + 1, device=DEV, dtype=torch.int32) * d["per_expert"]
        gate, up = torch._grouped_mm(x, self.w["experts_up"].transpose(1, 2), offs=offs).chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(gate) * up, self.w["experts_down"].transpose(1, 2), offs=offs)

    def forward(self, x_sp):
        d = self.d
        tp, sp = d["tp"], x_sp.shape[0]
        # SP all-gather as a copy, reduce-scatter as this rank's block (unflatten + index: inductor's
        # pattern matcher failed on a slice of a repeat, torch 2.11)
        x = x_sp + self.attention(self.n1(x_sp).repeat(tp, 1)).unflatten(0, (tp, sp))[0]
        y = self.n2(x)
        scores = F.linear(y.float(), self.w["router"].float()).sigmoid()
        probs, idx = scores.topk(d["topk"], dim=-1)
        order = idx.flatten().argsort(stable=True)
        src = order // d["topk"]
        routed = y.index_select(0, src)  # permute: topk copies of each token
        received = routed.repeat(d["etp"], 1)  # an expert-tp group's gather; EP all-to-all: same count
        perm = torch.randperm(received.shape[0], device=DEV)
        out = self.experts(received.index_select(0, perm))  # sorted by local expert
        out = out.index_select(0, perm.argsort()).unflatten(0, (d["etp"], -1))[0]
        w = probs.flatten().index_select(0, order).unsqueeze(1).to(out.dtype)
        moe = torch.zeros_like(y).index_add(0, src, out * w)  # un-permute, weighted
        if d["shared"]:
            yy = y.repeat(tp, 1)
            gate, up = self.lin(yy, "shared_up").chunk(2, dim=-1)
            moe = moe + self.lin(F.silu(gate) * up, "shared_down").unflatten(0, (tp, sp))[0]
        return x + moe


def kernel_classes(prof) -> dict:
    """Device seconds and counts per kernel class, and the 25 largest kernels by name."""
    classes: dict = {}
    names: dict = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        n = e.name.lower()
        c = ("attention" if any(s in n for s in ("flash", "fmha", "cudnn", "attention")) else
             "gemm" if any(s in n for s in ("gemm", "cutlass", "xmma", "nvjet", "matmul", "sm90", "grouped")) else
             "other")
        s = e.device_time_total * 1e-6
        cls = classes.setdefault(c, {"s": 0.0, "kernels": 0})
        cls["s"] += s
        cls["kernels"] += 1
        nm = names.setdefault(e.name[:120], {"s": 0.0, "n": 0})
        nm["s"] += s
        nm["n"] += 1
    top = sorted(names.items(), key=lambda kv: -kv[1]["s"])[:25]
    return {"classes": classes, "top": [{"name": k, **v} for k, v in top]}


def layer_row(name, d, fp8, grouped=True, compiled=False, trace=None):
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    layer = RankLayer(d, fp8=fp8)
    layer.grouped = grouped
    if compiled:
        layer = torch.compile(layer, dynamic=False)
    x = torch.randn(d["tokens"] // d["tp"], d["h"], device=DEV, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    fwd = lambda: layer(x)  # noqa: E731

    def step():
        layer(x).backward(g)
    t0 = time.perf_counter()
    step()
    row = {"layout": name, "fp8_linears": fp8, "grouped_mm": grouped and d["experts"] > 1, "compiled": compiled,
           "first_call_s": time.perf_counter() - t0, "fwd_s": gm.timed(fwd, reps=7), "fwd_bwd_s": gm.timed(step, reps=7)}
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if trace else [])
    with profile(activities=acts, record_shapes=bool(trace)) as prof:
        step()
        torch.cuda.synchronize()
    row.update(kernel_classes(prof))
    if trace:  # a Kineto trace of one forward + backward (calibration material), gzipped
        import gzip
        import shutil
        raw = os.path.join(gm.OUT, trace)
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb", compresslevel=9) as z:
            shutil.copyfileobj(f, z)
        os.remove(raw)
        row["trace_file"] = trace + ".gz"
    row["kernels"] = sum(c["kernels"] for c in row["classes"].values())
    del layer, x, g
    torch.cuda.empty_cache()
    return row


@gm.section
def layers():
    rows = []
    for name, d in LAYOUTS.items():
        for fp8 in (False, True):
            for grouped in ((True, False) if d["experts"] > 1 else (True,)):
                try:
                    trace = f"trace_{name}_bf16.json" if not fp8 and grouped else None
                    rows.append(layer_row(name, d, fp8, grouped, trace=trace))
                except Exception as e:  # noqa: BLE001
                    rows.append({"layout": name, "fp8_linears": fp8, "grouped_mm": grouped, "error": repr(e)[:400]})
    return {"method": "RankLayer forward and forward+backward (eager; gradients of x and every weight), median "
                      "of 7 CUDA-event timings; one profiled forward+backward for the kernel classes; SDPA's "
                      "default backend; communication replaced by local copies of the same sizes", "rows": rows}


@gm.section
def compiled_layers():
    """The layers under torch.compile (fused elementwise work and FP8 casts, as torchtitan runs
    them); skipped past 240 s of script time (a device run has a budget). Inductor's pattern
    matcher is off: with it on, torch 2.11's inductor failed on every one of these layers
    ("Not all inputs to pattern found in match.kwargs ... slice_shape"); fusion is unaffected."""
    import torch._inductor.config as inductor_config
    inductor_config.pattern_matcher = False
    rows = []
    for name, d in LAYOUTS.items():
        for fp8 in (False, True):
            if time.perf_counter() - T0 > 240:
                rows.append({"layout": name, "fp8_linears": fp8, "skipped": "time budget"})
                continue
            try:
                rows.append(layer_row(name, d, fp8, compiled=True))
            except Exception as e:  # noqa: BLE001
                rows.append({"layout": name, "fp8_linears": fp8, "compiled": True, "error": repr(e)[:400]})
                torch._dynamo.reset()
    return {"method": "torch.compile(RankLayer, dynamic=False), otherwise as layers", "rows": rows}


T0 = time.perf_counter()

if __name__ == "__main__":
    gm.main("/tmp/gpu_measure_moe_layer", (("env", gm.env), ("layer_gemms", layer_gemms), ("attention", attention),
                                        ("layers", layers), ("compiled_layers", compiled_layers)))
