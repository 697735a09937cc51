"""What every study shares: sweeping its labelled points over its bundled scenario,
writing and printing its tables, the hardware numbers and crossover arithmetic.

Run ``clustersim study NAME`` (see :mod:`sim.studies`).
"""

from dataclasses import dataclass, field
import math
from pathlib import Path
import tomllib

import pandas as pd

from ..hardware.gpus import FABRIC_EFFICIENCY, gpu_preset
from ..input.load import scenario_from_dict, topology_spec
from ..model.transformer import dims, non_embedding_params, total_params
from ..outputs.paths import make_dir, output_dir, written
from ..sweeps.grid import point_key, sweep
from ..units import GB

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"  # package data


@dataclass
class Report:
    """A finished study: per-point table, per-curve summary, notes, files written."""

    title: str
    table: pd.DataFrame
    summary: pd.DataFrame
    notes: list[str]
    paths: dict = field(default_factory=dict)


def scenario_path(name: str) -> Path:
    """The study's bundled scenario, ``sim/studies/scenarios/NAME.toml``."""
    return SCENARIO_DIR / f"{name}.toml"


def run_study(name: str, module, out_dir: Path, quick: bool = False, workers=None, dask=None,
              quiet: bool = False) -> Report:
    """Sweep the study's points, analyse, write table + summary CSVs and the plot into
    ``out_dir`` (checked before the sweep; created, that one level, if missing). A study
    whose points are not training steps (``rl-stragglers``: whole RL runs) runs them with
    its own ``run_points(quick, workers, dask, quiet)``."""
    output_dir(out_dir, "--out-dir")
    if hasattr(module, "run_points"):
        rows = module.run_points(quick, workers, dask, quiet)
    else:
        rows = sweep_points(scenario_path(name), module.points(quick), workers, dask, quiet)
    table, summary, notes = module.analyze(rows)
    out_dir = make_dir(out_dir, "--out-dir")
    paths = {"table": out_dir / f"study-{name}.csv", "summary": out_dir / f"study-{name}-summary.csv",
             "plot": out_dir / f"study-{name}.png"}
    for what, frame in (("table", table), ("summary", summary)):
        with written(paths[what], "--out-dir") as tmp:
            frame.to_csv(tmp, index=False)
    with written(paths["plot"], "--out-dir") as tmp:
        module.plot(table, summary, tmp)
    return Report(module.TITLE, table, summary, notes, paths)


def sweep_points(scenario: Path, labelled: list[tuple[dict, dict]], workers=None, dask=None,
                 quiet: bool = False) -> pd.DataFrame:
    """Sweep ``(labels, overrides)`` pairs; one row per pair: labels, then the sweep row."""
    df = sweep(scenario, [p for _, p in labelled], workers=workers, dask=dask, quiet=quiet)
    by_key = dict(zip(df["point"], df.to_dict("records")))
    rows = pd.DataFrame([{**labels, **by_key[point_key(p)]} for labels, p in labelled])
    rows["error"] = rows["error"].where(rows["error"].notna(), None)
    return rows


def valid(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose point simulated (no error)."""
    return rows[rows["error"].isna()]


@dataclass(frozen=True)
class Hardware:
    """The numbers the seeds' formulas need, for one point of a study."""

    domain: int  # GPUs per NVLink domain
    nic_bw: float  # bytes/s per GPU across domains, after IB efficiency
    nvlink_bw: float  # bytes/s per GPU inside a domain, after NVLink efficiency
    peak_flops: float  # dense bf16 FLOP/s
    params_total: float  # every parameter (what FSDP gathers)
    params_active: float  # parameters a token passes through (6ND's N), output layer included
    tokens: float  # tokens per optimizer step


def hardware(scenario: Path, overrides: dict) -> Hardware:
    """Resolve one point of the study's scenario into :class:`Hardware`."""
    s = scenario_from_dict(tomllib.loads(Path(scenario).read_text()), overrides, Path(scenario).parent)
    spec = topology_spec(s)  # (the simulator's: overrides, GPUs a node, Slurm segments)
    gpu = gpu_preset(s.cluster.gpu or spec.gpu)
    nic = spec.nic_gbps * GB if spec.nic_gbps else gpu.nic_bw
    nvlink = spec.nvlink_gbps * GB if spec.nvlink_gbps else gpu.nvlink_bw
    d = dims(s.model)
    active = non_embedding_params(d, active=True) + d.h * d.v
    return Hardware(spec.gpus_per_domain, nic * FABRIC_EFFICIENCY["ib"], nvlink * FABRIC_EFFICIENCY["nvlink"],
                    gpu.peak_flops, total_params(d, s.model.tied_embeddings), active,
                    s.training.global_batch * s.training.seq_len)


def crater(gpus, mfu, plateau: float, frac: float = 0.9) -> float | None:
    """The GPU count where MFU first falls below ``frac`` x plateau, interpolated in log2
    of the GPU count between the neighbouring points; None if it never does."""
    pairs = sorted(zip(gpus, mfu))
    for (n0, m0), (n1, m1) in zip(pairs, pairs[1:]):
        if m1 < frac * plateau <= m0:
            t = (m0 - frac * plateau) / (m0 - m1)
            return 2 ** (math.log2(n0) + t * (math.log2(n1) - math.log2(n0)))
    return None


def text_table(df: pd.DataFrame, formats: dict[str, str]) -> str:
    """``df`` as aligned text, each column formatted with ``formats[col]`` (e.g. "{:.1%}")."""
    shown = df.copy()
    for col, fmt in formats.items():
        if col in shown:
            shown[col] = [("-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v))
                          for v in shown[col]]
    return shown.to_string(index=False)


def human(n: float | None) -> str:
    """A count for prose: 4096 -> '4,096'; None or NaN -> '-'."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    return f"{n:,.0f}"
