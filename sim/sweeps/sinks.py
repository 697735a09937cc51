"""Where sweep rows are kept: a CSV file, a Parquet file with its journal, or memory; and
the lock that keeps a second sweep away from an output file in use.

Durability (docs/sweeps.md): every finished row is appended and fsynced before the next
is taken, so a killed sweep loses at most the row being written. The lock is ``flock`` on
a sidecar file ``.OUT.lock`` beside ``OUT``, held for the whole sweep; the kernel drops it
when the sweep's process dies, however it dies. Run by :func:`sim.sweeps.grid.sweep`.
"""

import csv
from contextlib import contextmanager
import io
import json
import os
from pathlib import Path
import time

from ..errors import InputError
from ..outputs.paths import output_file, regular_file, write_bytes

JOURNAL_SUFFIX = ".partial.jsonl"  # Parquet outputs: the durable row-by-row record


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
    """Replace ``path`` atomically (a temporary file, fsynced, renamed over); a failed write
    exits 2 naming --out and the path (:func:`sim.outputs.paths.write_bytes`)."""
    write_bytes(path, data, "--out")


def _append(path: Path, text: str) -> None:
    """Append one row, fsynced (a row is durable once the sweep counts it); a failed write
    (a full disk, a quota) exits 2 naming --out and the path, the rows before it kept."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise InputError("--out", f"cannot write {path}: {exc.strerror or exc}") from None


MAX_RESUME_BYTES = 1 << 30  # a resumed output or journal: 100,000 points (the grid's cap) x ~2 KB a row is 200 MB


def _read_back(path: Path) -> bytes:
    """The bytes of an output being resumed: a regular file (never a device such as
    /dev/full, which reads without end, or a FIFO) of at most MAX_RESUME_BYTES."""
    regular_file(path, "--out")
    size = path.stat().st_size
    if size > MAX_RESUME_BYTES:
        raise InputError("--out", f"{path} has {size:,} bytes, more than a sweep output of the largest grid "
                                  f"({MAX_RESUME_BYTES:,}); move it away or give another --out")
    with open(path, "rb") as f:
        return f.read(MAX_RESUME_BYTES + 1)


def one_line(exc) -> str:
    """An exception's first line, at most 200 characters."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


class _Sink:
    """Rows by point key, in memory; subclasses also keep them in a file."""

    def flush(self) -> None:
        """Make the file hold every row added so far (Parquet: rewrite it from the journal)."""

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
        raw = _read_back(self.path)
        if raw and not raw.endswith(b"\n"):
            raw = raw[:raw.rfind(b"\n") + 1]  # the torn row; the rewrite below drops it
        lines = raw.decode("utf-8", errors="replace").split("\n")[:-1]
        if not lines:
            return
        try:
            rows = list(csv.reader(lines))
        except csv.Error as exc:  # a binary file: a NUL, a bare carriage return
            raise InputError("--out", f"{self.path} exists and is not a sweep output (not CSV text: {exc}); move it "
                                      "away or give another --out") from None
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
        _append(self.path, self._line(row))

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

        regular_file(self.path, "--out")
        try:
            df = pd.read_parquet(self.path)
        except (OSError, ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise InputError("--out", f"{self.path} exists and is not a readable Parquet sweep output "
                                      f"({one_line(exc)}); move it away or give another --out") from None
        if "point" not in df.columns:
            raise InputError("--out", f"{self.path} exists and is not a sweep output (no 'point' column)")
        self._extend(dict.fromkeys(df.columns))
        for rec in df.to_dict("records"):
            self.rows[rec["point"]] = {k: _from_frame(v) for k, v in rec.items()}

    def _load_journal(self) -> None:
        raw = _read_back(self.journal)
        good = raw[:raw.rfind(b"\n") + 1]  # drop a torn last line
        for n, line in enumerate(good.decode("utf-8", errors="replace").splitlines(), start=1):
            try:
                row = json.loads(line)
                ok = isinstance(row, dict) and isinstance(row.get("point"), str)
            except (ValueError, RecursionError):
                ok = False
            if not ok:
                raise InputError("--out", f"{self.journal}:{n}: not a sweep journal row (a JSON object with a "
                                          "'point'); move it away or give another --out")
            self._extend(row)
            self.rows[row["point"]] = row
        if len(good) < len(raw):
            _fsync_write(self.journal, good)

    def add(self, row: dict) -> None:
        super().add(row)
        _append(self.journal, json.dumps(row) + "\n")
        if time.monotonic() - self._written > 1.0:
            self._write_parquet()

    def flush(self) -> None:
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
    path = output_file(out, "--out", (".csv", ".parquet"))
    if path.suffix == ".parquet":
        regular_file(path.with_name(path.name + JOURNAL_SUFFIX), "--out")
    return CsvSink(path, columns) if path.suffix == ".csv" else ParquetSink(path, columns)


# ---------------------------------------------------------------- the lock
def lock_path(path: Path) -> Path:
    """The sidecar lock file of an output: ``.NAME.lock`` in the same folder."""
    return path.with_name(f".{path.name}.lock")


@contextmanager
def exclusive(path: Path):
    """Hold an exclusive lock on output ``path`` for the block; InputError naming the file
    if another sweep holds it. The lock file is removed on release, which is safe because
    a taker checks, once locked, that the file it locked is still the one at the path."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (docs/sweeps.md)
        yield
        return
    side = lock_path(path)
    while True:
        fd = os.open(side, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError("--out", f"{path} is being written by another sweep (it holds {side}); wait for "
                                      "it to finish or give another --out") from None
        try:
            if os.fstat(fd).st_ino == os.stat(side).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the previous holder removed it between our open and our lock: take the new one
    try:
        yield
    finally:
        side.unlink(missing_ok=True)
        os.close(fd)
