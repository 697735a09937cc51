"""The Cython declarations of bench/compile_engine.py's experiment (bench/compiled/*.pxd) against
the engine's own classes: a .pxd types what its .py module defines and nothing else, so the
.py stays the one source. Every ``cdef class`` there must name exactly the attributes its class
sets on ``self`` (and, where the class has ``__slots__``, exactly those), and every method it
declares must be one of the class's. Pure Python (ast): no compiler needed.
Run: ``python -m pytest -q tests/test_compiled_decls.py``
"""

import ast
import re

import pytest

from conftest import REPO

DECLARED = sorted((REPO / "bench" / "compiled").glob("*.pxd"))
CLASS = re.compile(r"^cdef class (\w+):")
ATTRS = re.compile(r"^    cdef (?:public )?[\w\[\]: ]+? ((?:\w+, )*\w+)$")
METHOD = re.compile(r"^    cpdef (\w+)\(")


def declarations(pxd) -> dict[str, tuple[set, set]]:
    """Class name -> (attribute names, method names) declared in ``pxd``."""
    out, current = {}, None
    for line in pxd.read_text().splitlines():
        if m := CLASS.match(line):
            current = out[m.group(1)] = (set(), set())
        elif current is not None and (m := ATTRS.match(line)):
            current[0].update(name for name in m.group(1).split(", ") if name != "__weakref__")
        elif current is not None and (m := METHOD.match(line)):
            current[1].add(m.group(1))
    return out


def defined(module) -> dict[str, tuple[set, set, set | None]]:
    """Class name -> (attributes set on ``self`` in its methods, its methods, its __slots__ or None)."""
    out = {}
    for node in ast.parse(module.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        attrs, methods, slots = set(), set(), None
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                methods.add(item.name)
                for sub in ast.walk(item):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                            and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        attrs.add(sub.attr)
            elif isinstance(item, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in item.targets):
                slots = set(ast.literal_eval(item.value))
        out[node.name] = (attrs, methods, slots)
    return out


def test_there_are_declarations():
    assert {p.stem for p in DECLARED} >= {"core", "clock"}


@pytest.mark.parametrize("pxd", DECLARED, ids=lambda p: p.name)
def test_declarations_match_the_classes(pxd):
    module = REPO / "sim" / "engine" / f"{pxd.stem}.py"
    classes = defined(module)
    for name, (attrs, methods) in declarations(pxd).items():
        assert name in classes, f"{pxd.name}: {name} is not a class of {module.name}"
        own_attrs, own_methods, slots = classes[name]
        assert attrs == own_attrs, f"{pxd.name} {name}: declared {sorted(attrs ^ own_attrs)} differ from the class's"
        if slots is not None:
            assert attrs == slots, f"{pxd.name} {name}: declared attributes differ from __slots__"
        assert methods <= own_methods, f"{pxd.name} {name}: {sorted(methods - own_methods)} not methods of the class"
