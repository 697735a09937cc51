"""Mutation check: break the code on purpose and see whether the named tests notice.

Run: ``python bench/mutations.py`` (every mutation, ~3 min on 2 cores), ``--only NAME,...``
for some, ``--list`` to print each mutation's patch without running anything. Each mutation
is one exact text replacement in one file (a second form where the code is written
another way: phases as typed span columns). It is applied to a temporary copy of the
repository (this checkout is never touched), and the tests it names run there with
``python -m pytest -q -x``; the copy is importable first on ``PYTHONPATH``, so ``import sim``
in the tests and in their CLI subprocesses is the mutated package. A baseline run of the
same tests on an unmutated copy must pass first. Prints one line per mutation:
``caught`` (the tests failed), ``MISSED`` (they passed), or ``STALE`` (the text to replace
is no longer in the file exactly once: update this list). Exit status: 0 when every
mutation is caught, 1 when one is missed, 2 when one is stale or the baseline fails.
docs/mutations.md lists what it prints.
"""

import argparse
import difflib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "plots", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis")


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # file to change, relative to the repository root
    edits: tuple[tuple[str, str], ...]  # (old, new): the first old text found exactly once is replaced
    tests: tuple[str, ...]  # pytest arguments that must fail once it is applied


TIMELINE, METRICS, DRAWN = "sim/outputs/timeline.py", "sim/outputs/metrics.py", ("tests/test_timeline_drawn.py",)
PHASES_TESTS = ("tests/test_metrics_phases.py",)
# Where the phase is a typed column of the spans (Phase, set where the op is built), the same
# breakage is the second edit of each pair below.
ENUM_PHASE = '    phase = comp["phase"].to_numpy()\n'
MUTATIONS = (
    Mutation("timeline-phase-compute", "the timeline's phase of every compute span is 'compute'", TIMELINE,
             (('    if name.endswith("_fwd"):\n        return "forward"\n', '    return "compute"\n'),
              ('    return DRAWN_PHASE.get(phase, "compute")\n', '    return "compute"\n')), DRAWN),
    Mutation("timeline-recompute-forward", "the timeline draws recomputation as forward", TIMELINE,
             (('"_bwd" in name or "recompute" in name else "compute"',
               '"_bwd" in name else "forward" if "recompute" in name else "compute"'),
              ('Phase.RECOMPUTE: "backward"', 'Phase.RECOMPUTE: "forward"')), DRAWN),
    Mutation("timeline-idle-is-busy", "the hatched idle bars cover the busy time instead of the gaps", TIMELINE,
             (("    return subtract(np.array([[0.0, end]]), comp)\n", "    return comp\n"),), DRAWN),
    Mutation("timeline-exposed-is-all-comm", "the red strip shows all communication, hidden or not", TIMELINE,
             (("    return subtract(comm, comp)\n", "    return comm\n"),), DRAWN),
    Mutation("metrics-bwd-recompute-swapped", "metrics counts backward as recompute and recompute as backward",
             METRICS, (('("recompute", "_recompute"), ("backward", "_bwd")', '("recompute", "_bwd"), ("backward", "_recompute")'),
                       (ENUM_PHASE, ENUM_PHASE + '    phase = np.where(phase == "backward", "recompute", '
                                                 'np.where(phase == "recompute", "backward", phase))\n')),
             PHASES_TESTS),
    Mutation("metrics-recompute-as-forward", "metrics never recognises recomputation (it counts as forward)",
             METRICS, (('("recompute", "_recompute")', '("recompute", "_recompute_")'),
                       (ENUM_PHASE, ENUM_PHASE + '    phase = np.where(phase == "recompute", "forward", phase)\n')),
             PHASES_TESTS),
    Mutation("metrics-no-phases", "metrics counts every compute span as forward", METRICS,
             (("        phase[hit] = label\n", "        pass\n"),
              (ENUM_PHASE, '    phase = np.full(len(comp), "forward", dtype=object)\n')), PHASES_TESTS),
    Mutation("golden-value-changed", "a golden file's step time is changed by 0.01 s", "tests/golden/straggler-dp.json",
             (('"step_time_s": 0.18', '"step_time_s": 0.19'),), ("tests/test_golden.py", "-k", "golden and straggler")),
    Mutation("straggler-never-slow", "a straggler's slowdown is never applied", "sim/hardware/faults.py",
             (("            if rank in ranks and now >= start:\n", "            if rank in ranks and now < start:\n"),),
             ("tests/test_golden.py", "-k", "golden")),
    Mutation("failed-link-kept", "a failed link (factor 0) stays up at full bandwidth", "sim/hardware/faults.py",
             (("                graph.remove_edge(u, v)\n", "                pass\n"),),
             ("tests/test_golden.py", "-k", "golden and nic")),
    Mutation("mtp-depths-dropped", "model.mtp_layers builds no multi-token-prediction depth", "sim/model/layer_ids.py",
             (("    return range(d.layers + 1, d.layers + 1 + d.mtp)\n", "    return range(0)\n"),),
             ("tests/test_golden.py", "-k", "golden and mtp")),
    Mutation("doctest-stale", "a docstring example's expected output no longer matches", "sim/units.py",
             (("(1048576, 2048, 512)", "(1048576, 2048, 513)"),), ("tests/test_doctests.py",)),
)


def mutated(m: Mutation) -> str | None:
    """The file's text with the mutation applied, or None when no edit's text is in it exactly once."""
    text = (REPO / m.path).read_text()
    for old, new in m.edits:
        if text.count(old) == 1:
            return text.replace(old, new)
    return None


def patch(m: Mutation) -> str:
    """The mutation as a unified diff (empty when it no longer applies)."""
    new = mutated(m)
    if new is None:
        return ""
    text = (REPO / m.path).read_text()
    return "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{m.path}", f"b/{m.path}", n=0))


def copy_repo(dest: Path) -> Path:
    root = dest / "repo"
    shutil.copytree(REPO, root, symlinks=True, ignore=SKIP)
    return root


def run_tests(root: Path, args: tuple[str, ...]) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("UPDATE_GOLDEN", None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args], cwd=root,
                       env=env, capture_output=True, text=True)
    return p.returncode, time.perf_counter() - t


def imports_the_copy(root: Path) -> bool:
    env = {**os.environ, "PYTHONPATH": str(root)}
    p = subprocess.run([sys.executable, "-c", "import sim; print(sim.__file__)"], cwd=root, env=env,
                       capture_output=True, text=True)
    return Path(p.stdout.strip()).resolve().is_relative_to(root.resolve())


def check(m: Mutation, tmp: Path) -> tuple[str, float]:
    if not patch(m):
        return "STALE", 0.0
    root = copy_repo(tmp / m.name)
    (root / m.path).write_text(mutated(m))
    rc, secs = run_tests(root, m.tests)
    return {0: "MISSED", 1: "caught"}.get(rc, f"error (pytest exit {rc})"), secs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutation names")
    ap.add_argument("--list", action="store_true", help="print each mutation's patch and exit")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not a.only or m.name in a.only.split(",")]
    if a.list:
        for m in chosen:
            print(f"# {m.name}: {m.what}\n# tests: pytest {shlex.join(m.tests)}\n{patch(m) or '(STALE)'}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
        base = copy_repo(Path(tmp) / "baseline")
        if not imports_the_copy(base):
            print("the copy is not what 'import sim' finds: PYTHONPATH is not first", file=sys.stderr)
            return 2
        files = sorted({t for m in chosen for t in m.tests if t.startswith("tests/")})
        rc, secs = run_tests(base, tuple(files))
        print(f"{'baseline':32s} {'passes' if rc == 0 else f'FAILS (pytest exit {rc})':10s} {secs:6.1f} s  "
              f"pytest {shlex.join(files)}", flush=True)
        if rc != 0:
            return 2
        shutil.rmtree(base)
        verdicts = []
        for m in chosen:
            verdict, secs = check(m, Path(tmp))
            verdicts.append(verdict)
            print(f"{m.name:32s} {verdict:10s} {secs:6.1f} s  pytest {shlex.join(m.tests)}", flush=True)
    if "STALE" in verdicts or any(v.startswith("error") for v in verdicts):
        return 2
    return 1 if "MISSED" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
