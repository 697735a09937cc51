"""When a layout does not fit in GPU memory, which single knob would make it fit: each candidate
(the next ZeRO stages, sequence parallelism, selective or full recompute, twice the pipeline
stages at the same GPU count) is tried on the peak-memory model alone (sim/parallel/memory.py,
no simulation) and the ones that fit are named with their memory per GPU.

Example: ``clustersim run scenarios/gpt3-175b-ptd.toml --set parallel.tp=8 --set parallel.pp=4
--set parallel.dp=24`` ends its summary with the knobs that would fit.
"""

from ..hardware.gpus import gpu_preset
from ..input.choices import Recompute
from ..parallel import workload
from ..parallel.memory import peak_memory
from ..units import format_bytes


def candidates(sc) -> list[tuple[str, dict, dict]]:
    """(``--set`` text, parallel changes, training changes) for each knob to try."""
    p, t = sc.parallel, sc.training
    out = [(f"parallel.zero={z}", {"zero": z}, {}) for z in range(p.zero + 1, 4)]
    if p.tp > 1 and not p.sequence_parallel:
        out.append(("parallel.sequence_parallel=true", {"sequence_parallel": True}, {}))
    order = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    if t.recompute in (Recompute.OP, Recompute.MLA_UP_PROJ):  # per-op / per-module checkpointing: full keeps less
        out.append(("training.recompute=full", {}, {"recompute": Recompute.FULL}))
    if t.recompute in order:
        out += [(f"training.recompute={r}", {}, {"recompute": r}) for r in order[order.index(t.recompute) + 1:]]
    if p.dp % 2 == 0 and sc.model.layers % (2 * p.pp * p.virtual_stages) == 0 and p.stage_layers is None:
        out.append((f"parallel.pp={2 * p.pp} parallel.dp={p.dp // 2}", {"pp": 2 * p.pp, "dp": p.dp // 2}, {}))
    return out


def fitting_knobs(sc, topo) -> list[str]:
    """``--set`` texts (with the memory each leaves per GPU) of the single knobs that fit."""
    gpu_name = sc.cluster.gpu or topo.spec.gpu
    gpu = gpu_preset(gpu_name)
    domains = [int(d) for d in topo.domains]
    out = []
    for text, par, train in candidates(sc):
        try:
            s = sc.model_copy(update={"parallel": sc.parallel.model_copy(update=par),
                                      "training": sc.training.model_copy(update=train)})
            ctx = workload.make_context(s, domains, gpu_name, None, topo.spec)
            total = peak_memory(ctx).total
        except (ValueError, KeyError, ZeroDivisionError):  # a layout this knob cannot form
            continue
        if total <= gpu.hbm_bytes:
            out.append(f"--set {text.replace(' ', ' --set ')} ({format_bytes(total, gpu.hbm_unit)})")
    return out


def hint(result) -> str | None:
    """The summary's line after DOES NOT FIT, or None when the run fits."""
    if result.summary["fits_in_memory"]:
        return None
    knobs = fitting_knobs(result.scenario, result.facts.topology)
    if not knobs:
        return "no single knob fits (tried ZeRO stages, sequence parallelism, recompute, 2x pipeline stages)"
    return "fits with " + "; or ".join(knobs)
