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


# Commands shown as a pattern (placeholders in capitals, ``...``, ``[optional]``) or that change
# the checkout on purpose: never run, each with the reason. Matched as substrings.
NOT_RUN = {
    "SCENARIO": "a synopsis: SCENARIO stands for any scenario",
    "A.toml B.toml": "a synopsis: A.toml and B.toml stand for two scenarios (tests/test_shared_fabric.py runs it)",
    "my.toml": "a synopsis: my.toml stands for a scenario of the reader's",
    " ...": "a synopsis: ... stands for the options of the command above",
    "[--": "a synopsis: [--option] is optional",
    "python - <<": "edits sim/outputs/timeline.py on purpose (bench/mutations.py runs it in a copy)",
    "python bench/mutations.py": "runs the test suite once per mutation (minutes; docs/mutations.md's own table)",
}

# Commands another test runs anyway (minutes of CPU): that test compares their output with the
# stored one (tests/test_docs.py's differences), so tests/test_docs.py does not run them again.
RUN_ELSEWHERE = {"python -m sim.studies.gallery": "tests/test_output_folders.py (in a clone, writing out/)"}

# Commands the docs show failing on purpose: substring -> the exit status they show (stderr compared).
EXIT = {"--algo pat --gpus 64 --topology generic": 2}


def expected_exit(command: str) -> int:
    """The exit status the docs show for ``command`` (0 unless listed in EXIT)."""
    return next((code for pattern, code in EXIT.items() if pattern in command), 0)


# Commands too long for CI (seconds of CPU each on 2 cores, measured): run with ``-m slow``.
SLOW = (
    "clustersim validate",
    "clustersim study ",
    "clustersim sweep ",
    "clustersim run scenarios/gpt3-175b-ptd.toml",
    "clustersim run scenarios/llama3-405b-16k-h100.toml",
    "clustersim run scenarios/llama3.1-70b-fp8-h100.toml",
    "clustersim plan llama3.1-70b",
    "clustersim campaign scenarios/llama3-405b-16k-h100.toml",
    "python -m sim.rl.validation --fit",  # (the plain table takes 5 s: run in CI)
    "python -m sim.rl.exports",
    "clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt examples/",  # 11 rows x scans
    "clustersim collective --op all_reduce --algo tree --proto auto --gpus 144",  # (after that calibration)
    "clustersim collective --op all_reduce --algo ring --proto auto --gpus 144",
)

# Parts of an output that differ from run to run (wall-clock time): masked before comparing.
VOLATILE = (
    re.compile(r"\bevents in [0-9][0-9.,]* s\b"),  # run's "918 events in 0.13 s"
    re.compile(r"^simulated in\s+[0-9][0-9.,]* s\b", re.M),  # rl's "simulated in    0.67 s"
    re.compile(r'"sim_wall_s": [0-9][0-9.e-]*'),  # --json
    re.compile(r"^simulation time: .*$", re.M),  # validate's wall-clock line
)


def not_run_reason(command: str) -> str | None:
    """Why ``command`` is not run, or None when it is."""
    for pattern, reason in NOT_RUN.items():
        if pattern in command:
            return reason
    return None


# Commands that read what an earlier command of the same walk-through wrote (a file in the
# folder it runs in): that command runs first, in the same scratch folder. Matched as substrings.
SETUP = {"gb200.toml": "clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt "
                       "--topology gb200-nvl72 --out gb200.toml",
         "gb200x2.toml": "clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt "
                         "examples/calibration/gb200-nvl72-2racks_all_reduce_perf.txt --topology gb200-nvl72 "
                         "--out gb200x2.toml"}


def setup_of(command: str) -> list[str]:
    """The commands to run before ``command``, in its folder."""
    return [first for key, first in SETUP.items() if key in command and command != first]


def is_slow(command: str) -> bool:
    """Whether ``command`` runs only with ``-m slow``."""
    return command.startswith(SLOW)
