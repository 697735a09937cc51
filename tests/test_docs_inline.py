"""Commands the docs name inline, in prose (a `clustersim ...` or `python ...` code span).

tests/test_docs.py runs every command of a fenced block and compares its output; this file
covers the ones written inline: each runs and exits 0 (from a scratch folder, after the
command that writes a file it reads), or is skipped with its reason -- shown in a fenced
block (run there), a synopsis with placeholders, the name of a command or an option rather
than a run, a benchmark or study that takes minutes (its fenced or documented form runs
under ``-m slow`` or in its own test). A new inline command runs here unless one of those
reasons holds, so a documented command that fails makes a test fail.
"""

import re

import pytest

from docs_commands import DOCS, REPO, all_commands, not_run_reason, setup_of
from test_docs import run_command, scratch

INLINE = re.compile(r"(?<!`)`((?:clustersim|python)\b[^`\n]*)`(?!`)")
PLACEHOLDER = re.compile(r"(?<![\w.-])[A-Z][A-Z_]+(?![\w.-])|\bN\b|\bT\b|\bB\b|\bS\b")
LONG = {
    "clustersim validate": "the full validation (15+ min): its fenced `clustersim validate` runs under -m slow",
    "clustersim study ": "a study (minutes): `clustersim study NAME --quick` runs in tests/test_studies*.py",
    "python bench/": "a benchmark (minutes): its figures are in its docstring and docs",
    "python -m pytest": "the test suite itself (or a part of it): what runs this test",
}


def inline_commands() -> list[str]:
    """Every inline command of README.md and docs/*.md, once, in order of appearance."""
    seen: dict[str, None] = {}
    for doc in DOCS:
        for cmd in INLINE.findall((REPO / doc).read_text()):
            seen.setdefault(cmd.strip(), None)
    return list(seen)


FENCED = {cmd for _, cmd in all_commands()}


def reason(cmd: str) -> str | None:
    """Why an inline command is not run here (None: it is)."""
    if cmd in FENCED:
        return "shown in a fenced block: tests/test_docs.py runs it and compares its output"
    if not_run_reason(cmd) or PLACEHOLDER.search(cmd):
        return "a synopsis: capitals, ... or [optional] stand for the reader's values"
    words = cmd.split()
    if words[0] == "clustersim" and len(words) <= 3 and all(w.startswith("--") for w in words[2:]) and len(words) > 1 \
            and words[1:] != ["--version"]:
        return "names a command or an option, not a run"
    return next((why for prefix, why in LONG.items() if cmd.startswith(prefix)), None)


COMMANDS = inline_commands()


def test_inline_commands_are_found_and_some_run():
    assert "clustersim --version" in COMMANDS and "clustersim run llama3-8b-fsdp-h100" in COMMANDS
    ran = [c for c in COMMANDS if reason(c) is None]
    assert len(ran) >= 6, ran


@pytest.mark.parametrize("cmd", COMMANDS)
def test_inline_command_runs(cmd, tmp_path):
    why = reason(cmd)
    if why is not None:
        pytest.skip(why)
    folder = scratch(tmp_path)
    for first in setup_of(cmd):
        done = run_command(first, folder)
        assert done.returncode == 0, f"{first}: {done.stderr[-800:]}"
    proc = run_command(cmd, folder)
    if cmd == "clustersim":  # README: "`clustersim` alone lists the commands" (argparse: exit 2)
        assert proc.returncode == 2 and all(c in proc.stderr + proc.stdout for c in ("run", "plan", "validate"))
        return
    assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-1500:]}"
    assert proc.stdout.strip()
