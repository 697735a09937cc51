"""Calibrate clustersim to a team's own cluster: measurements in, a calibration profile out.

Inputs (any mix, any number): nccl-tests / rccl-tests output (:mod:`.nccl`) fits the fabric's
efficiency and latency per link kind (:mod:`.fabric`); PyTorch profiler traces (:mod:`.kineto`)
fit the GEMM efficiency curve (:mod:`.kernels`) and are compared, compute / exposed
communication / idle, with the simulated step; training logs (:mod:`.logs`) with the scenario
that produced them fit the sustained compute factor over all runs at once (:mod:`.steps`).
The profile (:mod:`.profile`) records every changed constant, its inputs' SHA-256 and the
version; ``--check`` re-runs those inputs against it.

Run ``clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt --topology gb200-nvl72
--out gb200.toml`` (docs/calibrate.md).
"""

from dataclasses import dataclass, replace
import os
from pathlib import Path
import stat

from ..errors import InputError
from ..hardware import specs
from ..hardware.calibration import Calibration
from ..hardware.gpus import gpu_preset
from ..input.load import load_scenario
from ..input.bundled import scenario_file
from ..version import __version__
from . import fabric, kineto, logs, nccl, profile
from .fit import Fitted, fit_all


@dataclass(frozen=True)
class Input:
    """One input file: its kind ("nccl-tests", "log", "trace"), what was read, its scenario."""

    path: str
    kind: str
    parsed: object
    scenario: object = None
    scenario_path: str | None = None


def classify(paths: list[str], scenario_paths: list[str]) -> list[Input]:
    """Read every input; logs and traces get their scenario (one for all, or one each in order)."""
    out, needing = [], []
    for p in paths:
        path = Path(p)
        head, size = _head(path)
        if head[:2] == b"\x1f\x8b" or kineto.looks_like(head.decode("utf-8", "replace")):
            out.append(Input(p, "trace", kineto.parse(path)))
            needing.append(len(out) - 1)
            continue
        if size > nccl.MAX_BYTES:
            raise InputError("INPUT", f"{p}: {size:,} bytes, more than the {nccl.MAX_BYTES:,} a table or log may have")
        text = _read(path).decode("utf-8", "replace")
        if nccl.looks_like(text):
            out += [Input(p, "nccl-tests", table) for table in nccl.parse_all(path, text)]
        else:
            out.append(Input(p, "log", None))
            needing.append(len(out) - 1)
    return _with_scenarios(out, needing, scenario_paths)


def _head(path: Path) -> tuple[bytes, int]:
    """The first 4 KiB of an input and its size: a regular file (a FIFO would block, a link
    to /dev/zero never end, a folder is no input), else InputError naming it."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise InputError("INPUT", f"{path}: {'no such file' if isinstance(exc, FileNotFoundError) else exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError("INPUT", f"{path}: not a regular file (a folder, FIFO or device)")
    return _read(path, 4096), info.st_size


def _read(path: Path, limit: int = -1) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError as exc:
        raise InputError("INPUT", f"{path}: cannot read ({exc})") from None


def _with_scenarios(items: list[Input], needing: list[int], scenario_paths: list[str]) -> list[Input]:
    if scenario_paths and not needing:  # (else it would be accepted and never read)
        raise InputError("--scenario", "no training log or trace among the inputs to pair it with; nccl-tests "
                                       "tables take --topology and --gpu")
    if len(scenario_paths) > 1 and len(scenario_paths) != len(needing):
        raise InputError("--scenario", f"{len(scenario_paths)} scenarios for {len(needing)} logs and traces: "
                                       "give one for all, or one per log/trace in their order")
    for n, i in enumerate(needing):
        item = items[i]
        if not scenario_paths:
            if item.kind == "log":
                raise InputError("--scenario", f"{item.path}: a training log needs the scenario that produced it")
            continue
        spath = scenario_paths[n if len(scenario_paths) > 1 else 0]
        s = load_scenario(scenario_file(spath))
        parsed = item.parsed
        if item.kind == "log":
            t = s.training
            parsed = logs.parse(item.path, t.global_batch * t.seq_len, s.cluster.gpus)
            logs.check_world(parsed, s.cluster.gpus, s.name)
        elif parsed.world is not None and parsed.world != s.cluster.gpus:
            raise InputError("INPUT", f"{item.path}:1: the trace's distributedInfo has world_size {parsed.world}, "
                                      f"but scenario {s.name!r} has {s.cluster.gpus} GPUs")
        items[i] = replace(item, parsed=parsed, scenario=s, scenario_path=str(spath))
    return items


def cluster_of(items: list[Input], topology_name: str | None, gpu_name: str | None) -> tuple[str, str]:
    """The topology and GPU the fit starts from: flags, else the first scenario's, else dgx-h100."""
    first = next((i.scenario for i in items if i.scenario is not None), None)
    topo = topology_name or (first.cluster.topology if first else "dgx-h100")
    spec = specs.load_spec(topo, key="--topology")
    gpu = gpu_name or (first.cluster.gpu if first and first.cluster.gpu else spec.gpu)
    try:
        gpu_preset(gpu)
    except InputError as exc:
        raise InputError("--gpu", exc.reason) from None
    for i in items:
        if i.scenario is not None and (i.scenario.cluster.gpu or specs.load_spec(i.scenario.cluster.topology).gpu) != gpu:
            raise InputError("--scenario", f"{i.scenario_path}: runs another GPU than {gpu!r}; a profile is one GPU type's")
    return topo, gpu


def fit_profile(paths: list[str], topology_name: str | None, gpu_name: str | None, scenario_paths: list[str],
                out: str, picture: str | None = None) -> dict:
    """Fit every input, write the profile to ``out``, return the report."""
    from ..outputs.paths import output_file

    output_file(out, "--out", (".toml",))
    if picture:
        output_file(picture, "--picture", (".png",))
    items = classify(paths, scenario_paths)
    topo, gpu = cluster_of(items, topology_name, gpu_name)
    fitted = fit_all(items, topo, gpu, picture)
    meta = {"clustersim_version": __version__, "topology": topo, "gpu": gpu}
    once = list({i.path: i for i in items}.values())  # (a file may hold several tables)
    inputs = [{"path": profile.relative(i.path, out), "kind": i.kind, "sha256": profile.sha256(i.path),
               "scenario": profile.relative(scenario_file(i.scenario_path), out) if i.scenario_path else None}
              for i in once]
    profile.write(out, profile.render(meta, inputs, fitted.fabric, fitted.compute, fitted.changes))
    return fitted.report(out, meta, inputs)


def check_profile(path: str) -> dict:
    """Re-run the inputs a profile records against it; the report says each input's residuals
    and whether its file still has the recorded SHA-256."""
    raw, cal = profile.read(path)
    meta = raw.get("profile", {})
    base = Path(os.path.abspath(path)).parent
    recorded = meta.get("inputs", [])
    if not recorded:
        raise InputError("--check", f"{path}: the profile lists no inputs ([[profile.inputs]])")
    paths, scenarios = [], []
    for item in recorded:
        p = base / item["path"]
        if not p.is_file():
            raise InputError("--check", f"{path}: input {item['path']} is gone (looked in {base})")
        paths.append(os.path.relpath(p))  # (as a user names it from here: the report prints it)
        if item.get("scenario"):
            scenarios.append(os.path.relpath(base / item["scenario"]))
    items = classify(paths, scenarios if len(set(scenarios)) > 1 else sorted(set(scenarios)))
    fitted = fit_all(items, meta.get("topology", "dgx-h100"), meta.get("gpu", "h100-sxm"), None, fixed=cal)
    report = fitted.report(path, meta, recorded)
    report["unchanged_inputs"] = [profile.sha256(p) == item.get("sha256") for p, item in zip(paths, recorded)]
    report["version_now"] = __version__
    return report


__all__ = ["Fitted", "check_profile", "classify", "fit_profile", "fabric", "Calibration"]
