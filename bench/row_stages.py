"""Where a validation row's CPU goes: the program build, the engine, the outputs, validation's own.

Run: ``python bench/row_stages.py ID[,ID...] [--repeat N]``: each row (its scenario as
``clustersim validate`` runs it, :func:`sim.studies.validation.compare`: ``force=True``) in its
own subprocess, with ``sim.step``'s stages wrapped by CPU timers (``time.process_time``):

- ``topology``: the fabric (``build_topology``);
- ``context`` and ``programs``: the layout, folding and costs (``workload.make_context``), then
  the simulated ranks' programs (``workload.build_programs``: layer programs, replayed steps,
  program copies);
- ``engine_setup``, ``engine_run`` and ``event_loop``: ``Engine.__init__``, ``Engine.run`` but its
  event loop (each program split into streams, the host's release times and anchors, the checks
  after the run), and the event loop itself (``run_until_empty``: the streams' callbacks and the
  network);
- ``spans_table``: the spans table (``spans_frame``); ``summary_s``: ``summarize``, ``peak_memory``;
  ``checks``: ``invariants`` (the compute floor over the programs);
- ``other``: the rest of ``simulate`` (``malloc_trim``, the work check, StepFacts);
- ``validation``: ``compare``'s own (the row's scenario parsed), outside ``simulate``.

It prints one JSON line per row and run: the load average, each stage's CPU seconds, the
total, what is outside the event loop (``outside_loop_s``), peak RSS, events, the predicted step (``repr``) and the summary's and spans' SHA-256
(bench/fingerprint.py's ``step_fingerprint``), so two trees compare stage by stage and prove
they predict the same. Run from another tree's root (``cd MAIN && python
/path/to/bench/row_stages.py ID``), the rows are that tree's ``sim``.
"""

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[2])
from fingerprint import step_fingerprint
from sim import step
from sim.engine import core
from sim.parallel import workload
from sim.outputs import invariants
from sim.studies import validation

cpu = {}
def timed(name, f):
    def wrapper(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            cpu[name] = cpu.get(name, 0.0) + time.process_time() - t
    return wrapper

step.build_topology = timed("topology", step.build_topology)
workload.make_context = timed("context", workload.make_context)
workload.build_programs = timed("programs", workload.build_programs)
core.Engine.__init__ = timed("engine_setup", core.Engine.__init__)
core.Engine.run = timed("engine_run", core.Engine.run)
core.run_until_empty = timed("event_loop", core.run_until_empty)
step.spans_frame = timed("spans_table", step.spans_frame)
step.summarize = timed("summary_s", step.summarize)
step.peak_memory = timed("summary_s", step.peak_memory)
invariants.check = timed("checks", invariants.check)
invariants.compute_floor = timed("checks", invariants.compute_floor)
step.simulate = timed("simulate", step.simulate)

row = next(r for r in validation.load_rows() if r.id == sys.argv[1])
t0 = time.process_time()
c = validation.compare(row, keep=True)  # (the result for its hashes; held until compare returns anyway)
total = time.process_time() - t0
sim_cpu = cpu.pop("simulate")
cpu["engine_run"] -= cpu["event_loop"]  # (the streams made, the run's own checks: outside the loop)
parts = {k: round(v, 2) for k, v in cpu.items()}
parts["other"] = round(sim_cpu - sum(cpu.values()), 2)
parts["validation"] = round(total - sim_cpu, 2)
print(json.dumps({"row": row.id, "load": os.getloadavg()[0], "cpu_s": round(total, 2), **parts,
                  "outside_loop_s": round(total - cpu["event_loop"], 2),
                  "rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
                  "events": c.result.summary["sim_events"], "predicted_step_s": repr(c.predicted_step_s),
                  **{f"sha_{k}": v for k, v in step_fingerprint(c.result).items() if k != "step_time_s"}}), flush=True)
"""


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    for _ in range(repeat):
        for row in argv[0].split(","):
            out = subprocess.run([sys.executable, "-c", CHILD, row, str(Path(__file__).parent)],
                                 capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
