"""Reduction numerics lab: gradients summed over ranks in a low-precision accumulator.

``clustersim numerics --ranks N --dtype fp16|bf16|fp32 --algo ring|tree [--seed S]
[--elements M] [--kahan | --accumulate fp32] [--json] [--plot out.png]``

Every rank holds a gradient array (seeded; per element a magnitude spread log-uniformly
over five decades, a consistent sign -- the true gradient -- plus per-rank noise of the
same size, and one element in a hundred a hundred times larger). The arrays are stored
in ``dtype`` and summed in the order the collective adds them, rounding the accumulator
to ``dtype`` after every addition:

- ``ring``: a ring reduce-scatter (the first half of a ring all-reduce): chunk c starts
  at rank c+1 and collects ranks c+2, c+3, ... in turn -- N-1 sequential additions.
- ``tree``: pairwise, as a binary reduction tree: log2(N) levels.

The result is compared with the exact (float64) sum of the same stored inputs, so only
the accumulation error is measured. The seeds: in fp16 between 1024 and 2048 the spacing
of representable numbers is 1, so 1024 + 0.5 == 1024; a running sum that has grown large
swallows every small contribution after it. Because the lost part always has the sign of
the true gradient's smaller terms, the error is a *bias* (it shrinks gradients toward a
truncated sum) that grows with N, not noise that averages out.

JSON keys (CONTRACT.md): ``ranks``, ``dtype``, ``algo``, ``relative_error`` (mean |error|
/ mean |exact|), ``bias`` (mean signed error / mean |exact|, the error signed along the
exact sum, so -0.01 means 1% of the gradient magnitude lost systematically),
``swamped_fraction`` (share of elements with at least one nonzero contribution lost
entirely: acc + x == acc); plus ``swamped_additions`` (share of additions lost).
"""

import json
import math

import numpy as np

from .. import bounds
from ..errors import InputError
from ..input.choices import Algorithm

DTYPES = ("fp16", "bf16", "fp32")
ALGOS = (Algorithm.RING, Algorithm.TREE)


# --- rounding ------------------------------------------------------------------------------

def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32: bf16 is
    the top 16 bits of an fp32 (8 exponent bits, 7 mantissa bits)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    out = u.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


def to_fp16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest IEEE half (ties to even); beyond 65504 it is inf, as on a GPU."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16)


def rounder(dtype: str):
    """x -> x rounded to ``dtype`` (as a float32/float16 array)."""
    if dtype == "fp16":
        return to_fp16
    if dtype == "bf16":
        return to_bf16
    if dtype == "fp32":
        return lambda x: np.asarray(x, dtype=np.float32)
    raise InputError("--dtype", f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")


def add(a, b, dtype: str):
    """``a + b`` in ``dtype``: exact sum, rounded once (what a fused adder returns)."""
    exact = np.asarray(a, dtype=np.float64) + np.asarray(b, dtype=np.float64)
    return rounder(dtype)(exact).astype(np.float64)


class Accumulator:
    """Running sums in one dtype, optionally Kahan-compensated (Kahan 1965), counting the
    nonzero additions that left the sum unchanged (swamped)."""

    def __init__(self, first: np.ndarray, dtype: str, kahan: bool = False):
        self.round, self.dtype, self.kahan = rounder(dtype), dtype, kahan
        self.sum = self.round(first).astype(np.float64)
        self.comp = np.zeros_like(self.sum)
        self.lost = np.zeros(len(self.sum), dtype=np.int64)

    def add(self, x: np.ndarray) -> None:
        """Add one rank's contribution to every element."""
        x = np.asarray(x, dtype=np.float64)
        if self.kahan:
            y = self.round(x - self.comp).astype(np.float64)
            t = self.round(self.sum + y).astype(np.float64)
            self.comp = self.round(self.round(t - self.sum).astype(np.float64) - y).astype(np.float64)
        else:
            y = x
            t = self.round(self.sum + x).astype(np.float64)
        self.lost += (t == self.sum) & (y != 0)
        self.sum = t


# --- gradients -------------------------------------------------------------------------------

def gradients(ranks: int, elements: int, seed: int, dtype: str) -> np.ndarray:
    """[ranks, elements] per-rank gradients stored in ``dtype`` (as float64 values).

    Per element a magnitude 10^U(-4, -1) (loss-scaled fp16 gradients live there) and a sign (the true gradient's direction); every
    rank contributes that magnitude x N(1, 0.5^2) along the sign -- many small values --
    and 0.5% of contributions are spikes 10^U(2, 4) times larger -- a few large (a rare
    token in one rank's batch, an outlier sample). A spike makes the running sum large;
    the small contributions added after it are what a short mantissa loses."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-4, -1, elements)
    sign = np.where(rng.random(elements) < 0.5, -1.0, 1.0)
    m = 1.0 + 0.5 * rng.standard_normal((ranks, elements))
    spikes = rng.random((ranks, elements)) < 0.005
    m[spikes] *= 10.0 ** rng.uniform(2, 4, int(spikes.sum()))
    return rounder(dtype)(sign * scale * m).astype(np.float64)


# --- reductions in collective order ------------------------------------------------------------

def ring_sum(g: np.ndarray, dtype: str, kahan: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Ring reduce-scatter order: element e in chunk c = e * N // M is summed starting at
    rank (c + 1) % N, then (c + 2) % N, ... ending at rank c. Returns (sums, swamped
    additions per element)."""
    n, m = g.shape
    chunk = np.arange(m) * n // m
    cols = np.arange(m)
    acc = Accumulator(g[(chunk + 1) % n, cols], dtype, kahan)
    for step in range(2, n + 1):
        acc.add(g[(chunk + step) % n, cols])
    return acc.sum, acc.lost


def tree_sum(g: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Binary tree: at each level rank i adds rank i + stride's partial sum. Returns
    (sums, swamped additions per element)."""
    n, m = g.shape
    rnd = rounder(dtype)
    level = g.copy()
    lost = np.zeros(m, dtype=np.int64)
    while len(level) > 1:
        odd = level[-1:] if len(level) % 2 else None
        a, b = level[0:len(level) - 1:2], level[1::2]
        s = rnd(a + b).astype(np.float64)
        lost += (((s == a) & (b != 0)) | ((s == b) & (a != 0))).sum(axis=0)
        level = s if odd is None else np.vstack([s, odd])
    return level[0], lost


def reduce(ranks: int, dtype: str, algo: str, seed: int = 0, elements: int = 16384,
           kahan: bool = False, accumulate: str | None = None) -> dict:
    """Sum ``ranks`` gradient arrays the way ``algo`` does, in ``dtype`` (or in
    ``accumulate`` and cast to ``dtype`` at the end), against the exact sum."""
    if algo not in ALGOS:
        raise InputError("--algo", f"unknown algorithm {algo!r}; known: {', '.join(ALGOS)}")
    rounder(dtype)  # validates
    if kahan and algo != Algorithm.RING:
        raise InputError("--kahan", "compensated summation applies to the ring's sequential sums")
    g = gradients(ranks, elements, seed, dtype)
    exact = g.sum(axis=0)  # float64 sum of the stored inputs: only accumulation error counts
    acc_dtype = accumulate or dtype
    if ranks == 1:
        got, lost = g[0], np.zeros(elements, dtype=np.int64)
    elif algo == Algorithm.RING:
        got, lost = ring_sum(g, acc_dtype, kahan)
    else:
        got, lost = tree_sum(g, acc_dtype)
    got = rounder(dtype)(got).astype(np.float64)  # the result is delivered in dtype
    finite = np.isfinite(got)  # fp16 saturates at 65504: a sum past it is inf
    err, exact = got[finite] - exact[finite], exact[finite]
    denom = np.abs(exact).mean() if finite.any() else 1.0
    if not finite.any():
        raise InputError("--ranks", f"every sum overflowed {dtype}; use fewer ranks or a wider dtype")
    additions = max(1, elements * (ranks - 1))
    return {"ranks": ranks, "dtype": dtype, "algo": algo, "seed": seed, "elements": elements,
            "accumulate": acc_dtype, "kahan": kahan,
            "relative_error": float(np.abs(err).mean() / denom),
            "bias": float((err * np.sign(exact)).mean() / denom),
            "swamped_fraction": float((lost > 0).mean()),
            "swamped_additions": float(lost.sum() / additions),
            "overflowed_fraction": float(1 - finite.mean())}


# --- the plot ----------------------------------------------------------------------------------

def sweep(ranks=(2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), dtypes=DTYPES, algos=ALGOS,
          seed: int = 0, elements: int = 8192) -> list[dict]:
    """reduce() for every rank count, dtype and algorithm."""
    return [reduce(n, d, a, seed, elements) for d in dtypes for a in algos for n in ranks]


def plot(rows: list[dict], path: str) -> None:
    """Relative error and |bias| vs rank count per dtype and algorithm (log-log), and the
    share of the error that is bias: near 1 means systematic, not noise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fp16": "tab:red", "bf16": "tab:orange", "fp32": "tab:blue"}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for d in DTYPES:
        for a, style in (("ring", "-"), ("tree", "--")):
            sel = [r for r in rows if r["dtype"] == d and r["algo"] == a]
            if not sel:
                continue
            n = [r["ranks"] for r in sel]
            rel = np.array([r["relative_error"] for r in sel])
            bias = np.array([-r["bias"] for r in sel])
            ax.plot(n, np.maximum(rel, 1e-12), style, color=colors[d], marker="o", ms=3, label=f"{d} {a}")
            ax2.plot(n, bias / np.where(rel > 0, rel, np.nan), style, color=colors[d], marker="o", ms=3,
                     label=f"{d} {a}")
    ax.set(xscale="log", yscale="log", xlabel="ranks summed", ylabel="relative error (mean |err| / mean |exact|)",
           title="Accumulation error grows with the rank count")
    ax.set_xscale("log", base=2)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.axhline(0.0, color="grey", lw=0.8)
    ax2.set(ylim=(-0.2, 1.1), xlabel="ranks summed", ylabel="-bias / relative error",
            title="Share of the error that is bias (1 = all of it loses magnitude)")
    ax2.set_xscale("log", base=2)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8, ncol=3, loc="lower right")
    ticks = sorted({r["ranks"] for r in rows})[::2]
    for a in (ax, ax2):
        a.set_xticks(ticks, [str(t) for t in ticks])
    fig.suptitle("Gradient all-reduce in a low-precision accumulator vs the exact sum "
                 "(clustersim numerics --plot)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- command line --------------------------------------------------------------------------

# Measured (16,384 ranks x 4,096 elements, tree in bf16): 3.0 GB peak RSS, ~45 bytes per value,
# and ~0.5 us of CPU per value. 2^24 values stay under ~0.8 GB and ~10 s of CPU.
MAX_VALUES = 1 << 24
BYTES_PER_VALUE = 45


def add_parser(sub) -> None:
    """Register ``clustersim numerics``."""
    p = sub.add_parser("numerics", help="reduction numerics lab: fp16/bf16/fp32 gradient sums vs exact")
    p.add_argument("--ranks", type=int, default=1024, help="ranks whose gradients are summed (default 1024)")
    p.add_argument("--dtype", default="fp16", help="|".join(DTYPES) + " (default fp16)")
    p.add_argument("--algo", default="ring", help="|".join(ALGOS) + " (default ring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--elements", type=int, default=16384, help="gradient elements per rank (default 16384)")
    p.add_argument("--kahan", action="store_true", help="Kahan-compensated accumulation (ring)")
    p.add_argument("--accumulate", default=None, help="accumulate in this dtype, cast to --dtype at the end "
                                                      "(e.g. fp32)")
    p.add_argument("--plot", help="also sweep 2..--ranks ranks for every dtype and algorithm; write a PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def validate(args) -> None:
    """One clear error per bad flag."""
    if args.dtype not in DTYPES:
        raise InputError("--dtype", f"unknown dtype {args.dtype!r}; known: {', '.join(DTYPES)}")
    if args.algo not in ALGOS:
        raise InputError("--algo", f"unknown algorithm {args.algo!r}; known: {', '.join(ALGOS)}")
    bounds.SEED.check("--seed", args.seed, whole=True)
    if not 1 <= args.ranks <= 65536:
        raise InputError("--ranks", f"expected 1..65536, got {args.ranks}")
    if not 1 <= args.elements <= 1 << 22:
        raise InputError("--elements", f"expected 1..{1 << 22}, got {args.elements}")
    if args.ranks * args.elements > MAX_VALUES:
        raise InputError("--elements", f"ranks x elements = {args.ranks * args.elements:,} values is past "
                                       f"{MAX_VALUES:,} (~{BYTES_PER_VALUE} bytes of memory each, measured: the "
                                       "gradients, their rounded copies and the sums)")
    if args.accumulate is not None and args.accumulate not in DTYPES:
        raise InputError("--accumulate", f"unknown dtype {args.accumulate!r}; known: {', '.join(DTYPES)}")
    if args.kahan and args.accumulate:
        raise InputError("--kahan", "choose --kahan or --accumulate, not both")
    if args.kahan and args.algo != Algorithm.RING:
        raise InputError("--kahan", "compensated summation applies to the ring's sequential sums")
    if args.plot is not None:
        from ..outputs.paths import output_file

        output_file(args.plot, "--plot", (".png",))


def run(args) -> int:
    """Reduce, compare, print (and plot)."""
    validate(args)
    out = reduce(args.ranks, args.dtype, args.algo, args.seed, args.elements, args.kahan, args.accumulate)
    if args.json:
        print(json.dumps(out))
    else:
        _print(out)
    if args.plot:
        top = int(math.log2(max(args.ranks, 2)))
        from ..outputs.paths import written

        rows = sweep(tuple(2 ** i for i in range(1, top + 1)), seed=args.seed)
        with written(args.plot, "--plot") as tmp:
            plot(rows, tmp)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def _print(out: dict) -> None:
    how = out["dtype"] + (f" (accumulated in {out['accumulate']})" if out["accumulate"] != out["dtype"] else "") \
        + (" + Kahan" if out["kahan"] else "")
    rows = [("ranks", out["ranks"]), ("dtype", how), ("algorithm", out["algo"]),
            ("relative error", f"{out['relative_error']:.3e}"),
            ("bias (signed along exact)", f"{out['bias']:+.3e}"),
            ("elements with a swamped term", f"{out['swamped_fraction']:.1%}"),
            ("additions swamped", f"{out['swamped_additions']:.2%}")]
    if out["overflowed_fraction"]:
        rows.append(("sums overflowed to inf", f"{out['overflowed_fraction']:.2%} (excluded from the errors)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
