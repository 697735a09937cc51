"""The ranked table: simulated layouts first, by simulated step time, then the others by
estimate; and how well the estimate ranked what was simulated (Spearman's rho).

A layout limited by its recomputation says so when the same layout without recompute
does not fit ("memory-bound recompute"). Estimated rows report ``step_time_s`` as the estimate scaled by the median simulated /
estimated ratio of the simulated rows (``estimate_s`` keeps the raw estimate), so their
MFU is comparable with the simulated rows'. Ties break on the estimate, then on the
estimate order (itself tie-broken on the layout's columns): the same search always gives
the same table.
"""

import numpy as np
import pandas as pd

from ..engine.kinds import Category
from ..input.choices import Recompute
from ..model.transformer import dims, model_flops_per_token
from .explain import CPU, estimated_limits, limit, simulated_losses
from .space import COLUMNS

AXES = (Category.TP, Category.CP, Category.EP, Category.PP, Category.DP)  # the exposed_<axis>_s columns, in order
TABLE = (("rank",) + COLUMNS + ("step_time_s", "mfu", "memory_per_gpu_bytes", "fits_in_memory", "simulated",
                                "extrapolated", "estimate_s", "bubble_fraction") + tuple(f"exposed_{a}_s" for a in AXES)
         + ("limit", "sim_wall_s", "sim_cost_s", "sim_cpu_s", "picked", "position"))


def spearman(a, b) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None below 3 pairs.

    >>> spearman([1, 2, 3, 4], [10, 30, 20, 40])
    0.8
    """
    if len(a) < 3:
        return None
    ra, rb = pd.Series(list(a)).rank().to_numpy(), pd.Series(list(b)).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return None
    return round(float(np.corrcoef(ra, rb)[0, 1]), 12)


def scale(ranked: pd.DataFrame, sims: dict[int, dict]) -> float:
    """Median simulated / estimated step time over the simulated positions (1 without)."""
    est = ranked["estimate_s"].to_numpy()
    return float(np.median([sims[p]["step_time_s"] / est[p] for p in sorted(sims)])) if sims else 1.0


def table(ranked: pd.DataFrame, sims: dict[int, dict], scenario, peak_flops: float,
          picked: dict | None = None) -> pd.DataFrame:
    """The final table from ``ranked`` (estimate order, with ``memory_bytes`` and the
    estimate's columns), ``sims`` (position -> simulated row) and ``picked`` (position -> why
    it was picked for simulation, sim/plan/select.py ``WHY``; empty where it was not: a pick
    that failed or was stopped keeps its estimate and its reason)."""
    ratio = scale(ranked, sims)
    t = scenario.training
    work = model_flops_per_token(dims(scenario.model), t.seq_len) * t.global_batch * t.seq_len \
        / scenario.cluster.gpus / peak_flops  # seconds of the step at 100% MFU
    out = ranked[list(COLUMNS)].reset_index(drop=True).copy()
    est = ranked["estimate_s"].to_numpy()
    out["position"] = np.arange(len(out))
    out["estimate_s"] = est
    out["simulated"] = False
    out["extrapolated"] = False  # a simulated step extrapolated from a steady-state run's few micro-batch counts
    out["step_time_s"] = est * ratio
    out["mfu"] = work / out["step_time_s"]
    out["memory_per_gpu_bytes"] = ranked["memory_bytes"].to_numpy()
    out["fits_in_memory"] = True
    out["bubble_fraction"] = ranked["est_bubble_s"].to_numpy() / est
    for a in AXES:
        out[f"exposed_{a}_s"] = ranked[f"est_{a}_s"].to_numpy() * ratio
    out["limit"] = estimated_limits(ranked)
    out["sim_wall_s"] = np.nan
    out["sim_cost_s"] = ranked["sim_cost_s"].to_numpy()  # predicted CPU of its simulation (cost.py)
    out["sim_cpu_s"] = np.nan  # measured, where simulated
    out["picked"] = ""
    for p, why in (picked or {}).items():
        out.loc[p, "picked"] = why
    for p, sim in sorted(sims.items()):
        cols = _simulated(sim)
        out.loc[p, list(cols)] = list(cols.values())
    forced = _memory_bound(out) & out["limit"].str.startswith("recompute").to_numpy()
    out.loc[forced, "limit"] = out.loc[forced, "limit"] + " (memory: without it the layout does not fit)"
    out = out.sort_values(["simulated", "step_time_s", "estimate_s", "position"], ascending=[False, True, True, True],
                          kind="stable", ignore_index=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out[list(TABLE)]


def without(table: pd.DataFrame, positions) -> pd.DataFrame:
    """``table`` less the rows of the given estimate positions, ranks renumbered."""
    if not positions:
        return table
    out = table[~table["position"].isin(set(positions))].reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out


def _simulated(sim: dict) -> dict:
    """The columns a simulation sets."""
    step = float(sim["step_time_s"])
    return {"simulated": True, "extrapolated": str(sim.get("extrapolated", False)) == "True",  # (a bool, numpy's or read back from OUT.sims.csv)
            "step_time_s": step, "mfu": float(sim["mfu"]),
            "memory_per_gpu_bytes": float(sim["memory_per_gpu_bytes"]), "fits_in_memory": bool(sim["fits_in_memory"]),
            "bubble_fraction": float(sim["bubble_fraction"]), "sim_wall_s": float(sim["sim_wall_s"]),
            "sim_cpu_s": float(sim.get(CPU, np.nan)),
            "limit": limit(simulated_losses(sim), step),
            **{f"exposed_{a}_s": float(sim[f"crit.exposed_{a}"]) for a in AXES}}


def _memory_bound(out: pd.DataFrame) -> np.ndarray:
    """Rows that recompute because they must: the same layout without recompute was
    rejected for memory (it is not among the evaluated ones)."""
    keys = [k for k in COLUMNS if k != "recompute"]
    plain = out.loc[out["recompute"] == Recompute.NONE, keys].drop_duplicates().assign(_fits=True)
    found = out[keys].merge(plain, on=keys, how="left")["_fits"].notna().to_numpy()
    return (out["recompute"] != Recompute.NONE).to_numpy() & ~found
