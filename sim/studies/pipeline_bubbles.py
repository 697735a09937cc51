"""Study: pipeline bubble fraction vs micro-batches per step, GPipe / 1F1B / interleaved,
against the closed forms.

Run ``clustersim study pipeline-bubbles [--quick]`` (scenario: sim/studies/scenarios/pipeline-bubbles.toml).

The seeds: at the start of a step the last stages wait, at the end the first ones do,
and the gap cannot be filled from the next step (the optimizer must run first). Closed
forms (Narayanan et al. 2021, section 2.2): bubble time / step time = (p-1)/(m+p-1) for
GPipe and 1F1B alike, (p-1)/(v m+p-1) for interleaved 1F1B with v chunks per GPU. The
simulator executes the real schedules op by op; its ``bubble_fraction`` is the time a
GPU's compute is idle with no communication in flight, averaged over GPUs.
"""

import numpy as np
import pandas as pd

from .base import text_table

TITLE = "Pipeline bubbles: simulated idle fraction vs the closed forms (GPT-3 175B, p = 8)"
STAGES = 8  # parallel.pp in the bundled scenario
CHUNKS = 2  # virtual_stages for interleaved 1F1B
SCHEDULES = ("gpipe", "1f1b", "interleaved")
HBM_GB = 80 * 2**30 / 1e9  # H100 SXM, GB


def micro_batches(quick: bool) -> list[int]:
    """Micro-batches per step (sequences: dp = 1, micro_batch = 1)."""
    return [1, 4, 8, 32] if quick else [1, 2, 4, 8, 16, 32, 64, 128]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """Every schedule at every m; interleaved with m not divisible by p is invalid (an
    error row: Megatron-LM's rule)."""
    return [({"schedule": s, "m": m}, {"parallel.schedule": s, "training.global_batch": m,
                                       "parallel.virtual_stages": CHUNKS if s == "interleaved" else 1})
            for s in SCHEDULES for m in micro_batches(quick)]


def closed_form(schedule: str, m, p: int = STAGES, v: int = CHUNKS):
    """(p-1)/(m+p-1), or (p-1)/(v m+p-1) for interleaved."""
    chunks = v if schedule == "interleaved" else 1
    return (p - 1) / (chunks * np.asarray(m, dtype=float) + p - 1)


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Per-point measured vs closed form; per-schedule worst and mean gap."""
    table = pd.DataFrame({"schedule": rows["schedule"], "micro_batches": rows["m"].astype(int),
                          "bubble_sim": rows["bubble_fraction"],
                          "bubble_closed_form": [closed_form(s, m) for s, m in zip(rows["schedule"], rows["m"])],
                          "step_s": rows["step_time_s"], "memory_gb": rows["memory_per_gpu_bytes"] / 1e9,
                          "fits_in_memory": rows["fits_in_memory"], "error": rows["error"]})
    table.insert(4, "difference", table["bubble_sim"] - table["bubble_closed_form"])
    ok = table[table["error"].isna()]
    summary = pd.DataFrame([{"schedule": s, "points": len(g), "max_abs_difference": g["difference"].abs().max(),
                             "mean_difference": g["difference"].mean(),
                             "bubble_at_m8_sim": g.loc[g["micro_batches"] == 8, "bubble_sim"].max(),
                             "max_m_that_fits": g.loc[g["fits_in_memory"].astype(bool), "micro_batches"].max(),
                             "invalid_points": int((table["schedule"] == s).sum() - len(g))}
                            for s, g in ok.groupby("schedule", sort=False)])
    return table, summary, notes(table, summary)


def notes(table: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """How close the simulator is, and why it departs."""
    out = [f"{s.schedule}: measured bubble within {s.max_abs_difference:.3f} of the closed form over {s.points} "
           f"points (mean difference {s.mean_difference:+.3f})" + (f"; {s.invalid_points} invalid points "
                                                                 f"(m not divisible by p) recorded as error rows"
                                                                 if s.invalid_points else "") + "."
           for s in summary.itertuples()]
    out.append("Below the closed form at small m: the optimizer step (no bubble) lengthens the step; above it "
               "at large m: the last stage also runs the output layer, so the other stages wait a little every "
               "micro-batch (the closed form assumes equal stages).")
    gpipe = table[(table["schedule"] == "gpipe") & table["error"].isna()]
    too_big = gpipe[~gpipe["fits_in_memory"].astype(bool)]
    if len(too_big):
        out.append(f"GPipe and 1F1B idle alike, but GPipe keeps all m micro-batches' activations: it stops fitting "
                   f"in 80 GB at m = {too_big['micro_batches'].min()}, 1F1B holds at most p in flight.")
    return out


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables (errors shortened)."""
    shown = table.assign(error=table["error"].map(lambda e: e.split(":")[0] + ": invalid" if isinstance(e, str) else None))
    fmt = {"bubble_sim": "{:.3f}", "bubble_closed_form": "{:.3f}", "difference": "{:+.3f}", "step_s": "{:.3f}",
           "memory_gb": "{:.1f}"}
    sfmt = {"max_abs_difference": "{:.3f}", "mean_difference": "{:+.3f}", "bubble_at_m8_sim": "{:.3f}"}
    return text_table(shown, fmt) + "\n\n" + text_table(summary, sfmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: bubble fraction vs m with the closed forms; right: memory per GPU vs m."""
    from . import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    ok = table[table["error"].isna()]
    m = np.geomspace(1, ok["micro_batches"].max(), 200)
    ax.plot(m, closed_form("1f1b", m), "-", color="0.35", lw=1.5, label="(p-1)/(m+p-1): GPipe, 1F1B")
    mi = m[m >= STAGES]
    ax.plot(mi, closed_form("interleaved", mi), "--", color="tab:red", lw=1.5,
            label=f"(p-1)/(v m+p-1): interleaved, v = {CHUNKS} (needs m divisible by p = {STAGES})")
    styles = {"gpipe": ("D", 10, "lightsteelblue", "tab:blue"), "1f1b": ("o", 5, None, "tab:green"),
              "interleaved": ("s", 7, None, "tab:red")}
    for schedule, (marker, size, face, color) in styles.items():
        g = ok[ok["schedule"] == schedule]
        ax.plot(g["micro_batches"], g["bubble_sim"], marker, ms=size, mfc=face or color, mec=color, mew=2,
                ls="none", label=f"simulated {schedule}")
        bx.plot(g["micro_batches"], g["memory_gb"], marker + "-", ms=size, mfc=face or color, color=color, mew=2,
                label=schedule)
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks([int(v) for v in sorted(ok["micro_batches"].unique())],
                        [str(int(v)) for v in sorted(ok["micro_batches"].unique())])
        axis.minorticks_off()
        axis.set_xlabel("micro-batches per step, m (log scale)")
        axis.grid(True, alpha=0.3)
    ax.set_ylim(0, 1)
    ax.set_ylabel("bubble fraction (idle time / step time)")
    ax.set_title(f"GPT-3 175B, p = {STAGES} stages x TP 8 on 64 H100s")
    ax.legend(loc="upper right", fontsize=9)
    bx.axhline(HBM_GB, color="black", ls="--", lw=1)
    bx.text(ok["micro_batches"].max(), HBM_GB, "HBM: 80 GiB = 85.9 GB ", va="bottom", ha="right", fontsize=9)
    bx.set_ylim(0, max(ok["memory_gb"].max(), HBM_GB) * 1.15)
    bx.set_ylabel("peak memory per GPU, GB")
    bx.set_title("Same idle time, different memory: GPipe stores every micro-batch")
    bx.legend(loc="lower right", fontsize=9)
    plotting.save(fig, path)
