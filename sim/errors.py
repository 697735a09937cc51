"""Errors a user can cause. The CLI turns :class:`InputError` into exit status 2.

Everything a user writes (scenario keys, CLI flags, topology files) is checked at the
edge; a bad value raises ``InputError(key, reason)`` whose text names the key and why.
"""


class InputError(Exception):
    """Invalid user input: ``str(e) == f"{key}: {reason}"``."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(key, reason)  # args rebuild it: SimPy re-raises type(e)(*e.args); pickling

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


class SimulationError(RuntimeError):
    """The simulator broke one of its own guarantees: a transfer made no progress, or a
    result failed an invariant (sim/outputs/invariants.py). An internal error (exit 1),
    never a result; the message names the scenario and what broke."""
