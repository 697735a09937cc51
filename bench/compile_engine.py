"""An experiment of issue 28, not part of the package: the engine's hot modules compiled with
Cython from the same .py files, in a copy of this tree, to time against the pure-Python tree.

Run: ``pip install cython`` (and a C compiler), then ``python bench/compile_engine.py OUT``:
copies ``sim/``, ``scenarios/``, ``topologies/`` and ``bench/`` into the folder OUT (made
anew), puts the declarations of ``bench/compiled/*.pxd`` beside their modules there (Cython's
augmenting .pxd files: the .py files are compiled unchanged, the .pxd only types the classes'
attributes and a few locals), compiles those modules in place with ``cythonize -i``, and
prints which engine modules the copy imports compiled. Then time it beside this tree, from
each tree's own folder (``python -c`` and ``bench/rows.py``'s children put the working folder
first on ``sys.path``, ahead of the editable install)::

    (cd OUT && PYTHONPATH=. python bench/rows.py dg-l70-64)
    python bench/rows.py dg-l70-64

The working tree itself is never compiled (no .so file shadows a .py file there). Measured
figures and why this is not wired into the install: docs/scaling.md, "A compiled engine
core".
"""

import os
from pathlib import Path
import shutil
import subprocess
import sys

REPO = Path(__file__).resolve().parent.parent
DECLARED = REPO / "bench" / "compiled"  # <module>.pxd for sim/engine/<module>.py
COMPILED = ("clock", "core", "network", "sharing")  # sim/engine modules compiled (the ones without a .pxd untyped)
# annotation_typing off: annotations stay hints (Cython would otherwise reject a tuple subclass passed
# as ``tuple``, and turn ``float`` arguments into C doubles); -ffp-contract=off: no fused multiply-adds
# (a compiler may contract a * b + c on targets with FMA, which rounds once where Python rounds twice)
DIRECTIVES = ("-3", "-X", "annotation_typing=False")


def copy_tree(out: Path) -> None:
    """This tree's package, data and benchmarks into ``out`` (links kept: sim/examples)."""
    if out.exists():
        shutil.rmtree(out)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.egg-info")
    for name in ("sim", "scenarios", "topologies", "bench"):
        shutil.copytree(REPO / name, out / name, symlinks=True, ignore=ignore)


def compile_engine(out: Path) -> None:
    """Cythonize the engine's modules of the copy in place, each with its .pxd if it has one."""
    engine = out / "sim" / "engine"
    for pxd in DECLARED.glob("*.pxd"):
        shutil.copy(pxd, engine / pxd.name)
    env = {**os.environ, "CFLAGS": (os.environ.get("CFLAGS", "") + " -ffp-contract=off").strip()}
    files = [str(engine / f"{name}.py") for name in COMPILED]
    subprocess.run([sys.executable, "-m", "Cython.Build.Cythonize", *DIRECTIVES, "-i", *files], cwd=out, env=env,
                   check=True)


def main(argv: list[str]) -> None:
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.exit(__doc__)
    out = Path(argv[0]).resolve()
    if out == REPO or REPO in out.parents:
        sys.exit("OUT must lie outside this tree (its compiled modules would shadow the .py files)")
    copy_tree(out)
    compile_engine(out)
    check = "import importlib; print(*(importlib.import_module('sim.engine.' + m).__file__ for m in %r), sep='\\n')"
    subprocess.run([sys.executable, "-c", check % (COMPILED,)], cwd=out, check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
