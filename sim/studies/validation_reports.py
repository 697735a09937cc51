"""Two reports over the compared validation rows (``clustersim validate`` prints them after
the table; ``--report-json FILE`` writes them as data, ``--plot PATH`` draws the first):

- **Scale trend.** The signed step-time error of each row, e = predicted / published - 1
  (negative: the simulator predicts a faster step than was measured, i.e. it is optimistic;
  rows published as tokens/s per GPU enter with their step time at the assumed batch, so
  the sign means the same on every row), against log2 of its GPU count. Its least-squares
  slope, in points (of percent) per doubling of the GPUs, with its standard error and n,
  over all rows and per *series*: rows whose scenarios differ only in the GPU count, the
  data-parallel degree and the global batch (the same model and layout scaled out); and one
  slope pooled within the series (each with its own intercept), free of the different
  models that sit at different GPU counts in the overall fit.
- **Layout ranking.** Every *group* of rows with the same model (architecture), GPU type,
  sequence length and sequences per GPU per step -- so the same work per GPU, and a step time
  that only layouts and knobs can change: AsyncTP on/off, 1F1B vs interleaved, FP8 vs BF16, 8
  vs 128 GPUs at the same per-GPU batch. Against the group's reference (its first row in the
  shipped order), each member's step-time ratio as published and as predicted, the miss
  predicted / published - 1 (= (1 + e_row) / (1 + e_reference) - 1), and Spearman's rank
  correlation of predicted with published step times within the group.

Both read only the rows' columns (their scenarios) and the predictions: no simulation here.
Targets (issue 27): every row within 15%, MAPE <= 5%, slope within +-1 point per doubling,
each ranking ratio within 5%.
"""

import json
import math
from dataclasses import dataclass
from fractions import Fraction

from .rows import Row

ROW_TARGET = 0.15  # |error| of every row
MAPE_TARGET = 0.05
SLOPE_TARGET = 1.0  # points per doubling, either sign
RATIO_TARGET = 0.05  # |predicted / published ratio - 1| of every ranking pair
SCALE_KEYS = ("cluster.gpus", "parallel.dp", "training.global_batch")  # what a series may vary


@dataclass(frozen=True)
class Fit:
    """Ordinary least squares y = intercept + slope * x, with the slope's standard error
    (None when n = 2: no residual degree of freedom)."""

    slope: float
    intercept: float
    stderr: float | None
    n: int


def least_squares(x: list[float], y: list[float]) -> Fit | None:
    """The closed-form OLS fit; None with fewer than two distinct x."""
    n = len(x)
    if n < 2 or len(set(x)) < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    intercept = my - slope * mx
    ssr = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y))
    return Fit(slope, intercept, math.sqrt(ssr / (n - 2) / sxx) if n > 2 else None, n)


def step_error(row: Row, predicted_step_s: float) -> float:
    """Signed relative error of the predicted step time (negative: optimistic)."""
    return predicted_step_s / row.published_step_s - 1


def flat(scenario: dict, prefix: str = "") -> dict:
    """A scenario's leaves as ``section.key`` -> value (``name`` left out)."""
    out = {}
    for key, value in scenario.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        elif f"{prefix}{key}" != "name":
            out[f"{prefix}{key}"] = value
    return out


def _canonical(items: dict) -> str:
    return json.dumps(items, sort_keys=True, default=str)


# --- scale trend ---------------------------------------------------------------------------------

def series_key(row: Row) -> str:
    """Rows share a series when their scenarios differ only in :data:`SCALE_KEYS`."""
    return _canonical({k: v for k, v in flat(row.scenario).items() if k not in SCALE_KEYS})


@dataclass(frozen=True)
class Point:
    """One row in the trend: its GPU count and signed step-time error (fraction)."""

    id: str
    gpus: int
    error: float


@dataclass(frozen=True)
class Series:
    """One model and layout scaled out: its points and their fit (None: one GPU count)."""

    label: str
    points: tuple[Point, ...]
    fit: Fit | None


@dataclass(frozen=True)
class ScaleTrend:
    points: tuple[Point, ...]
    fit: Fit | None
    series: tuple[Series, ...]  # only those with at least two GPU counts
    within: Fit | None  # one slope shared by every series, each with its own intercept


def within_series(series) -> Fit | None:
    """The pooled within-series slope (fixed effects: each series' points less its means), so
    that models of different sizes at different GPU counts do not make a slope of their own.
    Its standard error has n - k - 1 degrees of freedom (k series intercepts and the slope);
    ``intercept`` is 0 (the series' own intercepts are not reported)."""
    x, y = [], []
    for s in series:
        lx, ly = [math.log2(p.gpus) for p in s.points], [100 * p.error for p in s.points]
        x += [a - sum(lx) / len(lx) for a in lx]
        y += [b - sum(ly) / len(ly) for b in ly]
    sxx = sum(a * a for a in x)
    if sxx == 0:
        return None
    slope = sum(a * b for a, b in zip(x, y)) / sxx
    dof = len(x) - len(series) - 1
    ssr = sum((b - slope * a) ** 2 for a, b in zip(x, y))
    return Fit(slope, 0.0, math.sqrt(ssr / dof / sxx) if dof > 0 else None, len(x))


def fit_points(points) -> Fit | None:
    """Slope of the error in points (percent) against log2(GPUs): points per doubling."""
    return least_squares([math.log2(p.gpus) for p in points], [100 * p.error for p in points])


def scale_trend(results: list[tuple[Row, float]]) -> ScaleTrend:
    """The trend over ``(row, predicted_step_s)`` pairs (rows that ran)."""
    points = tuple(Point(r.id, r.num_gpus, step_error(r, pred)) for r, pred in results)
    by_key: dict[str, list] = {}
    for (row, _), point in zip(results, points):
        by_key.setdefault(series_key(row), []).append((row, point))
    series = []
    for members in by_key.values():
        mine = tuple(p for _, p in members)
        if len({p.gpus for p in mine}) > 1:
            first = members[0][0]
            series.append(Series(f"{first.model} on {first.gpu} {first.layout} {first.precision}", mine,
                                 fit_points(mine)))
    return ScaleTrend(points, fit_points(points), tuple(series), within_series(series))


# --- layout ranking ------------------------------------------------------------------------------

def group_key(row: Row) -> str:
    """Same model, GPU type, sequence length and sequences per GPU per step."""
    t = row.scenario["training"]
    per_gpu = Fraction(int(t["global_batch"]), row.num_gpus)
    return _canonical({"model": row.scenario["model"], "gpu": row.gpu, "seq_len": t["seq_len"],
                       "per_gpu": str(per_gpu)})


@dataclass(frozen=True)
class Pair:
    """A group member against the group's reference row."""

    id: str
    differs: str  # the scenario keys that differ from the reference, "key a->b, ..."
    published_ratio: float  # published step / reference's published step
    predicted_ratio: float

    @property
    def miss(self) -> float:
        return self.predicted_ratio / self.published_ratio - 1


@dataclass(frozen=True)
class Group:
    label: str
    reference: str
    pairs: tuple[Pair, ...]
    spearman: float | None  # None when either side's ranks are all tied


def differences(row: Row, reference: Row) -> str:
    """``key a->b`` for every scenario leaf that differs (short key names; ``default``: the
    row leaves the key out)."""
    a, b = flat(reference.scenario), flat(row.scenario)
    keys = sorted(set(a) | set(b), key=lambda k: (k not in SCALE_KEYS, k))
    return ", ".join(f"{k.rpartition('.')[2]} {_short(a.get(k, 'default'))}->{_short(b.get(k, 'default'))}"
                     for k in keys if a.get(k) != b.get(k))


def _short(value) -> str:
    """A value as ``differences`` prints it: a list as runs, ``[0, 1 x 126, 0]`` (a 128-chunk
    ``stage_layers``), anything else as itself."""
    if not isinstance(value, list):
        return str(value)
    runs: list[list] = []
    for v in value:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "[" + ", ".join(f"{v} x {n}" if n > 1 else str(v) for v, n in runs) + "]"


def layout_ranking(results: list[tuple[Row, float]]) -> tuple[Group, ...]:
    """Every group of two or more rows (shipped order kept: the first row is the reference)."""
    by_key: dict[str, list] = {}
    for row, pred in results:
        by_key.setdefault(group_key(row), []).append((row, pred))
    groups = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        ref, ref_pred = members[0]
        pairs = tuple(Pair(r.id, differences(r, ref), r.published_step_s / ref.published_step_s, p / ref_pred)
                      for r, p in members[1:])
        t = ref.scenario["training"]
        label = (f"{ref.model} on {ref.gpu}, seq {t['seq_len']}, "
                 f"{Fraction(int(t['global_batch']), ref.num_gpus)} seq/GPU")
        groups.append(Group(label, ref.id, pairs, spearman([r.published_step_s for r, _ in members],
                                                           [p for _, p in members])))
    return tuple(groups)


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the ranks (None when one side is constant)."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    saa = sum((x - ma) ** 2 for x in ra)
    sbb = sum((y - mb) ** 2 for y in rb)
    if saa == 0 or sbb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(ra, rb)) / math.sqrt(saa * sbb)


# --- as data -------------------------------------------------------------------------------------

def _fit_json(fit: Fit | None) -> dict | None:
    return None if fit is None else {"slope_points_per_doubling": fit.slope, "stderr": fit.stderr,
                                     "intercept_points": fit.intercept, "n": fit.n}


def trend_json(trend: ScaleTrend) -> dict:
    return {"points": [{"id": p.id, "num_gpus": p.gpus, "step_error": p.error} for p in trend.points],
            "overall": _fit_json(trend.fit), "within_series": _fit_json(trend.within),
            "series": [{"label": s.label, "ids": [p.id for p in s.points], "fit": _fit_json(s.fit)}
                       for s in trend.series]}


def ranking_json(groups: tuple[Group, ...]) -> list[dict]:
    return [{"label": g.label, "reference": g.reference, "spearman": g.spearman,
             "pairs": [{"id": p.id, "differs": p.differs, "published_ratio": p.published_ratio,
                        "predicted_ratio": p.predicted_ratio, "miss": p.miss} for p in g.pairs]}
            for g in groups]


# --- the issue-27 targets ------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One target of issue 27: what it asks, where the rows stand, and whether that meets it."""

    name: str
    value: str
    met: bool


def targets(errors: list[float], trend: ScaleTrend, groups: tuple[Group, ...]) -> tuple[Target, ...]:
    """The four targets over the rows' errors (each in its published metric, as the table's),
    the trend and the ranking groups."""
    worst = max(errors, key=abs) if errors else float("nan")
    mape = sum(abs(e) for e in errors) / len(errors) if errors else float("nan")
    out = [Target(f"every row within {ROW_TARGET:.0%}",
                  f"{sum(abs(e) <= ROW_TARGET for e in errors)} of {len(errors)} rows, worst {worst:+.1%}",
                  all(abs(e) <= ROW_TARGET for e in errors)),
           Target(f"MAPE <= {MAPE_TARGET:.0%}", f"{mape:.1%}", mape <= MAPE_TARGET)]
    if trend.fit is not None:
        out.append(Target(f"scale-trend slope within +-{SLOPE_TARGET:g} point per doubling",
                          f"{trend.fit.slope:+.2f} points per doubling", abs(trend.fit.slope) <= SLOPE_TARGET))
    misses = [p.miss for g in groups for p in g.pairs]
    if misses:
        inside = sum(abs(m) <= RATIO_TARGET for m in misses)
        out.append(Target(f"every ranking ratio within {RATIO_TARGET:.0%}",
                          f"{inside} of {len(misses)} pairs, worst {max(misses, key=abs):+.1%}",
                          inside == len(misses)))
    return tuple(out)


def targets_json(items: tuple[Target, ...]) -> list[dict]:
    return [{"target": t.name, "value": t.value, "met": t.met} for t in items]
