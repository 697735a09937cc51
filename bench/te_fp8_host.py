"""How far each Transformer Engine FP8 row is from host-bound, and what a host cost per FP8 linear would move.

Run: ``python bench/te_fp8_host.py [ID,...] [--whatif X_US[,X_US...]]`` (default rows: the NeMo
FP8 rows and their BF16 twins). For each row's transformer layer (one micro-batch on the busiest
rank, :mod:`sim.parallel.layer_program`: what the builder makes of it) it prints the GPU seconds
of its forward and backward compute, the host seconds to issue them (sim/model/host.py), the FP8
GEMM launches (a linear's forward GEMM is one, its backward two), and the host time each of those
launches could gain before the layer's passes bind on the host: (GPU - issue) / launches, for
the forward alone and for forward + backward (no op of these rows syncs the host, so the host's
lead carries from pass to pass and the whole layer is the budget in steady state).

``--whatif``: re-simulate each row (minutes) with X microseconds more host time per FP8 GEMM
launch -- what Transformer Engine's FP8 Python path (casts' allocations, recipe checks, FP8
dtype lookups: docs/precision.md, "Transformer Engine's FP8 host path, counted") would add if
it were that much dearer than the model's per-launch costs -- and print the step and
``--report``'s host verdict (sim/outputs/host.py). X 0 re-simulates the row as shipped.
A what-if over ``sim.model.host.issue_s``; nothing here changes the simulator.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.input.load import scenario_from_dict  # noqa: E402
from sim.model import host  # noqa: E402
from sim.parallel import layer_program as lp  # noqa: E402
from sim.studies.validation import load_rows  # noqa: E402

ROWS = ("dg-grok-fp8-2048", "dg-grok-2048", "dg-l70-fp8-64", "dg-l70-64", "dg-l405-fp8-1024", "dg-l405-512")
_ISSUE_S = host.issue_s


def charged(x: float):
    """``host.issue_s`` with ``x`` more seconds per FP8 GEMM launch."""
    def issue_s(kernels) -> float:
        return _ISSUE_S(kernels) + x * sum(k.count for k in kernels if k.fp8 and k.flops)
    return issue_s


def scenario(row_id: str):
    return scenario_from_dict(next(r for r in load_rows() if r.id == row_id).scenario)


def layer_issue(s, x: float) -> dict:
    """Layer kind -> (forward GPU, forward issue, backward GPU, backward issue) seconds, with
    ``x`` more host seconds per FP8 GEMM launch (the programs cached under a key of their own)."""
    host.issue_s = charged(x)
    try:
        progs = lp.programs(s, s.cluster.gpu, key=("host what-if", x) + lp.content_key(s, s.cluster.gpu, None),
                            kinds=(lp.Kind.DENSE, lp.Kind.MOE))
    finally:
        host.issue_s = _ISSUE_S
    out = {}
    for kind, p in progs.items():
        fwd = [op for op in p.ops if op.phase is lp.Phase.FORWARD]
        bwd = [op for op in p.ops if op.phase is not lp.Phase.FORWARD]
        out[kind] = (p.forward_s, sum(op.issue for op in fwd), p.backward_s + p.compute_s(lp.Phase.RECOMPUTE),
                     sum(op.issue for op in bwd))
    return out


def slack(row_id: str) -> None:
    """Print the layer's GPU and host seconds and the per-launch host budget."""
    s = scenario(row_id)
    base, unit = layer_issue(s, 0.0), layer_issue(s, 1.0)  # issue at 1 s a launch: the launches
    for kind, (fg, fi, bg, bi) in base.items():
        nf, nb = round(unit[kind][1] - fi), round(unit[kind][3] - bi)
        budget_f = (fg - fi) / nf if nf else float("inf")
        budget = (fg + bg - fi - bi) / (nf + nb) if nf + nb else float("inf")
        print(f"{row_id:18s} {kind.value:5s} fwd GPU {fg * 1e3:6.3f} issue {fi * 1e3:6.3f} ms  bwd GPU {bg * 1e3:6.3f} "
              f"issue {bi * 1e3:6.3f} ms  FP8 GEMM launches {nf} + {nb}  budget per launch: fwd {budget_f * 1e6:5.0f} us, "
              f"fwd + bwd {budget * 1e6:5.0f} us")


def whatif(row_id: str, x: float) -> None:
    """Re-simulate ``row_id`` with ``x`` more host seconds per FP8 GEMM launch; print a JSON line."""
    from sim.outputs.host import verdict
    from sim.step import simulate
    host.issue_s = charged(x)
    try:
        cpu = time.process_time()
        result = simulate(scenario(row_id), force=True)
        cpu = time.process_time() - cpu
    finally:
        host.issue_s = _ISSUE_S
    v = verdict(result) or {}
    print(json.dumps({"row": row_id, "x_us": x * 1e6, "step_s": result.summary["step_time_s"], "cpu_s": round(cpu, 1),
                      "host_wait_s": v.get("wait_s"), "gpu_idle_s": v.get("idle_s"), "host_bound": v.get("host_bound")}),
          flush=True)


def main(argv: list[str]) -> None:
    rows = argv[0].split(",") if argv and not argv[0].startswith("-") else list(ROWS)
    xs = [float(v) * 1e-6 for v in argv[argv.index("--whatif") + 1].split(",")] if "--whatif" in argv else []
    for row_id in rows:
        if xs:
            for x in xs:
                whatif(row_id, x)
        else:
            slack(row_id)


if __name__ == "__main__":
    main(sys.argv[1:])
