"""The folders are the layers of ARCHITECTURE.md, and imports point down only.

Every module of ``sim`` belongs to the layer of its folder (or, at the top level, of its
name); a module may import from its own layer or a lower one, never a higher one. The
walk reads every import statement, function-level ones included, with ``ast``.
"""

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[1] / "sim"

# bottom -> top: one row of ARCHITECTURE.md's table each
LAYERS = [
    ("foundation", ("sim.errors", "sim.units", "sim.version", "sim.bounds")),
    ("hardware", ("sim.hardware",)),
    ("input", ("sim.input",)),
    ("model costs / collectives", ("sim.model", "sim.collectives")),
    ("engine", ("sim.engine",)),
    ("parallelism", ("sim.parallel",)),
    ("outputs", ("sim.outputs",)),
    ("one step", ("sim.step", "sim.work")),
    ("studies and labs", ("sim.studies", "sim.labs")),
    ("capabilities", ("sim.plan", "sim.rl", "sim.campaign", "sim.fabric", "sim.calibrate")),
    ("command line", ("sim.commands", "sim.cli", "sim.__main__", "sim")),
]


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix that names ``module``'s package or module."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise KeyError(module)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SIM.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every sim import in a file."""
    mod = module_name(path)
    return imports_of(path.read_text(), mod if path.name == "__init__.py" else mod.rpartition(".")[0])


def imports_of(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every sim import in ``source``, a module of ``package``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "sim" and not target.startswith("sim."):
                continue
            for alias in node.names:  # `from sim.x import y` may import submodule y
                sub = f"{target}.{alias.name}"
                found = (SIM.parent / sub.replace(".", "/")).with_suffix(".py").exists() or \
                    (SIM.parent / sub.replace(".", "/") / "__init__.py").exists()
                out.append((node.lineno, sub if found else target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name == "sim" or a.name.startswith("sim.")]
    return out


FILES = sorted(SIM.rglob("*.py"))


def test_every_module_has_a_layer():
    missing = [module_name(p) for p in FILES if _no_layer(module_name(p))]
    assert not missing, f"modules outside every layer of tests/test_architecture.py: {missing}"


def _no_layer(module: str) -> bool:
    """Named by no prefix but the package itself (a new top-level module or folder)."""
    named = [p for _, prefixes in LAYERS for p in prefixes if p != "sim"
             and (module == p or module.startswith(p + "."))]
    return not named and module != "sim"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SIM.parent)))
def test_imports_point_down(path):
    mine = layer_of(module_name(path))
    upward = [f"line {line}: {target} ({LAYERS[layer_of(target)][0]})"
              for line, target in imports(path) if layer_of(target) > mine]
    assert not upward, f"{module_name(path)} ({LAYERS[mine][0]}) imports from a higher layer: {upward}"


def test_the_walk_sees_an_upward_arrow():
    """The check can fail: a model module importing the engine, even inside a function."""
    source = "def f():\n    from ..engine import core\n    from ..errors import InputError\n"
    found = imports_of(source, "sim.model")
    assert found == [(2, "sim.engine.core"), (3, "sim.errors")]
    assert layer_of("sim.engine.core") > layer_of("sim.model.layers") > layer_of("sim.errors")
