"""CPU seconds of simulating validation rows, each in its own process, with what they predict.

Run: ``python bench/rows.py ID[,ID...] [--repeat N] [--set K=V ...]``: for each row of
``clustersim validate`` (its scenario as :func:`sim.studies.validation.compare` runs it:
``force=True``) and each repeat, one subprocess prints the load average, CPU and wall
seconds of ``sim.simulate``, peak RSS, events, the predicted step time (``repr``: every
digit) and the SHA-256 of its summary and spans (bench/fingerprint.py's
``step_fingerprint``), so two trees timed in turn on a loaded machine compare in CPU
seconds and prove they predict the same. ``--set`` overrides the row's scenario (e.g.
``training.global_batch=315`` for the 530B row at its fewest micro-batches). ``--dump DIR``: also
writes each row's whole summary (``DIR/ID.json``) and spans (``DIR/ID.npz``: numeric columns as
arrays, the others as hashes), which ``python bench/compare_fingerprints.py BEFORE AFTER`` compares
number by number.
"""

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from fingerprint import step_fingerprint
from sim.input.load import parse_value, scenario_from_dict
from sim.step import simulate
from sim.studies.validation import load_rows

row = next(r for r in load_rows() if r.id == sys.argv[2])
overrides = {k: parse_value(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
scenario = scenario_from_dict(row.scenario, overrides or None)
cpu, wall = time.process_time(), time.perf_counter()
result = simulate(scenario, force=True)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"row": row.id, "load": os.getloadavg()[0], "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                  "rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
                  "events": result.summary["sim_events"], "predicted_step_s": repr(result.summary["step_time_s"]),
                  **{k: v for k, v in step_fingerprint(result).items() if k != "step_time_s"}}))
if sys.argv[3]:
    from pathlib import Path
    import hashlib, numpy as np
    out = Path(sys.argv[3]) / f"{row.id}.json"
    out.write_text(json.dumps(result.summary, sort_keys=True, default=str))
    spans = result.spans
    numeric = {c: spans[c].to_numpy() for c in spans if spans[c].dtype.kind in "iufb"}
    hashed = {c: np.array(hashlib.sha256(spans[c].astype(str).str.cat(sep="\n").encode()).hexdigest())
              for c in spans if c not in numeric}
    np.savez(out.with_suffix(".npz"), **numeric, **hashed)
"""


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    ids, repeat, overrides, dump, args = argv[0].split(","), 1, [], "", iter(argv[1:])
    for a in args:
        if a == "--repeat":
            repeat = int(next(args))
        elif a == "--dump":
            dump = next(args)
            Path(dump).mkdir(parents=True, exist_ok=True)
        elif a == "--set":
            overrides.append(next(args))
        else:
            sys.exit(f"unknown argument {a!r}\n{__doc__}")
    for _ in range(repeat):
        for row in ids:
            out = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), row, dump, *overrides],
                                 capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
