"""Megatron-Core's unfused token permutation and un-permutation, timed on one GPU.

Run on a machine with one NVIDIA GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_permute.py`` writes ``dir/measure.json``. It runs the
token dispatcher's memory passes as Megatron-Core writes them without ``moe_permute_fusion``
(NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_utils.py): ``permute`` -- the routing
map transposed, ``argsort`` of it, ``tokens.index_select(0, sorted_indices)`` (its backward is
PyTorch's ``index_add_``, atomic adds) -- and ``unpermute`` -- the probabilities
``masked_select``-ed into the permuted order, multiplied in, ``scatter_add_`` back to the
tokens (atomic adds) -- forward and backward through autograd, at the per-rank shapes of the
MoE validation rows (bench/gpu_measure_moe_layer.py's LAYOUTS: DeepSeek-V3 tp 2 -- 2,048
tokens of 7,168, top 8 of 256 -- Qwen3-235B-A22B tp 2 -- 2,048 of 4,096, top 8 of 128 --
Grok-1 tp 4 -- 1,024 of 6,144, top 2 of 8), every expert receiving the same count. The
probabilities are fp32 where NeMo sets ``moe_router_dtype = 'fp32'`` (DeepSeek-V3; Qwen3 taken
the same) and BF16 for Grok-1 (NeMo 24.12's default): fp32 probabilities promote the permuted
tokens to fp32 before the scatter (moe_utils.py's own comment).

``timings``: per layout, CUDA-event medians (9 repetitions of 5 calls after 3 warm-ups) of the
forward and of forward + backward (the routing map's argsort included, as Megatron runs it), of
the ``scatter_add_`` alone and of the ``index_add_`` alone; ``profile``: five profiled forward +
backward passes after 3 warm-ups, the device seconds per pass and per kernel (the CUDA-event
times of the first section include host gaps where the kernels are short). Stored:
bench/measured/h200-2026-11-26-permute.json (README there).
"""

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (the CUDA-event timing every measurement script shares)

DEV = "cuda"
# layout: (tokens a rank routes, hidden, top-k, experts, probabilities' dtype)
SHAPES = {"dsv3": (2048, 7168, 8, 256, torch.float32), "qwen3": (2048, 4096, 8, 128, torch.float32),
          "grok1": (1024, 6144, 2, 8, torch.bfloat16)}


def timed(fn) -> float:
    """Median seconds of one call: bench/gpu_measure.py's timing, 9 repeats of 5 calls each."""
    return gm.timed(fn, reps=9, inner=5)


def sorted_indices(rm, n: int, k: int):
    """moe_utils.permute's order: argsort of the transposed routing map, token ids."""
    return rm.T.contiguous().reshape(-1).argsort(descending=True, stable=True)[:n * k] % n


def layer(n: int, h: int, k: int, e: int, pd):
    """Inputs (even loads) and the forward (permute, weigh, scatter-add back) as Megatron-Core runs
    them unfused; the backward through autograd to the tokens and the probabilities."""
    x = torch.randn(n, h, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    chosen = (torch.arange(n, device=DEV).unsqueeze(1) * k + torch.arange(k, device=DEV)) % e
    rm = torch.zeros(n, e, device=DEV, dtype=torch.bool).scatter_(1, chosen, True)
    probs = (torch.rand(n, e, device=DEV, dtype=pd) * rm).requires_grad_(True)
    g = torch.randn(n, h, device=DEV, dtype=torch.bfloat16)

    def fwd():
        i = sorted_indices(rm, n, k)
        p = x.index_select(0, i) * probs.T.contiguous().masked_select(rm.T.contiguous()).unsqueeze(-1)
        out = torch.zeros((n, h), dtype=p.dtype, device=DEV)
        out.scatter_add_(0, i.unsqueeze(1).expand(-1, h), p)
        return out.to(torch.bfloat16)

    def both():
        torch.autograd.grad(fwd(), (x, probs), g)
    return x, rm, fwd, both


def timings() -> list[dict]:
    rows = []
    for name, (n, h, k, e, pd) in SHAPES.items():
        x, rm, fwd, both = layer(n, h, k, e, pd)
        i = sorted_indices(rm, n, k)
        p = x.detach().index_select(0, i)
        pw, out, expanded = p.to(pd), torch.zeros((n, h), dtype=pd, device=DEV), i.unsqueeze(1).expand(-1, h)
        rows.append(dict(layout=name, tokens=n, h=h, topk=k, experts=e, probs=str(pd), fwd_s=timed(fwd),
                         fwd_bwd_s=timed(both),
                         scatter_add_s=timed(lambda: out.zero_().scatter_add_(0, expanded, pw)),
                         index_add_s=timed(lambda: torch.zeros_like(p[:n]).index_add_(0, i, p))))
    return rows


def profiled() -> list[dict]:
    rows = []
    for name, (n, h, k, e, pd) in SHAPES.items():
        both = layer(n, h, k, e, pd)[3]
        for _ in range(3):
            both()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                both()
            torch.cuda.synchronize()
        kernels: dict = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                v = kernels.setdefault(ev.name[:90], [0.0, 0])
                v[0] += ev.device_time_total * 1e-6 / 5
                v[1] += 1
        rows.append(dict(layout=name, device_fwd_bwd_s=sum(v[0] for v in kernels.values()),
                         kernels=sorted(([kn, v[0], v[1] // 5] for kn, v in kernels.items()), key=lambda z: -z[1])))
    return rows


if __name__ == "__main__":
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "timings": timings(), "profile": profiled()}
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "permute.json"), "w") as f:
        json.dump(out, f, indent=1)
