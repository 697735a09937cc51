"""nccl-tests / rccl-tests output: the plain-text tables ``all_reduce_perf`` and friends print.

The format (NVIDIA/nccl-tests src/common.cu ``printHeader``/``PRINT``; ROCm/rccl-tests prints
the same): ``#``-comment lines (``# nThread 1 nGpus 1 minBytes ...``, one ``#  Rank  N Group 0
Pid ... on HOST device ...`` per rank, the column header), then one row per size::

    size  count  type  redop  root  | time algbw busbw #wrong (out-of-place) | time algbw busbw #wrong (in-place)

(older releases: no ``root`` column, ``error`` in place of ``#wrong``; ``alltoall`` prints
``N/A`` for in-place), and ``# Avg bus bandwidth : X`` at the end. The collective is not
printed: it comes from the binary's name in the file or its file name (``all_gather_perf``),
else from the count column (all_reduce: count = size / type bytes; reduce_scatter: that / n)
and the busbw/algbw factor (2(n-1)/n only for all_reduce). The GPU count is the number of
ranks listed (or one more than the highest rank shown); NCCL_ALGO=... and NCCL_NVLS_ENABLE=0
in the file (an echoed command line) say what NCCL ran.

Used by ``clustersim calibrate all_reduce_perf.txt --out profile.toml``.
"""

from dataclasses import dataclass
from pathlib import Path
import re

from .. import bounds
from ..collectives.kinds import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE_SCATTER, Algorithm, CollectiveOp
from ..errors import InputError

MAX_BYTES = 256 << 20  # a long training log or a big sweep of tables

OPS = {"all_reduce": ALL_REDUCE, "allreduce": ALL_REDUCE, "all_gather": ALL_GATHER, "allgather": ALL_GATHER,
       "reduce_scatter": REDUCE_SCATTER, "reducescatter": REDUCE_SCATTER, "alltoall": ALL_TO_ALL,
       "all_to_all": ALL_TO_ALL, "broadcast": BROADCAST}  # a binary's name (all_reduce_perf) -> the collective
ALGO_NAMES = {"ring": Algorithm.RING, "tree": Algorithm.TREE, "nvls": Algorithm.NVLS, "nvlstree": Algorithm.NVLS_TREE,
              "collnet": Algorithm.COLLNET, "collnetdirect": Algorithm.COLLNET, "collnetchain": Algorithm.COLLNET,
              "pat": Algorithm.PAT}  # NCCL_ALGO's spelling -> the algorithm
TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2,
              "int32": 4, "uint32": 4, "int": 4, "float": 4, "float32": 4, "int64": 8, "uint64": 8,
              "double": 8, "float64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1}
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_BINARY = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast)_perf")


@dataclass(frozen=True)
class Row:
    """One size: bytes, and (out-of-place, in-place) time in seconds and busbw in bytes/s
    (in-place None where not printed); ``line`` is its line number in the file."""

    bytes: int
    time_s: float
    busbw: float
    time_in_s: float | None
    busbw_in: float | None
    line: int


@dataclass(frozen=True)
class Table:
    """One nccl-tests run: the collective, the GPUs and servers, what NCCL was told to run."""

    path: str
    op: CollectiveOp
    gpus: int
    hosts: int  # servers seen in the rank lines (0: none listed)
    algo: Algorithm  # AUTO unless NCCL_ALGO was set
    nvls: bool  # False when NCCL_NVLS_ENABLE=0
    rows: tuple[Row, ...]

    def time_s(self, row: Row) -> float:
        """The measured time of a size: the mean of out-of-place and in-place where both exist."""
        return row.time_s if row.time_in_s is None else (row.time_s + row.time_in_s) / 2


def looks_like(text: str) -> bool:
    """Whether a file's text is nccl-tests output (its header line)."""
    return "nThread" in text and "minBytes" in text or ("out-of-place" in text and "busbw" in text)


def parse(path: str | Path, text: str | None = None) -> Table:
    """The first (usually only) table of an nccl-tests output (see :func:`parse_all`)."""
    return parse_all(path, text)[0]


def parse_all(path: str | Path, text: str | None = None) -> list[Table]:
    """Every table of one nccl-tests / rccl-tests output (rccl-tests' scripts run several
    binaries into one file, each ending ``# Avg bus bandwidth`` and, in rccl-tests, ``#
    Collective test concluded: X_perf``); InputError naming ``file:line`` on a malformed or
    truncated one."""
    path = Path(path)
    text = bounds.read_text(path, "INPUT", MAX_BYTES) if text is None else text
    lines = text.splitlines()
    algo_match = re.search(r"NCCL_ALGO=([A-Za-z]+)", text)
    algo = ALGO_NAMES.get(algo_match.group(1).lower(), Algorithm.AUTO) if algo_match else Algorithm.AUTO
    segments = _segments(lines)
    tables, ranks, hosts = [], set(), []
    for first, last, closed in segments:
        part = lines[first:last]
        seg_ranks, seg_hosts, rows = _read(path, part, first, closed)
        if rows is None:
            continue  # comments after the last table
        ranks, hosts = (seg_ranks, seg_hosts) if seg_ranks else (ranks, hosts)
        gpus = _gpus(ranks, path, lines)
        op = _op(path, len(segments) == 1, "\n".join(part), rows, part)
        tables.append(Table(str(path), op, gpus, len(set(hosts)), algo, "NCCL_NVLS_ENABLE=0" not in text, tuple(rows)))
    if not tables:
        raise InputError("INPUT", f"{path}:{len(lines)}: no nccl-tests rows (size count type ... time algbw busbw)")
    return tables


def _segments(lines: list[str]) -> list[tuple[int, int, bool]]:
    """(first, end, closed) line ranges of the tables: each closes with its ``Avg bus bandwidth``
    line and the ``Collective test concluded`` line just after it; what follows the last is open."""
    out, first, i = [], 0, 0
    while i < len(lines):
        if "Avg bus bandwidth" in lines[i]:
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith("#")) \
                    and "nThread" not in lines[end] and not _RANK.match(lines[end].strip()) and "size" not in lines[end]:
                end += 1
            out.append((first, end, True))
            first, i = end, end
        else:
            i += 1
    if first < len(lines):
        out.append((first, len(lines), False))
    return out


def _read(path: Path, part: list[str], offset: int, closed: bool):
    """(ranks, hosts, rows) of one table's lines; rows None when the part holds no table."""
    ranks, hosts, columns, rows = set(), [], None, []
    for number, line in enumerate(part, offset + 1):
        match = _RANK.match(line.strip())
        if match:
            ranks.add(int(match.group(1)))
            hosts.append(match.group(2))
        elif line.lstrip().startswith("#") and "size" in line and "busbw" in line:
            columns = line.lstrip("# ").split()
        elif _is_row(line):
            if columns is None:
                raise InputError("INPUT", f"{path}:{number}: a data row before the column header (size count type ... busbw)")
            rows.append(_row(line, columns, f"{path}:{number}", number))
    if not rows:
        if closed:
            raise InputError("INPUT", f"{path}:{offset + len(part)}: a table without rows")
        return ranks, hosts, None
    if not closed:
        raise InputError("INPUT", f"{path}:{offset + len(part)}: truncated: the run ends without '# Avg bus "
                                  "bandwidth' (nccl-tests prints it after the last size)")
    return ranks, hosts, rows


def _is_row(line: str) -> bool:
    parts = line.split()
    return bool(parts) and not line.lstrip().startswith("#") and parts[0].isdigit() and len(parts) > 1 \
        and parts[1].isdigit()


def _row(line: str, columns: list[str], where: str, number: int) -> Row:
    """A data row: ``time algbw busbw`` twice after the size, count, type, redop (and root)."""
    parts = line.split()
    first = columns.index("time") if "time" in columns else -1
    if first < 0 or len(parts) < first + 3:
        raise InputError("INPUT", f"{where}: truncated row ({len(parts)} fields; a row has "
                                  f"{len(columns)}: {' '.join(columns)})")
    try:
        size = int(parts[0])
        time_us, busbw = float(parts[first]), float(parts[first + 2])
    except ValueError:
        raise InputError("INPUT", f"{where}: expected numbers in the size, time and busbw columns") from None
    second = first + 4
    time_in = busbw_in = None
    if len(parts) >= second + 3 and parts[second] != "N/A":
        try:
            time_in, busbw_in = float(parts[second]) * 1e-6, float(parts[second + 2]) * 1e9
        except ValueError:
            raise InputError("INPUT", f"{where}: expected numbers in the in-place time and busbw columns") from None
    elif len(parts) < second + 1 and len(columns) >= second + 3:
        raise InputError("INPUT", f"{where}: truncated row: the in-place columns are missing")
    if size < 1 or time_us <= 0:
        raise InputError("INPUT", f"{where}: size {size} B in {time_us} us is no measurement")
    return Row(size, time_us * 1e-6, busbw * 1e9, time_in, busbw_in, number)


def _gpus(ranks: set, path: Path, lines: list[str]) -> int:
    if ranks:
        return max(max(ranks) + 1, len(ranks))
    match = re.search(r"-np\s+(\d+)", "\n".join(lines))
    if match:
        return int(match.group(1))
    raise InputError("INPUT", f"{path}:1: no '#  Rank N ... device' lines and no 'mpirun -np N': "
                              "cannot tell how many GPUs ran (keep the header nccl-tests prints)")


def _op(path: Path, by_name: bool, text: str, rows: list[Row], lines: list[str]) -> CollectiveOp:
    """The collective: the binary named in the table's text, or in the file name (when the file
    holds one table), else what the count column and the reduction say."""
    named = _BINARY.search(text) or (_BINARY.search(path.name.lower().replace("-", "_")) if by_name else None)
    if named:
        return OPS[named.group(1)]
    first = next(line for line in lines if _is_row(line)).split()
    size, count, kind = int(first[0]), int(first[1]), first[2].lower()
    per = TYPE_BYTES.get(kind)
    redop = first[3].lower() if len(first) > 3 else ""
    if per and redop not in ("none", ""):
        return ALL_REDUCE if count * per == size else REDUCE_SCATTER
    raise InputError("INPUT", f"{path}:{rows[0].line}: cannot tell the collective "
                              "(all_gather and alltoall print alike): keep the binary's name in the file or name "
                              "the file after it, e.g. all_gather_perf.txt")


def render(op: CollectiveOp, gpus: int, gpus_per_node: int, sizes: list[int], times_s: list[float],
           algo: str | None = None) -> str:
    """nccl-tests' text for simulated times (what the round-trip tests feed back to the fit):
    the header, one rank line per GPU, the rows (in-place = out-of-place), the average."""
    from ..studies.nccl_tests import bus_factor

    binary = "alltoall" if op is ALL_TO_ALL else op.value
    out = [f"# {binary}_perf" + (f" with NCCL_ALGO={algo}" if algo else ""),
           f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} step: 2(factor) warmup iters: 5 "
           "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    out += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {'node%d' % (r // gpus_per_node):>10} device "
            f"{r % gpus_per_node:2d} [0x00] simulated" for r in range(gpus)]
    out += ["#", f"#{'out-of-place':>62}{'in-place':>35}",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    busbws = []
    for size, t in zip(sizes, times_s):
        count = size // 4 // (1 if op in (ALL_REDUCE, BROADCAST) else gpus)
        algbw = size / t / 1e9
        busbw = algbw * bus_factor(op, gpus)
        busbws.append(busbw)
        cols = f"{t * 1e6:8.2f} {algbw:7.2f} {busbw:7.2f}      0"
        out.append(f"{size:12d} {count:13d}     float     sum      -1 {cols} {cols}")
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}", "#"]
    return "\n".join(out) + "\n"
