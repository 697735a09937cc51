"""``clustersim sweep SCENARIO --grid k=v1,v2 [--grid ...] --out FILE [--workers N] [--dask ADDR]``.

Example: ``clustersim sweep scenarios/llama3-8b-fsdp-h100.toml --grid training.seq_len=2048..8192x2
--grid parallel.dp_algo=ring,hierarchical --out seq.csv`` (see docs/sweeps.md).

This module owns the ``--grid`` text syntax; :mod:`sim.sweeps.grid` takes Python values.
"""

import math
import re
import sys

from ..errors import InputError
from ..input.load import parse_value
from .calibrate import add_calibration_flag, calibration_overrides

MAX_VALUES = 100_000  # a range typo should fail fast, not enumerate forever
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"^\s*({_NUM})\s*\.\.\s*({_NUM})\s*(?:([x+])\s*({_NUM}))?\s*$")


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("sweep", help="simulate a grid of overrides, one row per point (resumable)")
    p.add_argument("scenario", help="scenario TOML file, or the name of a bundled example")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=VALUES", required=True,
                   help="values of one key: v1,v2,... | A..BxF (geometric) | A..B+S (arithmetic); "
                        "repeat for a cartesian product")
    p.add_argument("--out", required=True, help="results file, .csv or .parquet, in a folder that exists; an "
                                                "existing one is resumed (rows of an unchanged scenario reused)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--point-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a point that runs longer and record it as an error row (default: no limit)")
    p.add_argument("--dask", metavar="ADDR", help="run on a dask.distributed scheduler, e.g. tcp://host:8786")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key at every point (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary line")
    add_calibration_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Parse the grid (exit 2 if malformed), sweep, say what was written; on Ctrl-C, stop
    at once and say what is kept."""
    from ..sweeps.grid import sweep

    grid = parse_grid(args.grid)
    stats: dict = {}
    try:
        sweep(args.scenario, grid, workers=args.workers, out=args.out, dask=args.dask, overrides=calibration_overrides(args),
              quiet=args.quiet, stats=stats, point_timeout=args.point_timeout)
    except KeyboardInterrupt:
        done = stats.get("resumed", 0) + sum(stats.get(k, 0) for k in ("invalid", "simulated", "failed", "timed_out"))
        print(f"sweep interrupted: {done} of {stats.get('points', '?')} points are in {args.out}; run the same "
              "command again to resume", file=sys.stderr)
        return 130
    if not args.quiet:
        print(report(stats, args.out), file=sys.stderr)
    return 0


def report(stats: dict, out: str) -> str:
    """The closing line: what was simulated, reused, recomputed and why, and the errors."""
    from ..sweeps.grid import STALE_REASONS

    errors = stats["invalid"] + stats["failed"] + stats["timed_out"]
    line = (f"sweep: {stats['points']} points in {out}: {stats['simulated']} simulated, {stats['resumed']} resumed, "
            f"{errors} with an error ({stats['invalid']} invalid, {stats['failed']} failed, "
            f"{stats['timed_out']} timed out)")
    if stats["recomputed"]:
        why = ", ".join(f"{n} {STALE_REASONS[k]}" for k, n in sorted(stats["stale"].items()))
        line += f"; {stats['recomputed']} finished rows recomputed ({why})"
    return line


def parse_grid(specs: list[str], flag: str = "--grid") -> dict[str, list]:
    """``["k=v1,v2", "n=8..64x2"]`` -> ``{"k": [v1, v2], "n": [8, 16, 32, 64]}``; every key
    must name a scenario key."""
    from ..sweeps.grid import check_key

    grid: dict[str, list] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise InputError(flag, f"expected KEY=V1,V2 or KEY=A..BxF or KEY=A..B+S, got {spec!r}")
        if key in grid:
            raise InputError(flag, f"{key} is given twice")
        check_key(key, flag)
        grid[key] = parse_values(text, f"{flag} {key}")
    from ..sweeps.grid import check_count

    check_count(grid, flag)
    return grid


def parse_values(text: str, flag: str = "--grid") -> list:
    """A range ``A..B+S`` (arithmetic; ``A..B`` steps by 1) or ``A..BxF`` (geometric), both
    ending at the last value <= B; else comma-separated values, each parsed with
    :func:`sim.input.load.parse_value` (commas inside [], {} or quotes do not split)."""
    m = _RANGE.match(text)
    if m:
        return _range(m, text.strip(), flag)
    items = _split_top(text)
    if any(not item.strip() for item in items):
        raise InputError(flag, f"empty value in {text!r}")
    return [parse_value(item.strip()) for item in items]


def _range(m, text: str, flag: str) -> list:
    a, b, s = (int(n) if re.fullmatch(r"[-+]?\d+", n) else float(n) for n in (m[1], m[2], m[4] or "1"))
    geometric = m[3] == "x"
    if b < a or (geometric and (a <= 0 or s <= 1)) or (not geometric and s <= 0):
        need = "0 < A <= B and factor > 1" if geometric else "A <= B and step > 0"
        raise InputError(flag, f"range {text!r}: needs {need}")
    count = int((math.log(b / a) / math.log(s) + 1e-9) if geometric else (b - a) / s) + 1
    if count > MAX_VALUES:
        raise InputError(flag, f"range {text!r} has {count} values (at most {MAX_VALUES})")
    values = [a * s**i if geometric else a + i * s for i in range(count + 1)]
    if not all(isinstance(n, int) for n in (a, s)):
        values = [round(v, 12) for v in values]  # 0.1 + 2 * 0.1 -> 0.3, not 0.30000000000000004
    return [v for v in values if v <= b * (1 + 1e-12) + 1e-12]


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes; inside a quoted string a backslash
    escapes the next character (``\\"`` does not end the string, as in TOML)."""
    items, depth, quote, cur, escaped = [], 0, None, [], False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = quote == '"'  # TOML: basic strings have escapes, literal ('...') strings none
            else:
                quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    return items + ["".join(cur)]
