"""The plots/ gallery: ``python -m sim.gallery [--out plots]`` regenerates every picture
from the bundled scenarios (scenarios/gallery/*.toml, scenarios/straggler-dp.toml) in
about half a minute, and prints the figures each one shows.

- ``gallery-fsdp-prefetch.png``: FSDP with and without prefetching the next layer's
  all-gather: compute/communication overlap, and the exposed gathers without it.
- ``gallery-pipeline-schedules.png``: GPipe, 1F1B and interleaved 1F1B on the same
  model and time axis: where the bubbles sit and how interleaving shrinks them.
- ``gallery-straggler.png``: one rank 1.5x slower in data parallelism holds every rank
  at the gradient all-reduce (pale bars: waiting for it).
- ``gallery-hierarchical.png``: flat ring vs hierarchical all-reduce across NVLink
  domains, NVLink and InfiniBand throughput over time, with fast and with slow NICs.
"""

import argparse
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def _run(path: Path, overrides=(), record_links=False):
    from .load import load_scenario
    from .step import simulate

    return simulate(load_scenario(str(path), list(overrides)), record_links=record_links)


def fsdp_prefetch(out: Path) -> list[str]:
    """Two panels: prefetch on / off."""
    from .timeline import plot_panels

    path = SCENARIOS / "gallery" / "fsdp-prefetch.toml"
    on, off = _run(path), _run(path, ["training.fsdp_prefetch=false"])
    plot_panels([(on, "prefetch on"), (off, "prefetch off")], out / "gallery-fsdp-prefetch.png",
                suptitle="FSDP (ZeRO-3): the next layer's all-gather overlaps this layer's compute only with prefetch")
    return [f"FSDP prefetch on: step {on.summary['step_time_s'] * 1e3:.1f} ms, exposed comm "
            f"{on.summary['exposed_comm_s'] * 1e3:.1f} ms; off: {off.summary['step_time_s'] * 1e3:.1f} ms, "
            f"exposed {off.summary['exposed_comm_s'] * 1e3:.1f} ms"]


def pipeline_schedules(out: Path) -> list[str]:
    """Three panels: GPipe, 1F1B, interleaved 1F1B (v = 2)."""
    from .timeline import plot_panels

    path = SCENARIOS / "gallery" / "pipeline.toml"
    runs = [("GPipe", _run(path, ["parallel.schedule=gpipe"])),
            ("1F1B", _run(path, ["parallel.schedule=1f1b"])),
            ("interleaved 1F1B, v=2", _run(path, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]))]
    plot_panels([(r, label) for label, r in runs], out / "gallery-pipeline-schedules.png", ranks="all",
                suptitle="Pipeline bubbles (hatched): p = 4 stages, m = 8 micro-batches; "
                         "(p-1)/(m+p-1) = 27% for GPipe and 1F1B, (p-1)/(v m+p-1) = 16% interleaved")
    return [f"{label}: step {r.summary['step_time_s'] * 1e3:.1f} ms, bubble {r.summary['bubble_fraction']:.1%}"
            for label, r in runs]


def straggler(out: Path) -> list[str]:
    """One slow rank in pure DP."""
    from .timeline import plot_panels

    r = _run(SCENARIOS / "straggler-dp.toml")
    plot_panels([(r, "rank 3 computes 1.5x slower")], out / "gallery-straggler.png", ranks="0-5",
                suptitle="A data-parallel straggler: every rank waits for rank 3 at the gradient all-reduce")
    return [f"straggler: step {r.summary['step_time_s'] * 1e3:.1f} ms, straggler cost "
            f"{r.summary['straggler_cost_s'] * 1e3:.1f} ms"]


def collective_log(topo, algo: str, group: tuple, nbytes: float):
    """(seconds, transfer log) of one all-reduce with every member simulated."""
    from .engine import Collective, Engine, Op, RankProgram

    call = Collective(("gallery",), "all_reduce", group, float(nbytes), algo)
    engine = Engine(topo, [RankProgram(r, [Op("all_reduce", "dp", "dp", comm=call)]) for r in group])
    engine.net.log = []
    engine.run()
    return engine.env.now, engine.net.log


def hierarchical(out: Path) -> list[str]:
    """Flat ring vs hierarchical all-reduce of 1.7B bf16 gradients (3.4 GB) over 2 DGX
    H100 nodes: NVLink and IB throughput over time, with 400 and 100 Gb/s NICs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from . import topology
    from .hardware import gpu_preset
    from .trace import series_from_log

    spec = topology.load_spec("dgx-h100")
    nbytes, group = 3.4e9, tuple(range(16))
    cases = [("400 Gb/s NICs (DGX H100)", spec), ("100 Gb/s NICs (what-if)", dataclasses.replace(spec, nic_gbps=12.5))]
    fig, axes = plt.subplots(2, 2, figsize=(14, 7), sharey="row")
    lines = []
    for row, (label, sp) in enumerate(cases):
        topo = topology.Topology(topology.fat_tree(16, sp, gpu_preset(sp.gpu)), sp)
        ends = {lid: a for (a, _), lid in topo._link_id.items()}
        # count each byte once, where it enters the fabric: GPU -> NVSwitch and NIC -> leaf
        bucket = {lid: "NVLink" if a[0] == "gpu" and topo.kinds[lid] == "nvlink" else
                  "InfiniBand" if a[0] == "nic" and topo.kinds[lid] == "ib" else None for lid, a in ends.items()}
        runs = {algo: collective_log(topo, algo, group, nbytes) for algo in ("ring", "hierarchical")}
        t_max = max(t for t, _ in runs.values())
        for col, (algo, (t, log)) in enumerate(runs.items()):
            ax = axes[row, col]
            series = series_from_log(log, bucket.get)
            for name, color, what in (("NVLink", "#4C72B0", "GPU -> NVSwitch, 16 GPUs"),
                                      ("InfiniBand", "#C44E52", "NIC -> leaf, 16 NICs")):
                if name in series:
                    times, rates = series[name]
                    ax.step(times * 1e3, rates / 1e9, where="post", color=color, label=f"{name} ({what})")
                    ax.fill_between(times * 1e3, rates / 1e9, step="post", color=color, alpha=0.2)
            ax.set_xlim(0, t_max * 1e3 * 1.02)
            ax.axvline(t * 1e3, color="k", lw=0.8, ls="--")
            ax.set_title(f"{label}: {algo} all-reduce, {t * 1e3:.1f} ms", fontsize=10, loc="left")
            ax.set_xlabel("time (ms)")
            ax.grid(True, alpha=0.3)
            if col == 0:
                ax.set_ylabel("bytes entering the fabric (GB/s)")
            ax.legend(fontsize=8, loc="center right")
            lines.append(f"{label}, {algo}: {t * 1e3:.1f} ms")
    fig.suptitle("All-reduce of 3.4 GB over 2 DGX H100 nodes (16 GPUs). NCCL-style flat rings already use every "
                 "NIC; hierarchical\nadds two NVLink phases and wins only when the inter-node links are the bottleneck",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "gallery-hierarchical.png", dpi=100)
    plt.close(fig)
    return lines


PICTURES = (fsdp_prefetch, pipeline_schedules, straggler, hierarchical)


def main(argv=None) -> int:
    """Regenerate every picture; print what each shows."""
    parser = argparse.ArgumentParser(prog="python -m sim.gallery", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "plots"), help="output folder (default: plots/)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for picture in PICTURES:
        for line in picture(out):
            print(line)
    print(f"wrote {len(PICTURES)} pictures to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
