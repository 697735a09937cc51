"""Study: pipeline bubble fraction vs micro-batches per step, GPipe / 1F1B / interleaved and
the zero-bubble schedules (ZB-H1, ZB-H2, ZB-V) and DualPipe(V), against the closed forms.

Run ``clustersim study pipeline-bubbles [--quick]`` (scenario: sim/studies/scenarios/pipeline-bubbles.toml).

The seeds: at the start of a step the last stages wait, at the end the first ones do,
and the gap cannot be filled from the next step (the optimizer must run first). Closed
forms (Narayanan et al. 2021, section 2.2): bubble time / step time = (p-1)/(m+p-1) for
GPipe and 1F1B alike, (p-1)/(v m+p-1) for interleaved 1F1B with v chunks per GPU. The
simulator executes the real schedules op by op; its ``bubble_fraction`` is the time a
GPU's compute is idle with no communication in flight, averaged over GPUs.

The newer schedules split the backward into B (input gradients) and W (weight gradients)
and run W in the bubbles. With equal F, B, W times (the papers' premise) one step's idle
fraction is (p-1)/(3m+p-1) for ZB-H1 (Qi et al. 2024: bubble (p-1)(F+B-W), a third of
1F1B's) and for DualPipeV (DeepSeek-V3 report Table 2: (PP/2-1)(F&B+B-3W) with PP = 2p
stages of half the size); (p-2)/(3m+p-2) for DualPipe (PP = p); ZB-H2 and ZB-V reach the
papers' zero bubble only across steps (their post-validated optimizer lets the next step
start early), so within one step their floor is the warm-up ramp: (p-1)/(3m+p-1) and
(p-1)/(6m+p-1) (ZB-V's chunks are half a stage). Real layers have B > W (the attention
core's backward has no weights), which the simulated points show.
"""

import numpy as np
import pandas as pd

from ..input.choices import ZERO_BUBBLE_SCHEDULES, Schedule
from .base import text_table

TITLE = "Pipeline bubbles: simulated idle fraction vs the closed forms (GPT-3 175B, p = 8)"
STAGES = 8  # parallel.pp in the bundled scenario
CHUNKS = 2  # virtual_stages for interleaved 1F1B
SCHEDULES = tuple(Schedule)  # gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, dualpipe, dualpipev
QUICK_NEW = ("zb-h1", "zb-v", "dualpipe")  # quick mode: these at m = 32 only (DualPipe needs m >= 2p)
HBM_GB = 80 * 2**30 / 1e9  # H100 SXM, GB


def micro_batches(quick: bool) -> list[int]:
    """Micro-batches per step (sequences: dp = 1, micro_batch = 1)."""
    return [1, 4, 8, 32] if quick else [1, 2, 4, 8, 16, 32, 64, 128]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """Every schedule at every m (quick: the older three at four m, three newer ones at m =
    32); interleaved with m not divisible by p, DualPipe(V) with m < 2p are invalid (error
    rows: Megatron-LM's and DualPipe's rules)."""
    grid = [(s, m) for s in SCHEDULES[:3] for m in micro_batches(quick)]
    grid += [(s, 32) for s in QUICK_NEW] if quick else [(s, m) for s in SCHEDULES[3:] for m in micro_batches(quick)]
    return [({"schedule": s, "m": m}, {"parallel.schedule": s, "training.global_batch": m,
                                       "parallel.virtual_stages": {"interleaved": CHUNKS, "zb-v": 2,
                                                                   "dualpipev": 2}.get(s, 1)})
            for s, m in grid]


def closed_form(schedule: Schedule, m, p: int = STAGES, v: int = CHUNKS):
    """(p-1)/(m+p-1), or (p-1)/(v m+p-1) for interleaved; the zero-bubble schedules and
    DualPipe(V) with equal F, B, W (see the module docstring)."""
    m = np.asarray(m, dtype=float)
    if schedule in (Schedule.ZB_H1, Schedule.ZB_H2, Schedule.DUALPIPEV):
        return (p - 1) / (3 * m + p - 1)
    if schedule == Schedule.ZB_V:
        return (p - 1) / (6 * m + p - 1)
    if schedule == Schedule.DUALPIPE:
        return (p - 2) / (3 * m + p - 2)
    chunks = v if schedule == Schedule.INTERLEAVED else 1
    return (p - 1) / (chunks * m + p - 1)


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Per-point measured vs closed form; per-schedule worst and mean gap."""
    table = pd.DataFrame({"schedule": rows["schedule"], "micro_batches": rows["m"].astype(int),
                          "bubble_sim": rows["bubble_fraction"],
                          "bubble_closed_form": [closed_form(s, m) for s, m in zip(rows["schedule"], rows["m"])],
                          "step_s": rows["step_time_s"], "memory_gb": rows["memory_per_gpu_bytes"] / 1e9,
                          "fits_in_memory": rows["fits_in_memory"], "error": rows["error"]})
    table.insert(4, "difference", table["bubble_sim"] - table["bubble_closed_form"])
    table.insert(5, "bubble_with_step_end", with_step_end(table))
    ok = table[table["error"].isna()]
    summary = pd.DataFrame([{"schedule": s, "points": len(g), "max_abs_difference": g["difference"].abs().max(),
                             "mean_difference": g["difference"].mean(),
                             "bubble_at_m8_sim": g.loc[g["micro_batches"] == 8, "bubble_sim"].max(),
                             "max_m_that_fits": g.loc[g["fits_in_memory"].astype(bool), "micro_batches"].max(),
                             "invalid_points": int((table["schedule"] == s).sum() - len(g))}
                            for s, g in ok.groupby("schedule", sort=False)])
    return table, summary, notes(table, summary)


def with_step_end(table: pd.DataFrame, p: int = STAGES, v: int = CHUNKS) -> pd.Series:
    """The older schedules' closed form with the step's own per-step work (zero_grad, gradient
    norm, optimizer, syncs: sim/parallel/step_end.py), which no stage idles through: a step of
    m micro-batches takes (m + (p-1)/chunks) t + T_end, so the simulated step times of one
    schedule are a line in m of slope t, and the bubble is (p-1) t / chunks over the step.
    NaN for the zero-bubble schedules and for a schedule with fewer than two valid points."""
    out = pd.Series(np.nan, index=table.index)
    valid = table["error"].isna() & table["schedule"].isin(SCHEDULES[:3])
    for schedule, g in table[valid].groupby("schedule"):
        if g["micro_batches"].nunique() >= 2:
            t = np.polyfit(g["micro_batches"].astype(float), g["step_s"].astype(float), 1)[0]
            chunks = CHUNKS if schedule == Schedule.INTERLEAVED else 1
            out[g.index] = (p - 1) * t / chunks / g["step_s"]
    return out


def notes(table: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """How close the simulator is, and why it departs."""
    out = [f"{s.schedule}: measured bubble within {s.max_abs_difference:.3f} of the closed form over {s.points} "
           f"points (mean difference {s.mean_difference:+.3f})" + (f"; {s.invalid_points} invalid points "
                                                                 f"(the schedule's micro-batch rule) recorded as error rows"
                                                                 if s.invalid_points else "") + "."
           for s in summary.itertuples()]
    out.append("Below the closed form at small m: the optimizer step (no bubble) lengthens the step; above it "
               "at large m: the last stage also runs the output layer, so the other stages wait a little every "
               "micro-batch (the closed form assumes equal stages).")
    zero = table[table["schedule"].isin(ZERO_BUBBLE_SCHEDULES) & table["error"].isna()]
    if len(zero):
        out.append(f"Zero-bubble schedules and DualPipe: {zero['difference'].min():+.3f} to "
                   f"{zero['difference'].max():+.3f} from their equal-F-B-W forms: here a layer's input-gradient "
                   "pass B outlasts its weight-gradient pass W (the attention core's backward and the recomputed "
                   "attention have no weights), so less W is left to fill the bubbles.")
    gpipe = table[(table["schedule"] == Schedule.GPIPE) & table["error"].isna()]
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
    newer = {"zb-h1": ("^", "tab:purple", "ZB-H1, ZB-H2, DualPipeV: (p-1)/(3m+p-1)"),
             "zb-v": ("v", "tab:brown", "ZB-V: (p-1)/(6m+p-1)"), "dualpipe": ("P", "tab:orange",
                                                                            "DualPipe: (p-2)/(3m+p-2)")}
    for schedule, (_, color, label) in newer.items():
        ax.plot(m, closed_form(schedule, m), ":", color=color, lw=1.3, label=label)
    styles = {"gpipe": ("D", 10, "lightsteelblue", "tab:blue"), "1f1b": ("o", 5, None, "tab:green"),
              "interleaved": ("s", 7, None, "tab:red"), "zb-h1": ("^", 7, None, "tab:purple"),
              "zb-h2": ("<", 7, "white", "tab:purple"), "zb-v": ("v", 7, None, "tab:brown"),
              "dualpipe": ("P", 8, None, "tab:orange"), "dualpipev": ("X", 7, "white", "tab:orange")}
    for schedule, (marker, size, face, color) in styles.items():
        g = ok[ok["schedule"] == schedule]
        if g.empty:
            continue
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
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    bx.axhline(HBM_GB, color="black", ls="--", lw=1)
    bx.text(ok["micro_batches"].max(), HBM_GB, "HBM: 80 GiB = 85.9 GB ", va="bottom", ha="right", fontsize=9)
    bx.set_ylim(0, max(ok["memory_gb"].max(), HBM_GB) * 1.15)
    bx.set_ylabel("peak memory per GPU, GB")
    bx.set_title("Same idle time, different memory: GPipe stores every micro-batch")
    bx.legend(loc="lower right", fontsize=9)
    plotting.save(fig, path)
