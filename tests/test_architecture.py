"""The folders are the layers of ARCHITECTURE.md, and imports point down only.

Every module of ``sim`` belongs to the layer of its folder (or, at the top level, of its
name); a module may import from its own layer or a lower one, never a higher one. The
walk reads every import statement, function-level ones included, with ``ast``. Two
arrows an import walk cannot see fail too: a string naming another room's module (a
registry by name; only the command line assembles those), and a module reading another
module's ``_private`` names.

Run: ``python -m pytest tests/test_architecture.py``
"""

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parents[1] / "sim"

# bottom -> top: one row of ARCHITECTURE.md's table each
LAYERS = [
    ("foundation", ("sim.errors", "sim.units", "sim.version", "sim.bounds", "sim.arrays")),
    ("hardware", ("sim.hardware",)),
    ("input", ("sim.input",)),
    ("model costs / collectives", ("sim.model", "sim.collectives")),
    ("engine", ("sim.engine",)),
    ("parallelism", ("sim.parallel",)),
    ("outputs", ("sim.outputs",)),
    ("one step", ("sim.step", "sim.steady", "sim.work")),
    ("sweeps", ("sim.sweeps",)),
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


# --- strings that name modules: a registry by name is an import the walk above cannot see


def room_of(module: str) -> str:
    """The folder of ``module`` under sim (``sim.rl``), or the top-level module itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (SIM / parts[-1]).is_dir() else module


def named_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every string in ``source``, docstrings aside, whose whole text names
    a module of sim (``"sim.rl.study"``, ``"sim.rl.study:run"``)."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
            ast.AsyncFunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            name = node.value.partition(":")[0]
            if name.startswith("sim.") and name.replace(".", "").replace("_", "").isalnum() and _exists(name):
                out.append((node.lineno, name))
    return out


def _exists(module: str) -> bool:
    path = SIM.parent / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def strings_across_rooms(source: str, module: str) -> list[str]:
    """Modules of another room that ``module`` names by string: only the command line,
    the top layer, assembles registries of other rooms' modules (sim.cli's commands,
    sim.commands.study's studies)."""
    if layer_of(module) == len(LAYERS) - 1:
        return [f"line {line}: {target}" for line, target in named_modules(source)
                if layer_of(target) > layer_of(module)]
    return [f"line {line}: {target}" for line, target in named_modules(source) if room_of(target) != room_of(module)]


def test_no_room_names_another_rooms_module_by_string():
    found = {module_name(p): strings_across_rooms(p.read_text(), module_name(p)) for p in FILES}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"modules named by string across rooms (register them in their own room): {found}"


def test_a_string_registration_across_rooms_fails():
    """What sim/studies did before its studies were registered in their rooms."""
    source = ('"""Doc naming sim.rl.study is fine."""\n'
              'STUDIES = {"a": "sim.studies.fsdp_crossover", "b": "sim.rl.study"}\n')
    assert named_modules(source) == [(2, "sim.studies.fsdp_crossover"), (2, "sim.rl.study")]
    assert strings_across_rooms(source, "sim.studies") == ["line 2: sim.rl.study"]
    assert strings_across_rooms(source, "sim.commands.study") == []
    assert room_of("sim.step") == "sim.step" and room_of("sim.rl") == room_of("sim.rl.loop") == "sim.rl"


# --- private names: a module uses another module's `_name`s only through its public names

# private names of other libraries that sim reads on purpose and that a sim module also defines
FOREIGN_PRIVATE = {"_node": "networkx.Graph._node, node -> attributes, read in hardware/ for speed",
                   "_now": "simpy.Environment._now, the clock: engine/clock.py advances it, engine/ reads it "
                           "without the property call (issue 28)"}


def private_names(source: str) -> set[str]:
    """Every ``_name`` (not ``__dunder__``) that ``source`` defines: functions, classes,
    variables, attributes it assigns, arguments and import aliases."""
    out = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            out.add(n.id if isinstance(n, ast.Name) else n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return {x for x in out if x.startswith("_") and not x.startswith("__")}


def private_reads(source: str, elsewhere: set[str]) -> list[str]:
    """Private names of other sim modules that ``source`` reads: ``from x import _name``,
    or ``obj._name`` (obj not self or cls) for a ``_name`` some other module defines and
    this one does not."""
    own, out = private_names(source), []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("sim")):
            out += [f"line {n.lineno}: import {a.name}" for a in n.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
            mine = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")
            if not mine and n.attr not in own and n.attr in elsewhere and n.attr not in FOREIGN_PRIVATE:
                out.append(f"line {n.lineno}: .{n.attr}")
    return out


def test_no_module_reads_another_modules_private_names():
    sources = {p: p.read_text() for p in FILES}
    definers: dict[str, set] = {}
    for p, source in sources.items():
        for name in private_names(source):
            definers.setdefault(name, set()).add(p)
    found = {}
    for p, source in sources.items():
        elsewhere = {name for name, where in definers.items() if where - {p}}
        if reads := private_reads(source, elsewhere):
            found[module_name(p)] = reads
    assert not found, f"private names read across modules (make them public or keep them home): {found}"


def test_a_private_read_across_modules_fails():
    """What parallel/copies.py and hardware/paths.py did before (Folding._locate, Topology._leaves)."""
    source = "from .tree import _tree_edges\ndef f(folding, topo, self):\n    self._own = folding._locate(1)\n" \
             "    return topo._leaves, self._own, topo._own, topo.graph._node\n"
    assert private_reads(source, {"_locate", "_leaves", "_own", "_node"}) == \
        ["line 1: import _tree_edges", "line 3: ._locate", "line 4: ._leaves"]


# What a layer launches, moves and computes is said once, by the rank-program builders
# (tp, cp, ep, passes, ...). The planner (sim/plan/) reads it through
# sim.parallel.layer_program and the layout's facts (groups, parameters, the layer split
# and schedule, memory, the counts a steady-state run simulates), never a builder's internals; the work census likewise, plus the
# workload's folding rule (which ranks a run simulates).
LAYER_INTERFACE = {"sim.parallel.layer_program", "sim.parallel.layout", "sim.parallel.params", "sim.parallel.pp",
                   "sim.parallel.program", "sim.parallel.memory", "sim.parallel.steady"}
# (the planner may ask the census, itself held to the interface, how many ranks a layout simulates)
READERS = {"sim.plan": LAYER_INTERFACE | {"sim.parallel.census"},
           "sim.parallel.census": LAYER_INTERFACE | {"sim.parallel.workload"}}


def interface_breaches(source: str, module: str) -> list[str]:
    """sim.parallel modules ``module`` imports beyond what its READERS entry allows."""
    allowed = next((v for k, v in READERS.items() if module == k or module.startswith(k + ".")), None)
    if allowed is None:
        return []
    package = module.rpartition(".")[0]
    found = {target for _, target in imports_of(source, package)
             if target == "sim.parallel" or target.startswith("sim.parallel.")}
    return sorted(t for t in found if t not in allowed)


@pytest.mark.parametrize("path", [p for p in FILES if any(module_name(p) == k or module_name(p).startswith(k + ".")
                                                          for k in READERS)],
                         ids=lambda p: str(p.relative_to(SIM.parent)))
def test_planner_and_census_read_layers_only_through_the_layer_program(path):
    assert not interface_breaches(path.read_text(), module_name(path)), module_name(path)


def test_the_interface_check_sees_a_builder_import():
    """The check can fail: the planner importing TP's byte formula, or the census passes."""
    assert interface_breaches("from ..parallel.tp import sublayer_bytes\n", "sim.plan.layers") == \
        ["sim.parallel.tp"]
    assert interface_breaches("from . import passes, layer_program\n", "sim.parallel.census") == \
        ["sim.parallel.passes"]
    assert interface_breaches("from ..parallel import tp\n", "sim.outputs.metrics") == []  # (others may)
