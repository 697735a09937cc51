"""Fingerprints of what the simulator predicts: a refactor that must not change results is
checked by running this before and after and diffing the two files.

Run: ``python bench/fingerprint.py out.json`` (``--validation``: also every shipped
validation row, ~15 min on 2 cores; ``--only NAME,...``: a subset). For each bundled
scenario (``scenarios/``), gallery and study scenario it records the SHA-256 of the summary
(without ``sim_wall_s`` and ``sim_events``, the engine's own cost) and of the spans table
(every column, as CSV), plus the step time to read by eye; for RL scenarios the SHA-256 of
the RL summary; the gallery's hardware scenario also on its B200, GB200 and MI355X clusters
(``gallery_scenarios/hardware@GPU``). Then: ``python bench/fingerprint.py --diff before.json after.json`` prints
every entry that differs and exits 1 if any does.
"""

import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UNSTABLE = ("sim_wall_s", "sim_events")
ADDED_COLUMNS = ("phase",)  # spans columns added after the first baselines (issue 26: the op phase)
FOLDERS = (REPO / "scenarios", REPO / "sim" / "studies" / "gallery_scenarios", REPO / "sim" / "studies" / "scenarios")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def step_fingerprint(result) -> dict:
    """Hashes of a training step's summary and spans."""
    summary = {k: v for k, v in result.summary.items() if k not in UNSTABLE}
    spans = result.spans
    out = {"summary": _sha(json.dumps(summary, sort_keys=True).encode()),
           "spans": _sha(spans.drop(columns=[c for c in ADDED_COLUMNS if c in spans]).to_csv(index=False).encode()),
           "step_time_s": summary.get("step_time_s")}
    for column in ADDED_COLUMNS:  # hashed on their own: a baseline taken before they existed still compares
        if column in spans:
            out[f"spans_{column}"] = _sha(spans[column].astype(str).str.cat(sep="\n").encode())
    return out


def scenario_fingerprint(path: Path) -> dict:
    import sim
    from sim.errors import InputError

    s = sim.load_scenario(path)
    if s.rl is not None:
        from sim.rl.run import simulate_rl

        summary = {k: v for k, v in simulate_rl(s).summary.items() if k not in UNSTABLE}
        return {"rl_summary": _sha(json.dumps(summary, sort_keys=True, default=str).encode())}
    try:
        return step_fingerprint(sim.simulate(s))
    except InputError as exc:  # e.g. a study scenario that only runs with its sweep's overrides
        return {"refused": str(exc)}


def validation_fingerprint() -> dict:
    from sim.studies.validation import compare, load_rows

    return {f"validate:{row.id}": {"predicted_step_s": compare(row).predicted_step_s} for row in load_rows()}


def collect(only: set[str] | None, validation: bool) -> dict:
    out = {}
    for folder in FOLDERS:
        for path in sorted(folder.glob("*.toml")):
            key = f"{folder.name}/{path.stem}"
            if only and path.stem not in only:
                continue
            t0 = time.perf_counter()
            out[key] = scenario_fingerprint(path)
            print(f"{key}: {out[key]} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    out.update(gallery_clusters(only))
    if validation:
        out.update(validation_fingerprint())
    return out


def gallery_clusters(only: set[str] | None) -> dict:
    """The gallery's hardware picture on its other clusters (``hardware.toml`` as a file is the
    H100 SuperPOD only): ``sim.studies.gallery.CLUSTERS`` with the gallery's own overrides."""
    from sim.studies.gallery import CLUSTERS, SCENARIOS, _run

    out = {}
    for _, topo, gpu in CLUSTERS[1:]:
        key = f"gallery_scenarios/hardware@{gpu}"
        if only and "hardware" not in only:
            continue
        out[key] = step_fingerprint(_run(SCENARIOS / "hardware.toml", [f"cluster.topology={topo}", f"cluster.gpu={gpu}"]))
        print(f"{key}: {out[key]}", file=sys.stderr, flush=True)
    return out


def diff(before: dict, after: dict) -> list[str]:
    return [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--diff"]:
        lines = diff(*(json.loads(Path(p).read_text()) for p in argv[1:3]))
        print("\n".join(lines) or "identical")
        return 1 if lines else 0
    only = None
    if "--only" in argv:
        i = argv.index("--only")
        only = set(argv[i + 1].split(","))
        del argv[i:i + 2]
    validation = "--validation" in argv
    argv = [a for a in argv if a != "--validation"]
    result = collect(only, validation)
    Path(argv[0]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
