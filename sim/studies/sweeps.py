"""Sweeps: one scenario, a grid of overrides, one row per grid point (CONTRACT.md).

Run ``clustersim sweep scenarios/llama3-8b-fsdp-h100.toml --grid training.seq_len=2048,4096
--grid training.recompute=none,selective --out seq.csv``; in Python,
``sim.sweep("scenarios/llama3-8b-fsdp-h100.toml", {"training.seq_len": [2048, 4096]})``.

A row holds the point's overridden keys, then every summary key (``comm_bytes_per_gpu``
flattened to ``comm_bytes_per_gpu.dp`` ...), then ``error`` (empty unless the point is
invalid or its simulation raised) and ``point``, the canonical JSON of the overrides that
identifies the point. Rows are written durably as they finish, so a killed sweep loses at
most the row being written; re-running with the same ``out`` skips every finished point
(error rows included). See docs/sweeps.md.
"""

from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
import csv
import io
import itertools
import json
import multiprocessing
import os
from pathlib import Path
import threading
import time
import tomllib
import typing

from pydantic import BaseModel

from .. import step
from ..errors import InputError
from ..input.load import override_pairs, scenario_from_dict
from ..input.scenario import Scenario

# The summary keys of CONTRACT.md, flattened; a key a newer summary adds is appended.
SUMMARY_COLUMNS = ("name", "num_gpus", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                   "bubble_fraction", "exposed_comm_s", "comm_bytes_per_gpu.dp", "comm_bytes_per_gpu.tp",
                   "comm_bytes_per_gpu.pp", "comm_bytes_per_gpu.ep", "comm_bytes_per_gpu.cp",
                   "memory_per_gpu_bytes", "fits_in_memory", "sim_events", "sim_wall_s", "straggler_cost_s")
JOURNAL_SUFFIX = ".partial.jsonl"  # Parquet outputs: the durable row-by-row record
MAX_POINTS = 100_000  # a grid typo should fail fast, not enumerate forever


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


# ---------------------------------------------------------------- one point
def run_point(scenario: Scenario) -> tuple[dict | None, str | None]:
    """Simulate one validated scenario: (flattened summary, None) or (None, error text).
    Runs in worker processes; never raises for a failed simulation."""
    try:
        return flatten(step.simulate(scenario).summary), None
    except InputError as exc:
        return None, _one_line(str(exc))
    except Exception as exc:  # a failed point is a row, not the end of the sweep
        return None, _one_line(f"internal error: {type(exc).__name__}: {exc}")


def flatten(summary: dict) -> dict:
    """Nested dicts become dotted columns: comm_bytes_per_gpu.dp, ..."""
    out = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- executors
def _run_local(tasks: list[tuple[str, Scenario]], workers: int):
    """Yield (key, result) as points finish: in this process for one worker, else in a
    process pool. Workers fork while this process has a single thread (fast, and scripts
    without a ``__main__`` guard work); with other threads alive (e.g. an in-process dask
    cluster) forking is unsafe, so they are spawned."""
    if workers <= 1 or len(tasks) <= 1:
        for key, scenario in tasks:
            yield key, run_point(scenario)
        return
    method = "fork" if threading.active_count() == 1 and os.name == "posix" else "spawn"
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        futures = {pool.submit(run_point, s): key for key, s in tasks}
        try:
            for future in as_completed(futures):
                try:
                    result = future.result()
                except BrokenProcessPool:
                    raise RuntimeError("a sweep worker process died (out of memory?); the rows finished so "
                                       "far are saved: re-run with the same out to resume") from None
                yield futures[future], result
        finally:
            for future in futures:
                future.cancel()


def _run_dask(tasks: list[tuple[str, Scenario]], dask):
    """Yield (key, result) as points finish on a dask.distributed cluster: ``dask`` is a
    scheduler address, a Client, or a cluster object (e.g. LocalCluster)."""
    from distributed import Client, as_completed as dask_completed

    own = not hasattr(dask, "submit")
    try:
        client = Client(dask, set_as_default=False) if own else dask
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        raise InputError("--dask", f"cannot connect to {dask!r}: {exc}") from None
    try:
        futures = {client.submit(run_point, s, pure=False): key
                   for key, s in tasks}
        for future in dask_completed(list(futures), loop=client.loop):
            yield futures[future], future.result()
    finally:
        if own:
            client.close()


# ---------------------------------------------------------------- sinks
def _cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, str):
        return v.replace("\r", " ").replace("\n", " ")  # one physical line per row
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _fsync_write(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically: write a temporary file, fsync, rename over."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Sink:
    """Rows by point key, in memory; subclasses also keep them in a file."""

    def __init__(self, columns: list[str]):
        self.columns, self.rows = list(columns), {}

    def _extend(self, row: dict) -> bool:
        extra = [k for k in row if k not in self.columns]
        self.columns += extra
        return bool(extra)

    def add(self, row: dict) -> None:
        self._extend(row)
        self.rows[row["point"]] = row

    def finish(self, order: list[str]) -> None:
        """All points are done: put the rows in grid order."""
        rank = {k: i for i, k in enumerate(order)}
        self.rows = dict(sorted(self.rows.items(), key=lambda kv: rank.get(kv[0], len(rank))))


class CsvSink(_Sink):
    """A CSV file, one physical line per row, appended and fsynced row by row. A torn last
    line (a killed writer) is cut off on open; only that point is simulated again."""

    def __init__(self, path: Path, columns: list[str]):
        super().__init__([])
        self.path = path
        if path.exists():
            self._load()
        self._extend(dict.fromkeys(columns))
        self._rewrite()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            raw = raw[:raw.rfind(b"\n") + 1]  # the torn row; the rewrite below drops it
        lines = raw.decode("utf-8", errors="replace").split("\n")[:-1]
        if not lines:
            return
        rows = list(csv.reader(lines))
        header = rows[0]
        if "point" not in header:
            raise InputError("--out", f"{self.path} exists and is not a sweep output (no 'point' column)")
        self.columns = header
        for n, cells in enumerate(rows[1:], start=2):
            if len(cells) != len(header):
                raise InputError("--out", f"{self.path}:{n}: {len(cells)} fields, the header has {len(header)}")
            row = dict(zip(header, cells))
            self.rows[row["point"]] = row

    def _line(self, row: dict) -> str:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([_cell(row.get(c)) for c in self.columns])
        return buf.getvalue()

    def _rewrite(self) -> None:
        text = self._line({c: c for c in self.columns}) + "".join(self._line(r) for r in self.rows.values())
        _fsync_write(self.path, text.encode())

    def add(self, row: dict) -> None:
        if self._extend(row):  # a new column: rewrite the file with the wider header
            self.rows[row["point"]] = row
            self._rewrite()
            return
        self.rows[row["point"]] = row
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(self._line(row))
            f.flush()
            os.fsync(f.fileno())

    def finish(self, order: list[str]) -> None:
        super().finish(order)
        self._rewrite()

    def frame(self):
        import pandas as pd

        return pd.read_csv(self.path, keep_default_na=True)


class ParquetSink(_Sink):
    """A Parquet file kept durable by a JSON-lines journal beside it (``OUT.partial.jsonl``,
    appended and fsynced row by row); the Parquet file is rewritten atomically at most once
    a second and at the end, when the journal is removed."""

    def __init__(self, path: Path, columns: list[str]):
        super().__init__(columns)
        self.path, self.journal = path, path.with_name(path.name + JOURNAL_SUFFIX)
        self._written = 0.0
        if path.exists():
            self._load_parquet()
        if self.journal.exists():
            self._load_journal()

    def _load_parquet(self) -> None:
        import pandas as pd

        df = pd.read_parquet(self.path)
        if "point" not in df.columns:
            raise InputError("--out", f"{self.path} exists and is not a sweep output (no 'point' column)")
        self._extend(dict.fromkeys(df.columns))
        for rec in df.to_dict("records"):
            self.rows[rec["point"]] = {k: _from_frame(v) for k, v in rec.items()}

    def _load_journal(self) -> None:
        raw = self.journal.read_bytes()
        good = raw[:raw.rfind(b"\n") + 1]  # drop a torn last line
        for line in good.decode("utf-8", errors="replace").splitlines():
            row = json.loads(line)
            self._extend(row)
            self.rows[row["point"]] = row
        if len(good) < len(raw):
            _fsync_write(self.journal, good)

    def add(self, row: dict) -> None:
        super().add(row)
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if time.monotonic() - self._written > 1.0:
            self._write_parquet()

    def _write_parquet(self) -> None:
        buf = io.BytesIO()
        _for_arrow(self._frame_from_rows()).to_parquet(buf, index=False)
        _fsync_write(self.path, buf.getvalue())
        self._written = time.monotonic()

    def _frame_from_rows(self):
        import pandas as pd

        return pd.DataFrame([[r.get(c) for c in self.columns] for r in self.rows.values()], columns=self.columns)

    def finish(self, order: list[str]) -> None:
        super().finish(order)
        self._write_parquet()
        self.journal.unlink(missing_ok=True)

    def frame(self):
        import pandas as pd

        return pd.read_parquet(self.path)


class MemorySink(_Sink):
    """No file: rows only in memory (``out=None``)."""

    def frame(self):
        import pandas as pd

        return pd.DataFrame([[r.get(c) for c in self.columns] for r in self.rows.values()], columns=self.columns)


def _from_frame(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    return None if isinstance(v, float) and v != v else v


def _for_arrow(df):
    """Columns holding values of several kinds (e.g. strings and lists) become JSON text."""
    for col in df.columns[df.dtypes == object]:
        kinds = {type(v) for v in df[col] if v is not None}
        if len(kinds - {int, float}) > 1 or (kinds & {str} and kinds & {int, float}):
            df[col] = [None if v is None else json.dumps(v) for v in df[col]]
    return df


def open_sink(out, columns: list[str]) -> _Sink:
    """The sink for ``out``: .csv, .parquet, or None (memory)."""
    if out is None:
        return MemorySink(columns)
    path = Path(out)
    if path.suffix in (".csv", ".parquet"):
        path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        return CsvSink(path, columns)
    if path.suffix == ".parquet":
        return ParquetSink(path, columns)
    raise InputError("--out", f"expected a .csv or .parquet path, got {str(out)!r}")


# ---------------------------------------------------------------- the sweep
def _scenario_data(scenario) -> tuple[dict, Path | None]:
    if isinstance(scenario, dict):
        return scenario, None
    if isinstance(scenario, (str, Path)):
        path = Path(scenario)
        try:
            return tomllib.loads(path.read_text()), path.parent
        except FileNotFoundError:
            raise InputError("scenario", f"no such file: {path}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError("scenario", f"{path}: malformed TOML ({exc})") from None
    raise InputError("scenario", f"expected a path or a scenario dict, got {type(scenario).__name__}")


def _progress(total: int, quiet: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = Console(stderr=True)
    return Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console,
                    disable=quiet or not console.is_terminal or total == 0)


def sweep(scenario, grid, workers: int | None = None, out=None, dask=None, overrides=None,
          quiet: bool = False, stats: dict | None = None):
    """Simulate every point of ``grid`` over ``scenario`` (a path or a scenario dict) and
    return one row per point as a pandas DataFrame, in grid order.

    ``grid``: dict key -> list of values (cartesian product) or a list of override dicts.
    ``overrides``: fixed ``--set`` overrides (dict or ["k=v"]), applied under the grid's.
    ``out``: .csv / .parquet written row by row; an existing file is resumed.
    ``workers``: processes (default os.cpu_count(); 1 runs in this process).
    ``dask``: a dask.distributed scheduler address, Client or cluster instead of processes.
    ``stats``: if given, filled with counts: points, resumed, invalid, simulated, failed.
    """
    data, base = _scenario_data(scenario)
    fixed = _fixed(overrides)
    points, order, grid_points = [], [], expand(grid)
    for p in grid_points:
        p = {**fixed, **p}
        key = point_key(p)
        if key not in order:
            points.append(p)
            order.append(key)
    keys = [k for p in grid_points for k in p] + list(fixed)  # grid keys first, then --set keys
    columns = list(dict.fromkeys(keys)) + list(SUMMARY_COLUMNS) + ["error", "point"]
    sink = open_sink(out, columns)
    counts = dict(points=len(points), resumed=0, invalid=0, simulated=0, failed=0)
    tasks, by_key = [], dict(zip(order, points))
    for p, key in zip(points, order):
        if key in sink.rows:
            counts["resumed"] += 1
            continue
        try:
            tasks.append((key, scenario_from_dict(data, p, base)))
        except InputError as exc:  # validated up front: an invalid point is an error row
            counts["invalid"] += 1
            sink.add({**p, "error": _one_line(str(exc)), "point": key})
    results = _run_dask(tasks, dask) if dask is not None else _run_local(tasks, workers or os.cpu_count() or 1)
    with _progress(len(tasks), quiet) as bar:
        job = bar.add_task("sweep", total=len(tasks))
        for key, (summary, error) in results:
            counts["simulated" if error is None else "failed"] += 1
            sink.add({**by_key[key], **(summary or {}), "error": error, "point": key})
            bar.advance(job)
    sink.finish(order)
    if stats is not None:
        stats.update(counts)
    df = sink.frame()
    df = df[df["point"].isin(set(order))]
    return df.set_index("point", drop=False).loc[order].reset_index(drop=True)


def _fixed(overrides) -> dict:
    pairs = dict(override_pairs(overrides))
    for key in pairs:
        check_key(key, "--set")
    return {k: _plain(v) for k, v in pairs.items()}
