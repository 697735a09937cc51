"""What the simulator charges for one rank's MoE decoder layer against what one GPU measured.

Run: ``python bench/measured_moe.py`` (reads bench/measured/h100-2026-11-26-moe-layer.json
and h200-2026-11-26-moe-layer.json, written by bench/gpu_measure_moe_layer.py; no GPU
needed here). For each measured layer (DeepSeek-V3 at tp 2 / ep 64, Qwen3-235B-A22B at tp 2 /
ep 32, Grok-1 at tp 4 / expert tp 4 / ep 8: the per-rank shapes of the MoE validation rows) it
builds the same rank's layer with the simulator's own rank-program builder -- the forward and
backward :class:`sim.parallel.passes.Pass` over one MoE layer, as
:mod:`sim.parallel.layer_program` does -- records the kernels of every compute op it times,
and prints the forward + backward compute per kernel class:

- GEMM: every kernel with FLOPs but attention's (BF16 and FP8 linears, the router's gating
  GEMM, the experts);
- attention: the flash-attention core (forward and backward kernels);
- other: every memory-bound kernel (norms, residuals, the router's scores and top-k, the
  token permutation and un-permutation, the re-sort by local expert, the gated activation,
  FP8 casts), each with its launch.

Two columns per class: ``kernel`` (the fitted sustained factor divided out -- sustained 1,
as the benchmark ran its kernels back to back, bench/measured_fp8.py's "kernel-level") and
``sim`` (the preset, as a simulated step runs them). The measured columns are the compiled
layers' profiler device time per class and their CUDA-event forward + backward wall time
(``compiled_layers``: Inductor fuses the elementwise chains as the real stacks' fused
kernels do; the eager rows run every elementwise op apart and are no stand-in for NeMo).

The scenarios: DeepSeek-V3 and Grok-1 are the validation rows dg-dsv3-1024, dg-grok-2048 and
dg-grok-fp8-2048 (sim/data/modern_runs.csv), Qwen3-235B-A22B the ``qwen3-235b-a22b`` preset at
tp 2 / ep 32 with sequence parallelism (no shipped row); every one with recompute off and
TP-communication overlap off (the measurement has neither: no recomputation, no
communication), uniform routing where the row does not pad to a capacity (the measured
experts receive the average EP load), each GPU's preset (h100-sxm, h200). Then Grok-1's
FP8 / BF16 speed-up of the whole layer, measured compiled against the simulator's with the
row's recipe (Transformer Engine) and with torchao's (the measured recipe: tensor-wise
dynamic casts fused by torch.compile).

Beside the layers: MLA's attention alone (the file's ``attention`` section, cuDNN at q/k 192,
v 128, not padded -- the layer itself pads v to 192), each GEMM alone (``layer_gemms``) against
the curve, and Megatron-Core's unfused permutation and un-permutation (h200-2026-11-26-permute.json,
bench/gpu_measure_permute.py) against :func:`sim.model.moe_kernels.permute` and ``unpermute``.

tests/test_measured_moe.py checks that bench/measured/README.md quotes what this prints.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import GEMM_KERNEL, ComputeModel, gemm
from sim.model.host import fused
from sim.model.layers import backward
from sim.model.moe_kernels import permute, unpermute
from sim.model.transformer import dims
from sim.parallel import layer_program as lp
from sim.parallel.passes import Pass
from sim.parallel.pp_zero_bubble import Kind as StepKind
from sim.parallel.program import RankBuilder
from sim.studies.validation import modern_rows

HERE = Path(__file__).parent / "measured"
FILES = {"h100-sxm": "h100-2026-11-26-moe-layer.json", "h200": "h200-2026-11-26-moe-layer.json"}
CLASSES = ("gemm", "attention", "other")
QWEN3 = {"name": "qwen3-235b tp2 ep32", "model": {"preset": "qwen3-235b-a22b"},
         "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1},
         "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 64},
         "parallel": {"tp": 2, "pp": 2, "dp": 16, "ep": 32, "expert_tp": 1, "sequence_parallel": True}}
# The measured Grok-1 layer attends its own 4,096 tokens (no context parallelism) on SDPA's
# default backend (cuDNN: the trace's cudnn_generated_fort_native_sdpa kernels); the rows run cp 2
# over 8,192 and FlashAttention-2: compared at the measured shape, the same tokens per rank.
GROK_AS_MEASURED = {"training": {"seq_len": 4096, "attention_backend": "cudnn"}, "parallel": {"cp": 1, "dp": 64}}
# measured layout -> (validation row or scenario, FP8 linears, overrides)
LAYOUTS = (("dsv3_tp2_ep64", "dg-dsv3-1024", False, {}), ("qwen3_tp2_ep32", QWEN3, False, {}),
           ("grok1_tp4_etp4_ep8", "dg-grok-2048", False, GROK_AS_MEASURED),
           ("grok1_tp4_etp4_ep8", "dg-grok-fp8-2048", True, GROK_AS_MEASURED))
# PyTorch's index_add_ kernel (atomic adds): the measured un-permutation and index_select's backward
SCATTER = "indexFuncLargeIndex"
MEASURED_LAYOUTS = ("dsv3_tp2_ep64", "qwen3_tp2_ep32", "grok1_tp4_etp4_ep8")


class KernelRecorder(RankBuilder):
    """A RankBuilder that keeps the kernels of every compute op it times (as timed: fused
    when the scenario compiles)."""

    def __init__(self, ctx, rank: int):
        super().__init__(ctx, rank)
        self.timed: list[tuple] = []

    def compute(self, name, kernels, deps=(), layer=-1, mb=-1, stream="compute", weights=True, loads=None) -> int:
        index = super().compute(name, kernels, deps, layer, mb, stream, weights, loads)
        self.timed.append(tuple(fused(kernels) if self.compiled else kernels))
        return index


def kind(k) -> str:
    """The class of a kernel: attention, gemm (FLOPs on tensor cores) or other (memory-bound)."""
    return "attention" if k.attn else "gemm" if k.flops else "other"


def scenario(source, gpu: str, overrides: dict, **training) -> dict:
    """The row's (or the given) scenario on ``gpu`` with ``overrides`` (section -> keys),
    recompute, TP-comm overlap and gradient-accumulation fusion off, the permutation and RoPE fused, uniform routing unless
    padded to a capacity."""
    data = next(r.scenario for r in modern_rows() if r.id == source) if isinstance(source, str) else source
    data = json.loads(json.dumps(data))
    for section, keys in overrides.items():
        data[section].update(keys)
    data["cluster"]["gpu"] = gpu
    # RoPE fused: the measured layers ran under torch.compile, whose Inductor fuses it (the row's
    # own unfused Megatron-Core RoPE, training.rope_fusion = false, is no part of the measurement)
    data["training"].update(recompute="none", rope_fusion=True, **training)
    # The FP8 row's NeMo fp8_params (Transformer Engine's FP8 weights) is memory only, and refused
    # under torchao's recipe (the measured one): no part of a layer's time
    data["training"].pop("fp8_params", None)
    data["parallel"]["tp_comm_overlap"] = False
    # The table splits the measured layers' own PyTorch scatter-adds out (``scatter``) and sets
    # the rest against the model's fused permutation; the unfused charge (the Grok-1 rows'
    # default) is compared on its own, in permute_lines.
    data["parallel"]["moe_permute_fusion"] = True
    # The measured layers' weight gradients are plain autograd ones (BF16 out, no main_grad):
    # the model's accumulation into main_grad (Megatron's default) is no part of the measurement
    data["parallel"]["gradient_accumulation_fusion"] = False
    moe = data["model"].setdefault("moe", {})
    if moe.get("routing") != "token_drop":
        moe["routing"] = "uniform"
    return data


def layer_kernels(data: dict) -> tuple[list[tuple], float, ComputeModel]:
    """The kernels of one MoE layer's forward and backward on the busiest rank (one tuple per
    compute op), the builder's own compute seconds of them, and its compute model."""
    s = scenario_from_dict(data)
    ctx = lp.context(s, s.cluster.gpu)
    layer = lp.representative(ctx.dims, lp.Kind.MOE)
    b = KernelRecorder(ctx, lp.busiest_rank(ctx, layer))
    mb = 1 if ctx.micro_batches > 1 else 0
    forward = Pass(b, [layer], mb, (), StepKind.F, param_waits={})
    forward.run()
    Pass(b, [layer], mb, forward.x, StepKind.B, sync=None, last_mb=False).run()
    built = sum(op.duration for op in b.program.ops if op.comm is None)
    return b.timed, built, ctx.compute


def per_class(ops: list[tuple], cm: ComputeModel) -> dict:
    """Seconds per kernel class (each kernel with its launches), and the attention's forward
    and backward kernels apart (``attention_fwd``, ``attention_bwd``)."""
    out = dict.fromkeys(CLASSES + ("attention_fwd", "attention_bwd"), 0.0)
    for kernels in ops:
        for k in kernels:
            out[kind(k)] += cm.time((k,))
            if k.attn:
                out[("attention_fwd", "attention_bwd")[k.attn - 1]] += cm.time((k,))
    return out


@dataclass
class Layer:
    """One measured layer against the simulator's."""

    gpu: str
    layout: str
    fp8: bool
    measured: dict  # class -> seconds (compiled, profiler device time)
    scatter: float  # of measured["other"]: the index_add_ kernels (SCATTER), seconds
    wall: float  # compiled forward + backward, CUDA events
    kernel: dict  # class -> seconds, sustained factor 1
    sim: dict  # class -> seconds, the preset
    built: float  # the builder's own compute seconds (== sum(sim))


def measured_row(gpu: str, layout: str, fp8: bool) -> dict:
    rows = json.loads((HERE / FILES[gpu]).read_text())["compiled_layers"]["rows"]
    return next(r for r in rows if r["layout"] == layout and r["fp8_linears"] == fp8)


def layer(gpu: str, layout: str, source, fp8: bool, overrides: dict, **training) -> Layer:
    m = measured_row(gpu, layout, fp8)
    data = scenario(source, gpu, overrides, **training)
    ops, built, cm = layer_kernels(data)
    t = data["training"]
    kernel_cm = ComputeModel(cm.gpu, e_max=GEMM_KERNEL[gpu]["bf16"], attention=t.get("attention_backend"),
                             precision=t.get("precision", "bf16"))
    scatter = sum(t["s"] for t in m["top"] if t["name"].startswith("void at::native::" + SCATTER))
    return Layer(gpu, layout, fp8, {c: m["classes"].get(c, {"s": 0.0})["s"] for c in CLASSES}, scatter,
                 m["fwd_bwd_s"], per_class(ops, kernel_cm), per_class(ops, cm), built)


def layers() -> list[Layer]:
    return [layer(gpu, name, source, fp8, extra) for gpu in FILES for name, source, fp8, extra in LAYOUTS]


def total(classes: dict) -> float:
    """Seconds over the three classes."""
    return sum(classes[c] for c in CLASSES)


def fp8_ratios(gpu: str = "h100-sxm") -> dict:
    """Grok-1's layer BF16 / FP8: measured compiled (CUDA-event wall time and profiler device
    time) and simulated (kernel level and preset; Transformer Engine's recipe and torchao's,
    compiled), all at the measured shape."""
    b, f = (layer(gpu, "grok1_tp4_etp4_ep8", row, fp8, GROK_AS_MEASURED)
            for row, fp8 in (("dg-grok-2048", False), ("dg-grok-fp8-2048", True)))
    out = {"wall": b.wall / f.wall, "device": total(b.measured) / total(f.measured)}
    for recipe, extra in (("te", {}), ("torchao", {"fp8_recipe": "torchao", "compile": True})):
        other = layer(gpu, "grok1_tp4_etp4_ep8", "dg-grok-fp8-2048", True, GROK_AS_MEASURED, **extra)
        out[recipe] = {col: total(getattr(b, col)) / total(getattr(other, col)) for col in ("kernel", "sim")}
    return out


def attention_micro(gpu: str) -> dict:
    """The attention section's cuDNN row at MLA's head dims (q/k 192, v 128, 4,096 tokens, 64
    heads, v not padded): forward and backward seconds."""
    rows = json.loads((HERE / FILES[gpu]).read_text())["attention"]["rows"]
    r = next(r for r in rows if r["backend"] == "CUDNN_ATTENTION" and r["seq"] == 4096 and r["qk_dim"] == 192)
    return {"fwd": r["fwd_s"], "bwd": r["bwd_s"]}


def gemm_misses(gpu: str) -> dict:
    """Per measured layout and precision: (measured seconds, kernel-level seconds, the two worst
    shapes' (label, miss)) over the ``layer_gemms`` rows -- each GEMM alone at its per-rank shape
    (forward, dgrad, wgrad orientations), the grouped experts as one GEMM per local expert, as
    the layer builder lists them; one launch each. The routers are left out: their standalone
    times (23-69 us, once 406 us, for GEMMs of a few us) are the timing's floor, not the GEMM."""
    cm = {p: ComputeModel(gpu_preset(gpu), e_max=GEMM_KERNEL[gpu]["bf16"], precision="fp8") for p in ("bf16", "fp8")}
    out: dict = {}
    for r in json.loads((HERE / FILES[gpu]).read_text())["layer_gemms"]["rows"]:
        name = next(n for n in MEASURED_LAYOUTS if r["shape"].startswith(n))
        if "_router_" in r["shape"]:
            continue
        for prec in ("bf16", "fp8"):
            if f"{prec}_s" not in r:
                continue
            if "experts" in r:
                kernels = (gemm(r["tokens_per_expert"], r["out"], r["h"]),) * r["experts"]
            else:
                kernels = (gemm(r["m"], r["n"], r["k"], fp8=prec == "fp8"),)
            sim = cm[prec].time(kernels)
            entry = out.setdefault((name, prec), [0.0, 0.0, []])
            entry[0] += r[f"{prec}_s"]
            entry[1] += sim
            entry[2].append((r["shape"][len(name) + 1:], sim / r[f"{prec}_s"] - 1))
    for entry in out.values():
        entry[2] = sorted(entry[2], key=lambda x: x[1])[:2]  # the simulator's two fastest against measured
    return out


def gemm_lines(gpu: str) -> list[str]:
    out = []
    misses = gemm_misses(gpu)
    for name in MEASURED_LAYOUTS:
        cells = []
        for prec in ("bf16", "fp8"):
            meas, sim, worst = misses[(name, prec)]
            cells.append(f"{prec.upper()} {_ms(meas)} / {_ms(sim)} {_miss(sim, meas)}, "
                         + ", ".join(f"{label} {miss:+.0%}" for label, miss in worst))
        out.append(f"    GEMMs alone, {name}: " + "; ".join(cells))
    return out


PERMUTE = "h200-2026-11-26-permute.json"  # bench/gpu_measure_permute.py: Megatron-Core's unfused passes
PERMUTE_ROWS = {"dsv3": "dg-dsv3-1024", "qwen3": QWEN3, "grok1": "dg-grok-2048"}


def permute_lines(gpu: str = "h200") -> list[str]:
    """Megatron-Core's unfused permutation and un-permutation, forward + backward (profiled
    device time) against the model's :func:`~sim.model.moe_kernels.permute` and
    :func:`~sim.model.moe_kernels.unpermute` kernels at kernel level, fused and unfused (the unfused
    rate is fitted to the grok1 row: its miss is 0 by construction), on the tokens the rank routes."""
    data = json.loads((HERE / PERMUTE).read_text())
    cm = ComputeModel(gpu_preset(gpu), e_max=GEMM_KERNEL[gpu]["bf16"])
    cells = []
    for t, p in zip(data["timings"], data["profile"]):
        d = dims(scenario_from_dict(scenario(PERMUTE_ROWS[t["layout"]], gpu, {})).model)
        sims = []
        for one_kernel in (True, False):  # (fused: the permutation as one kernel or as Megatron-Core's eager ops)
            kernels = (permute(d, t["tokens"], one_kernel),) + unpermute(d, t["tokens"], one_kernel)
            sims.append(cm.time(kernels) + cm.time(backward(kernels)))
        m = p["device_fwd_bwd_s"]
        cells.append(f"{t['layout']} {_ms(m)} / {_ms(sims[0])} {_miss(sims[0], m)} / {_ms(sims[1])} {_miss(sims[1], m)}")
    return [f"Unfused permute + unpermute, forward + backward, ms, {data['gpu']} ({PERMUTE}) device time / "
            f"the model's kernels (kernel level) fused / unfused (parallel.moe_permute_fusion false): " + "; ".join(cells)]


def _ms(x: float) -> str:
    return f"{x * 1e3:6.2f}"


def _miss(sim: float, measured: float) -> str:
    return f"({sim / measured - 1:+4.0%})"


def _line(r: Layer) -> str:
    cells = "  ".join(f"{_ms(r.measured[c])} {_ms(r.kernel[c])} {_miss(r.kernel[c], r.measured[c])} {_ms(r.sim[c])}"
                      for c in CLASSES)
    rest = r.measured["other"] - r.scatter
    return (f"  {r.layout:19s}{' fp8' if r.fp8 else '    '}  {cells}  {_ms(r.scatter)} {_ms(rest)} "
            f"{_miss(r.kernel['other'], rest)}  {_ms(total(r.measured))} {_ms(r.wall)} {_ms(total(r.kernel))} "
            f"{_miss(total(r.kernel), total(r.measured))} {_ms(total(r.sim))} {_miss(total(r.sim), r.wall)}")


def report() -> str:
    out = ["One rank's MoE layer, forward + backward, ms: measured compiled (profiler device time per class) vs the "
           "simulator's kernels at kernel level (sustained 1; its miss) and at the preset (sim)",
           "  layer                      GEMM: meas kernel (miss)   sim   attention: meas kernel (miss) sim    "
           "other: meas kernel (miss)   sim  scatter  rest (miss)    total: meas  wall kernel (miss)   sim (vs wall)"]
    gpu = None
    for r in layers():
        if r.gpu != gpu:
            gpu = r.gpu
            env = json.loads((HERE / FILES[gpu]).read_text())["env"]
            out.append(f" {env['gpu']} ({FILES[gpu]}) vs the {gpu} preset")
        out.append(_line(r))
        if r.layout == "dsv3_tp2_ep64":
            m = attention_micro(gpu)
            out.append(f"    MLA attention alone (cuDNN, q/k 192, v 128, not padded): measured forward {_ms(m['fwd'])} "
                       f"backward {_ms(m['bwd'])}; kernel level {_ms(r.kernel['attention_fwd'])} "
                       f"{_miss(r.kernel['attention_fwd'], m['fwd'])} {_ms(r.kernel['attention_bwd'])} "
                       f"{_miss(r.kernel['attention_bwd'], m['bwd'])}")
        if r.layout == "grok1_tp4_etp4_ep8" and r.fp8:
            out.append(f"   {env['gpu']}: each GEMM alone (layer_gemms, routers left out), summed, measured / kernel "
                       "level (miss), and the two shapes the simulator is fastest on")
            out += gemm_lines(gpu)
    out += permute_lines()
    ratios = fp8_ratios()
    out.append(f"Grok-1 layer BF16 / FP8 on the H100: measured compiled {ratios['wall']:.2f} (wall), "
               f"{ratios['device']:.2f} (device time); simulated, Transformer Engine {ratios['te']['kernel']:.2f} "
               f"(kernel) {ratios['te']['sim']:.2f} (preset), torchao {ratios['torchao']['kernel']:.2f} (kernel) "
               f"{ratios['torchao']['sim']:.2f} (preset)")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(report(), end="")
