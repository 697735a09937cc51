"""What the simulator charges for one FP8 training linear against what one H100 measured.

Run: ``python bench/measured_fp8.py`` (reads bench/measured/h100-2026-11-26-fp8-moe.json,
written by bench/gpu_measure_fp8_moe.py on the GPU; no GPU needed here). For each measured
``fp8_linear`` shape (m tokens, k -> n features: the Llama 3 8B/70B/405B layers at 8,192
tokens, whole and as TP-8 shards) it builds the linear's kernels with the layer builder's
own function, :func:`sim.model.layers.linear` (the forward list and
:func:`sim.model.layers.backward` of it), and times them with the ``h100-sxm`` preset's
:class:`sim.model.compute.ComputeModel`:

- BF16: the forward, dgrad and wgrad GEMMs;
- FP8 as torchao runs it (``training.fp8_recipe = "torchao"``: the measured recipe, compiled):
  the casts of x, w and the output gradient (:data:`sim.model.quant.TORCHAO_CAST_BYTES`) and
  the three FP8 GEMMs;

and prints the BF16 / FP8 time ratio the simulator gives beside the measured one (the
compiled column), at the preset (the sustained factor slows the GEMMs, not the casts, as in a
simulated step) and at kernel level (sustained factor 1, as the benchmark ran). Transformer
Engine's recipe (``"te"``: casts fused with transposes and norms, weights cast once per step,
here once per linear) is printed for comparison; it was not measured at these shapes.

Then Transformer Engine's delayed-scaling recipe as bench/measured/h100-2026-11-27-te-fp8.json
measured it (``te_linear``, bench/gpu_measure_te_fp8.py: the per-GPU linears of the three NeMo
FP8 rows, GPT-3 175B tp 4 and Grok-1's expert): per shape the measured BF16 / FP8 time of one
micro-batch's linear (the two casts and three GEMMs replayed as a CUDA graph: the GPU's own
time; the weight's once-per-step cast apart, as the model charges it with the optimizer) and of
its GEMMs alone, beside the model's (``training.fp8_recipe = "te"``: :func:`sim.model.layers.linear`
and its backward) at the preset and at kernel level, and the model's casts over the measured ones.

Then a whole step: the 4-layer Llama-3-8B-shaped model of bench/measured/
h100-2026-11-26-fp8-step.json (one H100, BF16 and torchao FP8 decoder linears, both under
torch.compile) simulated as a 1-GPU scenario of the same shape, its BF16 / FP8 step ratio
beside the measured one.

tests/test_measured.py checks that bench/measured/README.md quotes what this prints and that
the simulated ratio stays within 10% of the measured one at the whole 70B/405B layer shapes.
"""

import json
import statistics
from pathlib import Path

from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import GEMM_KERNEL, ComputeModel
from sim.model.layers import Shard, backward, linear
from sim.model.optimizer import optimizer
from sim.step import simulate

HERE = Path(__file__).parent / "measured"
MEASURED = json.loads((HERE / "h100-2026-11-26-fp8-moe.json").read_text())
TE = json.loads((HERE / "h100-2026-11-27-te-fp8.json").read_text())
STEP = json.loads((HERE / "h100-2026-11-26-fp8-step.json").read_text())["fp8_step"]
STEP_MODEL = {"layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256,
              "mlp": "swiglu"}  # (STEP["model"]: untied embedding and head)
GPU = "h100-sxm"


def shard(m: int, recipe: str | None) -> Shard:
    """One micro-batch of ``m`` tokens on one GPU (no TP: the shapes already are the shards)."""
    if recipe is None:
        return Shard(m, m, 1, 1, False, True)
    return Shard(m, m, 1, 1, False, True, fp8=True, quant="fp8", recipe=recipe)


def linear_s(cm: ComputeModel, m: int, n: int, k: int, recipe: str | None) -> float:
    """Seconds of one linear's forward, dgrad and wgrad with their casts, as the layer builder
    lists them; under Transformer Engine also the weight's once-per-step cast (the optimizer's
    kernel: one micro-batch here)."""
    fwd = linear(m, n, k, shard(m, recipe))
    extra = optimizer(0.0, n * k)[1:] if recipe == "te" else []
    return cm.time(fwd) + cm.time(backward(fwd)) + cm.time(extra)


def rows() -> list[dict]:
    """Per measured shape: the measured ratio and the simulated ones."""
    gpu = gpu_preset(GPU)
    models = {"preset": ComputeModel(gpu), "kernel": ComputeModel(gpu, e_max=GEMM_KERNEL[GPU]["bf16"])}
    out = []
    for r in MEASURED["fp8_linear"]["rows"]:
        m, n, k = r["m"], r["n"], r["k"]
        row = {"shape": r["shape"], "m": m, "n": n, "k": k, "measured": r["fp8_compiled_speedup"]}
        for name, cm in models.items():
            bf16 = linear_s(cm, m, n, k, None)
            row[name] = bf16 / linear_s(cm, m, n, k, "torchao")
            row[name + "_te"] = bf16 / linear_s(cm, m, n, k, "te")
        out.append(row)
    return out


def te_row(cms: dict, r: dict) -> dict:
    """One ``te_linear`` shape: measured and simulated BF16 / FP8 ratios, and the casts' time."""
    m, n, k = r["m"], r["n"], r["k"]
    out = {"shape": r["shape"], "m": m, "n": n, "k": k, "measured": r["bf16_s"] / r["te_micro_batch_graph_s"],
           "measured_gemm": r["gemm_only_speedup"]}
    for name, cm in cms.items():
        bf16, fp8 = linear(m, n, k, shard(m, None)), linear(m, n, k, shard(m, "te"))
        gemms = [x for x in fp8 if x.flops]
        both = cm.time(bf16) + cm.time(backward(bf16))
        out[name] = both / (cm.time(fp8) + cm.time(backward(fp8)))
        out[name + "_gemm"] = both / (cm.time(gemms) + cm.time(backward(gemms)))
        casts = [x for x in fp8 if not x.flops]
        out[name + "_casts"] = (cm.time(casts) + cm.time(backward(casts))) / \
            (r["cast_transpose_x_graph_s"] + r["cast_transpose_g_graph_s"])
    return out


def te_rows() -> list[dict]:
    gpu = gpu_preset(GPU)
    cms = {"preset": ComputeModel(gpu), "kernel": ComputeModel(gpu, e_max=GEMM_KERNEL[GPU]["bf16"])}
    return [te_row(cms, r) for r in TE["te_linear"]["rows"]]


def te_lines() -> list[str]:
    env = TE["env"]
    out = [f"Transformer Engine's delayed-scaling recipe, {env['gpu']}, {env['date_utc'][:10]} "
           f"(bench/measured/h100-2026-11-27-te-fp8.json, te_linear) vs the {GPU} preset, training.fp8_recipe = \"te\"",
           "BF16 / FP8 time of one micro-batch's linear (casts + 3 GEMMs, CUDA graph), and of its GEMMs alone",
           "  shape                            m      n      k   measured  simulated (miss)  kernel-level (miss)"
           "   GEMMs: measured  kernel-level (miss)   casts: model / measured"]
    table = te_rows()
    for r in table:
        out.append(f"  {r['shape']:28s} {r['m']:6d} {r['n']:6d} {r['k']:6d}   {r['measured']:6.2f}   "
                   f"{r['preset']:6.2f} ({r['preset'] / r['measured'] - 1:+6.1%})   "
                   f"{r['kernel']:6.2f} ({r['kernel'] / r['measured'] - 1:+6.1%})          "
                   f"{r['measured_gemm']:6.2f}  {r['kernel_gemm']:6.2f} ({r['kernel_gemm'] / r['measured_gemm'] - 1:+6.1%})"
                   f"          {r['kernel_casts']:5.2f}")
    for label, keep in (("NeMo FP8 rows' attention and MLP linears", lambda r: not r["shape"].startswith(("g175", "grok_expert"))),
                        ("every shape", lambda r: True)):
        chosen = [r for r in table if keep(r)]
        out.append(f"  {label} ({len(chosen)}): measured median {statistics.median(r['measured'] for r in chosen):.2f}, "
                   f"simulated {statistics.median(r['preset'] for r in chosen):.2f}, kernel-level "
                   f"{statistics.median(r['kernel'] for r in chosen):.2f}; GEMMs alone measured "
                   f"{statistics.median(r['measured_gemm'] for r in chosen):.2f}, kernel-level "
                   f"{statistics.median(r['kernel_gemm'] for r in chosen):.2f} (mean |miss| "
                   f"{statistics.mean(abs(r['kernel_gemm'] / r['measured_gemm'] - 1) for r in chosen):.1%})")
    return out


def whole_layer(row: dict) -> bool:
    """The 70B / 405B layers' linears whole (tp 1): the shapes the 10% check covers."""
    return row["shape"].split("_")[0] in ("70b", "405b") and "_tp1_" in row["shape"]


def step_s(precision: str, seq: int, batch: int) -> float:
    """The simulated step of the measured 4-layer model on one H100, compiled."""
    training = {"seq_len": seq, "global_batch": batch, "micro_batch": batch, "precision": precision, "compile": True}
    if precision == "fp8":
        training["fp8_recipe"] = "torchao"
    return simulate(scenario_from_dict({"name": "fp8-step", "model": STEP_MODEL, "training": training,
                                        "cluster": {"topology": "dgx-h100", "gpus": 1, "gpu": GPU},
                                        "parallel": {"dp": 1, "gradient_accumulation_fusion": False}})).summary["step_time_s"]


def step_rows() -> list[dict]:
    """Per measured shape (batch x seq): measured and simulated BF16 / FP8 step ratios, compiled."""
    wall = {(r["precision"], r["batch"], r["seq"]): r["wall_s"] for r in STEP["rows"] if r["compiled"]}
    return [{"batch": b, "seq": s, "measured": wall[("bf16", b, s)] / wall[("fp8", b, s)],
             "simulated": step_s("bf16", s, b) / step_s("fp8", s, b)}
            for (p, b, s) in sorted(wall) if p == "bf16"]


def step_lines() -> list[str]:
    out = ["Whole step, 4-layer Llama-3-8B shape, compiled (h100-2026-11-26-fp8-step.json): BF16 / FP8 step time"]
    for r in step_rows():
        out.append(f"  {r['batch']} x {r['seq']} tokens: measured {r['measured']:.3f}, simulated {r['simulated']:.3f} "
                   f"({r['simulated'] / r['measured'] - 1:+.1%})")
    return out


def report() -> str:
    env = MEASURED["env"]
    out = [f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date_utc'][:10]} "
           f"(bench/measured/h100-2026-11-26-fp8-moe.json, fp8_linear) vs clustersim's {GPU} preset",
           "BF16 / FP8 time of one linear's forward + dgrad + wgrad (FP8: torchao tensor-wise, compiled)",
           "  shape              m      n      k   measured  simulated (miss)  kernel-level (miss)   TE recipe"]
    table = rows()
    for r in table:
        out.append(f"  {r['shape']:15s} {r['m']:5d} {r['n']:6d} {r['k']:6d}   {r['measured']:6.2f}   "
                   f"{r['preset']:6.2f} ({r['preset'] / r['measured'] - 1:+6.1%})   "
                   f"{r['kernel']:6.2f} ({r['kernel'] / r['measured'] - 1:+6.1%})   {r['preset_te']:6.2f}")
    for label, keep in (("70B/405B whole layers", whole_layer), ("every shape", lambda r: True)):
        chosen = [r for r in table if keep(r)]
        misses = [r["preset"] / r["measured"] - 1 for r in chosen]
        out.append(f"  {label} ({len(chosen)}): measured median {statistics.median(r['measured'] for r in chosen):.2f}, "
                   f"simulated median {statistics.median(r['preset'] for r in chosen):.2f}, "
                   f"worst miss {max(misses, key=abs):+.1%}")
    return "\n".join(out + step_lines() + te_lines()) + "\n"


if __name__ == "__main__":
    print(report(), end="")
