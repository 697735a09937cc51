"""How far two runs' results are apart, number by number: for a change that may move results by
rounding only (bench/fingerprint.py's hashes say *whether* they moved, this says *how far*).

Run: ``python bench/rows.py ID [--set K=V ...] --dump DIR`` in each tree (one ``DIR/ID.json``
summary and ``DIR/ID.npz`` spans per row), then ``python bench/compare_fingerprints.py BEFORE AFTER
[--tolerance 1e-12]`` on the two folders (or on two summary JSON files). For every pair it prints
the largest relative change of a float, |a - b| / max(|a|, |b|), over the whole summary (every key,
every list item) and over each numeric spans column, with where it is, and every *discrete*
change: a string, bool, null, an integer, a list's length or a key present in one run only (which
rank is last, bottleneck labels, rank orders, counts), a non-numeric spans column (hashed), the
number of spans. ``sim_events`` and ``sim_wall_s`` (the engine's own cost, not results) are left
out, as in bench/fingerprint.py. Exits 1 if a float moved by more than the tolerance or anything
discrete changed.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

UNSTABLE = ("sim_wall_s", "sim_events")


def relative(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude (0 when equal, inf across nan/inf mismatches)."""
    if a == b or (a != a and b != b):
        return 0.0
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale not in (0.0, float("inf")) else float("inf")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def walk(a, b, where: str, worst: list, discrete: list) -> None:
    """Record in ``worst`` ([relative change, where]) the largest float change of ``a`` against
    ``b``, and in ``discrete`` every change that is not a float's."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k in UNSTABLE and not where:
                continue
            if k not in a or k not in b:
                discrete.append(f"{where}/{k}: only in {'after' if k in b else 'before'}")
            else:
                walk(a[k], b[k], f"{where}/{k}", worst, discrete)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            discrete.append(f"{where}: {len(a)} items -> {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{where}[{i}]", worst, discrete)
    elif _number(a) and _number(b) and (isinstance(a, float) or isinstance(b, float)):
        r = relative(float(a), float(b))
        if r > worst[0]:
            worst[:] = [r, where]
    elif a != b or type(a) is not type(b):
        discrete.append(f"{where}: {a!r} -> {b!r}")


def spans_changes(a: dict, b: dict, worst: list, discrete: list) -> None:
    """:func:`walk` over two spans tables saved by bench/rows.py ``--dump`` (numeric columns as arrays,
    the others as hashes)."""
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            discrete.append(f"spans.{name}: only in {'after' if name in b else 'before'}")
            continue
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype.kind in "USO" or y.dtype.kind in "USO":
            if x.shape != y.shape or not np.array_equal(x, y):
                discrete.append(f"spans.{name}: differs ({x.shape} -> {y.shape})")
            continue
        if x.dtype.kind in "iub" and not np.array_equal(x, y):
            discrete.append(f"spans.{name}: {int((x != y).sum())} of {x.size} integers differ")
            continue
        x, y = x.astype(float), y.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.maximum(np.abs(x), np.abs(y))
            r = np.where(x == y, 0.0, np.abs(x - y) / scale)
        r = np.where(np.isnan(x) & np.isnan(y), 0.0, r)
        if r.size and np.nanmax(np.where(np.isnan(r), np.inf, r)) > worst[0]:
            i = int(np.argmax(np.where(np.isnan(r), np.inf, r)))
            worst[:] = [float(r[i]) if not np.isnan(r[i]) else float("inf"), f"spans.{name}[{i}]"]


def compare(before: Path, after: Path) -> tuple[list, list]:
    """([largest relative change, where], discrete changes) of one row's dumps (``X.json``, and
    ``X.npz`` beside it when both runs saved one)."""
    worst, discrete = [0.0, "-"], []
    walk(json.loads(before.read_text()), json.loads(after.read_text()), "", worst, discrete)
    a, b = before.with_suffix(".npz"), after.with_suffix(".npz")
    if a.exists() and b.exists():
        with np.load(a) as x, np.load(b) as y:
            spans_changes(dict(x), dict(y), worst, discrete)
    return worst, discrete


def pairs(before: Path, after: Path) -> list[tuple[str, Path, Path]]:
    if before.is_file():
        return [(before.stem, before, after)]
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    return [(Path(n).stem, before / n, after / n) for n in names]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tolerance", type=float, default=1e-12)
    args = parser.parse_args(argv)
    failed = False
    for name, a, b in pairs(args.before, args.after):
        if not (a.exists() and b.exists()):
            print(f"{name}: only in {'after' if b.exists() else 'before'}")
            failed = True
            continue
        (r, where), discrete = compare(a, b)
        failed |= r > args.tolerance or bool(discrete)
        print(f"{name}: largest relative change {r:.3g} ({where}); discrete changes: {len(discrete)}")
        for line in discrete[:20]:
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
