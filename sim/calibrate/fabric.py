"""Fit link efficiencies and latencies per link kind to nccl-tests tables.

Each table row is simulated as ``clustersim collective`` times it (the same topology, GPU count
and algorithm: NCCL_ALGO if the file sets it, else NCCL's tuner) under a trial
:class:`~sim.hardware.calibration.Calibration`; the parameters -- share of line rate and per-hop
latency of every link kind the tables cross (NVLink inside one NVLink domain, InfiniBand as
well when a table spans domains) -- minimise the squared log error of the times over every row
of every table at once (Levenberg-Marquardt on log parameters, finite-difference Jacobian).
Large sizes pin the efficiencies, small sizes the latencies; a parameter no row moves (all
sizes large, say) keeps its preset value and the report says so.

Run ``clustersim calibrate all_reduce_perf.txt --out profile.toml``.
"""

from dataclasses import dataclass, replace
import math

import numpy as np

from ..hardware import specs, topology
from ..hardware.calibration import Calibration
from ..hardware.gpus import FABRIC_EFFICIENCY, LINK_LATENCY, gpu_preset, nvlink_efficiency
from ..studies.nccl_tests import algorithm, time_collective
from ..errors import InputError
from .nccl import Table

STEP = 0.05  # log step of the finite differences (5%: the tuner's choices change in steps)
MOVED = 1e-3  # a parameter whose column moves no residual by this much per unit log is undetermined
ITERATIONS = 25


@dataclass(frozen=True)
class Param:
    """One fitted constant: ``field`` is "efficiency" or "latency", ``kind`` the link kind."""

    field: str
    kind: str

    @property
    def name(self) -> str:
        return f"fabric.{'efficiency' if self.field == 'efficiency' else 'latency_us'}.{self.kind}"


def presets(gpu_name: str) -> dict[Param, float]:
    """The preset values the fit starts from (latency in seconds)."""
    eff = dict(FABRIC_EFFICIENCY, nvlink=nvlink_efficiency(gpu_name))
    return {**{Param("efficiency", k): v for k, v in eff.items()},
            **{Param("latency", k): v for k, v in LINK_LATENCY.items()}}


def params_of(tables: list[Table], spec) -> list[Param]:
    """The constants these tables can tell: NVLink always, InfiniBand when a table spans domains."""
    kinds = ["nvlink"] + (["ib"] if any(t.gpus > spec.gpus_per_domain for t in tables) else [])
    return [Param(f, k) for k in kinds for f in ("efficiency", "latency")]


def calibration_of(values: dict[Param, float], base: Calibration | None = None) -> Calibration:
    """A Calibration holding ``values`` (on top of ``base``'s compute section)."""
    eff = tuple(sorted((p.kind, v) for p, v in values.items() if p.field == "efficiency"))
    lat = tuple(sorted((p.kind, v) for p, v in values.items() if p.field == "latency"))
    return replace(base or Calibration(), efficiency=eff, latency=lat)


class Bench:
    """Simulates every row of the tables on one topology preset and GPU."""

    def __init__(self, tables: list[Table], topology_name: str, gpu_name: str):
        self.tables, self.gpu = tables, gpu_preset(gpu_name)
        self.spec = specs.load_spec(topology_name, key="--topology")
        for t in tables:
            _check_servers(t, self.spec)
        self.measured = np.array([t.time_s(r) for t in tables for r in t.rows])

    def times(self, cal: Calibration | None) -> np.ndarray:
        """Simulated seconds of every row, in table order."""
        out = []
        for t in self.tables:
            spec = self.spec if t.nvls else replace(self.spec, nvls=False)
            per = max(spec.gpus_per_node, spec.gpus_per_domain)
            total = -(-t.gpus // per) * per
            if spec.max_gpus is not None and t.gpus > spec.max_gpus:
                raise InputError("--topology", f"{t.path}: {t.gpus} GPUs ran but {spec.name!r} holds {spec.max_gpus}")
            topo = topology.build(spec, min(total, spec.max_gpus or total), self.gpu, calibration=cal)
            group = tuple(range(t.gpus))
            for r in t.rows:
                algo = algorithm(topo, t.op, t.algo, "auto", group, r.bytes)  # NCCL picks the protocol
                out.append(time_collective(topo, t.op, algo, group, r.bytes))
        return np.array(out)

    def residuals(self, cal: Calibration | None) -> np.ndarray:
        """log(simulated / measured) of every row."""
        return np.log(self.times(cal) / self.measured)


def fit(bench: Bench, start: dict[Param, float], params: list[Param], base: Calibration | None = None):
    """Levenberg-Marquardt on the log of ``params`` from ``start``, after a coarse scan of each
    efficiency (a link that is no bottleneck at the preset moves no time: a gradient alone would
    never find it); returns (values, params the rows determine, residuals before, after)."""
    values = dict(start)

    def residuals(x):
        return bench.residuals(calibration_of({**values, **dict(zip(params, np.exp(x)))}, base))

    before = residuals(np.array([math.log(values[p]) for p in params]))
    x0 = np.array([math.log(values[p]) for p in params])
    x = _scan(residuals, x0, params)
    r = residuals(x)
    determined, damping = {i for i in range(len(params)) if x[i] != x0[i]}, 1e-3
    for _ in range(ITERATIONS):
        jac = _jacobian(residuals, x, r, range(len(params)))
        moved = np.abs(jac).max(axis=0) > MOVED * STEP
        determined |= {i for i, m in enumerate(moved) if m}
        if not moved.any():
            break
        trial = x.copy()
        trial[moved] += _lm_step(jac[:, moved], r, damping)
        trial = _clip(trial, params)
        r_trial = residuals(trial)
        if (r_trial ** 2).sum() < (r ** 2).sum():
            gain = (r ** 2).sum() - (r_trial ** 2).sum()
            x, r, damping = trial, r_trial, damping / 3
            if gain < 1e-12:
                break
        else:
            damping *= 10
            if damping > 1e6:
                break
    free = sorted(determined)
    fitted = {**values, **{params[i]: float(np.exp(x[i])) for i in free}}
    return fitted, [params[i] for i in free], before, r


SCAN = (1.0, 0.85, 0.7, 0.55, 0.4, 0.25)  # efficiencies tried before the gradient steps


def _scan(residuals, x: np.ndarray, params: list[Param]) -> np.ndarray:
    """Each efficiency in turn set to the best of :data:`SCAN` (or left where it is)."""
    x = x.copy()
    for i, p in enumerate(params):
        if p.field != "efficiency":
            continue
        best, best_sse = x[i], float((residuals(x) ** 2).sum())
        for value in SCAN:
            trial = x.copy()
            trial[i] = math.log(value)
            sse = float((residuals(trial) ** 2).sum())
            if sse < best_sse:
                best, best_sse = trial[i], sse
        x[i] = best
    return x


def _jacobian(residuals, x, r, free) -> np.ndarray:
    cols = []
    for i in free:
        xp = x.copy()
        xp[i] += STEP
        cols.append((residuals(xp) - r) / STEP)
    return np.column_stack(cols)


def _lm_step(jac: np.ndarray, r: np.ndarray, damping: float) -> np.ndarray:
    jtj = jac.T @ jac
    return np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-12), -jac.T @ r)


def _clip(x: np.ndarray, params: list[Param]) -> np.ndarray:
    """Efficiencies stay within (1%, 100%] of line rate, latencies within 1 ns .. 1 ms."""
    out = x.copy()
    for i, p in enumerate(params):
        lo, hi = (math.log(0.01), 0.0) if p.field == "efficiency" else (math.log(1e-9), math.log(1e-3))
        out[i] = min(max(out[i], lo), hi)
    return out


def _check_servers(t: Table, spec) -> None:
    """A table whose rank lines name every server must match the topology's GPUs per server."""
    if t.hosts and t.gpus % t.hosts == 0 and t.hosts > 1:
        per = t.gpus // t.hosts
        if per != spec.gpus_per_node:
            raise InputError("--topology", f"{t.path}:{t.rows[0].line}: {t.gpus} GPUs on {t.hosts} servers is "
                                           f"{per} per server; topology {spec.name!r} has {spec.gpus_per_node}")
