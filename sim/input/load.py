"""Load a scenario: TOML + ``--set`` overrides -> presets resolved -> every rule checked.

``load_scenario(path, overrides=None)`` is the public entry point (``sim.load_scenario``).
Each failed rule raises :class:`~sim.errors.InputError` naming the key and the reason.
"""

import dataclasses
from pathlib import Path
import tomllib

from pydantic import ValidationError

from . import presets
from .. import bounds
from ..hardware import topology
from ..errors import InputError
from ..hardware.gpus import gpu_preset
from .scenario import Scenario


def load_scenario(path: str | Path, overrides: list[str] | dict | None = None) -> Scenario:
    """Read, override, resolve and check a scenario file."""
    path = Path(path)
    text = bounds.read_text(path, "scenario")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InputError("scenario", f"{path}: malformed TOML ({exc or 'nested too deeply'})") from None
    return scenario_from_dict(data, overrides, base=path.parent)


def scenario_from_dict(data: dict, overrides: list[str] | dict | None = None,
                       base: Path | None = None) -> Scenario:
    """Same as :func:`load_scenario` for an already-parsed dict."""
    bounds.check_depth(data, "scenario")
    data = _deep_copy(data)
    for key, value in override_pairs(overrides):
        bounds.check_depth(value, key)
        _set(data, key, value)
    _resolve_model(data, base)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    return check(scenario)


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
        pairs.append((key.strip(), parse_value(text.strip())))
    return pairs


def parse_value(text: str):
    """A TOML value if it parses as one (8, 1.5, true, [1, 2]), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise InputError("--set", f"value nested too deeply: {text[:40]}...") from None


def _set(data: dict, key: str, value) -> None:
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
    spec = topology.load_spec(s.cluster.topology)
    overrides = _check_topology_overrides(s, spec)
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"topology_overrides": overrides})})
    _check_faults(s)
    gpu_preset(s.cluster.gpu or s.cluster.topology_overrides.get("gpu", spec.gpu))
    gpus = _gpu_count(s, spec)
    m, p, t = s.model, s.parallel, s.training
    model = m.model_copy(update={"kv_heads": m.kv_heads or m.heads, "ffn_hidden": m.ffn_hidden or 4 * m.hidden})
    s = s.model_copy(update={"model": model, "cluster": s.cluster.model_copy(update={"gpus": gpus})})
    _check_product(p, gpus)
    _check_dp_algo(p)
    _check_heads(model, p)
    _check_batch(t, p)
    _check_stages(model, p, t)
    _check_moe(model, p)
    _check_ranks(s, gpus, _per_node(s, spec))
    if s.jitter.floor != 1.0 and s.jitter.distribution != "normal":
        raise InputError("jitter.floor", f"bounds the normal distribution's draws; with {s.jitter.distribution!r} "
                                         "it would do nothing (set distribution = \"normal\")")
    return s


def topology_spec(s: Scenario) -> topology.FatTreeSpec:
    """The cluster's topology parameters with the scenario's overrides applied (what
    sim.step builds the graph from)."""
    spec = topology.load_spec(s.cluster.topology)
    overrides = dict(s.cluster.topology_overrides)
    if s.cluster.gpus_per_node:
        overrides["gpus_per_node"] = s.cluster.gpus_per_node
        overrides.setdefault("gpus_per_domain", max(spec.gpus_per_domain, s.cluster.gpus_per_node)
                             if spec.gpus_per_domain >= spec.gpus_per_node else s.cluster.gpus_per_node)
    return dataclasses.replace(spec, **overrides)


def _check_topology_overrides(s: Scenario, spec) -> dict:
    """Override values obey the same rules and bounds as a topology file's (a zero, NaN
    or negative bandwidth or count would divide by zero or never finish); returns them
    converted (``16.0`` spines -> 16)."""
    fields = topology.FatTreeSpec.__dataclass_fields__
    checked = {}
    for k, v in s.cluster.topology_overrides.items():
        key = f"cluster.topology_overrides.{k}"
        if k not in fields or k == "name":
            raise InputError(key, f"unknown key; known: {', '.join(f for f in fields if f != 'name')}")
        checked[k] = topology.check_field(key, k, v)
    merged = dataclasses.replace(spec, **checked)
    if merged.routing not in ("spray", "ecmp"):
        raise InputError("cluster.topology_overrides.routing", f"expected 'spray' or 'ecmp', got {merged.routing!r}")
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


def _check_product(p, gpus: int) -> None:
    product = p.tp * p.pp * p.dp * p.cp
    if product != gpus:
        raise InputError("parallel", f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {product}, "
                                     f"but the cluster has {gpus} GPUs")


def _check_dp_algo(p) -> None:
    """A tree implements only all-reduce (DDP); ZeRO reduce-scatters and all-gathers."""
    if p.dp_algo == "tree" and p.zero > 0:
        raise InputError("parallel.dp_algo", f"'tree' implements only all-reduce, but zero = {p.zero} "
                                             "reduce-scatters and all-gathers; use ring, hierarchical or auto")


def _check_heads(m, p) -> None:
    if m.hidden % m.heads:
        raise InputError("model.heads", f"hidden = {m.hidden} is not divisible by heads = {m.heads}")
    head_dim = m.hidden // m.heads
    if head_dim > bounds.HEAD_DIM.hi:
        raise InputError("model.heads", f"head dim hidden / heads = {head_dim} exceeds {bounds.HEAD_DIM.hi} "
                                        f"({bounds.HEAD_DIM.why})")
    if m.heads % m.kv_heads:
        raise InputError("model.kv_heads", f"heads = {m.heads} is not divisible by kv_heads = {m.kv_heads}")
    for key, n in (("heads", m.heads), ("kv_heads", m.kv_heads)):
        if n % p.tp:
            raise InputError("parallel.tp", f"tp = {p.tp} does not divide model.{key} = {n}")


def _check_batch(t, p) -> None:
    per_step = p.dp * t.micro_batch
    if t.global_batch < per_step:
        raise InputError("training.global_batch",
                         f"batch-size floor: every data-parallel rank needs at least one micro-batch of "
                         f"{t.micro_batch} sequence(s), so global_batch >= dp * micro_batch = {p.dp} * "
                         f"{t.micro_batch} = {per_step}, got {t.global_batch}")
    if t.global_batch % per_step:
        raise InputError("training.global_batch", f"{t.global_batch} is not divisible by dp * micro_batch = {per_step}")
    if t.seq_len % p.cp:
        raise InputError("training.seq_len", f"seq_len = {t.seq_len} is not divisible by cp = {p.cp}")


def _check_stages(m, p, t) -> None:
    chunks = p.pp * p.virtual_stages
    if (p.schedule == "interleaved") != (p.virtual_stages > 1):
        raise InputError("parallel.schedule", f"schedule = {p.schedule!r} with virtual_stages = {p.virtual_stages}: "
                                              "interleaved needs virtual_stages > 1 and vice versa")
    micro = t.global_batch // (p.dp * t.micro_batch)
    if p.schedule == "interleaved" and micro % p.pp:
        raise InputError("parallel.virtual_stages", f"interleaved 1F1B needs micro-batches per step ({micro}) "
                                                    f"divisible by pp = {p.pp} (Megatron-LM's rule)")
    if p.stage_layers is None:
        if m.layers < chunks:
            raise InputError("parallel.pp", f"{m.layers} layers cannot fill pp * virtual_stages = {chunks} stages")
        return
    if len(p.stage_layers) != chunks:
        raise InputError("parallel.stage_layers", f"has {len(p.stage_layers)} entries, needs pp * virtual_stages = {chunks}")
    if min(p.stage_layers) < 1:
        raise InputError("parallel.stage_layers", "every pipeline stage needs at least one layer")
    if sum(p.stage_layers) != m.layers:
        raise InputError("parallel.stage_layers", f"sums to {sum(p.stage_layers)}, the model has {m.layers} layers")


def _check_moe(m, p) -> None:
    if m.moe is None:
        if p.ep > 1:
            raise InputError("parallel.ep", f"ep = {p.ep} needs an MoE model ([model.moe])")
        return
    if m.moe.dense_layers >= m.layers:
        raise InputError("model.moe.dense_layers", f"{m.moe.dense_layers} dense layers leave no MoE layer of "
                                                   f"the model's {m.layers} (drop [model.moe] for a dense model)")
    if m.moe.experts % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} does not divide model.moe.experts = {m.moe.experts}")
    if (p.dp * p.cp) % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} must divide dp * cp = {p.dp * p.cp} (experts shard inside dp*cp)")


def _check_ranks(s: Scenario, gpus: int, per_node: int) -> None:
    for i, st in enumerate(s.stragglers):
        if not st.ranks and not st.nodes:
            raise InputError(f"stragglers[{i}]", "names no rank and no node (give ranks = [...] or nodes = [...])")
        bad = [r for r in st.ranks if r >= gpus]
        if bad:
            raise InputError(f"stragglers[{i}].ranks", f"rank {bad[0]} is outside 0..{gpus - 1}")
        bad = [n for n in st.nodes if n * per_node >= gpus]
        if bad:
            raise InputError(f"stragglers[{i}].nodes", f"node {bad[0]} is outside the {gpus // per_node} nodes")
