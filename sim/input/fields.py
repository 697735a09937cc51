"""Strict, bounded field types for the scenario schema (see sim/input/scenario.py).

Pydantic's lax mode would read ``true`` as 1, ``"8"`` as 8 and accept ``inf``; these
types do not. Every numeric key is declared with its :class:`sim.bounds.Bound`, so the
check and its one-line reason live in one place:

- ``count(BOUND)``: a whole number (an int, or a float without a fraction such as
  ``1e6``); never a boolean or a string.
- ``real(BOUND)``: a finite number (int or float); never a boolean, a string, nan or inf.
- ``Flag``: a boolean (TOML ``true``/``false`` only). ``Text``: a string (a name);
  ``PathText``: a string that may be a file path.
- a choice: its ``StrEnum`` of sim/input/choices.py (pydantic reads the value, the loaded
  scenario holds the member); ``choice(ENUM, members)`` where only some members are allowed.
"""

from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field, StrictBool, StrictStr

from ..bounds import NAME_CHARS, PATH_CHARS, Bound
from ..errors import InputError

Flag = StrictBool
Text = Annotated[StrictStr, Field(max_length=NAME_CHARS)]
PathText = Annotated[StrictStr, Field(max_length=PATH_CHARS)]  # a file path, or a preset's name


def _checker(bound: Bound, whole: bool):
    def check(value):
        try:
            return bound.check("", value, whole)
        except InputError as exc:  # pydantic adds the key's location
            raise ValueError(exc.reason) from None

    check.bound = bound  # (for listing every key's bound: CONTRACT.md)
    return check


def count(bound: Bound):
    """A whole number inside ``bound``."""
    return Annotated[int, BeforeValidator(_checker(bound, True))]


def real(bound: Bound):
    """A finite number inside ``bound``."""
    return Annotated[float, BeforeValidator(_checker(bound, False))]


def choice(enum: type[StrEnum], members: tuple):
    """A member of ``enum`` among ``members`` (given as its value), refused with the message
    pydantic writes for a whole enum (``Input should be 'a', 'b' or 'c'``)."""
    values = [m.value for m in members]
    allowed = ", ".join(repr(v) for v in values[:-1]) + f" or {values[-1]!r}"

    def check(value):
        if isinstance(value, str) and value in values:
            return enum(value)
        raise ValueError(f"Input should be {allowed}")

    return Annotated[enum, BeforeValidator(check)]
