"""Every choice of the scenario is an enum (sim/input/choices.py), not a ``Literal`` of strings:
the schema says so, each member's value reads back from TOML and from ``--set`` as that member
and writes back as the same string, and a value outside the choice is refused in one line.

Run: ``python -m pytest -q tests/test_choices.py``
"""

import copy
from enum import StrEnum
import json
import tomllib
import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

from sim.input import choices
from sim.input.load import load_scenario, parse_value, set_key
from sim.input.scenario import Scenario
from tests.conftest import REPO, assert_refusals

BASE = {"model": {"preset": "llama3-8b", "moe": {}}, "training": {"seq_len": 4096, "global_batch": 8},
        "rl": {"generator_gpus": 8, "trainer_gpus": 8, "steps": 2, "lengths": {"mean": 512.0, "max": 1024}}}
SUBSETS = {"parallel.dp_algo": choices.DP_ALGORITHMS}  # (fields.choice: direct is all-to-all only)


def _leaves(annotation):
    """The plain types an annotation is made of (through Optional, list, dict, Annotated)."""
    if typing.get_origin(annotation) is typing.Literal:
        return [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if args and (typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict)):
        return [leaf for a in args for leaf in _leaves(a)]
    return [annotation]


def fields(model=Scenario, prefix=""):
    """(dotted key, leaf type) of every field of the scenario model, nested sections too."""
    for name, info in model.model_fields.items():
        for leaf in _leaves(info.annotation):
            if isinstance(leaf, type) and issubclass(leaf, BaseModel):
                yield from fields(leaf, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", leaf


CHOICES = sorted({(key, leaf) for key, leaf in fields() if isinstance(leaf, type) and issubclass(leaf, StrEnum)},
                 key=lambda kv: kv[0])


def test_no_choice_is_a_literal_of_strings():
    literals = [key for key, leaf in fields() if typing.get_origin(leaf) is typing.Literal]
    assert not literals, f"choice fields declared as Literal strings (use an enum of sim/input/choices.py): {literals}"


def test_every_choice_has_its_enum():
    """The choices the brief names are all there, each with an enum of the input layer or below."""
    keys = {key for key, _ in CHOICES}
    assert {"model.moe.routing", "model.mlp", "model.attention", "training.precision", "training.recompute",
            "training.attention_backend", "training.fp8_recipe", "training.kernels", "jitter.distribution",
            "jitter.mode", "parallel.schedule", "parallel.ep_dispatcher", "parallel.cp_impl", "parallel.dp_algo",
            "rl.mode", "rl.weight_route", "rl.weight_sync", "simulation.micro_batches"} <= keys
    assert all(leaf.__module__.startswith(("sim.input.", "sim.hardware.")) for _, leaf in CHOICES)
    exported = {getattr(choices, n) for n in choices.__all__}
    assert all(leaf in exported for _, leaf in CHOICES)


def _validated(key: str, value) -> Scenario:
    data = copy.deepcopy(BASE)
    set_key(data, key, value)
    return Scenario.model_validate(data)


def _at(obj, key: str):
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.mark.parametrize("key,enum", CHOICES, ids=[k for k, _ in CHOICES])
def test_every_value_round_trips(key, enum):
    """TOML text and a --set value each read back as the member (compared by identity in the
    simulator) and write back as the same string: JSON dump, f-string, CSV cell."""
    section, _, leaf = key.rpartition(".")
    for member in SUBSETS.get(key, enum):
        from_toml = tomllib.loads(f'[{section}]\n{leaf} = "{member.value}"\n')
        s = _validated(key, _at(from_toml, key))
        assert _at(s, key) is member
        assert _at(s, key) is _at(_validated(key, parse_value(member.value)), key)  # --set key=value
        assert _at(json.loads(s.model_dump_json()), key) == member.value
        assert _at(s.model_dump(mode="json"), key) == member.value and f"{_at(s, key)}" == member.value


@pytest.mark.parametrize("key,enum", CHOICES, ids=[k for k, _ in CHOICES])
def test_other_values_are_refused(key, enum):
    """A value outside the choice: pydantic's message listing the values, as the Literal wrote it."""
    allowed = [m.value for m in SUBSETS.get(key, enum)]
    listed = ", ".join(repr(v) for v in allowed[:-1]) + f" or {allowed[-1]!r}"
    for bad in ["bogus", 1, True, "RING"] + [m.value for m in enum if m.value not in allowed]:
        with pytest.raises(ValidationError) as err:
            _validated(key, bad)
        assert err.value.errors()[0]["msg"].removeprefix("Value error, ") == f"Input should be {listed}"


def test_loaded_scenarios_hold_members():
    """What the loader fills in (the default schedule) is a member too: the builders compare by identity."""
    for name in ("gpt3-175b-ptd", "llama3.1-70b-fp8-h100", "rl-llama3-8b-h100"):
        s = load_scenario(REPO / "scenarios" / f"{name}.toml")
        for key, enum in CHOICES:
            if (key.startswith("rl.") and s.rl is None) or (key.startswith("model.moe.") and s.model.moe is None):
                continue
            value = _at(s, key)
            assert value is None or type(value) is enum, (name, key, value)
    assert type(load_scenario(REPO / "scenarios" / "gpt3-175b-ptd.toml").parallel.schedule) is choices.Schedule


def test_cli_refuses_a_value_outside_the_choice():
    """Exit 2, one line naming the key: dp_algo's subset (direct), a precision, a schedule's case."""
    assert_refusals(REPO / "scenarios" / "gpt3-175b-ptd.toml",
                    [(["parallel.dp_algo=direct"], "parallel.dp_algo"), (["training.precision=fp9"], "training.precision"),
                     (["parallel.schedule=1F1B"], "parallel.schedule")])
