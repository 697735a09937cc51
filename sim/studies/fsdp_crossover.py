"""Study: FSDP's MFU vs GPU count at a fixed global batch, against the seeds' crossover N*.

Run ``clustersim study fsdp-crossover [--quick]`` (scenario: sim/studies/scenarios/fsdp-crossover.toml).

The seeds (Dwarkesh, "Notes on pretraining parallelisms"): compute time per step
= 6 x tokens x active params / (N x FLOP/s_eff) falls as 1/N while FSDP's communication
= 3 x total params x 2 bytes / (NVLink domain size x IB bandwidth per GPU) stays flat, so
MFU craters past the crossover N* where they meet. FLOP/s_eff is the simulator's own rate
at the smallest GPU count, where communication hides under compute, so compute(N) =
compute(N0) x N0 / N exactly and N* = compute(N0) x N0 / comm. Curves: the bundled
scenario; the same with hierarchical collectives; a 4x larger batch (N* moves right);
Mixtral 8x7B, 13B of 47B parameters active (N* moves left: comm grows with total params,
compute only with active ones); the bundled scenario on IB switches that reduce (SHARP),
where NCCL's tuner (``auto``) takes CollNet all-gathers and reduce-scatters: a handful of
steps through the switches instead of a ring's N-1, the same bytes per NIC.
"""

import numpy as np
import pandas as pd

from .base import crater, hardware, human, scenario_path, text_table, valid

TITLE = "FSDP crossover: MFU vs GPUs at a fixed global batch, simulated vs the seeds' N*"
NAME = "fsdp-crossover"
MIXTRAL = {"model.preset": "mixtral-8x7b", "model.moe.routing": "uniform"}
SHARP = {"cluster.topology_overrides.sharp": True}  # IB switches that reduce; NCCL's tuner picks (auto)
CURVES = (  # label, overrides, global batch (sequences of 1,024 tokens)
    ("Llama-3-8B, 2M-token batch (ring)", {}, 2048),
    ("Llama-3-8B, 2M-token batch, hierarchical", {"parallel.dp_algo": "hierarchical"}, 2048),
    ("Llama-3-8B, 8M-token batch (ring)", {}, 8192),
    ("Mixtral-8x7B, 2M-token batch (ring)", MIXTRAL, 2048),
    ("Llama-3-8B, 2M-token batch, NVLS + SHARP switches", SHARP, 2048),
)
QUICK_GPUS = (8, 64, 256, 512, 1024, 2048)
CRATER = 0.9  # "cratered": MFU below 90% of its small-N plateau


def gpu_counts(batch: int, quick: bool) -> list[int]:
    """8, 16, ... up to the batch floor (one sequence per GPU)."""
    counts = QUICK_GPUS if quick else [2**k for k in range(3, 15)]
    return [n for n in counts if n <= batch]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """(labels, overrides) for every curve and GPU count; each GPU takes its whole share
    of the batch as one micro-batch."""
    return [({"curve": label}, {**extra, "training.global_batch": batch, "cluster.gpus": n, "parallel.dp": n,
                                "training.micro_batch": batch // n})
            for label, extra, batch in CURVES for n in gpu_counts(batch, quick)]


def analytic(hw, compute_n0: float, n0: int) -> dict:
    """The seeds' model: FLOP/s_eff from the measured compute at ``n0`` GPUs, comm, N*."""
    flops_eff = 6 * hw.tokens * hw.params_active / (n0 * compute_n0)
    comm = 3 * hw.params_total * 2 / (hw.domain * hw.nic_bw)  # bf16 bytes / (k x W)
    return {"flops_eff": flops_eff, "comm_s": comm, "n_star": compute_n0 * n0 / comm}


def curve_analysis(label: str, rows: pd.DataFrame, extra: dict) -> tuple[pd.DataFrame, dict]:
    """Per-point table and summary row of one curve."""
    rows = valid(rows).sort_values("cluster.gpus")
    first = rows.iloc[0]
    n0, plateau = int(first["cluster.gpus"]), float(first["mfu"])
    compute_n0 = float(first["step_time_s"] - first["exposed_comm_s"])
    hw = hardware(scenario_path(NAME), {**extra, "cluster.gpus": n0, "parallel.dp": n0,
                                        "training.global_batch": int(first["training.global_batch"]),
                                        "training.micro_batch": int(first["training.micro_batch"])})
    model = analytic(hw, compute_n0, n0)
    n = rows["cluster.gpus"].astype(int)
    compute = compute_n0 * n0 / n
    table = pd.DataFrame({
        "curve": label, "gpus": n, "tokens_per_gpu": hw.tokens / n, "mfu_sim": rows["mfu"],
        "mfu_seeds": plateau * (compute / compute.clip(lower=model["comm_s"])),
        "step_s_sim": rows["step_time_s"], "compute_s_seeds": compute, "comm_s_seeds": model["comm_s"],
        "exposed_comm_s_sim": rows["exposed_comm_s"], "fits_in_memory": rows["fits_in_memory"].astype(bool)})
    n90 = crater(n, rows["mfu"], plateau, CRATER)
    last = rows.iloc[-1]
    summary = {"curve": label, "tokens_per_step": hw.tokens, "params_total": hw.params_total,
               "params_active": hw.params_active, "flops_eff_tflops": model["flops_eff"] / 1e12,
               "mfu_plateau": plateau, "comm_s_seeds": model["comm_s"], "n_star_seeds": model["n_star"],
               "tokens_per_gpu_at_n_star": hw.tokens / model["n_star"],
               "batch_floor_gpus": int(first["training.global_batch"]),
               "n_crater_sim": n90, "crater_over_n_star": n90 / model["n_star"] if n90 else None,
               "gpus_max": int(last["cluster.gpus"]), "step_s_sim_at_max": float(last["step_time_s"]),
               "comm_s_sim_at_max": float(last["step_time_s"]) - compute_n0 * n0 / int(last["cluster.gpus"])}
    return table, summary


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Tables and the notes a reader needs: where each curve craters vs N*."""
    tables, summaries = [], []
    for label, extra, _ in CURVES:
        table, summary = curve_analysis(label, rows[rows["curve"] == label], extra)
        tables.append(table)
        summaries.append(summary)
    summary = pd.DataFrame(summaries)
    return pd.concat(tables, ignore_index=True), summary, notes(summary)


def notes(summary: pd.DataFrame) -> list[str]:
    """One line per curve, then what explains the gap."""
    out = []
    for s in summary.itertuples():
        where = (f"craters (MFU < {CRATER:.0%} of its {s.mfu_plateau:.1%} plateau) at N ~ {human(s.n_crater_sim)}"
                 if s.n_crater_sim else f"does not crater up to {human(s.gpus_max)} GPUs")
        ratio = f" = {s.crater_over_n_star:.2f} x N*" if s.crater_over_n_star else ""
        out.append(f"{s.curve}: simulator {where}{ratio}; seeds' N* = {human(s.n_star_seeds)} "
                   f"({s.tokens_per_gpu_at_n_star:,.0f} tokens per GPU).")
    base = summary.iloc[0]
    out.append(f"Why the simulator craters before N*: the seeds count bandwidth only ({base.comm_s_seeds * 1e3:.0f} ms "
               f"per step for Llama-3-8B); a flat ring all-gather or reduce-scatter over N GPUs also takes N-1 "
               f"sequential hops of a few microseconds each, ~100 times per step, so at {human(base.gpus_max)} GPUs "
               f"the simulated communication is ~{base.comm_s_sim_at_max * 1e3:.0f} ms. Hierarchical collectives "
               f"shorten the rings (N/8 hops across domains) but move the full layer through each GPU's NVLink "
               f"after the IB phase instead of alongside it.")
    sharp = summary[summary["curve"].str.contains("SHARP")]
    if len(sharp) and sharp.iloc[0].n_crater_sim:
        out.append(f"With SHARP switches the all-gathers and reduce-scatters no longer pay N-1 ring steps: the "
                   f"simulator craters at N ~ {human(sharp.iloc[0].n_crater_sim)} instead of "
                   f"{human(base.n_crater_sim)}; the bytes per NIC, and so the seeds' N*, stay the same.")
    elif len(sharp):
        out.append(f"With SHARP switches the all-gathers and reduce-scatters no longer pay N-1 ring steps: no "
                   f"crater up to {human(sharp.iloc[0].gpus_max)} GPUs (ring: {human(base.n_crater_sim)}).")
    out.append(f"Crossover in tokens per GPU = FLOP/s_eff / (domain x IB bandwidth) ~ "
               f"{base.tokens_per_gpu_at_n_star:,.0f}: with 4k-token sequences the batch floor (one sequence per "
               f"GPU) comes before N* on H100, which is why these curves use 1k-token sequences.")
    return out


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables."""
    points_fmt = {"tokens_per_gpu": "{:,.0f}", "mfu_sim": "{:.1%}", "mfu_seeds": "{:.1%}", "step_s_sim": "{:.3f}",
                  "compute_s_seeds": "{:.3f}", "comm_s_seeds": "{:.3f}", "exposed_comm_s_sim": "{:.3f}"}
    cols = ["curve", "n_star_seeds", "n_crater_sim", "crater_over_n_star", "mfu_plateau", "flops_eff_tflops",
            "comm_s_seeds", "comm_s_sim_at_max", "batch_floor_gpus"]
    summary_fmt = {"n_star_seeds": "{:,.0f}", "n_crater_sim": "{:,.0f}", "crater_over_n_star": "{:.2f}",
                   "mfu_plateau": "{:.1%}", "flops_eff_tflops": "{:.0f}", "comm_s_seeds": "{:.3f}",
                   "comm_s_sim_at_max": "{:.3f}"}
    return text_table(table, points_fmt) + "\n\n" + text_table(summary[cols], summary_fmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: MFU vs GPUs, simulated (solid) and the seeds' model (dotted), N* marked.
    Right: the seeds' picture for the base curve: compute falls as 1/N, comm stays flat."""
    from . import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    for (label, group), s, color in zip(table.groupby("curve", sort=False), summary.itertuples(), plotting.COLORS):
        plotting.sim_line(ax, group["gpus"], group["mfu_sim"], group["fits_in_memory"], color, label)
        if "hierarchical" not in label and "SHARP" not in label:  # (same hardware as the base curve)
            n = np.geomspace(group["gpus"].min(), group["gpus"].max(), 200)
            ax.plot(n, s.mfu_plateau * np.minimum(1, s.n_star_seeds / n), ":", color=color, lw=1.5)
            ax.plot([s.n_star_seeds], [s.mfu_plateau], "v", color=color, ms=10, mec="black", mew=0.5)
        if s.n_crater_sim:
            ax.plot([s.n_crater_sim], [CRATER * s.mfu_plateau], "o", color=color, ms=11, mfc="none", mew=2)
    plotting.gpu_axis(ax)
    ax.set_ylabel("MFU")
    ax.set_ylim(0, 0.7)
    ax.set_title("MFU vs GPU count at a fixed global batch (1k-token sequences)")
    plotting.legend_notes(ax, ["dotted: seeds' model, MFU = plateau x min(1, N*/N)",
                               "\u25bc seeds' N*   \u25cb simulator crater (MFU < 90% of plateau)",
                               "hollow markers: does not fit in 80 GB HBM",
                               "batch floor (1 sequence per GPU): 2k GPUs at 2M tokens, 8k at 8M"])
    base = table[table["curve"] == summary.iloc[0]["curve"]]
    plotting.times_panel(bx, base, summary.iloc[0])
    plotting.save(fig, path)
