"""Jitter at scale: the step waits for the slowest of N ranks at every collective.

``python -m sim.studies.jitter_scaling`` simulates pure data parallelism with lognormal per-op compute
jitter from 8 to 1,024 GPUs (every rank simulated, no folding; one gradient bucket, so
the ranks meet once, at the all-reduce) and plots the step time beside the expectation
of a maximum over N ranks, estimated by Monte Carlo from the same distribution:
E[step] = E[max_i sum_j d_j X_ij] + all-reduce + E[max_i d_opt X_i], where d_j are the
compute ops before the all-reduce and d_opt the optimizer after it. Output:
out/jitter-vs-gpus.png and a printed table (``python -m sim.studies.jitter_scaling
plots/jitter-vs-gpus.png`` replaces the shipped one).
"""

from pathlib import Path

import numpy as np

from ..input.load import scenario_from_dict
from ..outputs.paths import make_dir, written
from ..engine.kinds import Category

BASE = {
    "name": "jitter-scaling",
    "model": {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 1024},
    "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1, "grad_bucket_mb": 1000},
    "cluster": {"topology": "dgx-h100"},
    "parallel": {"zero": 0, "fold": False},
}


def expected_max(durations: np.ndarray, n: int, sigma: float, samples: int = 2000, seed: int = 0) -> float:
    """E[max over n ranks of sum_j d_j X_ij], X mean-one lognormal (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    draws = rng.lognormal(-sigma**2 / 2, sigma, size=(samples, n, len(durations)))
    return float((draws @ durations).max(axis=1).mean())


def expected_step(clean, n: int, sigma: float) -> float:
    """The Monte Carlo expectation above, from the ops of the run without jitter."""
    spans = clean.spans[clean.spans["rank"] == clean.spans["rank"].min()]
    comp = spans[spans.category == Category.COMPUTE]
    opt = comp[comp.name == "optimizer"]
    before = comp[comp.name != "optimizer"]
    d_before = (before.end_s - before.start_s).to_numpy()
    d_opt = (opt.end_s - opt.start_s).to_numpy()
    comm = clean.summary["step_time_s"] - d_before.sum() - d_opt.sum()
    return expected_max(d_before, n, sigma) + comm + expected_max(d_opt, n, sigma)


def scaling(gpus=(8, 16, 32, 64, 128, 256, 512, 1024), sigma: float = 0.05, seeds=(0, 1, 2)) -> list[dict]:
    """Step time with and without jitter for each GPU count (mean over seeds)."""
    from ..step import simulate

    rows = []
    for n in gpus:
        base = {**BASE, "training": {**BASE["training"], "global_batch": n},
                "cluster": {**BASE["cluster"], "gpus": n}, "parallel": {**BASE["parallel"], "dp": n}}
        clean_run = simulate(scenario_from_dict(base), baseline=False)
        clean = clean_run.summary["step_time_s"]
        noisy = [simulate(scenario_from_dict({**base, "seed": s, "jitter": {"sigma": sigma}}),
                          baseline=False).summary["step_time_s"] for s in seeds]
        rows.append({"gpus": n, "clean_s": clean, "jitter_s": float(np.mean(noisy)),
                     "ratio": float(np.mean(noisy)) / clean,
                     "expected_ratio": expected_step(clean_run, n, sigma) / clean})
    return rows


def plot(rows: list[dict], path: str, sigma: float) -> None:
    """Step-time ratio vs GPU count beside E[max of N draws]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["gpus"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(n, [(r["jitter_s"] - r["clean_s"]) * 1e3 for r in rows], "o-", label="simulated")
    left.plot(n, [(r["expected_ratio"] - 1) * r["clean_s"] * 1e3 for r in rows], "s--",
              label="expected: E[max over N ranks] (Monte Carlo)")
    left.set_ylabel("time added by jitter (ms)")
    left.set_title(f"Jitter cost grows with N (sigma={sigma} per op)")
    right.plot(n, [r["ratio"] for r in rows], "o-", label="simulated")
    right.plot(n, [r["expected_ratio"] for r in rows], "s--", label="expected")
    right.set_ylabel("step time / step time without jitter")
    right.set_title("Relative cost (all-reduce time grows too)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (pure data parallelism, every rank simulated)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(out: str = "out/jitter-vs-gpus.png", sigma: float = 0.05) -> None:
    """Run the study, print the table, write the plot."""
    rows = scaling(sigma=sigma)
    print(f"{'gpus':>6} {'clean ms':>9} {'jitter ms':>10} {'ratio':>7} {'expected':>8}")
    for r in rows:
        print(f"{r['gpus']:>6} {r['clean_s'] * 1e3:>9.2f} {r['jitter_s'] * 1e3:>10.2f} {r['ratio']:>7.4f} "
              f"{r['expected_ratio']:>8.4f}")
    make_dir(Path(out).parent, "out")
    with written(out, "out") as tmp:
        plot(rows, tmp, sigma)
    print(f"wrote {out}")


if __name__ == "__main__":
    import sys
    main(*sys.argv[1:2])  # ``python -m sim.studies.jitter_scaling [PNG]``
