"""What ran, echoed in ``clustersim run``'s text summary so an override can be checked: the
model and its parameter counts, the precision and the peak each part ran at, every parallel
knob, and the collective algorithm NCCL's tuner chose per axis (``auto`` resolved exactly as
the engine resolves it, :func:`sim.collectives.resolve`). ``mfu_text`` says which peak MFU is
relative to (CONTRACT.md: ``mfu`` = TFLOP/s per GPU / dense BF16 peak, under FP8 too).

Example: ``clustersim run scenarios/llama3.1-70b-fp8-h100.toml``.
"""

from collections import defaultdict

from ..collectives.kinds import SEND_RECV
from .. import collectives
from ..hardware.gpus import Precision, gpu_preset
from ..model.transformer import active_params, dims, total_params


def _billions(n: float) -> str:
    return f"{n / 1e9:,.2f}B" if n < 1e11 else f"{n / 1e9:,.1f}B"


def model_text(sc) -> str:
    """``llama3.1-70b (preset): 70.55B parameters, 69.50B active per token``."""
    m = sc.model
    d = dims(m)
    source = "preset" if m.preset else ("HF config" if m.hf_config else "scenario")
    return (f"{m.name} ({source}): {_billions(total_params(d, m.tied_embeddings))} parameters, "
            f"{_billions(active_params(d))} active per token (6ND's N: no input embedding)")


def precision_text(sc, gpu) -> str:
    """Which peak each part of the step ran at."""
    bf16 = f"{gpu.peak_flops / 1e12:,.0f} TFLOP/s dense BF16"
    if sc.training.precision is Precision.FP8:
        return (f"fp8: transformer linear layers at {gpu.fp8_flops / 1e12:,.0f} TFLOP/s dense FP8; "
                f"attention core, router, output layer at {bf16}")
    return f"{sc.training.precision}: every GEMM at {bf16} (the 16-bit peak)"


def knobs_text(sc) -> str:
    """Every parallel knob a layout can turn, on or off."""
    p, t = sc.parallel, sc.training
    on = {True: "on", False: "off"}
    text = (f"zero {p.zero}, sequence parallel {on[p.sequence_parallel]}, TP comm overlap "
            f"{on[p.tp_comm_overlap]}, recompute {t.recompute}, dp_algo {p.dp_algo}")
    if sc.model.moe is not None:
        text += (f", EP comm overlap {on[p.ep_comm_overlap]}, expert TP "
                 f"{p.expert_tp if p.expert_tp is not None else f'{p.tp} (= tp)'}")
    return text


def algorithms(result) -> dict[str, dict[str, int]]:
    """``axis op`` (the op's category: dp, tp, cp, ep, ...) -> {algorithm (with protocol): calls} over the simulated ranks' programs."""
    topo = result.facts.topology
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen = set()
    for prog in result.facts.programs:
        for op in prog.ops:
            call = op.comm
            if call is None or call.op is SEND_RECV or len(call.group) < 2 or call.nbytes <= 0 \
                    or call.key in seen:  # a pipeline send/recv has no algorithm to choose
                continue
            seen.add(call.key)
            domains = tuple(int(d) for d in topo.domains[list(call.group)])
            algo = collectives.resolve(call.op, call.algo, call.nbytes, domains, topo.fabric)
            out[f"{op.category} {call.op}"][algo] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


def algorithms_text(result) -> str:
    """``dp all_reduce: ring:simple x24; tp all_reduce: nvls:simple x96`` (calls per algorithm)."""
    parts = [f"{axis}: " + ", ".join(f"{a} x{n}" for a, n in sorted(algos.items()))
             for axis, algos in algorithms(result).items()]
    return "; ".join(parts) or "none"


def mfu_text(summary, sc, gpu) -> str:
    """``74.3% of the dense BF16 peak (989 TFLOP/s); 37.1% of the FP8 peak``."""
    text = f"{summary['mfu']:.1%} of the dense BF16 peak ({gpu.peak_flops / 1e12:,.0f} TFLOP/s)"
    if sc.training.precision is Precision.FP8 and gpu.fp8_flops:
        text += f"; {summary['tflops_per_gpu'] * 1e12 / gpu.fp8_flops:.1%} of the dense FP8 peak"
    return text


def echo_rows(result) -> list[tuple[str, str]]:
    """The rows :func:`sim.commands.run.print_summary` adds after the layout."""
    sc = result.scenario
    gpu = gpu_preset(result.facts.gpu)
    return [("model", model_text(sc)), ("precision", precision_text(sc, gpu)),
            ("parallel knobs", knobs_text(sc)), ("collectives", algorithms_text(result))]
