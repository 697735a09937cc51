"""Bounds, strict types and file limits (sim/bounds.py, sim/input/fields.py).

Run: ``python -m pytest tests/test_bounds.py``
"""

import math
import os
import typing

import pytest
from pydantic import BaseModel

from sim import bounds
from sim.errors import InputError
from sim.hardware import specs
from sim.input.scenario import Scenario

B = bounds.Bound(1, 100, "why")


@pytest.mark.parametrize("value, whole, expected", [(8, True, 8), (8.0, True, 8), (1e2, True, 100),
                                                    (2.5, False, 2.5), (3, False, 3)])
def test_bound_accepts_numbers_inside_and_whole_floats_as_counts(value, whole, expected):
    got = B.check("k", value, whole)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value, whole, words", [
    (True, True, "whole number"), (False, False, "a number"), ("8", True, "whole number"),
    (1.5, True, "whole number"), (math.nan, False, "finite"), (math.inf, True, "finite"),
    (-math.inf, False, "finite"), (0, True, "outside 1..100 (why)"), (101, False, "outside"),
    (2**53 + 1, True, "2^53"), (None, False, "a number"), ([1], True, "whole number"),
])
def test_bound_refuses_wrong_types_non_finite_and_out_of_range(value, whole, words):
    with pytest.raises(InputError) as info:
        B.check("the.key", value, whole)
    assert info.value.key == "the.key" and words in info.value.reason


def _numeric_fields(model=Scenario, prefix=""):
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        sub = [t for t in (field.annotation, *args) if isinstance(t, type) and issubclass(t, BaseModel)]
        if sub:
            yield from _numeric_fields(sub[0], prefix + name + ".")
        elif {field.annotation, *args, *(a for t in args for a in typing.get_args(t))} & {int, float}:
            yield prefix + name, field


def _has_bound(field) -> bool:
    found = list(field.metadata)
    for t in typing.get_args(field.annotation):
        found += list(getattr(t, "__metadata__", ()))
        for a in typing.get_args(t):
            found += list(getattr(a, "__metadata__", ()))
    return any(hasattr(getattr(m, "func", None), "bound") for m in found)


def test_every_numeric_key_of_the_schema_is_declared_with_a_bound():
    """The convention of sim/input/scenario.py: a new numeric key uses count()/real()."""
    unbound = [key for key, field in _numeric_fields() if not _has_bound(field)]
    assert not unbound, f"numeric keys without a sim.bounds bound (use count(B.X) / real(B.X)): {unbound}"


def test_every_numeric_topology_field_has_a_bound():
    fields = specs.FatTreeSpec.__dataclass_fields__
    numeric = [k for k, f in fields.items() if any(t in str(f.type) for t in ("int", "float"))]
    assert sorted(numeric) == sorted(specs.FIELD_BOUNDS)


def test_topology_fields_are_strict():
    with pytest.raises(InputError, match="expected a whole number"):
        specs.check_field("k", "spines", True)
    with pytest.raises(InputError, match="finite"):
        specs.check_field("k", "oversubscription", math.nan)
    assert specs.check_field("k", "spines", 16.0) == 16


def test_read_text_refuses_what_is_not_a_small_regular_file(tmp_path):
    (tmp_path / "ok.toml").write_text("a = 1")
    assert bounds.read_text(tmp_path / "ok.toml", "k") == "a = 1"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * 100)
    (tmp_path / "latin").write_bytes(b"\xff\xfe")
    cases = [(tmp_path / "missing", "no such file"), (tmp_path / "fifo", "not a regular file"),
             (tmp_path, "not a regular file"), ("/dev/zero", "not a regular file"),
             (tmp_path / "latin", "not UTF-8")]
    for path, words in cases:
        with pytest.raises(InputError, match=words):
            bounds.read_text(path, "k")
    with pytest.raises(InputError, match="has 100 bytes, more than the 10 allowed"):
        bounds.read_text(tmp_path / "big", "k", max_bytes=10)


def test_depth_is_counted_without_recursion():
    deep = []
    for _ in range(100_000):
        deep = [deep]
    assert bounds.depth({"a": {"b": [1, [2]]}}) == 4 and bounds.depth(3) == 0
    assert bounds.depth(deep) == bounds.MAX_DEPTH + 1  # stops counting past the limit
    with pytest.raises(InputError, match="nested more than"):
        bounds.check_depth(deep, "k")
