"""What ``clustersim plan`` starts from: a model (a preset name or a Hugging Face
config.json) or a scenario (a file or a bundled example, whose [model] and [training]
are kept and whose [parallel] the planner replaces), plus the cluster and batch flags.
Every flag is checked here, before anything is enumerated; a bad one is one line naming it.
"""

import copy
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .. import bounds
from ..hardware import mesh
from ..hardware.gpus import gpu_preset, low_peak
from ..input.choices import MicroBatches, Precision
from ..hardware.specs import load_spec
from ..input import presets
from ..input.bundled import EXAMPLES
from ..input.load import override_pairs, set_key, scenario_from_dict

SEARCHED = ("training.micro_batch", "training.recompute")  # the planner chooses these (and all of [parallel])
NOT_PLANNED = ("stragglers", "jitter", "variability", "rl")  # sections a planned (clean) step cannot have
# The planner simulates its picks in steady-state mode (sim/steady.py: three small micro-batch counts, checked
# linear to 1e-9 of the step, extrapolated; exact to ~1e-13 where periodic) unless the scenario or a --set says
# ``simulation.micro_batches = "all"``: a clean step (no NOT_PLANNED section) qualifies wherever its three runs
# are at most half its micro-batches (sim/parallel/steady.py), and cost.py prices each pick so (issue 28).
# Only the planner's ranking uses it: ``clustersim run`` and validate simulate every micro-batch unless asked.
STEADY = MicroBatches.STEADY.value


@dataclass(frozen=True)
class Request:
    """A checked planning request: the base scenario (as data and loaded) and the cluster."""

    data: dict  # scenario data without [parallel]; cluster.gpus set
    scenario: object  # the loaded base (on its own 1-GPU layout): model and training facts
    spec: object  # topology spec
    gpu: str
    gpus: int


def source_data(arg: str) -> dict:
    """MODEL_OR_SCENARIO -> scenario data (a config's or scenario's paths made absolute)."""
    path = Path(arg)
    if path.is_file() or ((path.exists() or path.is_symlink()) and arg not in presets.MODELS):  # FIFOs named too
        if path.suffix == ".json":
            bounds.read_text(path, "MODEL_OR_SCENARIO")  # a regular file of at most 1 MiB
            return {"model": {"hf_config": str(path.resolve())}}
        return _absolute_config(_read_toml(path), path.parent)
    if arg in presets.MODELS:
        return {"model": {"preset": arg}}
    bundled = EXAMPLES / f"{path.name}.toml"
    if not path.suffix and len(path.parts) == 1 and bundled.is_file():
        return _absolute_config(_read_toml(bundled), bundled.parent)
    raise InputError("MODEL_OR_SCENARIO", f"{arg!r} is no model preset, config.json or scenario file; presets: "
                                          f"{', '.join(sorted(presets.MODELS))}")


def _absolute_config(data: dict, folder: Path) -> dict:
    """A scenario's ``model.hf_config`` made absolute (the planner's points are dicts, read
    from no folder)."""
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        model["hf_config"] = str((folder / model["hf_config"]).resolve())
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("calibration"), str):
        cluster["calibration"] = str((folder / cluster["calibration"]).resolve())
    return data


def _read_toml(path: Path) -> dict:
    from ..input.load import read_toml

    return read_toml(path, "MODEL_OR_SCENARIO")


def request(arg: str, gpus: int | None, topology: str | None, gpu: str | None, seq_len: int | None,
            batch_tokens: int | None, precision: str | None = None, overrides=None,
            calibration: str | None = None) -> Request:
    """Check the flags against each other and the base scenario; load the base.
    ``calibration``: a profile's path (``--calibration``), in place of the scenario's."""
    data = source_data(arg)
    data.setdefault("name", Path(arg).stem)
    if calibration:
        data.setdefault("cluster", {})["calibration"] = str(Path(calibration).resolve())
    return request_of(data, gpus, topology, gpu, seq_len, batch_tokens, precision, overrides)


def request_of(data: dict, gpus: int | None = None, topology: str | None = None, gpu: str | None = None,
               seq_len: int | None = None, batch_tokens: int | None = None, precision: str | None = None,
               overrides=None) -> Request:
    """:func:`request` for scenario data (a published run of sim/studies/validation.py, ...):
    flags left None come from the data."""
    data = copy.deepcopy(data)
    for section in NOT_PLANNED:
        if data.get(section):
            raise InputError(section, "the planner searches layouts of a clean training step; remove this section")
    if (data.get("cluster") or {}).get("faults"):
        raise InputError("cluster.faults", "the planner searches layouts of a clean training step; remove the faults")
    cluster = dict(data.get("cluster") or {})
    training = dict(data.get("training") or {})
    topology = topology or cluster.get("topology")
    if not topology:
        raise InputError("--topology", "required (a preset such as dgx-h100, or a topology file)")
    spec = load_spec(topology, key="--topology")
    flag = "--gpu" if gpu else "cluster.gpu"
    gpu = _gpu(gpu or cluster.get("gpu") or spec.gpu, flag)
    mesh.check_gpu(spec, gpu_preset(gpu), flag)
    gpus = _gpus(gpus if gpus is not None else cluster.get("gpus") or _nodes(cluster, spec), spec, topology)
    seq = _positive(seq_len if seq_len is not None else training.get("seq_len"), "--seq-len")
    bounds.SEQ_LEN.check("--seq-len", seq, whole=True)
    tokens = _positive(batch_tokens if batch_tokens is not None else
                       (training.get("global_batch") or 0) * seq or None, "--global-batch-tokens")
    if tokens > bounds.BATCH.hi * seq:
        raise InputError("--global-batch-tokens", f"{tokens:,} tokens are more than {bounds.BATCH.hi:,} sequences of "
                                                  f"{seq:,} ({bounds.BATCH.why})")
    if tokens % seq:
        raise InputError("--global-batch-tokens", f"{tokens} is not a multiple of --seq-len {seq} (whole sequences)")
    if precision not in (None, Precision.BF16, Precision.FP16) and not low_peak(gpu_preset(gpu), precision):
        raise InputError("--precision", f"{precision!r} needs tensor cores for it, which {gpu} lacks; use bf16")
    training.update(seq_len=seq, global_batch=tokens // seq, **({"precision": precision} if precision else {}))
    for key in SEARCHED:
        training.pop(key.split(".")[1], None)
    out = {k: v for k, v in data.items() if k not in ("parallel", "cluster", "training")}
    out.update(training=training, cluster={"gpu": gpu, "topology": topology,
                                           **{k: cluster[k] for k in ("topology_overrides", "calibration")
                                              if cluster.get(k)}})
    _apply(out, overrides)
    out.setdefault("simulation", {}).setdefault("micro_batches", STEADY)
    scenario = scenario_from_dict(out)  # 1 GPU, default layout: checks model and training
    out["cluster"]["gpus"] = gpus
    return Request(out, scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"gpus": gpus})}),
                   spec, gpu, gpus)


def _apply(data: dict, overrides) -> None:
    for key, value in override_pairs(overrides):
        if key.startswith("parallel.") or key in SEARCHED or key.startswith("cluster."):
            raise InputError("--set", f"{key} is the planner's to choose (or a flag's); set model.* or training.* keys")
        if key.split(".")[0] in NOT_PLANNED:  # as in a scenario file: the estimate knows no perturbation
            raise InputError("--set", f"{key}: the planner searches layouts of a clean training step, so "
                                      f"[{key.split('.')[0]}] is refused here as in a scenario file")
        set_key(data, key, value)


def _gpu(name: str, flag: str) -> str:
    try:
        return gpu_preset(name).name
    except InputError as exc:
        raise InputError(flag, exc.reason) from None


def _nodes(cluster: dict, spec) -> int | None:
    nodes = cluster.get("nodes")
    return nodes * (cluster.get("gpus_per_node") or spec.gpus_per_node) if isinstance(nodes, int) else None


def _gpus(n, spec, topology: str) -> int:
    n = bounds.GPUS.check("--gpus", _positive(n, "--gpus"), whole=True)  # (1e18: a divisor search without end)
    per_node = spec.gpus_per_node
    if n > per_node and n % per_node:
        raise InputError("--gpus", f"{n} GPUs are not whole {per_node}-GPU nodes of topology {topology!r}")
    if spec.max_gpus is not None and n > spec.max_gpus:
        raise InputError("--gpus", f"{n} GPUs asked but topology {topology!r} holds {spec.max_gpus}")
    return n


def _positive(value, flag: str) -> int:
    if value is None:
        raise InputError(flag, "required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(flag, f"expected a positive integer, got {value!r}")
    return value
