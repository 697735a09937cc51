"""Study: the FSDP batch-size floor, and what adding PP, CP or TP buys beyond it.

Run ``clustersim study batch-floor [--quick]`` (scenario: sim/studies/scenarios/batch-floor.toml).

The seeds: FSDP is data parallel, each GPU needs at least one whole sequence (attention
cannot easily be split), so a 10M-token batch of 10k-token sequences caps FSDP at ~1k
GPUs. Here: Llama 3 70B, 1,024 sequences of 8,192 tokens. Pure FSDP is swept up to
16k GPUs; the loader rejects dp > sequences with an InputError, which the sweep records
as error rows. Beyond 1,024 GPUs the study keeps dp = 1,024 and multiplies it by a
pipeline (pp), context (cp) or tensor (tp) degree of N / 1,024.
"""

from matplotlib.ticker import FuncFormatter, LogLocator
import pandas as pd

from .base import human, text_table

TITLE = "Batch floor: pure FSDP stops at one sequence per GPU; what PP, CP or TP buy beyond it"
SEQUENCES = 1024  # global batch, sequences of 8,192 tokens
STRATEGIES = ("FSDP", "FSDP + PP", "FSDP + CP", "FSDP + TP")
AXIS = {"FSDP + PP": "parallel.pp", "FSDP + CP": "parallel.cp", "FSDP + TP": "parallel.tp"}


def gpu_counts(quick: bool) -> list[int]:
    """128 ... 16k GPUs (quick: 256, 1k, 4k)."""
    return [256, 1024, 4096] if quick else [2**k for k in range(7, 15)]


def points(quick: bool) -> list[tuple[dict, dict]]:
    """Pure FSDP at every GPU count; the other strategies beyond the floor."""
    out = [({"strategy": "FSDP", "degree": 1}, {"cluster.gpus": n, "parallel.dp": n}) for n in gpu_counts(quick)]
    for strategy, key in AXIS.items():
        for n in gpu_counts(quick):
            if n > SEQUENCES:
                d = n // SEQUENCES
                out.append(({"strategy": strategy, "degree": d}, {"cluster.gpus": n, "parallel.dp": SEQUENCES, key: d}))
    return out


def analyze(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Per-point table (errors kept), per-strategy summary and findings."""
    table = pd.DataFrame({
        "strategy": rows["strategy"], "gpus": rows["cluster.gpus"].astype(int), "degree": rows["degree"],
        "dp": rows["parallel.dp"].astype(int), "tokens_per_s": rows["tokens_per_s"], "mfu": rows["mfu"],
        "bubble_fraction": rows["bubble_fraction"], "exposed_comm_s": rows["exposed_comm_s"],
        "step_s": rows["step_time_s"], "memory_gb": rows["memory_per_gpu_bytes"] / 1e9,
        "fits_in_memory": rows["fits_in_memory"], "error": rows["error"]})
    ok = table[table["error"].isna()]
    floor = ok[ok["strategy"] == "FSDP"].sort_values("tokens_per_s").iloc[-1]
    summary = []
    for strategy in STRATEGIES:
        mine = ok[ok["strategy"] == strategy].sort_values("gpus")
        top = mine.iloc[-1]
        bad = table[(table["strategy"] == strategy) & table["error"].notna()]
        summary.append({"strategy": strategy, "max_valid_gpus": int(top["gpus"]), "degree_there": int(top["degree"]),
                        "tokens_per_s_there": top["tokens_per_s"], "mfu_there": top["mfu"],
                        "bubble_there": top["bubble_fraction"],
                        "speedup_vs_best_fsdp": top["tokens_per_s"] / floor["tokens_per_s"],
                        "gpus_vs_best_fsdp": top["gpus"] / floor["gpus"],
                        "first_invalid_gpus": int(bad["gpus"].min()) if len(bad) else None,
                        "why_invalid": bad.sort_values("gpus")["error"].iloc[0] if len(bad) else None})
    summary = pd.DataFrame(summary)
    return table, summary, notes(table, summary, floor)


def notes(table: pd.DataFrame, summary: pd.DataFrame, floor) -> list[str]:
    """What the floor is and what each strategy buys past it."""
    out = [f"Pure FSDP: best {floor['tokens_per_s'] / 1e6:.2f}M tokens/s at {human(floor['gpus'])} GPUs "
           f"(MFU {floor['mfu']:.1%}); more GPUs than the {SEQUENCES:,} sequences are rejected: "
           f"{summary.iloc[0]['why_invalid']}"]
    for s in summary.iloc[1:].itertuples():
        line = (f"{s.strategy}: up to {human(s.max_valid_gpus)} GPUs (degree {s.degree_there}) for "
                f"{s.speedup_vs_best_fsdp:.2f}x FSDP's best throughput on {s.gpus_vs_best_fsdp:.0f}x the GPUs, "
                f"MFU {s.mfu_there:.1%}")
        if s.bubble_there > 0.01:
            line += f", pipeline bubble {s.bubble_there:.0%} (one micro-batch per pipeline at dp = {SEQUENCES:,})"
        if pd.notna(s.first_invalid_gpus):
            line += f"; invalid from {human(s.first_invalid_gpus)} GPUs: {s.why_invalid}"
        out.append(line + ".")
    out.append("At a fixed batch, PP adds GPUs but each pipeline holds one micro-batch, so the bubble "
               "(p-1)/(m+p-1) with m = 1 eats the gain; CP and TP split each sequence's work instead, at the cost "
               "of per-layer communication and smaller matrix multiplies.")
    return out


def report_text(table: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The printed tables (error messages shortened to their key)."""
    shown = table.assign(error=table["error"].map(lambda e: e.split(":")[0] + ": invalid" if isinstance(e, str) else None))
    fmt = {"tokens_per_s": "{:,.0f}", "mfu": "{:.1%}", "bubble_fraction": "{:.1%}", "exposed_comm_s": "{:.3f}",
           "step_s": "{:.3f}", "memory_gb": "{:.1f}"}
    sfmt = {"tokens_per_s_there": "{:,.0f}", "mfu_there": "{:.1%}", "bubble_there": "{:.1%}",
            "speedup_vs_best_fsdp": "{:.2f}", "gpus_vs_best_fsdp": "{:.0f}", "first_invalid_gpus": "{:,.0f}"}
    return text_table(shown, fmt) + "\n\n" + text_table(summary.drop(columns=["why_invalid"]), sfmt)


def plot(table: pd.DataFrame, summary: pd.DataFrame, path) -> None:
    """Left: tokens/s vs GPUs with invalid points marked; right: MFU."""
    from . import plotting

    fig, (ax, bx) = plotting.figure(2, width=15)
    ok = table[table["error"].isna()]
    origin = ok[(ok["strategy"] == "FSDP") & (ok["gpus"] == SEQUENCES)]
    for strategy, color in zip(STRATEGIES, plotting.COLORS):
        mine = pd.concat([origin, ok[ok["strategy"] == strategy]]) if strategy != "FSDP" else ok[ok["strategy"] == strategy]
        mine = mine.drop_duplicates("gpus").sort_values("gpus")
        label = strategy if strategy == "FSDP" else f"{strategy} (degree = GPUs / {SEQUENCES:,})"
        plotting.sim_line(ax, mine["gpus"], mine["tokens_per_s"] / 1e6, mine["fits_in_memory"], color, label)
        plotting.sim_line(bx, mine["gpus"], mine["mfu"], mine["fits_in_memory"], color, label)
        bad = table[(table["strategy"] == strategy) & table["error"].notna()]
        for axis in (ax, bx):
            axis.plot(bad["gpus"], [0.02] * len(bad), "x", color=color, ms=10, mew=2.5,
                      transform=axis.get_xaxis_transform())
    for axis in (ax, bx):
        axis.axvline(SEQUENCES, color="black", ls="--", lw=1)
        axis.text(SEQUENCES, 0.06, f"batch floor: {SEQUENCES:,} GPUs for pure FSDP ", rotation=90, ha="right",
                  va="bottom", transform=axis.get_xaxis_transform(), fontsize=8.5)
        plotting.gpu_axis(axis)
    best = origin["tokens_per_s"].iloc[0] / 1e6
    n = sorted(table["gpus"].unique())
    ax.plot(n, [best * g / SEQUENCES for g in n], ":", color="0.5", lw=1.2, label="linear scaling through FSDP at the floor")
    ax.plot([], [], "x", color="black", ms=9, mew=2.5, label="invalid point (error row): dp > sequences, ...")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_ylabel("training throughput, million tokens/s (log scale)")
    ax.set_title("Llama-3-70B, 1,024 x 8k-token sequences per step, H100")
    bx.set_ylim(0, 0.6)
    bx.set_ylabel("MFU")
    bx.set_title("MFU: what the extra GPUs cost")
    ax.legend(loc="upper left", fontsize=8.5)
    bx.text(0.99, 0.98, "x on the axis: invalid point (error row)\nhollow markers: does not fit in 80 GB HBM",
            transform=bx.transAxes, ha="right", va="top", fontsize=8, bbox=dict(boxstyle="round", fc="white", ec="0.7"))
    plotting.save(fig, path)
