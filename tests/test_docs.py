"""Every command README.md and docs/*.md show runs, and prints what the docs store for it.

As SimPy checks each docs example against a stored ``.out``: each command of a fenced block
(tests/docs_commands.py extracts them) runs through a subprocess in a scratch folder holding
the repository's scenarios and topologies, and its stdout is compared with
``docs/out/<slug>.out``: the words exactly, each number within ``REL_TOL`` of the stored one or
one unit of its last printed digit (so a rounding flip passes, a drift does not); wall-clock
figures are masked. Fast commands run in CI; the long ones (``docs_commands.SLOW``) with
``python -m pytest -m slow tests/test_docs.py``. ``UPDATE_DOCS=1`` rewrites the stored outputs.
A command shown as a synopsis (placeholders) is listed in ``docs_commands.NOT_RUN`` with why.

What the docs show is checked too: the output under each ``$ command`` of a fenced block is its
stored output (test_docs_show_what_the_commands_print), and the tables docs/gallery.md and
docs/rl.md quote are the stored outputs of the commands that print them.
"""

import os
from pathlib import Path
import re
import shlex
import subprocess
import sys

import pytest

import docs_commands as dc
from conftest import REPO, cli_env

OUT = REPO / "docs" / "out"
REL_TOL = 1e-3  # numbers in an output compared within 0.1% (or one unit of the last printed digit)
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?")
_RUNNABLE = sorted({cmd for _, cmd in dc.all_commands() if dc.not_run_reason(cmd) is None})
FAST = [c for c in _RUNNABLE if not dc.is_slow(c) and c not in dc.RUN_ELSEWHERE]
LONG = [c for c in _RUNNABLE if dc.is_slow(c)]


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` as the docs show it, run from ``cwd`` with this checkout's package."""
    args = shlex.split(command)
    if args[0] == "clustersim":
        args = [sys.executable, "-m", "sim", *args[1:]]
    elif args[0] == "python":
        args = [sys.executable, *args[1:]]
    return subprocess.run(args, cwd=cwd, env={**cli_env(), "CLUSTERSIM_PROGRESS_EVERY": "3600", "COLUMNS": "80"},
                          capture_output=True, text=True, timeout=3600)


def scratch(tmp_path: Path) -> Path:
    """A folder that looks like the repository to a command: scenarios, topologies, bench, plots/."""
    for name in ("scenarios", "topologies", "bench", "sim", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "plots").mkdir()
    return tmp_path


def _mask(text: str) -> str:
    for pattern in dc.VOLATILE:
        text = pattern.sub("<wall>", text)
    return text


def _unit(token: str) -> float:
    """One unit of the last digit ``token`` prints (``12.30`` -> 0.01, ``1,024`` -> 1)."""
    mantissa = token.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(token.lower().split("e")[1]) if "e" in token.lower() else 0
    return 10.0 ** (exponent - decimals)


def differences(stored: str, printed: str) -> list[str]:
    """Where ``printed`` departs from ``stored``: a differing word or a number out of tolerance."""
    a, b = _mask(stored).splitlines(), _mask(printed).splitlines()
    if len(a) != len(b):
        return [f"{len(b)} lines printed, {len(a)} stored"]
    out = []
    for n, (x, y) in enumerate(zip(a, b), 1):
        if _NUMBER.sub("#", x) != _NUMBER.sub("#", y):
            out.append(f"line {n}: {y!r} (stored {x!r})")
            continue
        for s, p in zip(_NUMBER.findall(x), _NUMBER.findall(y)):
            u, v = float(s.replace(",", "")), float(p.replace(",", ""))
            if abs(u - v) > max(REL_TOL * max(abs(u), abs(v)), _unit(s) * 1.0001):
                out.append(f"line {n}: {p} where the docs store {s}: {y!r}")
    return out


def check(command: str, tmp_path: Path) -> None:
    folder = scratch(tmp_path)
    for first in dc.setup_of(command):  # (a walk-through's earlier step writes what this one reads)
        done = run_command(first, folder)
        assert done.returncode == 0, f"{first}\n(before {command}): {done.stderr[-1500:]}"
    proc = run_command(command, folder)
    code = dc.expected_exit(command)
    assert proc.returncode == code, f"{command}\nexit {proc.returncode} (docs: {code}): {proc.stderr[-1500:]}"
    printed = proc.stdout if code == 0 else proc.stderr  # a refusal is compared by its message
    stored = OUT / f"{dc.slug(command)}.out"
    if os.environ.get("UPDATE_DOCS"):
        stored.write_text(printed)
    assert stored.is_file(), f"no stored output {stored.name}: run with UPDATE_DOCS=1 and review it"
    bad = differences(stored.read_text(), printed)
    assert not bad, f"{command}: output no longer matches docs/out/{stored.name}:\n" + "\n".join(bad[:20])


def test_every_docs_command_is_run_or_says_why():
    """A new command in the docs is either runnable (and then run) or a listed synopsis; every
    stored output belongs to a command the docs still show."""
    commands = [cmd for _, cmd in dc.all_commands()]
    assert len(commands) >= 40  # the extraction finds the blocks (README and eight docs)
    runnable = {dc.slug(c) + ".out" for c in _RUNNABLE}
    assert len(runnable) == len(_RUNNABLE), "two commands share a stored output name"
    stale = sorted(p.name for p in OUT.glob("*.out") if p.name not in runnable)
    assert not stale, f"stored outputs of commands the docs no longer show: {stale}"
    assert set(dc.RUN_ELSEWHERE) <= set(_RUNNABLE) - set(LONG), "a command run elsewhere is no longer shown"


@pytest.mark.parametrize("command", FAST, ids=dc.slug)
def test_docs_command(command, tmp_path):
    check(command, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", LONG, ids=dc.slug)
def test_docs_command_long(command, tmp_path):
    check(command, tmp_path)


def shown_outputs() -> list[tuple[str, str, str]]:
    """(doc, command, the output the doc shows under it) of every ``$ command`` line of a fenced
    block: the lines after it up to the next ``$`` line or the block's end."""
    out = []
    for doc in dc.DOCS:
        for block in dc._FENCE.findall((REPO / doc).read_text()):
            lines = block.split("\n")
            starts = [i for i, line in enumerate(lines) if line.startswith("$ ")] + [len(lines)]
            for i, j in zip(starts, starts[1:]):
                shown = lines[i + 1:j]
                while shown and not shown[-1].strip():
                    shown.pop()
                out.append((doc, dc._strip_comment(lines[i][2:]), "\n".join(shown)))
    return out


def test_docs_show_what_the_commands_print():
    """Where a doc shows a ``$ command`` with its output, the output is the stored one (which
    test_docs_command checks against the live command): figures in the docs cannot drift."""
    checked = 0
    for doc, command, shown in shown_outputs():
        stored = OUT / f"{dc.slug(command)}.out"
        if dc.not_run_reason(command) or dc.expected_exit(command) or not stored.is_file():
            continue
        bad = differences(stored.read_text().rstrip("\n"), shown)
        assert not bad, f"{doc}: what it shows under {command!r} is not docs/out/{stored.name}:\n" + "\n".join(bad[:10])
        checked += 1
    assert checked >= 8


def test_rl_md_decode_table_is_what_the_validation_prints():
    """docs/rl.md's table of the decode model against vLLM runs (mean, min, max step error and the
    whole-run replay's, per run) is the stored output of ``python -m sim.rl.validation``."""
    text = (REPO / "docs" / "rl.md").read_text()
    table = text[text.index("| run | rounds |"):].split("\n\n")[0]
    quoted = re.findall(r"[-+]\d+\.\d%", table)
    printed = re.findall(r"[-+]\d+\.\d%", (OUT / f"{dc.slug('python -m sim.rl.validation')}.out").read_text())
    assert len(quoted) == 16 and quoted == printed


def test_rl_md_stragglers_table_is_what_the_study_prints():
    """docs/rl.md's rl-stragglers table (per spread: generator utilization of each mode, the sync
    closed form, the pipeline's staleness mean / max) is the stored output of its command."""
    rows = {}
    for line in (OUT / f"{dc.slug('clustersim study rl-stragglers --out-dir plots')}.out").read_text().splitlines():
        p = line.split()
        if len(p) >= 12 and p[0] in ("sync", "async", "pipeline"):
            rows[(p[0], p[1])] = p
    text = (REPO / "docs" / "rl.md").read_text()
    table = text[text.index("| sigma / mean |"):].split("\n\n")[0].splitlines()[2:]
    assert len(table) == 6
    for line in table:
        cv, *cells = (c.strip() for c in line.strip("|").split("|"))
        sync, pipe = rows[("sync", cv)], rows[("pipeline", cv)]
        printed = [sync[2], rows[("async", cv)][2], pipe[2], sync[4], f"{pipe[8]} / {pipe[9]}"]
        assert cells == [c.replace("100.0%", "100%") for c in printed], (cv, cells, printed)  # (docs: "100%")


# Figures docs/gallery.md quotes that the gallery does not print: closed forms, computed there.
GALLERY_CLOSED_FORMS = {"27.3%", "15.8%"}


def test_gallery_md_quotes_what_the_gallery_prints():
    """Every decimal figure (ms or %) in docs/gallery.md is one the gallery command prints (its
    stored output, which test_docs_command checks against the live command in CI)."""
    printed = set(re.findall(r"\d+\.\d+(?: ms|%)", (OUT / f"{dc.slug('python -m sim.studies.gallery')}.out").read_text()))
    quoted = set(re.findall(r"\d+\.\d+(?: ms|%)", (REPO / "docs" / "gallery.md").read_text()))
    assert len(quoted) >= 20
    assert quoted - GALLERY_CLOSED_FORMS <= printed, sorted(quoted - GALLERY_CLOSED_FORMS - printed)
