"""Sweeps: one scenario, a grid of overrides, one row per grid point (CONTRACT.md).

Run ``clustersim sweep scenarios/llama3-8b-fsdp-h100.toml --grid training.seq_len=2048,4096
--grid training.recompute=none,selective --out seq.csv``; in Python,
``sim.sweep("scenarios/llama3-8b-fsdp-h100.toml", {"training.seq_len": [2048, 4096]})``.

A row holds the point's overridden keys, then every summary key (``comm_bytes_per_gpu``
flattened to ``comm_bytes_per_gpu.dp`` ...), then ``error`` (empty unless the point is
invalid or its simulation raised), ``point`` (the canonical JSON of the overrides that
identifies the point), ``fingerprint`` (a hash of the fully resolved scenario of the point
and the clustersim version) and ``version``. Rows are written durably as they finish
(:mod:`.sinks`), so a killed sweep loses at most the row being written; re-running
with the same ``out`` reuses a finished row only when its fingerprint matches, and
recomputes (and counts) the others. Points run in :mod:`.pool`. See docs/sweeps.md.
"""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
from pathlib import Path
import typing

from pydantic import BaseModel

from ..errors import InputError
from ..hardware.specs import load_spec
from ..input.bundled import scenario_file
from ..input.load import override_pairs, read_toml, scenario_from_dict
from ..input.scenario import Scenario, Simulation
from ..outputs.paths import output_file
from ..outputs.progress import Progress
from ..version import __version__
from .pool import RETRIED_ERRORS, TIMEOUT_PREFIX, LocalPool, check_workers, one_line, run_dask, run_in_process
from .sinks import exclusive, open_sink

# The summary keys of CONTRACT.md, flattened; a key a newer summary adds is appended.
SUMMARY_COLUMNS = ("name", "num_gpus", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                   "bubble_fraction", "exposed_comm_s", "comm_bytes_per_gpu.dp", "comm_bytes_per_gpu.tp",
                   "comm_bytes_per_gpu.pp", "comm_bytes_per_gpu.ep", "comm_bytes_per_gpu.cp",
                   "memory_per_gpu_bytes", "fits_in_memory", "sim_events", "sim_wall_s", "straggler_cost_s")
TRAILING_COLUMNS = ("error", "point", "fingerprint", "version")
MAX_POINTS = 100_000  # a grid typo should fail fast, not enumerate forever
STALE_REASONS = {"format": "older format without a fingerprint", "changed": "scenario or clustersim version changed",
                 "retried": "timed out or lost its worker last time"}


# ---------------------------------------------------------------- keys and points
def check_key(key: str, flag: str = "--grid") -> None:
    """Raise InputError unless ``key`` names a scenario key (a dotted path through the
    schema; below a free-form table such as ``cluster.topology_overrides`` the loader checks)."""
    node, parts = Scenario, key.split(".")
    for i, part in enumerate(parts):
        fields = node.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "the scenario"
            raise InputError(flag, f"unknown key {key!r}: {where} has no {part!r}; known: {', '.join(fields)}")
        node = _section(fields[part].annotation)
        if node is None:
            annotation = fields[part].annotation
            if i < len(parts) - 1 and typing.get_origin(annotation) is not dict:
                raise InputError(flag, f"unknown key {key!r}: {'.'.join(parts[:i + 1])} is not a table")
            return


def _section(annotation):
    """The pydantic model inside ``annotation`` (``MoE | None`` -> MoE), else None."""
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def expand(grid) -> list[dict]:
    """The points of a grid: the cartesian product of a dict key -> values (the last key
    varies fastest), or a list of override dicts taken as given."""
    if isinstance(grid, dict):
        for key, values in grid.items():
            check_key(key)
            if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not list(values):
                raise InputError("grid", f"{key}: expected a non-empty list of values, got {values!r}")
        check_count(grid)  # counted before the product is built: 1e10 points is refused, not enumerated
        points = [dict(zip(grid, combo)) for combo in itertools.product(*(list(v) for v in grid.values()))]
    elif isinstance(grid, (list, tuple)) and all(isinstance(p, dict) for p in grid):
        points = [dict(p) for p in grid]
        for key in {k for p in points for k in p}:
            check_key(key)
    else:
        raise InputError("grid", f"expected a dict of key -> values or a list of dicts, got {type(grid).__name__}")
    if len(points) > MAX_POINTS:
        raise InputError("grid", f"{len(points)} points (at most {MAX_POINTS})")
    return [{k: _plain(v) for k, v in p.items()} for p in points]


def check_count(grid: dict, flag: str = "grid") -> int:
    """The number of points of a cartesian grid (the product of its value counts), computed
    without building it; InputError naming ``flag`` past MAX_POINTS."""
    count = math.prod(len(list(v)) for v in grid.values())
    if count > MAX_POINTS:
        counts = " x ".join(f"{len(list(v)):,} {k}" for k, v in grid.items())
        raise InputError(flag, f"{count:,} points ({counts}); at most {MAX_POINTS:,}")
    return count


def _plain(v):
    """numpy scalars and tuples -> plain Python values (JSON-able, TOML-like)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v.item() if hasattr(v, "item") else v


def point_key(overrides: dict) -> str:
    """The canonical identity of a point: its overrides as sorted, compact JSON."""
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------- fingerprints
def fingerprint(payload: dict) -> str:
    """16 hex digits of the SHA-256 of ``payload`` as canonical JSON, with the version."""
    text = json.dumps({**payload, "clustersim": __version__}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Fingerprints:
    """The fingerprint of a point: its fully resolved scenario (presets, Hugging Face config
    and overrides applied) and the topology file it names; for a point the loader rejects,
    the scenario data and the overrides."""

    def __init__(self, data: dict, point_fn: str | None = None):
        self.data, self.specs = data, {}
        self.extra = {} if point_fn is None else {"point_fn": point_fn}

    def valid(self, s: Scenario) -> str:
        name = s.cluster.topology
        if name not in self.specs:
            self.specs[name] = dataclasses.asdict(load_spec(name))
        scenario = s.model_dump(mode="json")
        if s.simulation == Simulation():  # (how it is simulated, left out at its default: the
            del scenario["simulation"]    # points a sweep wrote before the section existed still match)
        return fingerprint({"scenario": scenario, "topology": self.specs[name], **self.extra})

    def invalid(self, overrides: dict) -> str:
        return fingerprint({"data": self.data, "overrides": overrides, **self.extra})


def stale_reason(row: dict | None, fp: str) -> str | None:
    """Why a finished ``row`` cannot be reused for a point of fingerprint ``fp`` (a key of
    STALE_REASONS), or None when it can."""
    have = row.get("fingerprint")
    if not isinstance(have, str) or not have:
        return "format"
    if have != fp:
        return "changed"
    error = row.get("error")
    if isinstance(error, str) and error.startswith(RETRIED_ERRORS):
        return "retried"
    return None


# ---------------------------------------------------------------- the sweep
def _scenario_data(scenario) -> tuple[dict, Path | None]:
    if isinstance(scenario, dict):
        return scenario, None
    if isinstance(scenario, (str, Path)):
        path = scenario_file(scenario)
        return read_toml(path), path.parent  # the guarded reader run uses (regular file, size, depth)
    raise InputError("scenario", f"expected a path or a scenario dict, got {type(scenario).__name__}")


def sweep(scenario, grid, workers: int | None = None, out=None, dask=None, overrides=None,
          quiet: bool = False, stats: dict | None = None, point_timeout: float | None = None,
          point_fn=None, label: str = "sweep"):
    """Simulate every point of ``grid`` over ``scenario`` (a path, a bundled example's name
    or a scenario dict) and return one row per point as a pandas DataFrame, in grid order.

    ``grid``: dict key -> list of values (cartesian product) or a list of override dicts.
    ``overrides``: fixed ``--set`` overrides (dict or ["k=v"]), applied under the grid's.
    ``out``: .csv / .parquet written row by row, locked against a second sweep; an existing
    file is resumed (rows whose fingerprint matches are reused, the others recomputed).
    ``workers``: processes (default os.cpu_count(); 1 runs in this process unless a time limit is set).
    ``dask``: a dask.distributed scheduler address, Client or cluster instead of processes.
    ``point_timeout``: seconds a point may run before its worker is killed and the point
    becomes an error row (local processes only).
    ``stats``: if given, filled as the sweep goes with counts: points, resumed, recomputed,
    stale (reason -> count), invalid, simulated, failed, timed_out.
    ``point_fn``: a module-level function scenario -> (row dict, None) or (None, error text)
    run for each point instead of :func:`.pool.run_point` (``clustersim plan`` adds
    its breakdown columns); its name enters every fingerprint, so rows of another point
    function are never reused. ``label``: the progress line's name.
    """
    data, base = _scenario_data(scenario)
    points, columns = _points(grid, _fixed(overrides))
    _check_limits(workers, point_timeout, dask)
    counts = stats if stats is not None else {}
    counts.update(points=len(points), resumed=0, recomputed=0, stale={}, invalid=0, simulated=0, failed=0,
                  timed_out=0)
    with contextlib.ExitStack() as held:
        if out is not None:
            held.enter_context(exclusive(output_file(out, "--out", (".csv", ".parquet"))))
        sink = open_sink(out, columns)
        try:
            tasks = _plan(sink, data, base, points, counts, _fn_name(point_fn))
            _execute(sink, tasks, points, counts, workers or os.cpu_count() or 1, dask, point_timeout, quiet,
                     point_fn, label)
        except KeyboardInterrupt:
            sink.flush()  # the file then holds every row counted (a Parquet's journal rows included)
            raise
        sink.finish(list(points))
    df = sink.frame()
    df = df[df["point"].isin(set(points))]
    return df.set_index("point", drop=False).loc[list(points)].reset_index(drop=True)


def _points(grid, fixed: dict) -> tuple[dict, list[str]]:
    """Point key -> overrides (``--set`` under the grid's), in grid order; and the columns."""
    grid_points = expand(grid)
    points = {}
    for p in grid_points:
        p = {**fixed, **p}
        points.setdefault(point_key(p), p)
    keys = [k for p in grid_points for k in p] + list(fixed)  # grid keys first, then --set keys
    return points, list(dict.fromkeys(keys)) + list(SUMMARY_COLUMNS) + list(TRAILING_COLUMNS)


def _check_limits(workers, point_timeout, dask) -> None:
    check_workers(workers)
    if point_timeout is None:
        return
    if isinstance(point_timeout, bool) or not isinstance(point_timeout, (int, float)) or not point_timeout > 0 \
            or point_timeout == float("inf"):
        raise InputError("--point-timeout", f"expected a positive number of seconds, got {point_timeout!r}")
    if dask is not None:
        raise InputError("--point-timeout", "a point running on a dask worker cannot be stopped; use the dask "
                                            "cluster's own limits, or local workers")


def _fn_name(point_fn) -> str | None:
    return None if point_fn is None else f"{point_fn.__module__}.{point_fn.__qualname__}"


def _plan(sink, data: dict, base, points: dict, counts: dict, point_fn: str | None = None) -> list[tuple]:
    """Validate every point (an invalid one becomes an error row at once), reuse the rows
    whose fingerprint matches, and return (key, scenario, fingerprint) of the points to run."""
    prints, tasks = _Fingerprints(data, point_fn), []
    for key, p in points.items():
        try:
            s = scenario_from_dict(data, p, base)
            fp, error = prints.valid(s), None
        except InputError as exc:
            s, fp, error = None, prints.invalid(p), one_line(str(exc))
        row = sink.rows.get(key)
        if row is not None:
            reason = stale_reason(row, fp)
            if reason is None:
                counts["resumed"] += 1
                continue
            counts["recomputed"] += 1
            counts["stale"][reason] = counts["stale"].get(reason, 0) + 1
        if s is None:
            counts["invalid"] += 1
            sink.add({**p, "error": error, "point": key, "fingerprint": fp, "version": __version__})
        else:
            tasks.append((key, s, fp))
    return tasks


def _execute(sink, tasks: list[tuple], points: dict, counts: dict, workers: int, dask, point_timeout,
             quiet: bool, point_fn=None, label: str = "sweep") -> None:
    """Run the points where asked, adding each row as it finishes."""
    prints = {key: fp for key, _, fp in tasks}
    jobs = [(key, s) for key, s, _ in tasks]
    with contextlib.ExitStack() as running:  # leaving it, however, stops every worker at once
        if dask is not None:
            results = running.enter_context(contextlib.closing(run_dask(jobs, dask, point_fn)))
        elif point_timeout is None and (workers <= 1 or len(jobs) <= 1):
            results = run_in_process(jobs, point_fn)
        else:
            pool = running.enter_context(LocalPool(workers, point_timeout, point_fn))
            pool.start(len(jobs))
            results = pool.run(jobs)
        progress = running.enter_context(Progress(label, len(jobs), quiet))
        for key, (summary, error) in results:
            kind = "simulated" if error is None else "timed_out" if error.startswith(TIMEOUT_PREFIX) else "failed"
            counts[kind] += 1
            sink.add({**points[key], **(summary or {}), "error": error, "point": key, "fingerprint": prints[key],
                      "version": __version__})
            progress.advance()


def _fixed(overrides) -> dict:
    pairs = dict(override_pairs(overrides))
    for key in pairs:
        check_key(key, "--set")
    return {k: _plain(v) for k, v in pairs.items()}
