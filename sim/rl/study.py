"""Study ``rl-stragglers``: generator utilization and staleness vs response-length spread, per mode.

Run ``clustersim study rl-stragglers [--quick]`` (scenario: sim/studies/scenarios/rl-stragglers.toml);
it writes ``out/study-rl-stragglers.png``, ``.csv`` and ``-summary.csv``.

The seeds: "RL responses grow in mean and variance of length, straggling GPU utilization.
Pipeline RL does in-flight weight updates ... so rollouts come from a recent model without
going fully off-policy." The study holds the mean response length and sweeps its
coefficient of variation (sigma / mean) for the three modes: synchronous, asynchronous
1-step off-policy and pipeline RL (staleness gate k = 1). Beside the simulated
synchronous batches it prints the closed form E[sum L] / (n E[max L]) for the run's
length distributions (exact in the decode-bound limit; a real decode step also gets
cheaper as the batch empties, so the simulated batches run a little fuller).

Each point is a whole RL run, not one training step, so this study runs its points
itself (:func:`run_points`, a process pool) instead of the scenario sweep.
"""

from concurrent.futures import ProcessPoolExecutor
import tomllib

import pandas as pd

from ..errors import InputError
from ..input.choices import RLMode
from ..input.load import scenario_from_dict
from ..studies.base import scenario_path, text_table
from . import lengths as length_model

TITLE = "RL stragglers: generator utilization and staleness vs response-length spread (Llama 3 8B, 32 H100s)"
MODES = tuple(RLMode)  # sync, async, pipeline
COLUMNS = ("mode", "cv", "generator_utilization", "generating_utilization", "sync_closed_form",
           "trainer_utilization", "tokens_per_s", "long_tail_fraction", "mean_staleness_steps",
           "max_staleness_steps", "response_length_mean", "step_time_s")


def cvs(quick: bool) -> list[float]:
    """Coefficients of variation of the response length."""
    return [0.0, 1.0, 2.0] if quick else [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]


def point_scenario(mode: RLMode, cv: float, quick: bool):
    """The study's scenario at one point (sync has no staleness key)."""
    path = scenario_path("rl-stragglers")
    data = tomllib.loads(path.read_text())
    rl = data["rl"]
    rl["mode"] = mode
    rl["lengths"]["sigma"] = cv * rl["lengths"]["mean"]
    if mode is RLMode.SYNC:
        rl.pop("max_staleness", None)
    if quick:
        rl["steps"] = 6
    return scenario_from_dict(data, base=path.parent)


def closed_form(s) -> float:
    """sum over steps of E[L] / sum over steps of E[max of n L], n sequences per engine."""
    rl = s.rl
    n = s.training.global_batch // (rl.generator_gpus // rl.generator_tp)
    steps = range(rl.steps)
    return (sum(length_model.expected(rl.lengths, i) for i in steps)
            / sum(length_model.expected_max(rl.lengths, i, n) for i in steps))


def run_point(args: tuple) -> dict:
    """One RL run (in a worker process)."""
    from .run import simulate_rl

    mode, cv, quick = args
    s = point_scenario(mode, cv, quick)
    summary = simulate_rl(s).summary
    return {"mode": mode, "cv": cv, **{k: summary[k] for k in COLUMNS if k in summary},
            "sync_closed_form": closed_form(s)}


def run_points(quick: bool = False, workers=None, dask=None, quiet: bool = False) -> pd.DataFrame:
    """Every (mode, cv) point, a whole RL run each, in a process pool (``workers``)."""
    if dask:
        raise InputError("--dask", "rl-stragglers runs its points in local processes (use --workers)")
    points = [(m, cv, quick) for cv in cvs(quick) for m in MODES]
    if workers == 1:
        rows = [run_point(p) for p in points]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(run_point, points))
    return pd.DataFrame(rows)


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The table, the per-mode summary and the findings."""
    table = rows[list(COLUMNS)]
    summary = summarize(table)
    return table, summary, notes(table, summary)


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per mode: utilization without spread and at the widest, the drop, staleness at the widest."""
    out = []
    for mode in MODES:
        g = table[table["mode"] == mode].sort_values("cv")
        lo, hi = g.iloc[0], g.iloc[-1]
        out.append({"mode": mode, "utilization_cv0": lo.generator_utilization,
                    f"utilization_cv{hi.cv:g}": hi.generator_utilization,
                    "utilization_drop": lo.generator_utilization - hi.generator_utilization,
                    "tokens_per_s_widest": hi.tokens_per_s, "mean_staleness_widest": hi.mean_staleness_steps,
                    "max_staleness_any": int(g.max_staleness_steps.max())})
    return pd.DataFrame(out)


def notes(table: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """The seeds' claim as numbers."""
    s = summary.set_index("mode")
    widest = table["cv"].max()
    col = f"utilization_cv{widest:g}"
    sync, pipe, asyn = s.loc["sync"], s.loc["pipeline"], s.loc["async"]
    return [f"sync: generator utilization falls from {sync.utilization_cv0:.1%} (every response alike) to "
            f"{sync[col]:.1%} at sigma = {widest:g} x mean: the engines wait for each batch's longest responses.",
            f"pipeline RL keeps {pipe[col]:.1%} at sigma = {widest:g} x mean ({pipe[col] / sync[col]:.1f}x sync, "
            f"{pipe.tokens_per_s_widest / sync.tokens_per_s_widest:.1f}x its trained tokens/s) with tokens "
            f"{pipe.mean_staleness_widest:.2f} steps stale on average, {int(pipe.max_staleness_any)} at most "
            "(k = 1 plus the weight updates a long response lives through).",
            f"async 1-step off-policy: {asyn[col]:.1%} at the widest spread, lag at most {int(asyn.max_staleness_any)}: "
            "it overlaps training with generation but still drains every engine before each weight swap."]


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables."""
    pct = "{:.1%}"
    fmt = {"generator_utilization": pct, "generating_utilization": pct, "sync_closed_form": pct,
           "trainer_utilization": pct, "long_tail_fraction": pct, "tokens_per_s": "{:,.0f}",
           "mean_staleness_steps": "{:.2f}", "response_length_mean": "{:,.0f}", "step_time_s": "{:.1f}", "cv": "{:g}"}
    sfmt = {c: pct for c in summary.columns if c.startswith("utilization")}
    sfmt.update({"tokens_per_s_widest": "{:,.0f}", "mean_staleness_widest": "{:.2f}"})
    return text_table(table, fmt) + "\n\n" + text_table(summary, sfmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: generator utilization vs spread per mode (and sync's closed form); right: staleness."""
    from matplotlib.ticker import MaxNLocator

    from ..studies import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    colors = dict(zip(MODES, plotting.COLORS))
    for mode in MODES:
        g = table[table["mode"] == mode].sort_values("cv")
        ax.plot(g["cv"], g["generator_utilization"], "o-", color=colors[mode], lw=2, label=f"{mode}: generator pool")
        if mode is RLMode.SYNC:
            ax.plot(g["cv"], g["generating_utilization"], "o:", color=colors[mode], lw=1.5,
                    label="sync: batch fullness while generating")
            ax.plot(g["cv"], g["sync_closed_form"], "--", color="black", lw=1.2,
                    label="closed form E[sum L] / (n E[max L])")
        if mode is not RLMode.SYNC:
            bx.plot(g["cv"], g["mean_staleness_steps"], "o-", color=colors[mode], lw=2, label=f"{mode}: mean per token")
            bx.plot(g["cv"], g["max_staleness_steps"], "s--", color=colors[mode], lw=1.2, label=f"{mode}: max")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("response-length spread sigma / mean")
    ax.set_ylabel("generator utilization (useful share of the engines' batch slots)")
    ax.set_title("Stragglers empty synchronous batches; pipeline RL keeps them full")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=8.5)
    bx.set_xlabel("response-length spread sigma / mean")
    bx.set_ylabel("policy lag of trained tokens (optimizer steps)")
    bx.set_title("The price: staleness (sync is 0 by construction)")
    bx.set_ylim(0, max(1.0, table["max_staleness_steps"].max()) + 0.5)
    bx.yaxis.set_major_locator(MaxNLocator(integer=True))
    bx.grid(True, alpha=0.3)
    bx.legend(loc="upper left", fontsize=8.5)
    plotting.save(fig, path)
