"""Timelines of an RL run: spans of both pools for the existing trace and PNG exports.

``clustersim rl SCENARIO --trace t.json --timeline t.png [--timeline-window 10s:60s]`` (or :func:`spans`, :func:`write_trace`,
:func:`plot`). The spans table has the shape of :mod:`sim.outputs.result`'s, aggregated so
long runs stay small:

- trainer rank 0, per training step: ``train_fwd`` then ``train_bwd`` then ``train_optimizer``
  blocks in the shares of forward, backward and other compute of the simulated step
  (the step's own timeline is ``clustersim run`` of the trainer pool), labelled with the
  step number; its ``weights`` row holds each transfer to the generators;
- the first GPU of each generator engine (31 at most, evenly picked): ``generate_fwd``
  blocks, one per contiguous stretch of generation with one weights version (labelled
  with it), a ``tail`` row where the engine runs underfull with nothing it may start
  (the stragglers' long tail), and a ``weights`` row: the transfers it receives and its
  pauses (pipeline) or swaps (async).

Gaps on a compute row are idle time, hatched by the timeline.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..engine.ops import SPAN_COLUMNS
from ..input.choices import RLMode
from ..engine.kinds import Category, Phase, StreamName
from ..outputs.result import Result, StepFacts
from .loop import Segment

MAX_ENGINES = 31  # engines shown (plus the trainer): the trace's default-selection size


def _merge(rows: list[tuple]) -> list[tuple]:
    """Join (start, end, key) rows with the same key that touch."""
    out = []
    for a, b, key in sorted(rows):
        if out and out[-1][2] == key and a <= out[-1][1] + 1e-12:
            out[-1] = (out[-1][0], max(out[-1][1], b), key)
        else:
            out.append((a, b, key))
    return out


def _row(rank, stream, name, category, start, end, step=-1, phase=None) -> dict:
    return {"rank": rank, "stream": stream, "name": name, "category": category, "start_s": start,
            "end_s": end, "layer": -1, "micro_batch": step, "stage": -1, "bytes": 0.0, "phase": phase}


def _trainer_rows(res) -> list[dict]:
    fwd, bwd = res.loop.trainer.phase_shares()
    rows = []
    for st in res.loop.steps:
        t, d = st.start, st.end - st.start
        for name, share, phase in (("train_fwd", fwd, Phase.FORWARD), ("train_bwd", bwd, Phase.BACKWARD),
                                   ("train_optimizer", 1 - fwd - bwd, Phase.OPTIMIZER)):
            if share > 0:
                rows.append(_row(0, StreamName.COMPUTE, name, Category.COMPUTE, t, t + d * share, st.step, phase))
                t += d * share
        if st.transfer:
            rows.append(_row(0, StreamName.WEIGHTS, "send_weights", Category.WEIGHTS, *st.transfer, st.step + 1,
                             Phase.WEIGHT_SYNC))
    return rows


def _engine_rows(g, wall: float, transfers: list[tuple]) -> list[dict]:
    rank, gen, tail, weights = g.gpus[0], [], [], []
    for start, end, kind, running, version in g.segments:
        end = wall if end is None else min(end, wall)
        if end <= start:
            continue
        if kind is Segment.GENERATE:
            gen.append((start, end, version))
            if running < g.cost.slots:
                tail.append((start, end, 0))
        elif kind is Segment.WEIGHTS:
            weights.append((start, end, "pause" if g.mode is RLMode.PIPELINE else "swap"))
    rows = [_row(rank, StreamName.COMPUTE, "generate_fwd", Category.COMPUTE, a, b, v, Phase.FORWARD)
            for a, b, v in _merge(gen)]
    rows += [_row(rank, StreamName.TAIL, "underfull", Category.TAIL, a, b) for a, b, _ in _merge(tail)]
    rows += [_row(rank, StreamName.WEIGHTS, name, Category.WEIGHTS, a, b) for a, b, name in _merge(weights)]
    rows += [_row(rank, StreamName.WEIGHTS, "receive_weights", Category.WEIGHTS, a, b, phase=Phase.WEIGHT_SYNC)
             for a, b in transfers]
    return rows


def shown_engines(generators) -> list:
    """At most :data:`MAX_ENGINES` engines, evenly picked."""
    if len(generators) <= MAX_ENGINES:
        return list(generators)
    idx = np.unique(np.linspace(0, len(generators) - 1, MAX_ENGINES).round().astype(int))
    return [generators[i] for i in idx]


def spans(res) -> pd.DataFrame:
    """The spans table of an :class:`~sim.rl.run.RLResult` (SPAN_COLUMNS; ``op`` numbers
    each rank's rows in time order)."""
    wall = res.summary["wall_s"]
    transfers = [st.transfer for st in res.loop.steps if st.transfer]
    rows = _trainer_rows(res)
    for g in shown_engines(res.loop.generators):
        rows += _engine_rows(g, wall, transfers)
    df = pd.DataFrame(rows).sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)
    df["op"] = df.groupby("rank").cumcount().astype(np.int64)
    return df[list(SPAN_COLUMNS)]


def as_result(res) -> Result:
    """A :class:`~sim.outputs.result.Result` the trace and timeline modules draw."""
    s = res.summary
    summary = {"name": s["name"], "num_gpus": s["num_gpus"], "step_time_s": s["step_time_s"],
               "mfu": s["trainer_mfu"]}
    facts = StepFacts(res.topology, list(range(s["num_gpus"])), link_bytes=res.info.get("link_bytes"),
                      link_log=res.info.get("link_log"))  # (no programs, layout or folding: rows of two pools)
    return Result(summary, spans(res), res.scenario, None, facts)


def title(res) -> str:
    """Which rank is what, with the pools' GPU counts, for the timeline's heading."""
    s = res.summary
    ranks = [g.gpus[0] for g in shown_engines(res.loop.generators)]
    unused = s["num_gpus"] - s["trainer_gpus"] - s["generator_gpus"]
    pools = f"{s['trainer_gpus']} trainer + {s['generator_gpus']} generator GPUs"
    pools += f", {unused} unused" if unused else ""
    return (f"{s['mode']} RL ({pools}): rank 0 = trainer pool (step n), ranks {ranks[0]}..{ranks[-1]} = generator "
            f"engines (weights version); MFU is the trainer pool's")


def sync_vs_pipeline(path: str, scenario: str = "scenarios/rl-llama3-8b-h100.toml", steps: int = 5) -> list[str]:
    """docs/rl.md's picture: the bundled scenario's first ``steps`` steps in sync and in
    pipeline mode on one time axis; returns a line per run (what the docs quote)."""
    from ..input.load import load_scenario
    from ..outputs.timeline import plot_panels
    from .run import simulate_rl

    runs = [simulate_rl(load_scenario(scenario, [f"rl.mode={mode}", f"rl.steps={steps}"]))
            for mode in (RLMode.SYNC, RLMode.PIPELINE)]
    results = [as_result(r) for r in runs]
    plot_panels([(res, title(r)) for r, res in zip(runs, results)], path,
                ranks=sorted(results[0].spans["rank"].unique().tolist()))
    return [f"{r.summary['mode']}: {r.summary['num_gpus']} GPUs ({r.summary['trainer_gpus']} trainer, "
            f"{r.summary['generator_gpus']} generator), {steps} steps in {r.summary['wall_s']:.0f} s, generator "
            f"utilization {r.summary['generator_utilization']:.0%}" for r in runs]


def write_trace(res, path: str) -> dict:
    """Chrome / Perfetto trace of both pools (busiest links too when the run recorded them)."""
    from ..outputs.trace import chrome_trace

    result = as_result(res)
    trace = chrome_trace(result, sorted(result.spans["rank"].unique().tolist()))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return trace


def plot(res, path: str, window: tuple | None = None) -> None:
    """PNG timeline of both pools; ``window`` (start_s, end_s or None, as
    :func:`sim.outputs.timeline_paint.parse_window` returns it) draws only that part of the run."""
    from ..outputs.timeline import plot_timeline
    from ..outputs.timeline_paint import resolve_window

    result = as_result(res)
    window = resolve_window(window, float(result.spans.end_s.max()), whole="run")
    plot_timeline(result, path, ranks=sorted(result.spans["rank"].unique().tolist()), title=title(res),
                  window=window, whole="run")



if __name__ == "__main__":  # python -m sim.rl.exports plots/rl-timeline-sync-vs-pipeline.png
    import sys

    from ..outputs.paths import output_file, written

    target = output_file(sys.argv[1] if len(sys.argv) > 1 else "rl-timeline-sync-vs-pipeline.png", "PNG", (".png",))
    with written(target, "PNG") as tmp:
        print("\n".join(sync_vs_pipeline(tmp)))
    print(f"wrote {target}")
