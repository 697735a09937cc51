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
    gpu = gpu_preset(s.cluster.gpu or s.cluster.topology_overrides.get("gpu", spec.gpu))
    gpus = _gpu_count(s, spec)
    m, p, t = s.model, s.parallel, s.training
    model = m.model_copy(update={"kv_heads": m.kv_heads or m.heads, "ffn_hidden": m.ffn_hidden or 4 * m.hidden})
    if p.schedule is None:  # Megatron: --num-layers-per-virtual-pipeline-stage alone means interleaved 1F1B
        p = p.model_copy(update={"schedule": "interleaved" if p.virtual_stages > 1 else "1f1b"})
    s = s.model_copy(update={"model": model, "parallel": p, "cluster": s.cluster.model_copy(update={"gpus": gpus})})
    _check_product(p, gpus if s.rl is None else s.rl.trainer_gpus, s.rl is not None)
    _check_dp_algo(p)
    _check_attention(model)
    _check_heads(model, p)
    _check_precision(t, gpu)
    _check_batch(t, p, whole=s.rl is None)
    _check_stages(model, p, t, whole=s.rl is None)
    _check_moe(model, p)
    _check_overlap(model, p, t)
    _check_ranks(s, gpus, _per_node(s, spec))
    if s.rl is not None:
        _check_rl(s, model, gpus)
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
    fields = topology.FatTreeSpec.__dataclass_fields__
    checked = {}
    for k, v in s.cluster.topology_overrides.items():
        key = f"cluster.topology_overrides.{k}"
        if k not in fields or k == "name":
            raise InputError(key, f"unknown key; known: {', '.join(f for f in fields if f != 'name')}")
        checked[k] = topology.check_field(key, k, v)
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


def _check_product(p, gpus: int, trainer_pool: bool = False) -> None:
    product = p.tp * p.pp * p.dp * p.cp
    if product != gpus:
        where = f"rl.trainer_gpus = {gpus}" if trainer_pool else f"the cluster has {gpus} GPUs"
        raise InputError("parallel", f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {product}, but {where}")


def _check_dp_algo(p) -> None:
    """Trees (tree, nvls_tree) implement only all-reduce (DDP); ZeRO reduce-scatters
    and all-gathers. PAT implements only those two (NCCL has no PAT all-reduce). What the
    cluster can run (NVLS, SHARP, one GPU per node) is checked once the groups are known."""
    if p.dp_algo in ("tree", "nvls_tree") and p.zero > 0:
        raise InputError("parallel.dp_algo", f"{p.dp_algo!r} implements only all-reduce, but zero = {p.zero} "
                                             "reduce-scatters and all-gathers; use ring, hierarchical, nvls, collnet, pat or auto")
    if p.dp_algo == "pat" and p.zero == 0:
        raise InputError("parallel.dp_algo", "'pat' implements only all-gather and reduce-scatter (NCCL 2.23+), but "
                                             "zero = 0 all-reduces gradients; use zero >= 1 or another algorithm")


MLA_RANKS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # required with mla


def _check_attention(m) -> None:
    """MLA ranks come together and only with attention = "mla"; MLA has no GQA and no head_dim."""
    given = [k for k in ("q_lora_rank",) + MLA_RANKS if getattr(m, k) is not None]
    if m.attention != "mla":
        if given:
            raise InputError(f"model.{given[0]}", 'is a multi-head latent attention rank: set model.attention = "mla" '
                                                  "or remove it")
        return
    missing = [k for k in MLA_RANKS if getattr(m, k) is None]
    if missing:
        raise InputError(f"model.{missing[0]}", 'required with model.attention = "mla" (DeepSeek-V3: kv_lora_rank 512, '
                                                "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)")
    if m.head_dim is not None:
        raise InputError("model.head_dim", "not with MLA, whose head widths are qk_nope_head_dim + qk_rope_head_dim "
                                           "(queries, keys) and v_head_dim (values)")
    if m.kv_heads != m.heads:
        raise InputError("model.kv_heads", f"MLA gives every query head its own key and value: kv_heads = "
                                           f"{m.kv_heads} must equal heads = {m.heads}")
    if m.qk_rope_head_dim % 2:
        raise InputError("model.qk_rope_head_dim", f"rotary embedding turns pairs of channels: {m.qk_rope_head_dim} "
                                                   "must be even")


def _check_precision(t, gpu) -> None:
    if t.precision == "fp8" and not gpu.fp8_flops:
        raise InputError("training.precision", f"'fp8' needs FP8 tensor cores, which {gpu.name} lacks (Hopper and "
                                               "Blackwell GPUs have them); use 'bf16'")
    if t.attention_backend is not None and not t.flash_attention:
        raise InputError("training.attention_backend", "chooses the fused-attention kernels, but flash_attention "
                                                       "is false (scores stored, no fused kernel): drop one of them")


def _check_heads(m, p) -> None:
    if m.head_dim is None and m.attention == "mha" and m.hidden % m.heads:
        raise InputError("model.heads", f"hidden = {m.hidden} is not divisible by heads = {m.heads} "
                                       "(give model.head_dim when heads are not hidden / heads wide)")
    head_dim = m.head_dim or m.hidden // m.heads
    if head_dim > bounds.HEAD_DIM.hi:
        key = "model.head_dim" if m.head_dim else "model.heads"
        raise InputError(key, f"head dim {head_dim} exceeds {bounds.HEAD_DIM.hi} ({bounds.HEAD_DIM.why})")
    if m.heads % m.kv_heads:
        raise InputError("model.kv_heads", f"heads = {m.heads} is not divisible by kv_heads = {m.kv_heads}")
    for key, n in (("heads", m.heads), ("kv_heads", m.kv_heads)):
        if n % p.tp:
            raise InputError("parallel.tp", f"tp = {p.tp} does not divide model.{key} = {n}")


def _check_batch(t, p, whole: bool = True) -> None:
    """``whole``: global_batch is split into micro-batches as given (an RL step's rows come
    from its responses' tokens instead, sim/rl/trainer.py)."""
    per_step = p.dp * t.micro_batch
    if whole and t.global_batch < per_step:
        raise InputError("training.global_batch",
                         f"batch-size floor: every data-parallel rank needs at least one micro-batch of "
                         f"{t.micro_batch} sequence(s), so global_batch >= dp * micro_batch = {p.dp} * "
                         f"{t.micro_batch} = {per_step}, got {t.global_batch}")
    if whole and t.global_batch % per_step:
        raise InputError("training.global_batch", f"{t.global_batch} is not divisible by dp * micro_batch = {per_step}")
    if t.seq_len % p.cp:
        raise InputError("training.seq_len", f"seq_len = {t.seq_len} is not divisible by cp = {p.cp}")


def _check_stages(m, p, t, whole: bool = True) -> None:
    chunks = p.pp * p.virtual_stages
    if (p.schedule == "interleaved") != (p.virtual_stages > 1):
        raise InputError("parallel.schedule", f"schedule = {p.schedule!r} with virtual_stages = {p.virtual_stages}: "
                                              "interleaved needs virtual_stages > 1 and vice versa")
    micro = t.global_batch // (p.dp * t.micro_batch)
    if p.schedule == "interleaved" and micro % p.pp and whole:
        raise InputError("parallel.virtual_stages", f"interleaved 1F1B needs micro-batches per step ({micro}) "
                                                    f"divisible by pp = {p.pp} (Megatron-LM's rule)")
    if p.stage_layers is None:
        if m.layers < chunks:
            raise InputError("parallel.pp", f"{m.layers} layers cannot fill pp * virtual_stages = {chunks} stages")
        return
    if len(p.stage_layers) != chunks:
        raise InputError("parallel.stage_layers", f"has {len(p.stage_layers)} entries, needs pp * virtual_stages = {chunks}")
    _check_empty_chunks(p.stage_layers)
    if sum(p.stage_layers) != m.layers:
        raise InputError("parallel.stage_layers", f"sums to {sum(p.stage_layers)}, the model has {m.layers} layers")


def _check_empty_chunks(counts: list[int]) -> None:
    """A chunk may hold no transformer layer only if it holds the embedding (the first) or
    the loss (the last): Megatron's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split (megatron/training/arguments.py) count those as
    a layer each, so with one layer per chunk they fill chunks of their own."""
    last = len(counts) - 1
    for i, n in enumerate(counts):
        if n < 0:
            raise InputError("parallel.stage_layers", f"entry {i} is {n}; layers per stage cannot be negative")
        if n == 0 and i not in (0, last):
            raise InputError("parallel.stage_layers",
                             f"entry {i} is 0: only the first chunk (which holds the embedding) and the last "
                             f"(entry {last}, the loss) may hold no transformer layer; every pipeline stage needs "
                             "at least one layer")


def _check_moe(m, p) -> None:
    if m.moe is None:
        if p.ep > 1:
            raise InputError("parallel.ep", f"ep = {p.ep} needs an MoE model ([model.moe])")
        if p.expert_tp is not None:
            raise InputError("parallel.expert_tp", f"expert_tp = {p.expert_tp} needs an MoE model ([model.moe])")
        return
    if m.moe.dense_layers >= m.layers:
        raise InputError("model.moe.dense_layers", f"{m.moe.dense_layers} dense layers leave no MoE layer of "
                                                   f"the model's {m.layers} (drop [model.moe] for a dense model)")
    if m.moe.experts % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} does not divide model.moe.experts = {m.moe.experts}")
    if p.expert_tp is None or p.expert_tp == p.tp:
        if (p.dp * p.cp) % p.ep:
            raise InputError("parallel.ep", f"ep = {p.ep} must divide dp * cp = {p.dp * p.cp} (experts shard inside "
                                            "dp*cp; set parallel.expert_tp to fold ep over tp ranks)")
        return
    _check_folding(p)


def _check_folding(p) -> None:
    """MoE parallel folding (Megatron-Core parallel_state.initialize_model_parallel):
    expert_tp * ep * expert_dp = tp * cp * dp, i.e. ep * expert_tp divides tp * cp * dp."""
    ranks = p.tp * p.cp * p.dp
    if ranks % p.ep:
        raise InputError("parallel.ep", f"ep = {p.ep} must divide tp * cp * dp = {p.tp}*{p.cp}*{p.dp} = {ranks}")
    if ranks % (p.ep * p.expert_tp):
        raise InputError("parallel.expert_tp",
                         f"ep * expert_tp = {p.ep}*{p.expert_tp} = {p.ep * p.expert_tp} must divide tp * cp * dp = "
                         f"{ranks} (expert_tp x ep x expert_dp = tp x cp x dp)")
    if p.tp > 1 and not p.sequence_parallel:
        raise InputError("parallel.expert_tp", f"expert_tp = {p.expert_tp} != tp = {p.tp} needs sequence_parallel = "
                                               "true (Megatron's MoE layer requires it with tp > 1)")


def _check_overlap(m, p, t) -> None:
    """Megatron's rules: --tp-comm-overlap needs sequence parallelism (arguments.py), which
    needs tp > 1; EP all-to-all overlap (--overlap-moe-expert-parallel-comm,
    transformer_config.py) needs ep > 1, no full recompute, and virtual stages when pp > 1."""
    if p.tp_comm_overlap and (p.tp == 1 or not p.sequence_parallel):
        raise InputError("parallel.tp_comm_overlap", f"needs tp > 1 and sequence_parallel = true (got tp = {p.tp}, "
                                                     f"sequence_parallel = {str(p.sequence_parallel).lower()})")
    if not p.ep_comm_overlap:
        return
    if p.ep == 1:
        raise InputError("parallel.ep_comm_overlap", "needs expert parallelism (ep > 1)")
    if t.recompute == "full":
        raise InputError("parallel.ep_comm_overlap", "does not work with training.recompute = 'full' (Megatron's rule)")
    if p.pp > 1 and p.virtual_stages == 1:
        raise InputError("parallel.ep_comm_overlap", f"with pp = {p.pp} needs virtual_stages > 1 (interleaved 1F1B; "
                                                     "Megatron's rule)")
    if p.schedule == "gpipe":
        raise InputError("parallel.ep_comm_overlap", "runs a combined 1F1B schedule; schedule = 'gpipe' has none")
    if p.pp == 1 and t.global_batch // (p.dp * t.micro_batch) < 2:
        raise InputError("parallel.ep_comm_overlap", "needs at least 2 micro-batches per step (one's all-to-alls "
                                                     "run under the other's compute)")


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


def _check_rl(s: Scenario, m, gpus: int) -> None:
    """The pools fit the cluster, engines split the generator GPUs and the model's heads,
    and whole sequences fit a training row. (Whether one sequence's KV cache fits an
    engine needs the model's sizes: sim/rl/inference.py checks it.)"""
    rl = s.rl
    if rl.generator_gpus + rl.trainer_gpus > gpus:
        raise InputError("rl.generator_gpus", f"generator_gpus + trainer_gpus = {rl.generator_gpus} + "
                                              f"{rl.trainer_gpus} = {rl.generator_gpus + rl.trainer_gpus} "
                                              f"exceeds the cluster's {gpus} GPUs")
    if rl.generator_gpus % rl.generator_tp:
        raise InputError("rl.generator_tp", f"generator_tp = {rl.generator_tp} does not divide "
                                            f"generator_gpus = {rl.generator_gpus} (one engine per generator_tp GPUs)")
    if m.heads % rl.generator_tp or (m.kv_heads % rl.generator_tp and rl.generator_tp % m.kv_heads):
        raise InputError("rl.generator_tp", f"generator_tp = {rl.generator_tp} must divide model.heads = {m.heads} "
                                            f"and divide or be a multiple of model.kv_heads = {m.kv_heads}")
    if rl.mode == "sync" and rl.max_staleness is not None:
        raise InputError("rl.max_staleness", "applies to the async and pipeline modes; sync trains each batch "
                                             "on the weights that generated it (staleness 0)")
    if rl.weight_sync == "overlapped" and (rl.mode == "sync" or rl.weight_route != "broadcast"):
        raise InputError("rl.weight_sync", "overlapped needs mode async or pipeline (sync generates with the new "
                                           "weights, so nothing can overlap their transfer) and weight_route = "
                                           "broadcast")
    if rl.prompt_tokens + rl.lengths.max > s.training.seq_len:
        raise InputError("rl.lengths.max", f"prompt_tokens + max = {rl.prompt_tokens} + {rl.lengths.max} exceeds "
                                           f"training.seq_len = {s.training.seq_len}: the trainer packs whole "
                                           "sequences into rows of seq_len tokens")
    if s.stragglers or s.jitter.sigma > 0:
        raise InputError("stragglers" if s.stragglers else "jitter",
                         "not modelled in an [rl] scenario (clustersim rl simulates the pools' steady state)")
