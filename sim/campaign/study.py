"""Study: goodput of a 15T-token Llama 3 405B campaign from 1,024 to 131,072 H100 GPUs:
where failures, rather than communication, become the limit.

Run ``clustersim study goodput-vs-scale [--quick]`` (scenario:
sim/studies/scenarios/goodput-vs-scale.toml; writes plots/study-goodput-vs-scale.{png,csv}).

Each GPU count is one step simulation (TP 8 x PP 16, data parallelism growing with the
GPUs, 16 sequences per replica) and then two campaigns over seeded trials with the Llama 3
failure table (:mod:`sim.campaign.failures`): the ``clustersim campaign`` defaults (2 min
detection, 10 min restart, synchronous checkpoints at the Young/Daly interval) and a
fast-recovery variant (30 s detection, 2 min restart as FlashRecovery reports for 4,800
devices, asynchronous checkpoints). Two losses are compared: communication (the step's
exposed communication / step time, from the simulator) and failures (1 - ETTR). Cost per
token assumes $2 per GPU-hour (an assumption, a round figure for H100 rental).
Reference: Kokolis et al. 2024 ("Revisiting Reliability in Large-Scale Machine Learning
Research Clusters", arXiv 2410.21680) project a job MTTF of 7.9 h at 1,024 GPUs, 1.8 h at
16,384 and 14 min at 131,072 from Meta's research clusters.
"""

import math
from pathlib import Path
import tomllib

import numpy as np
import pandas as pd

from ..input.load import scenario_from_dict
from ..studies.base import scenario_path, text_table, valid
from .build import Options, build
from .trials import run

TITLE = "Goodput vs scale: Llama 3 405B, 15T tokens, failures vs communication from 1k to 131k H100"
NAME = "goodput-vs-scale"
TOKENS = 15e12
SEQUENCES_PER_REPLICA = 16  # Meta's 2,048 sequences over 128 replicas (Llama 3 paper, section 3.3)
MODEL_PARALLEL = 8 * 16  # TP x PP
GPU_HOUR_USD = 2.0  # assumption, see the module docstring
TRIALS, SEED = 50, 0
VARIANTS = (("default recovery", Options(TOKENS)),
            ("fast recovery", Options(TOKENS, mode="async", detect_s=30.0, restart_s=120.0)))
KOKOLIS_MTTF_H = {1024: 7.9, 16384: 1.8, 131072: 14 / 60}  # arXiv 2410.21680, projected job MTTF


def gpu_counts(quick: bool) -> list[int]:
    """1,024 to 131,072 GPUs (quick: 1k, 4k, 16k)."""
    return [1024, 4096, 16384] if quick else [2**k for k in range(10, 18)]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """One step simulation per GPU count."""
    return [({"gpus": n}, overrides(n)) for n in gpu_counts(quick)]


def overrides(gpus: int) -> dict:
    """The scenario keys of one GPU count: more replicas, same sequences per replica."""
    dp = gpus // MODEL_PARALLEL
    return {"cluster.nodes": gpus // 8, "parallel.dp": dp, "training.global_batch": SEQUENCES_PER_REPLICA * dp}


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Per GPU count and variant: ETTR, days, interruptions, cost; per variant: the crossover."""
    path = scenario_path(NAME)
    data = tomllib.loads(Path(path).read_text())
    records = []
    for row in valid(rows).sort_values("gpus").to_dict("records"):
        s = scenario_from_dict(data, overrides(int(row["gpus"])), Path(path).parent)
        for variant, opts in VARIANTS:
            records.append(campaign_row(s, row, variant, opts))
    table = pd.DataFrame(records)
    summary = pd.DataFrame([variant_summary(v, g) for v, g in table.groupby("variant", sort=False)])
    return table, summary, notes(table, summary)


def campaign_row(s, row: dict, variant: str, opts: Options) -> dict:
    """One campaign at one GPU count."""
    c, facts = build(s, float(row["step_time_s"]), opts)
    o = run(c, TRIALS, SEED)
    gpus = facts.fleet.gpus
    ettr = c.steps * c.step_s / o.wall_s
    gpu_hours = gpus * o.wall_s.mean() / 3600
    return {"variant": variant, "gpus": gpus, "step_s": c.step_s, "mfu": row["mfu"],
            "comm_loss": row["exposed_comm_s"] / row["step_time_s"], "failure_loss": 1 - float(ettr.mean()),
            "ettr": float(ettr.mean()), "ettr_p10": float(np.percentile(ettr, 10)),
            "days": float(o.wall_s.mean() / 86400), "days_p90": float(np.percentile(o.wall_s, 90) / 86400),
            "interruptions_per_day": float(np.mean(o.interruptions / (o.wall_s / 86400))),
            "mtbf_h": 1 / float(np.sum(c.rates)) / 3600, "mtbf_kokolis_h": KOKOLIS_MTTF_H.get(gpus),
            "checkpoint_interval_s": c.interval * c.step_s,
            "usd_per_mtok": gpu_hours * GPU_HOUR_USD / (TOKENS / 1e6),
            "usd_per_mtok_no_failures": gpus * c.steps * c.step_s / 3600 * GPU_HOUR_USD / (TOKENS / 1e6),
            "fits_in_memory": bool(row["fits_in_memory"])}


def crossover(gpus, comm, failure) -> float | None:
    """The GPU count where the failure loss first exceeds the communication loss,
    interpolated in log2 of the GPU count; None if it never does in range."""
    pts = list(zip(gpus, np.asarray(failure) - np.asarray(comm)))
    if pts and pts[0][1] > 0:
        return float(pts[0][0])
    for (n0, d0), (n1, d1) in zip(pts, pts[1:]):
        if d0 <= 0 < d1:
            return 2 ** (math.log2(n0) + d0 / (d0 - d1) * (math.log2(n1) - math.log2(n0)))
    return None


def variant_summary(variant: str, g: pd.DataFrame) -> dict:
    """One variant's crossover and its ends."""
    first, last = g.iloc[0], g.iloc[-1]
    at_16k = g[g["gpus"] == 16384]
    return {"variant": variant, "crossover_gpus": crossover(g["gpus"], g["comm_loss"], g["failure_loss"]),
            "gpus_min": int(first.gpus), "gpus_max": int(last.gpus), "ettr_min_gpus": first.ettr,
            "ettr_16k": float(at_16k.ettr.iloc[0]) if len(at_16k) else None, "ettr_max_gpus": last.ettr,
            "usd_per_mtok_min_gpus": first.usd_per_mtok, "usd_per_mtok_max_gpus": last.usd_per_mtok,
            "days_max_gpus": last.days}


def notes(table: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """What the study found, one line per variant plus the failure rates."""
    out = []
    for s in summary.itertuples():
        where = (f"failures cost more than exposed communication from ~{s.crossover_gpus:,.0f} GPUs"
                 if pd.notna(s.crossover_gpus) else f"communication stays the larger loss up to {s.gpus_max:,} GPUs")
        out.append(f"{s.variant}: {where}; ETTR {s.ettr_min_gpus:.1%} at {s.gpus_min:,} GPUs"
                   + (f", {s.ettr_16k:.1%} at 16,384" if pd.notna(s.ettr_16k) and s.gpus_max != 16384 else "")
                   + f", {s.ettr_max_gpus:.1%} at {s.gpus_max:,}; ${s.usd_per_mtok_min_gpus:.2f} -> "
                     f"${s.usd_per_mtok_max_gpus:.2f} per million tokens.")
    base = table[table["variant"] == VARIANTS[0][0]]
    ref = "; ".join(f"{int(r.gpus):,} GPUs {r.mtbf_h:.2f} h (Kokolis et al. {r.mtbf_kokolis_h:.2f} h)"
                    for r in base.itertuples() if pd.notna(r.mtbf_kokolis_h))
    out.append(f"Job MTBF from the Llama 3 table: {ref}.")
    out.append(f"Exposed communication stays {base.comm_loss.min():.1%} to {base.comm_loss.max():.1%} of a step "
               f"with 16 sequences per replica, while interruptions grow from {base.interruptions_per_day.iloc[0]:.1f} "
               f"to {base.interruptions_per_day.iloc[-1]:.1f} per day.")
    return out


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables."""
    cols = ["variant", "gpus", "step_s", "comm_loss", "failure_loss", "ettr", "days", "interruptions_per_day",
            "mtbf_h", "checkpoint_interval_s", "usd_per_mtok"]
    fmt = {"step_s": "{:.2f}", "comm_loss": "{:.1%}", "failure_loss": "{:.1%}", "ettr": "{:.1%}", "days": "{:,.1f}",
           "interruptions_per_day": "{:.1f}", "mtbf_h": "{:.2f}", "checkpoint_interval_s": "{:.0f}",
           "usd_per_mtok": "{:.2f}"}
    sfmt = {"crossover_gpus": "{:,.0f}", "ettr_min_gpus": "{:.1%}", "ettr_16k": "{:.1%}", "ettr_max_gpus": "{:.1%}",
            "usd_per_mtok_min_gpus": "{:.2f}", "usd_per_mtok_max_gpus": "{:.2f}", "days_max_gpus": "{:.1f}"}
    return text_table(table[cols], fmt) + "\n\n" + text_table(summary, sfmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: the two losses against GPUs, crossovers marked. Right: cost per million tokens,
    with and without failures."""
    from ..studies import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    base = table[table["variant"] == VARIANTS[0][0]]
    plotting.sim_line(ax, base["gpus"], base["comm_loss"], base["fits_in_memory"], "black",
                      "communication: exposed comm / step time (simulated)", marker="s")
    for (variant, g), s, color in zip(table.groupby("variant", sort=False), summary.itertuples(),
                                      ("tab:red", "tab:orange")):
        plotting.sim_line(ax, g["gpus"], g["failure_loss"], g["fits_in_memory"], color, f"failures: 1 - ETTR, {variant}")
        if pd.notna(s.crossover_gpus):
            ax.axvline(s.crossover_gpus, color=color, ls=":", lw=1.2)
        plotting.sim_line(bx, g["gpus"], g["usd_per_mtok"], g["fits_in_memory"], color, f"with failures, {variant}")
    bx.plot(base["gpus"], base["usd_per_mtok_no_failures"], "--", color="black", lw=1.5, label="without failures")
    plotting.gpu_axis(ax)
    ax.set_ylabel("share of wall time lost")
    ax.set_title("What limits a 15T-token Llama 3 405B run: communication vs failures")
    plotting.legend_notes(ax, ["dotted: where failures overtake communication",
                               "failure table: Llama 3 405B (Dubey et al. 2024, Table 5)",
                               "hollow markers: does not fit in 80 GB HBM"], loc="upper left", at=(0.02, 0.72))
    plotting.gpu_axis(bx)
    bx.set_ylabel(f"USD per million tokens at ${GPU_HOUR_USD:.0f} per GPU-hour")
    bx.set_title("Cost per token")
    bx.legend(loc="upper left", fontsize=8.5)
    plotting.save(fig, path)
