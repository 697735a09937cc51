"""Load a scenario: TOML + ``--set`` overrides -> presets resolved -> every rule checked.

``load_scenario(path, overrides=None)`` is the public entry point (``sim.load_scenario``).
Each failed rule raises :class:`~sim.errors.InputError` naming the key and the reason.
"""

import dataclasses
from pathlib import Path
import tomllib

from pydantic import ValidationError

from . import presets, rules
from .. import bounds
from ..hardware import calibration, mesh, specs
from ..errors import InputError
from ..hardware.gpus import gpu_preset
from .choices import V_SCHEDULES, Distribution, Schedule
from .scenario import Scenario


def load_scenario(path: str | Path, overrides: list[str] | dict | None = None) -> Scenario:
    """Read, override, resolve and check a scenario file."""
    path = Path(path)
    return scenario_from_dict(read_toml(path), overrides, base=path.parent)


def read_toml(path: str | Path, key: str = "scenario") -> dict:
    """The table of a TOML file read through the one guarded door (:func:`sim.bounds.read_text`:
    a regular file of at most 1 MiB, UTF-8), nested at most :data:`sim.bounds.MAX_DEPTH` levels;
    InputError(key) naming the file otherwise. Every command that reads a scenario uses it
    (run, plot, sweep, plan, rl, campaign, study)."""
    path = Path(path)
    text = bounds.read_text(path, key)
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InputError(key, f"{path}: malformed TOML ({exc or 'nested too deeply'})") from None
    try:
        bounds.check_depth(data, key)
    except InputError as exc:
        raise InputError(key, f"{path}: {exc.reason}") from None
    return data


def scenario_from_dict(data: dict, overrides: list[str] | dict | None = None,
                       base: Path | None = None) -> Scenario:
    """Same as :func:`load_scenario` for an already-parsed dict."""
    bounds.check_depth(data, "scenario")
    data = _deep_copy(data)
    for key, value in override_pairs(overrides):
        bounds.check_depth(value, key)
        set_key(data, key, value)
    _resolve_model(data, base)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    return _calibrated(check(scenario), base)


def _calibrated(s: Scenario, base: Path | None) -> Scenario:
    """The scenario with ``cluster.calibration``'s path replaced by the profile it names
    (relative to the scenario file), checked against the cluster's GPU."""
    path = s.cluster.calibration
    if not isinstance(path, str):
        return s
    path = Path(path) if base is None or Path(path).is_absolute() else base / path
    profile = calibration.load(path)
    profile.check_gpu(s.cluster.gpu or topology_spec(s).gpu)
    return s.model_copy(update={"cluster": s.cluster.model_copy(update={"calibration": profile})})


def _deep_copy(d):
    return {k: _deep_copy(v) for k, v in d.items()} if isinstance(d, dict) else (
        [_deep_copy(v) for v in d] if isinstance(d, list) else d)


def override_pairs(overrides) -> list[tuple[str, object]]:
    """``["k=v", ...]`` (``--set`` items, values parsed by :func:`parse_value`) or a dict
    -> [(key, value), ...]."""
    if not overrides:
        return []
    if isinstance(overrides, dict):
        return list(overrides.items())
    pairs = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InputError("--set", f"expected key=value, got {item!r}")
        value = parse_value(text.strip())
        if isinstance(value, str) and value.startswith(("[", "{")):  # meant as a list or table, not TOML
            raise InputError(key.strip(), f"--set value {value[:60]!r} is not a TOML value (lists are [a, b], "
                                          "tables {key = value}; JSON's \"key\": value is not TOML), e.g. "
                                          "--set 'stragglers=[{ranks = [3], slowdown = 1.5}]'")
        pairs.append((key.strip(), value))
    return pairs


def parse_value(text: str):
    """A TOML value if it parses as one (8, 1.5, true, [1, 2]), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise InputError("--set", f"value nested too deeply: {text[:40]}...") from None


def set_key(data: dict, key: str, value) -> None:
    """Set the dotted ``key`` (``model.hidden``) of a nested scenario dict to ``value``,
    making sections on the way; InputError if a part of the path is not a section."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise InputError(key, f"{part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _resolve_model(data: dict, base: Path | None) -> None:
    model = data.get("model")
    if not isinstance(model, dict):
        raise InputError("model", "missing section [model] (give preset, hf_config or the fields)")
    if model.get("preset") and model.get("hf_config"):
        raise InputError("model", "give either preset or hf_config, not both")
    for key in ("preset", "hf_config"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise InputError(f"model.{key}", f"expected a name or path (a string), got {model[key]!r}")
        longest = bounds.PATH_CHARS if key == "hf_config" else bounds.NAME_CHARS
        if len(model.get(key) or "") > longest:
            raise InputError(f"model.{key}", f"longer than {longest} characters")
    if model.get("preset"):
        resolved = presets.model_preset(model["preset"])
    elif model.get("hf_config"):
        resolved = presets.hf_config(model["hf_config"], base)
    else:
        resolved = {}
    explicit = {k: v for k, v in model.items() if k not in ("preset", "hf_config")}
    if isinstance(resolved.get("moe"), dict) and isinstance(explicit.get("moe"), dict):
        explicit["moe"] = {**resolved["moe"], **explicit["moe"]}
    data["model"] = {**resolved, **explicit, "preset": model.get("preset"), "hf_config": model.get("hf_config")}
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if data["model"].get(k) is None]
    if missing:
        raise InputError(f"model.{missing[0]}", "required (or give model.preset / model.hf_config)")


def _first_error(exc: ValidationError) -> InputError:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "scenario"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    return InputError(key, msg.removeprefix("Value error, "))


def check(s: Scenario) -> Scenario:
    """Cross-field rules; returns the scenario with cluster.gpus and model defaults filled."""
    spec = specs.load_spec(s.cluster.topology)
    overrides = _check_topology_overrides(s, spec)
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"topology_overrides": overrides})})
    _check_faults(s)
    gpu = gpu_preset(s.cluster.gpu or s.cluster.topology_overrides.get("gpu", spec.gpu))
    mesh.check_gpu(dataclasses.replace(spec, **overrides), gpu, "cluster.gpu")
    gpus = _gpu_count(s, spec)
    m, p = s.model, s.parallel
    model = m.model_copy(update={"kv_heads": m.kv_heads or m.heads, "ffn_hidden": m.ffn_hidden or 4 * m.hidden})
    if p.schedule is None:  # Megatron: --num-layers-per-virtual-pipeline-stage alone means interleaved 1F1B
        p = p.model_copy(update={"schedule": Schedule.INTERLEAVED if p.virtual_stages > 1 else Schedule.ONE_F_ONE_B})
    if p.schedule in V_SCHEDULES and p.virtual_stages == 1:  # a V: two chunks per rank (zbpp_utils.py)
        p = p.model_copy(update={"virtual_stages": 2})
    t = s.training
    if t.grad_bucket_mb is not None:  # the old key: an alias of parallel.ddp_bucket_mb, the one definition
        if p.ddp_bucket_mb is not None:
            raise InputError("training.grad_bucket_mb", "is the old name of parallel.ddp_bucket_mb (the one "
                                                        "definition of the DDP bucket size): give only that one")
        p, t = p.model_copy(update={"ddp_bucket_mb": t.grad_bucket_mb}), t.model_copy(update={"grad_bucket_mb": None})
    s = s.model_copy(update={"model": model, "parallel": p, "training": t,
                             "cluster": s.cluster.model_copy(update={"gpus": gpus})})
    rules.check_all(s, gpu, gpus, _per_node(s, spec))
    topology_spec(s)  # cluster.segment: fits the domain, divides the job's nodes (specs.segmented)
    if s.jitter.floor != 1.0 and s.jitter.distribution is not Distribution.NORMAL:
        raise InputError("jitter.floor", f"bounds the normal distribution's draws; with '{s.jitter.distribution}' "
                                         "it would do nothing (set distribution = \"normal\")")
    return s


def topology_spec(s: Scenario) -> specs.FatTreeSpec:
    """The cluster's topology parameters with the scenario's overrides applied, then its
    Slurm segments (``cluster.segment``: :func:`sim.hardware.specs.segmented`): what
    sim.step builds the graph from."""
    spec = specs.load_spec(s.cluster.topology)
    overrides = dict(s.cluster.topology_overrides)
    if s.cluster.gpus_per_node:
        overrides["gpus_per_node"] = s.cluster.gpus_per_node
        overrides.setdefault("gpus_per_domain", max(spec.gpus_per_domain, s.cluster.gpus_per_node)
                             if spec.gpus_per_domain >= spec.gpus_per_node else s.cluster.gpus_per_node)
    spec = dataclasses.replace(spec, **overrides)
    return specs.segmented(spec, s.cluster.segment, s.cluster.gpus) if s.cluster.segment else spec


def clean_copy(s: Scenario) -> Scenario:
    """The same scenario without stragglers, jitter or link faults (what sim.step prices
    ``straggler_cost_s`` against)."""
    from .scenario import Jitter

    return s.model_copy(update={"stragglers": [], "jitter": Jitter(),
                                "cluster": s.cluster.model_copy(update={"faults": []})})


def _check_topology_overrides(s: Scenario, spec) -> dict:
    """Override values obey the same rules and bounds as a topology file's (a zero, NaN
    or negative bandwidth or count would divide by zero or never finish); returns them
    converted (``16.0`` spines -> 16)."""
    fields = specs.FatTreeSpec.__dataclass_fields__
    checked = {}
    for k, v in s.cluster.topology_overrides.items():
        key = f"cluster.topology_overrides.{k}"
        if k not in fields or k == "name":
            raise InputError(key, f"unknown key; known: {', '.join(f for f in fields if f != 'name')}")
        checked[k] = specs.check_field(key, k, v)
    merged = dataclasses.replace(spec, **checked)
    if merged.gpus_per_domain % merged.gpus_per_node and merged.gpus_per_node % merged.gpus_per_domain:
        raise InputError("cluster.topology_overrides.gpus_per_domain",
                         f"{merged.gpus_per_domain} must be a multiple or a divisor of gpus_per_node = {merged.gpus_per_node}")
    return checked


def _check_faults(s: Scenario) -> None:
    """A link is either failed (factor 0) or carries at least FAULT_FACTOR.lo of its rate."""
    for i, f in enumerate(s.cluster.faults):
        if 0 < f.factor < bounds.FAULT_FACTOR.lo:
            raise InputError(f"cluster.faults[{i}].factor", f"{f.factor} is neither 0 (failed) nor in "
                             f"{bounds.FAULT_FACTOR.lo}..1 ({bounds.FAULT_FACTOR.why})")


def _per_node(s: Scenario, spec) -> int:
    c = s.cluster
    return c.gpus_per_node or int(c.topology_overrides.get("gpus_per_node", spec.gpus_per_node))


def _gpu_count(s: Scenario, spec) -> int:
    c, p = s.cluster, s.parallel
    per_node = _per_node(s, spec)
    if c.gpus and c.nodes and c.gpus != c.nodes * per_node:
        raise InputError("cluster.gpus", f"{c.gpus} GPUs but nodes * gpus_per_node = {c.nodes} * {per_node} = {c.nodes * per_node}")
    if c.gpus:
        return c.gpus
    if c.nodes:
        return c.nodes * per_node
    return p.tp * p.pp * p.dp * p.cp
