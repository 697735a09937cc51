"""Failure classes of a training campaign and their per-device rates.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12`` (default table)
or add ``--failures my_table.csv`` (same columns).

The default table, ``sim/data/llama3_interruptions.csv``, is the root-cause breakdown of
Llama 3 405B pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4
and Table 5): 466 job interruptions in a 54-day snapshot on 16,384 H100 GPUs in 2,048
servers, 419 unexpected (Table 5, by component) and 47 planned (automated maintenance such
as firmware upgrades, operator-initiated configuration or dataset updates).

Derivation. Each row becomes a rate per device-hour,
``rate = count / (devices x 54 days x 24 h)``, where ``devices`` is what the class scales
with, counted on the reference cluster:

- ``gpu`` (16,384): the GPU rows (faulty GPU, HBM3, SRAM, system processor, silent data
  corruption, thermal interface), NICs (one 400 Gb/s NIC per GPU on Meta's RoCE fabric,
  paper section 3.3.1), network switches and cables (a rail-optimised fat tree has a fixed
  number of cables and switch ports per GPU at each tier; the bundled builder has 1.5 IB
  cables per GPU at every scale) and NCCL watchdog timeouts (a hang of any one rank);
- ``node`` (2,048 servers of 8 GPUs): host parts (SSD, power supply, chassis, IO board,
  CPU, system memory) and unplanned host maintenance;
- ``job`` (1): software bugs and dependencies (a bug is in the code the whole job runs)
  and the planned interruptions (a maintenance roll-out or a configuration change touches
  the job once, whatever its size).

A scenario's failure rate is then ``sum(rate_c x devices_c)`` over the classes, with its own
GPU and node counts. ``kind`` says what an interruption costs: ``hardware`` (detection, a
healthy node to replace the failed one, restart, checkpoint load, and the work since the
last checkpoint), ``software`` (the same without the node) or ``planned`` (a checkpoint is
saved first, so no work is lost; no detection).

The paper prints 30.1% beside Faulty GPU's 148 (148/419 is 35.3%); the counts add up to
the 419 the text states, so the rates use the counts.
"""

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InputError

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "data" / "llama3_interruptions.csv"
KINDS = ("hardware", "software", "planned")
HARDWARE, SOFTWARE, PLANNED = range(3)
REFERENCE_DEVICES = {"gpu": 16_384, "node": 2_048, "job": 1}  # Llama 3 405B: 16,384 H100 in 2,048 servers
WINDOW_HOURS = 54 * 24  # the paper's 54-day snapshot
MAX_BYTES = 1_000_000  # a failure table is a few dozen rows
MAX_ROWS = 1_000
REQUIRED = ("cause", "kind", "scales_with", "rate_per_device_hour")


class Row(BaseModel):
    """One failure class as written in a table (rate per device-hour)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cause: str = Field(min_length=1, max_length=80)
    kind: Literal["hardware", "software", "planned"]
    scales_with: Literal["gpu", "node", "job"]
    rate_per_device_hour: float = Field(ge=0, allow_inf_nan=False)
    category: str = ""
    count: int | None = Field(default=None, ge=0)
    percent: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    source: str = ""


@dataclass(frozen=True)
class Fleet:
    """What the classes scale with: the job's GPUs and servers."""

    gpus: int
    nodes: int

    def devices(self, scales_with: str) -> int:
        """How many devices of a kind the job runs on."""
        return {"gpu": self.gpus, "node": self.nodes, "job": 1}[scales_with]


@dataclass(frozen=True)
class FailureTable:
    """Validated rows; :meth:`rates` turns them into one fleet's failures per second."""

    rows: tuple[Row, ...]
    path: str

    @property
    def causes(self) -> tuple[str, ...]:
        """The classes' names, in table order."""
        return tuple(r.cause for r in self.rows)

    @property
    def kinds(self) -> np.ndarray:
        """Index into KINDS of every class."""
        return np.array([KINDS.index(r.kind) for r in self.rows], dtype=np.int64)

    def rates(self, fleet: Fleet) -> np.ndarray:
        """Failures per second of every class on ``fleet`` (rate per device-hour x devices / 3600)."""
        return np.array([r.rate_per_device_hour * fleet.devices(r.scales_with) / 3600.0 for r in self.rows])


def load_table(path: str | Path | None = None) -> FailureTable:
    """Read and validate a failure table (the Llama 3 default when ``path`` is None)."""
    path = Path(path) if path is not None else DEFAULT_TABLE
    records = _read_records(path)
    rows, seen = [], set()
    for i, record in enumerate(records, start=1):
        row = _row(i, record)
        if row.cause in seen:
            raise InputError(f"--failures row {i} column cause", f"duplicate cause {row.cause!r}")
        seen.add(row.cause)
        rows.append(row)
    return FailureTable(tuple(rows), str(path))


def _read_records(path: Path) -> list[dict]:
    """The file's data rows as dicts of strings (lines starting with '#' are comments)."""
    if not path.is_file():
        raise InputError("--failures", f"no such file: {path}")
    if path.stat().st_size > MAX_BYTES:
        raise InputError("--failures", f"{path} is larger than {MAX_BYTES:,} bytes; a failure table is a few rows")
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    except UnicodeDecodeError:
        raise InputError("--failures", f"{path} is not UTF-8 text") from None
    reader = csv.DictReader(lines)
    columns = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InputError("--failures", f"{path}: missing column(s) {', '.join(missing)}; "
                                       f"expected at least {', '.join(REQUIRED)}")
    unknown = [c for c in columns if c not in Row.model_fields]
    if unknown:
        raise InputError(f"--failures column {unknown[0]}", f"unknown column; known: {', '.join(Row.model_fields)}")
    records = list(reader)
    if not records or len(records) > MAX_ROWS:
        raise InputError("--failures", f"{path}: expected 1 to {MAX_ROWS} rows, found {len(records)}")
    return records


def _row(i: int, record: dict) -> Row:
    """Validate one record; an error names the row and the column."""
    if None in record:  # more cells than columns
        raise InputError(f"--failures row {i}", "has more cells than the header has columns")
    fields = {k: v.strip() for k, v in record.items() if v is not None and v.strip() != ""}
    try:
        return Row(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        column = err["loc"][0] if err["loc"] else "?"
        cause = fields.get("cause", "?")
        raise InputError(f"--failures row {i} column {column}",
                         f"({cause}) {err['msg'].lower()}, got {fields.get(column)!r}") from None


def derived_rate(count: int, scales_with: str) -> float:
    """Per device-hour rate of ``count`` interruptions in the reference 54-day window."""
    return count / (REFERENCE_DEVICES[scales_with] * WINDOW_HOURS)
