"""The gallery: ``python -m sim.studies.gallery [--out-dir DIR]`` regenerates every picture into DIR (default
``out/``, untracked; ``--out-dir plots`` replaces the pictures the repository ships)
from the bundled scenarios (sim/studies/gallery_scenarios/*.toml and the example
scenarios/straggler-dp.toml, all shipped with the package) in a few seconds, and prints the figures each one shows (docs/gallery.md explains them).

- ``gallery-fsdp-prefetch.png``: FSDP with and without prefetching the next layer's
  all-gather: compute/communication overlap, and the exposed gathers without it.
- ``gallery-pipeline-schedules.png``: GPipe, 1F1B and interleaved 1F1B on the same
  model and time axis: where the bubbles sit and how interleaving shrinks them; then
  ZB-H1, ZB-H2, ZB-V, DualPipe and DualPipeV on the same case.
- ``gallery-dualpipe.png``, ``gallery-dualpipe-pairs.png``: DualPipe's two directions and
  (zoomed) its overlapped forward-backward pairs on an MoE model with expert parallelism.
- ``gallery-straggler.png: one rank 1.5x slower in data parallelism holds every rank
  at the gradient all-reduce (pale bars: waiting for it).
- ``gallery-hierarchical.png``: flat ring vs hierarchical all-reduce across NVLink
  domains: how busy NVLink and InfiniBand are over time with fast and with slow NICs,
  and a training step with ``parallel.dp_algo`` ring vs hierarchical.
- ``gallery-hardware.png``: one step of the same model (Llama 3 70B cut to 16 layers, TP 8 x
  DP 16) on an H100 SuperPOD, a B200 SuperPOD, two GB200 NVL72 racks and an MI355X cluster
  of 128 GPUs each, on one time axis.
"""

import argparse
import dataclasses
from pathlib import Path

from ..collectives.kinds import ALL_REDUCE, Algorithm
from ..errors import InputError
from ..input.bundled import EXAMPLES
from ..outputs.paths import make_dir, written

SCENARIOS = Path(__file__).resolve().parent / "gallery_scenarios"  # package data
COMPARED = (Algorithm.RING, Algorithm.HIERARCHICAL)  # the hierarchical figure's two all-reduces


def _run(path: Path, overrides=(), record_links=False):
    from ..input.load import load_scenario
    from ..step import simulate

    return simulate(load_scenario(str(path), list(overrides)), record_links=record_links)


def fsdp_prefetch(out: Path) -> list[str]:
    """Two panels: prefetch on / off."""
    from ..outputs.timeline import plot_panels

    path = SCENARIOS / "fsdp-prefetch.toml"
    on, off = _run(path), _run(path, ["training.fsdp_prefetch=false"])
    with written(out / "gallery-fsdp-prefetch.png", "--out") as tmp:
        plot_panels([(on, "prefetch on"), (off, "prefetch off")], tmp,
                    suptitle="FSDP (ZeRO-3): the next layer's all-gather overlaps this layer's compute only "
                             "with prefetch")
    return [f"FSDP prefetch on: step {on.summary['step_time_s'] * 1e3:.1f} ms, MFU {on.summary['mfu']:.1%}, exposed "
            f"comm {on.summary['exposed_comm_s'] * 1e3:.1f} ms; off: {off.summary['step_time_s'] * 1e3:.1f} ms, "
            f"MFU {off.summary['mfu']:.1%}, exposed {off.summary['exposed_comm_s'] * 1e3:.1f} ms"]


NEW_SCHEDULES = (("ZB-H1", "zb-h1"), ("ZB-H2", "zb-h2"), ("ZB-V (two chunks per GPU in a V)", "zb-v"),
                 ("DualPipe (both directions, two parameter copies)", "dualpipe"), ("DualPipeV", "dualpipev"))


def pipeline_schedules(out: Path) -> list[str]:
    """GPipe, 1F1B, interleaved 1F1B (v = 2), then the zero-bubble schedules and DualPipe(V)
    on the same model, 4 stages and 8 micro-batches."""
    from ..outputs.timeline import plot_panels

    path = SCENARIOS / "pipeline.toml"
    runs = [("GPipe", _run(path, ["parallel.schedule=gpipe"])),
            ("1F1B", _run(path, ["parallel.schedule=1f1b"])),
            ("interleaved 1F1B, v=2", _run(path, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]))]
    runs += [(label, _run(path, [f"parallel.schedule={name}"])) for label, name in NEW_SCHEDULES]
    with written(out / "gallery-pipeline-schedules.png", "--out") as tmp:
        plot_panels([(r, label) for label, r in runs], tmp, ranks="all",
                    suptitle="Pipeline bubbles (hatched), p = 4, m = 8: GPipe, 1F1B 27%, interleaved 16% (closed forms); "
                             "ZB-*, DualPipe(V) move weight gradients into them")
    return [f"{label}: step {r.summary['step_time_s'] * 1e3:.1f} ms, bubble {r.summary['bubble_fraction']:.1%}"
            for label, r in runs]


def dualpipe(out: Path) -> list[str]:
    """DualPipe on 4 stages, 8 micro-batches (0-3 enter at GPU 0, 4-7 at GPU 3), MoE with
    expert parallelism so that each paired forward and backward hides the other's all-to-alls."""
    from ..outputs.timeline import plot_panels

    r = _run(SCENARIOS / "dualpipe.toml")
    with written(out / "gallery-dualpipe.png", "--out") as tmp:
        plot_panels([(r, "DualPipe")], tmp, ranks="all",
                    suptitle="DualPipe: micro-batches 0-3 flow GPU 0 -> 3, 4-7 flow GPU 3 -> 0; in the middle each "
                             "forward runs interleaved with another micro-batch's backward (all-to-alls under compute)")
    step = r.summary["step_time_s"]
    with written(out / "gallery-dualpipe-pairs.png", "--out") as tmp:
        plot_panels([(r, "DualPipe, the middle of the step")], tmp, ranks="0,4", window=(0.22 * step, 0.42 * step),
                    suptitle="DualPipe's overlapped pairs: a forward (light) and another micro-batch's backward "
                             "(dark), layer piece by layer piece; all-to-alls (ep) under the other's compute")
    return [f"DualPipe (MoE, EP 4): step {r.summary['step_time_s'] * 1e3:.1f} ms, bubble "
            f"{r.summary['bubble_fraction']:.1%}, exposed comm {r.summary['exposed_comm_s'] * 1e3:.1f} ms"]


def straggler(out: Path) -> list[str]:
    """One slow rank in pure DP."""
    from ..outputs.timeline import plot_panels

    r = _run(EXAMPLES / "straggler-dp.toml")
    with written(out / "gallery-straggler.png", "--out") as tmp:
        plot_panels([(r, "rank 3 computes 1.5x slower")], tmp, ranks="0-5",
                    suptitle="A data-parallel straggler: every rank waits for rank 3 at the gradient all-reduce")
    return [f"straggler: step {r.summary['step_time_s'] * 1e3:.1f} ms, without it "
            f"{(r.summary['step_time_s'] - r.summary['straggler_cost_s']) * 1e3:.1f} ms, straggler cost "
            f"{r.summary['straggler_cost_s'] * 1e3:.1f} ms"]


def collective_log(topo, algo: Algorithm, group: tuple, nbytes: float):
    """(seconds, transfer log) of one all-reduce with every member simulated."""
    from .nccl_tests import run_collective

    engine = run_collective(topo, ALL_REDUCE, algo, group, nbytes, simulate_all=True, record_links=True)
    return engine.env.now, engine.net.log


def _fabric_buckets(topo) -> tuple[dict, dict]:
    """Link id -> 'NVLink' / 'InfiniBand' for the links where bytes enter the fabric
    (GPU -> NVSwitch, NIC -> leaf: each byte counted once), and each bucket's capacity."""
    ends = {lid: a for lid, (a, _) in enumerate(topo.link_ends)}
    bucket = {lid: "NVLink" if a[0] == "gpu" and topo.kinds[lid] == "nvlink" else
              "InfiniBand" if a[0] == "nic" and topo.kinds[lid] == "ib" else None for lid, a in ends.items()}
    caps = {}
    for lid, name in bucket.items():
        if name is not None:
            caps[name] = caps.get(name, 0.0) + float(topo.caps[lid])
    return bucket, caps


def _busy_panel(ax, series: dict, caps: dict, colors: dict, t_max: float) -> None:
    """How busy each fabric of ``series`` (name -> (times, bytes/s)) is over time, in % of its
    links' capacity ``caps[name]``, on an axis ``t_max`` seconds wide."""
    for name in ("NVLink", "InfiniBand"):
        if name in series:
            times, rates = series[name]
            util = 100 * rates / caps[name]
            ax.step(times * 1e3, util, where="post", color=colors[name], lw=1.5)
            ax.fill_between(times * 1e3, util, step="post", color=colors[name], alpha=0.15)
    ax.set_xlim(0, t_max * 1e3 * 1.02)
    ax.set_ylim(0, 110)
    ax.set_xlabel("time (ms)")
    ax.grid(True, alpha=0.3)


def hierarchical(out: Path) -> list[str]:
    """Flat ring vs hierarchical all-reduce across NVLink domains. Rows 1-2: one 3.4 GB
    all-reduce (1.7B bf16 gradients) over 2 DGX H100 nodes, how busy NVLink and InfiniBand
    are over time, with 400 and with 100 Gb/s NICs. Row 3: the training step of
    sim/studies/gallery_scenarios/hierarchical.toml (100 Gb/s NICs) with ``parallel.dp_algo`` ring vs
    hierarchical. Also prints both algorithms over 4 nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..hardware import specs

    spec = specs.load_spec("dgx-h100")
    cases = [("400 Gb/s NICs (DGX H100)", spec), ("100 Gb/s NICs (what-if)", dataclasses.replace(spec, nic_gbps=12.5))]
    colors = {"NVLink": "#4C72B0", "InfiniBand": "#C44E52"}
    fig, axes = plt.subplots(3, 2, figsize=(15, 10.5), gridspec_kw={"height_ratios": [1, 1, 1.15]})
    lines = _all_reduce_rows(axes, cases, colors)
    features, step_lines = _step_row(axes[2])
    _hierarchical_legends(fig, features, colors)
    with written(out / "gallery-hierarchical.png", "--out") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return lines + step_lines


ALL_REDUCE_BYTES = 3.4e9  # the hierarchical figure's all-reduce: 1.7B bf16 gradients


def _all_reduce_rows(axes, cases: list, colors: dict) -> list[str]:
    """:func:`hierarchical`'s rows 1-2 (one row per NIC case: each algorithm's all-reduce over
    2 nodes, how busy each fabric is) and its lines, those over 4 nodes too."""
    from ..hardware import topology
    from ..hardware.gpus import gpu_preset
    from ..outputs.trace import series_from_log

    lines = []
    for row, (label, sp) in enumerate(cases):
        topo = topology.Topology(topology.fat_tree(16, sp, gpu_preset(sp.gpu)), sp)
        bucket, caps = _fabric_buckets(topo)
        runs = {algo: collective_log(topo, algo, tuple(range(16)), ALL_REDUCE_BYTES) for algo in COMPARED}
        t_max = max(t for t, _ in runs.values())
        for col, (algo, (t, log)) in enumerate(runs.items()):
            ax = axes[row, col]
            _busy_panel(ax, series_from_log(log, bucket.get), caps, colors, t_max)
            ax.axvline(t * 1e3, color="k", lw=0.8, ls="--")
            ax.set_title(f"{label}: {algo} all-reduce, {t * 1e3:.1f} ms", fontsize=10, loc="left")
            if col == 0:
                ax.set_ylabel("busy (% of capacity)")
            lines.append(f"{label}, 2 nodes, {algo}: {t * 1e3:.1f} ms")
    for label, sp in cases:  # the same over 4 domains: hierarchical's advantage is gone
        topo = topology.Topology(topology.fat_tree(32, sp, gpu_preset(sp.gpu)), sp)
        for algo in COMPARED:
            t, _ = collective_log(topo, algo, tuple(range(32)), ALL_REDUCE_BYTES)
            lines.append(f"{label}, 4 nodes, {algo}: {t * 1e3:.1f} ms")
    return lines


def _step_row(axes) -> tuple[list, list[str]]:
    """:func:`hierarchical`'s row 3: the gallery's training step under each algorithm, on one
    time axis; (the timelines' features for the legend, its lines)."""
    from ..outputs.timeline import draw

    steps = [(algo, _run(SCENARIOS / "hierarchical.toml", [f"parallel.dp_algo={algo}"])) for algo in COMPARED]
    end = max(float(r.spans.end_s.max()) for _, r in steps)
    features, lines = [], []
    for ax, (algo, r) in zip(axes, steps):
        features.append(draw(ax, r, [0], (0.0, end), legend=False))
        ax.set_title(f"training step, 100 Gb/s NICs, dp_algo = {algo}: {r.summary['step_time_s'] * 1e3:.1f} ms, "
                     f"MFU {r.summary['mfu']:.1%}", fontsize=10, loc="left")
        lines.append(f"step with 100 Gb/s NICs, dp_algo={algo}: {r.summary['step_time_s'] * 1e3:.1f} ms, "
                     f"MFU {r.summary['mfu']:.1%}, exposed comm {r.summary['exposed_comm_s'] * 1e3:.1f} ms")
    return features, lines


def _hierarchical_legends(fig, features, colors: dict) -> None:
    """:func:`hierarchical`'s legends (the fabrics' over the panels, the timelines' under them)
    and title."""
    from matplotlib.lines import Line2D

    from ..outputs.timeline_paint import add_legend

    fig.tight_layout(rect=(0, 0.07, 1, 0.91))
    legend_ax = fig.add_axes((0.06, 0.0, 0.9, 0.05))  # the timelines' legend, under them
    legend_ax.axis("off")
    add_legend(legend_ax, features, ncol=7)
    handles = [Line2D([], [], color=colors["NVLink"], lw=2, label="NVLink: GPU -> NVSwitch links, all 16 GPUs"),
               Line2D([], [], color=colors["InfiniBand"], lw=2, label="InfiniBand: NIC -> leaf links, all 16 NICs"),
               Line2D([], [], color="k", lw=0.8, ls="--", label="all-reduce done")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.935), ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Flat ring vs hierarchical all-reduce of 3.4 GB over 2 DGX H100 nodes (16 GPUs). NCCL-style rings "
                 "already drive every NIC;\nhierarchical adds two NVLink phases and wins only when the NICs are the "
                 "bottleneck (and the domains few)", fontsize=11)


CLUSTERS = (("H100 SuperPOD", "dgx-h100-superpod", "h100-sxm"), ("B200 SuperPOD", "dgx-b200", "b200"),
            ("GB200 NVL72 racks", "gb200-nvl72", "gb200"), ("MI355X cluster", "amd-xgmi", "mi355x"))


def hardware(out: Path) -> list[str]:
    """Four panels: the same step on four clusters (:data:`CLUSTERS`)."""
    from ..outputs.timeline import plot_panels

    path = SCENARIOS / "hardware.toml"
    runs = [(label, _run(path, [f"cluster.topology={topo}", f"cluster.gpu={gpu}"])) for label, topo, gpu in CLUSTERS]
    base = runs[0][1].summary["step_time_s"]
    with written(out / "gallery-hardware.png", "--out") as tmp:
        plot_panels([(r, f"{label}: {r.summary['step_time_s'] * 1e3:.0f} ms, MFU {r.summary['mfu']:.0%}")
                     for label, r in runs], tmp, ranks="0-1",
                    suptitle="One step of Llama 3 70B (16 layers), TP 8 x DP 16 on 128 GPUs, on four clusters")
    return [f"{label}: step {r.summary['step_time_s'] * 1e3:.1f} ms ({base / r.summary['step_time_s']:.2f}x the "
            f"H100 SuperPOD), MFU {r.summary['mfu']:.1%}, exposed comm {r.summary['exposed_comm_s'] * 1e3:.1f} ms"
            for label, r in runs]


PICTURES = (fsdp_prefetch, pipeline_schedules, dualpipe, straggler, hierarchical, hardware)


def main(argv=None) -> int:
    """Regenerate every picture; print what each shows."""
    parser = argparse.ArgumentParser(prog="python -m sim.studies.gallery",
                                     description="Regenerate gallery-*.png from the bundled scenarios and "
                                                 "print the figures each picture shows.")
    parser.add_argument("--out-dir", "--out", dest="out", default="out",
                        help="output folder, created if missing (its parent must exist; default: out/ in the current "
                             "folder; --out-dir plots replaces the pictures the repository ships)")
    args = parser.parse_args(argv)
    try:
        out = make_dir(args.out, "--out-dir")
    except InputError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    for picture in PICTURES:
        for line in picture(out):
            print(line)
    print(f"wrote {len(PICTURES)} pictures to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
