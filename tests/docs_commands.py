"""The commands README.md and docs/*.md show, extracted from their fenced code blocks.

A command is a line of a fenced block that starts with ``clustersim`` or ``python``, with
its backslash continuations joined and its trailing ``# comment`` removed. tests/test_docs.py
runs each one (or says why it cannot: a placeholder such as ``SCENARIO``) and compares what it
prints with the stored ``docs/out/<slug>.out`` (``UPDATE_DOCS=1`` rewrites them).
"""

from pathlib import Path
import re
import shlex

REPO = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a ``#`` outside quotes after a space)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return " ".join(shlex.quote(t) if re.search(r"[^\w@%+=:,./-]", t) else t for t in lexer)


def commands(doc: str) -> list[str]:
    """Every command the fenced blocks of ``doc`` (a path under the repository) show."""
    out = []
    for block in _FENCE.findall((REPO / doc).read_text()):
        lines = block.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith("$ "):
                line = line[2:]
            if re.match(r"(clustersim|python)\b", line):
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + lines[i].strip()
                if "<<" in line:  # a heredoc: the script is the block's rest
                    out.append(line)
                else:
                    out.append(_strip_comment(line))
            i += 1
    return out


def all_commands() -> list[tuple[str, str]]:
    """(doc, command) for every document, in order."""
    return [(doc, cmd) for doc in DOCS for cmd in commands(doc)]


def slug(command: str) -> str:
    """A file name for a command's stored output."""
    s = re.sub(r"[^A-Za-z0-9.=]+", "-", command.replace("scenarios/", "")).strip("-")
    return s[:150]
