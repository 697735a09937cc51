"""Study: where the FSDP crossover moves as the NVLink domain grows from 8 to 72 to 256 GPUs.

Run ``clustersim study domain-size [--quick]`` (scenario: sim/studies/scenarios/domain-size.toml).

The seeds: FSDP communication = 3 x total params x 2 bytes / (domain size x IB bandwidth),
so N* should grow in proportion to the domain ("TPUs excel with bigger domains"). That
counts only the traffic leaving a domain. With hierarchical collectives every GPU also
moves the whole layer through its own NVLink port inside the domain, whatever the domain
size, so communication is at least 3 x params x 2 bytes / NVLink bandwidth per GPU: the
NVLink-aware model adds that term (the in-domain phase follows the cross-domain one).
"""

import numpy as np
import pandas as pd

from .base import crater, hardware, human, scenario_path, text_table, valid
from .fsdp_crossover import analytic

TITLE = "NVLink domain size: where the FSDP crossover moves (8 vs 72 vs 256 GPUs per domain)"
NAME = "domain-size"
DOMAINS = (8, 72, 256)
CRATER = 0.9
# Same tokens per step (2,359,296) for every curve: whole 72-GPU domains need GPU counts
# 9 x 2^k, which divide 2,304 sequences; 2^k GPUs divide 2,048 sequences of 1,152 tokens.
SHAPES = {72: (2304, 1024), 8: (2048, 1152), 256: (2048, 1152)}  # sequences, tokens each


def gpu_counts(domain: int, quick: bool) -> list[int]:
    """2^k GPUs (9 x 2^k for 72-GPU domains) up to the batch floor."""
    base = 9 if domain == 72 else 8
    ks = (0, 3, 5, 6, 7, 8) if quick else range(0, 9)
    return [base * 2**k for k in ks]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """(labels, overrides): every domain size and GPU count."""
    out = []
    for k in DOMAINS:
        batch, seq = SHAPES[k]
        for n in gpu_counts(k, quick):
            out.append(({"domain": k}, {"cluster.topology_overrides.gpus_per_domain": k, "cluster.gpus": n,
                                        "parallel.dp": n, "training.global_batch": batch,
                                        "training.seq_len": seq, "training.micro_batch": batch // n}))
    return out


def nvlink_aware_comm(hw) -> float:
    """Hierarchical FSDP per step: 3 x params x 2 bytes across domains at k x W, then
    (k-1)/k of it through each GPU's NVLink port."""
    volume = 3 * hw.params_total * 2
    return volume / (hw.domain * hw.nic_bw) + volume * (hw.domain - 1) / hw.domain / hw.nvlink_bw


def curve_analysis(k: int, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per-point table and summary row of one domain size."""
    rows = valid(rows).sort_values("cluster.gpus")
    first, last = rows.iloc[0], rows.iloc[-1]
    n0, plateau = int(first["cluster.gpus"]), float(first["mfu"])
    compute_n0 = float(first["step_time_s"] - first["exposed_comm_s"])
    batch, seq = SHAPES[k]
    hw = hardware(scenario_path(NAME), {"cluster.topology_overrides.gpus_per_domain": k, "cluster.gpus": n0,
                                        "parallel.dp": n0, "training.global_batch": batch,
                                        "training.seq_len": seq, "training.micro_batch": batch // n0})
    seeds, aware = analytic(hw, compute_n0, n0), nvlink_aware_comm(hw)
    n_aware = compute_n0 * n0 / aware
    n = rows["cluster.gpus"].astype(int)
    compute = compute_n0 * n0 / n
    table = pd.DataFrame({"domain": k, "gpus": n, "tokens_per_gpu": hw.tokens / n, "mfu_sim": rows["mfu"],
                          "mfu_nvlink_aware": plateau * compute / np.maximum(compute, aware),
                          "step_s_sim": rows["step_time_s"], "compute_s": compute,
                          "exposed_comm_s_sim": rows["exposed_comm_s"],
                          "fits_in_memory": rows["fits_in_memory"].astype(bool)})
    n90 = crater(n, rows["mfu"], plateau, CRATER)
    summary = {"domain": k, "mfu_plateau": plateau, "comm_s_seeds": seeds["comm_s"], "comm_s_nvlink_aware": aware,
               "n_star_seeds": seeds["n_star"], "n_star_nvlink_aware": n_aware, "n_crater_sim": n90,
               "crater_over_n_star_seeds": n90 / seeds["n_star"] if n90 else None,
               "crater_over_n_star_nvlink": n90 / n_aware if n90 else None, "gpus_max": int(last["cluster.gpus"]),
               "mfu_sim_at_max": float(last["mfu"]), "step_s_sim_at_max": float(last["step_time_s"])}
    return table, summary


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Tables and findings: the crossover per domain size, seeds vs NVLink-aware vs simulated."""
    parts = [curve_analysis(k, rows[rows["domain"] == k]) for k in DOMAINS]
    summary = pd.DataFrame([s for _, s in parts])
    return pd.concat([t for t, _ in parts], ignore_index=True), summary, notes(summary)


def notes(summary: pd.DataFrame) -> list[str]:
    """Where the crossover moves, in the three models."""
    out = []
    for s in summary.itertuples():
        where = f"craters at N ~ {human(s.n_crater_sim)}" if s.n_crater_sim else \
            f"does not crater up to {human(s.gpus_max)} GPUs"
        out.append(f"{s.domain:.0f}-GPU domains: simulator {where}; seeds' N* = {human(s.n_star_seeds)}, "
                   f"NVLink-aware N* = {human(s.n_star_nvlink_aware)}.")
    small, big = summary.iloc[0], summary.iloc[-1]
    if small.n_crater_sim and big.n_crater_sim:
        out.append(f"From {small.domain:.0f} to {big.domain:.0f} GPUs per domain the seeds' N* grows "
                   f"{big.n_star_seeds / small.n_star_seeds:.0f}x; the simulated crater moves "
                   f"{big.n_crater_sim / small.n_crater_sim:.1f}x and the NVLink-aware N* "
                   f"{big.n_star_nvlink_aware / small.n_star_nvlink_aware:.1f}x: once k x IB bandwidth exceeds "
                   f"one GPU's NVLink bandwidth ({small.comm_s_nvlink_aware - small.comm_s_seeds:.3f} s per step "
                   f"of in-domain traffic here), a bigger domain no longer shortens FSDP's communication.")
    return out


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables."""
    fmt = {"tokens_per_gpu": "{:,.0f}", "mfu_sim": "{:.1%}", "mfu_nvlink_aware": "{:.1%}", "step_s_sim": "{:.3f}",
           "compute_s": "{:.3f}", "exposed_comm_s_sim": "{:.3f}"}
    sfmt = {"mfu_plateau": "{:.1%}", "comm_s_seeds": "{:.4f}", "comm_s_nvlink_aware": "{:.3f}",
            "n_star_seeds": "{:,.0f}", "n_star_nvlink_aware": "{:,.0f}", "n_crater_sim": "{:,.0f}",
            "crater_over_n_star_seeds": "{:.2f}", "crater_over_n_star_nvlink": "{:.2f}", "mfu_sim_at_max": "{:.1%}",
            "step_s_sim_at_max": "{:.3f}"}
    return text_table(table, fmt) + "\n\n" + text_table(summary, sfmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: MFU vs GPUs per domain size. Right: crossover GPU count vs domain size."""
    from . import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    for (k, group), s, color in zip(table.groupby("domain", sort=False), summary.itertuples(), plotting.COLORS):
        plotting.sim_line(ax, group["gpus"], group["mfu_sim"], group["fits_in_memory"], color,
                          f"{k} GPUs per NVLink domain")
        n = np.geomspace(group["gpus"].min(), group["gpus"].max(), 200)
        ax.plot(n, s.mfu_plateau * np.minimum(1, s.n_star_nvlink_aware / n), ":", color=color, lw=1.5)
        if s.n_crater_sim:
            ax.plot([s.n_crater_sim], [CRATER * s.mfu_plateau], "o", color=color, ms=11, mfc="none", mew=2)
    plotting.gpu_axis(ax)
    ax.set_ylim(0, 0.7)
    ax.set_ylabel("MFU")
    ax.set_title("Llama-3-8B FSDP on H100, hierarchical collectives, 2.36M-token batch")
    plotting.legend_notes(ax, ["dotted: NVLink-aware model, MFU = plateau x min(1, N*/N)",
                               "\u25cb simulator crater (MFU < 90% of plateau)",
                               "hollow markers: does not fit in 80 GB HBM"])
    crossover_panel(bx, summary)
    plotting.save(fig, path)


def crossover_panel(ax, summary: pd.DataFrame) -> None:
    """Crossover GPU count vs domain size: seeds, NVLink-aware, simulated."""
    k = summary["domain"]
    ax.plot(k, summary["n_star_seeds"], "v--", color="tab:gray", ms=9, label="seeds' N* (grows with the domain)")
    ax.plot(k, summary["n_star_nvlink_aware"], "s:", color="black", ms=7,
            label="NVLink-aware N* (+ whole layer through each GPU's NVLink)")
    sim = summary.dropna(subset=["n_crater_sim"])
    ax.plot(sim["domain"], sim["n_crater_sim"], "o-", color="tab:red", lw=2, ms=8,
            label="simulator: MFU < 90% of plateau")
    for s in summary.itertuples():
        ax.annotate(human(s.n_star_seeds), (s.domain, s.n_star_seeds), textcoords="offset points", xytext=(-8, 4),
                    ha="right", fontsize=8, color="tab:gray")
    for s in sim.itertuples():
        ax.annotate(human(s.n_crater_sim), (s.domain, s.n_crater_sim), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize=8, color="tab:red")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(k) / 1.6, max(k) * 1.4)
    ax.set_xticks(list(k), [str(v) for v in k])
    ax.minorticks_off()
    ax.set_xlabel("GPUs per NVLink domain (log scale)")
    ax.set_ylabel("crossover GPU count (log scale)")
    ax.set_title("Where the crossover moves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8.5)
    ax.text(0.02, 0.80, "seeds: comm = 3 x params x 2 B / (k x IB per GPU)\n"
            "NVLink-aware: + (k-1)/k x 3 x params x 2 B / NVLink per GPU\n"
            "N* = compute at N GPUs x N / comm", transform=ax.transAxes, ha="left", va="top", fontsize=8,
            bbox=dict(boxstyle="round", fc="white", ec="0.7"))
