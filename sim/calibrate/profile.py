"""The calibration profile file: what ``clustersim calibrate --out`` writes (CONTRACT.md,
"Calibration profile").

``[profile]`` says which clustersim wrote it, from which topology and GPU, and lists its inputs
(path relative to the profile, kind, SHA-256, the scenario of a log or trace); ``[fabric]`` and
``[compute]`` hold the constants the simulator uses in place of the presets
(sim/hardware/calibration.py reads them); ``[[report.change]]`` says for each changed constant
its preset and fitted values, on how many points, with what residual before and after.
"""

import hashlib
import json
import os
from pathlib import Path
import tomllib

from .. import bounds
from ..hardware import calibration


def sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def relative(path: str | Path, profile: str | Path) -> str:
    """``path`` as the profile records it: relative to the profile's folder (links kept as
    written, so a profile beside a linked folder records the path a user sees)."""
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(profile)))


def render(meta: dict, inputs: list[dict], fabric: dict, compute: dict, changes: list[dict]) -> str:
    """The profile's TOML text."""
    out = ["# clustersim calibration profile, written by `clustersim calibrate` (docs/calibrate.md).",
           "# Use it with --calibration FILE, or [cluster] calibration = \"FILE\" in a scenario.", "",
           "[profile]"]
    out += [f"{k} = {_value(v)}" for k, v in meta.items()]
    for item in inputs:
        out += ["", "[[profile.inputs]]"] + [f"{k} = {_value(v)}" for k, v in item.items() if v is not None]
    for table, values in (("fabric.efficiency", fabric.get("efficiency", {})),
                          ("fabric.latency_us", fabric.get("latency_us", {}))):
        if values:
            out += ["", f"[{table}]"] + [f"{k} = {_value(v)}" for k, v in sorted(values.items())]
    if compute:
        out += ["", "[compute]"] + [f"{k} = {_value(v)}" for k, v in compute.items()]
    for change in changes:
        out += ["", "[[report.change]]"] + [f"{k} = {_value(v)}" for k, v in change.items() if v is not None]
    return "\n".join(out) + "\n"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(round(float(v), 6)) if isinstance(v, float) else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write(path: str, text: str) -> None:
    """Write the profile, checking first that it reads back as a valid one."""
    from ..outputs.paths import write_bytes

    calibration.from_dict(tomllib.loads(text), path, "--out")
    write_bytes(path, text.encode(), "--out")


def read(path: str | Path) -> tuple[dict, calibration.Calibration]:
    """(the raw TOML, its overrides) of a profile; InputError naming --check on a bad one."""
    cal = calibration.load(path, "--check")
    return tomllib.loads(bounds.read_text(Path(path), "--check")), cal
