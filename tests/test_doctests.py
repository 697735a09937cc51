"""The examples in the package's docstrings run, so ``python -m pytest -q`` (CI's command)
fails when one goes stale: every module under ``sim/`` whose source holds a ``>>>`` line
is imported and its doctests are run (ELLIPSIS on, as ``pytest --doctest-modules``).
Examples marked ``# doctest: +SKIP`` (a whole simulation in ``sim/__init__.py``) are only parsed.

Importing a module to find its doctests must cost nothing: a fresh interpreter imports every
module of the package (but ``sim.__main__``, which runs the CLI) from an empty folder, and
must print nothing and write nothing.

Run: ``python -m pytest tests/test_doctests.py``
"""

import doctest
import importlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env

PACKAGE = Path(__file__).resolve().parent.parent / "sim"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


WITH_EXAMPLES = [module_name(p) for p in sources() if ">>>" in p.read_text(encoding="utf-8")]


def test_the_package_has_doctests():
    assert len(WITH_EXAMPLES) >= 9  # cli, units, sim, network, plan.rank, plan.space, paths, rl.lengths, topology


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_doctests_pass(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' lines but no doctest finds them (outside a docstring?)"
    runner, out = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS), io.StringIO()
    for test in tests:
        runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()


IMPORT_ALL = """
import importlib, pkgutil, sim
for m in pkgutil.walk_packages(sim.__path__, "sim."):
    if m.name != "sim.__main__":
        importlib.import_module(m.name)
print(len(sys.modules), file=open(sys.argv[1], "w"))
"""


def test_importing_every_module_prints_and_writes_nothing(tmp_path):
    work, count = tmp_path / "cwd", tmp_path / "count"
    work.mkdir()
    p = subprocess.run([sys.executable, "-c", "import sys" + IMPORT_ALL, str(count)], cwd=work,
                       capture_output=True, text=True, timeout=120, env=cli_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""
    assert list(work.iterdir()) == []
    assert int(count.read_text()) > 100
