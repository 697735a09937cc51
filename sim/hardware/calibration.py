"""A calibration profile's overrides: the constants a cluster measured, in place of the presets'.

``clustersim calibrate`` (sim/calibrate/) fits a profile to a team's own measurements and
writes it as TOML (CONTRACT.md, "Calibration profile"); a scenario names it with
``[cluster] calibration = "profile.toml"`` (or ``--calibration`` on the commands). This module
reads the two sections that change the simulation and applies them where the hardware and
compute models are built, never through a global:

- ``[fabric.efficiency]`` / ``[fabric.latency_us]``: per link kind (nvlink, ib, pcie) the share
  of line rate NCCL reaches and the per-hop latency -- in place of
  :data:`sim.hardware.gpus.FABRIC_EFFICIENCY` / ``LINK_LATENCY`` (and the per-architecture
  NVLink efficiency). :func:`apply` writes them on every edge of a built graph;
  :func:`sim.hardware.switching.fabric_of` gives NCCL's tuner the same numbers.
- ``[compute]``: the sustained factor and the kernel efficiency curves of
  :mod:`sim.model.compute` (``ComputeModel(..., calibration=...)`` reads them), for the one
  GPU type the profile was measured on.

Run ``clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt --topology gb200-nvl72
--out gb200.toml``, then ``clustersim collective --op all_reduce --gpus 72 --topology gb200-nvl72 --calibration gb200.toml``.
"""

from dataclasses import dataclass
from pathlib import Path
import tomllib

from .. import bounds
from ..errors import InputError

LINK_KINDS = ("nvlink", "ib", "pcie")
SECTIONS = ("profile", "fabric", "compute", "report")  # top-level tables a profile may hold
# Bounds of the values a profile may set, and why they end there.
EFFICIENCY = bounds.Bound(0.01, 1.0, "a share of the line rate")
LATENCY_US = bounds.Bound(0.0, 1e4, "microseconds per hop; 10 ms would be a broken link")
SHARE = bounds.Bound(0.01, 1.0, "a share of the datasheet peak")
# gemm_kernel is the traced GEMM share over the sustained factor it is used with (their product is
# large GEMMs' share of the peak, <= 1: sim/model/compute.py checks it where the GPU is known), so it
# passes 1 where real kernels outrun the sustained preset (a BF16 H200 trace: 0.77 / 0.7406 = 1.04);
# 4 = a product of 1 at the lowest preset factor, 0.4736 (b200-power-limited), with room to spare.
KERNEL = bounds.Bound(0.01, 4.0, "the kernel share over the sustained factor (their product is at most 1)")
SUSTAINED = bounds.Bound(0.05, 1.5, "a share of the kernel rate kept through a step")
HALF = bounds.Bound(0.0, 1e6, "the size (elements or keys) at which half the top efficiency is reached")
COMPUTE_KEYS = ("gpu", "sustained", "gemm_kernel", "gemm_half_size", "attention_forward",
                "attention_backward", "hbm_efficiency")


@dataclass(frozen=True)
class Calibration:
    """The overrides of one profile (hashable: it rides in a frozen Scenario and keys memos).
    ``efficiency``/``latency``: (link kind, value) pairs, latency in seconds; compute fields
    are None where the profile leaves the preset's value."""

    source: str = ""  # the file it was read from (for messages)
    efficiency: tuple[tuple[str, float], ...] = ()
    latency: tuple[tuple[str, float], ...] = ()
    gpu: str | None = None  # the GPU type the [compute] section was measured on
    sustained: float | None = None
    gemm_kernel: float | None = None
    gemm_half_size: float | None = None
    attention_forward: tuple[float, float] | None = None
    attention_backward: tuple[float, float] | None = None
    hbm_efficiency: float | None = None

    def link_efficiency(self, kind: str, default: float) -> float:
        """Share of line rate for link ``kind`` (``default`` where the profile is silent)."""
        return dict(self.efficiency).get(kind, default)

    def link_latency(self, kind: str, default: float) -> float:
        """Seconds per hop for link ``kind`` (``default`` where the profile is silent)."""
        return dict(self.latency).get(kind, default)

    @property
    def has_compute(self) -> bool:
        """Whether the profile changes any compute constant."""
        return any(getattr(self, k) is not None for k in COMPUTE_KEYS[1:])

    def check_gpu(self, gpu_name: str, key: str = "cluster.calibration") -> None:
        """InputError when the compute constants were measured on another GPU type."""
        if self.has_compute and self.gpu and self.gpu != gpu_name:
            raise InputError(key, f"{self.source}: [compute] was fitted on {self.gpu!r}, the cluster runs {gpu_name!r}")


def load(path: str | Path, key: str = "cluster.calibration") -> Calibration:
    """Read a profile file; InputError(key) naming the file and the entry on any bad value."""
    path = Path(path)
    if not path.is_file():
        raise InputError(key, f"{path}: no such calibration profile (write one with `clustersim calibrate`)")
    try:
        data = tomllib.loads(bounds.read_text(path, key))
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InputError(key, f"{path}: malformed TOML ({exc or 'nested too deeply'})") from None
    if not data:  # (else accepted, and calibrating nothing)
        raise InputError(key, f"{path}: empty; a profile holds the tables {', '.join(SECTIONS)} (write one with "
                              "`clustersim calibrate`)")
    return from_dict(data, str(path), key)


def from_dict(data: dict, source: str = "", key: str = "cluster.calibration") -> Calibration:
    """A profile's parsed TOML -> :class:`Calibration` (every value checked)."""
    where = f"{source}: " if source else ""
    for name, value in data.items():
        if name not in SECTIONS or not isinstance(value, dict):
            raise InputError(key, f"{where}unexpected {name!r}; a profile holds the tables {', '.join(SECTIONS)}")
    fabric = data.get("fabric", {})
    for name in fabric:
        if name not in ("efficiency", "latency_us"):
            raise InputError(key, f"{where}fabric.{name}: unknown key; known: efficiency, latency_us")
    eff = _per_kind(fabric.get("efficiency", {}), "fabric.efficiency", EFFICIENCY, where, key)
    lat = _per_kind(fabric.get("latency_us", {}), "fabric.latency_us", LATENCY_US, where, key)
    compute = _compute(data.get("compute", {}), where, key)
    return Calibration(source, eff, tuple((k, v * 1e-6) for k, v in lat), **compute)


def _per_kind(table, name: str, bound: bounds.Bound, where: str, key: str) -> tuple:
    if not isinstance(table, dict):
        raise InputError(key, f"{where}{name}: expected a table of {', '.join(LINK_KINDS)}")
    out = []
    for kind, value in sorted(table.items()):
        if kind not in LINK_KINDS:
            raise InputError(key, f"{where}{name}.{kind}: unknown link kind; known: {', '.join(LINK_KINDS)}")
        out.append((kind, float(_check(bound, value, f"{name}.{kind}", where, key))))
    return tuple(out)


def _check(bound: bounds.Bound, value, name: str, where: str, key: str):
    try:
        return bound.check(name, value)
    except InputError as exc:
        raise InputError(key, f"{where}{name}: {exc.reason}") from None


def _compute(table: dict, where: str, key: str) -> dict:
    out = {}
    for name, value in table.items():
        if name not in COMPUTE_KEYS:
            raise InputError(key, f"{where}compute.{name}: unknown key; known: {', '.join(COMPUTE_KEYS)}")
        if name == "gpu":
            if not isinstance(value, str):
                raise InputError(key, f"{where}compute.gpu: expected a GPU preset name")
            out[name] = value
        elif name.startswith("attention_"):
            if not isinstance(value, list) or len(value) != 2:
                raise InputError(key, f"{where}compute.{name}: expected [top share, half keys]")
            out[name] = (float(_check(SHARE, value[0], f"compute.{name}[0]", where, key)),
                         float(_check(HALF, value[1], f"compute.{name}[1]", where, key)))
        else:
            bound = {"sustained": SUSTAINED, "gemm_half_size": HALF, "gemm_kernel": KERNEL}.get(name, SHARE)
            out[name] = float(_check(bound, value, f"compute.{name}", where, key))
    return out


def from_dump(data: dict) -> Calibration:
    """A Calibration from its own ``dataclasses.asdict`` / pydantic dump (a scenario dumped to
    JSON and read back, as the RL trainer's worker processes do); not a user format."""
    pairs = {k: tuple(tuple(p) for p in data.get(k, ())) for k in ("efficiency", "latency")}
    attn = {k: tuple(data[k]) for k in ("attention_forward", "attention_backward") if data.get(k) is not None}
    rest = {k: v for k, v in data.items() if k not in pairs and k not in attn and k in Calibration.__dataclass_fields__}
    return Calibration(**rest, **pairs, **attn)


def apply(graph, cal: Calibration | None) -> None:
    """Write the profile's per-kind efficiency and latency on every edge of a built topology
    graph (:func:`sim.hardware.topology.fat_tree`); the graph remembers the profile, so its
    :class:`~sim.hardware.topology.Topology` gives NCCL's tuner the same fabric."""
    if cal is None:
        return
    graph.graph["calibration"] = cal
    eff, lat = dict(cal.efficiency), dict(cal.latency)
    for _, _, d in graph.edges(data=True):
        kind = d["kind"]
        if kind in eff:
            d["eff"] = eff[kind]
        if kind in lat:
            d["latency"] = lat[kind]
