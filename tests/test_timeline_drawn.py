"""What a PNG timeline SAYS, read back from the drawn matplotlib Axes (not only that a file
exists): the colour of every compute block against the pipeline schedule's closed form, the
optimizer at the end, the hatched idle time against the summary's bubble, the red
exposed-communication strip against the summary's exposed communication, and the RL
loop's two pools (training steps as forward then backward, engines while they generate).

The drawing is read through its artists: ``broken_barh`` collections (a colour of
:data:`sim.outputs.timeline.COLORS`, or the hatched idle bars), the micro-batch numbers written
inside compute blocks, and the row labels. Nothing here parses op names, so the tests hold
however the timeline derives a span's phase. A bar's drawn time is its width times the
share of its row's band it fills (spans narrower than a pixel fill their pixel column to
their busy share, :mod:`sim.outputs.timeline_paint`), so drawn time equals the spans' covered
time; :func:`slack` keeps the older one-pixel-per-bar bound as an upper limit, and where
widths are compared the plot is also drawn as if :data:`FINE` pixels wide (the exposed strip
is checked at the PNG's own width).

Run: ``python -m pytest tests/test_timeline_drawn.py``
"""

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from sim import load_scenario, simulate  # noqa: E402
from sim.outputs.metrics import critical_rank, length, rank_breakdown, rank_times, union  # noqa: E402
from sim.outputs import timeline  # noqa: E402
from sim.outputs.timeline import draw  # noqa: E402
from sim.outputs.timeline_paint import COLORS, STRIP, color_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "sim" / "studies" / "gallery_scenarios" / "pipeline.toml"
MODEL = ("forward", "backward", "forward2", "backward2")  # colours of model compute blocks
COMPUTE = MODEL + ("compute",)  # ... and of the optimizer
FINE = 10**7  # pixels across the step when widths are compared: bars widened to a pixel, and gaps
              # under one closed, then change a width by ~1e-7 of the step per span at most


@dataclass(frozen=True)
class Bar:
    """One drawn rectangle, in seconds: its row's label, what it shows and its extent."""
    row: str
    kind: str  # a COLORS key, "idle" (hatched) or "pale" (a collective waiting for peers)
    x0: float
    x1: float
    fill: float = 1.0  # share of the row's band filled: a pixel column drawn as busy as it was


UNITS = {"time (us)": 1e6, "time (ms)": 1e3, "time (s)": 1.0}  # the x-axis label -> per second


@dataclass(frozen=True)
class Drawn:
    bars: list[Bar]
    labels: list[tuple[str, float, int]]  # (row, x in s, micro-batch number written there)
    px: float  # one pixel, in seconds

    def rows(self) -> dict[int, str]:
        """Shown rank -> the label of its compute row."""
        return {int(b.row.split()[1]): b.row for b in self.bars if b.row.endswith("compute")}

    def row(self, rank: int) -> str:
        return self.rows()[rank]

    def of(self, row: str, *kinds: str) -> list[Bar]:
        return sorted((b for b in self.bars if b.row == row and b.kind in kinds), key=lambda b: b.x0)

    def width(self, row: str, *kinds: str) -> float:
        """Area drawn: width times the share of the band filled (time, in seconds)."""
        return sum((b.x1 - b.x0) * b.fill for b in self.of(row, *kinds))

    def blocks(self, row: str) -> list[tuple[str, int]]:
        """(colour, micro-batch) of every numbered compute block of ``row``, left to right."""
        out = []
        for r, x, mb in sorted((lab for lab in self.labels if lab[0] == row), key=lambda lab: lab[1]):
            under = [b.kind for b in self.of(r, *COMPUTE) if b.x0 <= x <= b.x1]
            assert len(under) == 1, f"{row}: micro-batch {mb} at {x:.6f} s is written over {under}"
            out.append((under[0], mb))
        return out


def _kind(collection, names: dict) -> str:
    """What a ``broken_barh`` collection shows: hatched idle, pale (white with alpha over a
    waiting collective) or the COLORS key of its face colour."""
    if collection.get_hatch():
        return "idle"
    rgba = tuple(np.round(collection.get_facecolor()[0], 6))
    return "pale" if rgba[3] < 1 else names[rgba]


def read(ax, window: float, px_width: int, kinds=()) -> Drawn:
    """Every bar and micro-batch label of a timeline drawn on ``ax`` (time axis in the unit
    its label names); ``kinds``: row kinds outside COLORS drawn in :func:`timeline.color_of`."""
    names = {tuple(np.round(to_rgba(c), 6)): k for k, c in COLORS.items()}
    names.update({tuple(np.round(to_rgba(color_of(k)), 6)): k for k in kinds})
    rows = {round(y - 0.5): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels())}
    per_s = UNITS[ax.get_xlabel()]
    bars = []
    for coll in ax.collections:
        if isinstance(coll, LineCollection):
            continue  # the white separators between blocks
        kind = _kind(coll, names)
        band = STRIP[1] if kind == "exposed" else 0.8  # rows are one unit tall, bars inset from y + 0.1
        for path in coll.get_paths():
            e = path.get_extents()
            bars.append(Bar(rows[int(np.floor(e.y0))], kind, e.x0 / per_s, e.x1 / per_s, (e.y1 - e.y0) / band))
    labels = [(rows[int(np.floor(t.get_position()[1]))], t.get_position()[0] / per_s, int(t.get_text()))
              for t in ax.texts]
    return Drawn(bars, labels, window / px_width)


def drawn(result, ranks="all", px_width: int | None = None) -> Drawn:
    """``result``'s timeline as :func:`sim.outputs.timeline.draw` draws it; ``px_width``:
    as if the plot were that many pixels wide (default: the PNG's)."""
    fig, ax = plt.subplots(figsize=(14, 6))
    saved = timeline.PX_WIDTH
    try:
        timeline.PX_WIDTH = px_width or saved
        draw(ax, result, ranks, legend=False)
        return read(ax, float(result.spans.end_s.max()), timeline.PX_WIDTH)
    finally:
        timeline.PX_WIDTH = saved
        plt.close(fig)


def pipeline(schedule: str, *over: str):
    return simulate(load_scenario(str(PIPELINE), [f"parallel.schedule={schedule}", *over]))


def slack(iv: np.ndarray, px: float, bars: int) -> float:
    """How much wider than spans ``iv`` (a row's, of any colour) their bars of one colour may
    be drawn: a bar is at least a pixel wide and gaps under a pixel are closed, so each bar
    and each span or gap narrower than a pixel adds at most one pixel; never narrower."""
    iv = np.asarray(iv, dtype=float).reshape(-1, 2)
    merged = union(iv)
    gaps = int((merged[1:, 0] - merged[:-1, 1] < px).sum()) if len(merged) > 1 else 0
    return px * (bars + int((iv[:, 1] - iv[:, 0] < px).sum()) + gaps)


def compute_spans(result, rank: int) -> np.ndarray:
    sp = result.spans
    return sp.loc[(sp["rank"] == rank) & (sp.category == "compute"), ["start_s", "end_s"]].to_numpy()


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """Megatron-LM's non-interleaved 1F1B order on ``stage`` (forward_backward_pipelining_
    without_interleaving): min(p - stage - 1, m) warm-up forwards, then one forward and one
    backward each, then the remaining backwards."""
    warm = min(p - stage - 1, m)
    order = [("forward", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("forward", warm + i), ("backward", i)]
    return order + [("backward", i) for i in range(m - warm, m)]


def gpipe(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    return [("forward", i) for i in range(m)] + [("backward", i) for i in range(m)]


@pytest.fixture(scope="module")
def runs():
    return {name: pipeline(name) for name in ("1f1b", "gpipe")}


@pytest.mark.parametrize("schedule, order", [("1f1b", one_f_one_b), ("gpipe", gpipe)])
def test_compute_blocks_follow_the_schedule(runs, schedule, order):
    """Stage s's compute row shows forward (light) and backward (dark) blocks in exactly the
    schedule's order, each numbered with its micro-batch; 4 stages, 8 micro-batches."""
    r = runs[schedule]
    d = drawn(r)
    p, m = r.scenario.parallel.pp, r.scenario.training.global_batch // r.scenario.training.micro_batch
    for stage in range(p):
        assert d.blocks(d.row(stage)) == order(p, m, stage)


def test_full_recompute_stays_inside_the_backward_blocks():
    """Recomputation is drawn as part of the backward pass (the legend's 'bwd (and
    recompute)'): the same blocks as without it, and the backward colour's width grows by the
    recomputed time of the metrics breakdown."""
    r = pipeline("1f1b", "training.recompute=full", "training.global_batch=4")
    d = drawn(r, px_width=FINE)
    step = float(r.spans.end_s.max())
    for stage in range(4):
        row = d.row(stage)
        assert d.blocks(row) == one_f_one_b(4, 4, stage)
        parts = rank_breakdown(r.spans, stage, step)
        assert parts["compute_recompute"] > 0.2 * parts["compute_forward"]
        # drawn bars are never narrower than the spans, and at most slack() wider
        bwd = d.width(row, "backward")
        assert parts["compute_backward"] + parts["compute_recompute"] <= bwd + 1e-12
        tol = slack(compute_spans(r, stage), d.px, len(d.of(row, "backward")))
        assert bwd <= parts["compute_backward"] + parts["compute_recompute"] + tol


def test_forward_and_backward_widths_are_the_breakdowns(runs):
    """The light and dark bars of a row cover what the metrics breakdown calls forward and
    backward compute; grey (the per-step ops: the gradient buffer's memset first, the
    gradient norm and the optimizer last, sim/parallel/step_end.py) is what it calls the
    optimizer, and its last bar ends the rank's compute."""
    r = runs["1f1b"]
    d = drawn(r, px_width=FINE)
    step = float(r.spans.end_s.max())
    for stage in range(4):
        row, parts = d.row(stage), rank_breakdown(r.spans, stage, step)
        for kind, want in (("forward", parts["compute_forward"]), ("backward", parts["compute_backward"])):
            got = d.width(row, kind)
            tol = slack(compute_spans(r, stage), d.px, len(d.of(row, kind)))
            assert want <= got + 1e-12 and got <= want + tol, (stage, kind)
        bars = d.of(row, *COMPUTE)
        last = max(bars, key=lambda b: b.x1)
        mine = r.spans[(r.spans["rank"] == stage) & (r.spans.category == "compute")]
        assert last.kind == "compute" and last.x1 == pytest.approx(mine.end_s.max(), rel=1e-9)
        grey = [b for b in bars if b.kind == "compute"]
        assert sum(b.x1 - b.x0 for b in grey) == pytest.approx(parts["compute_optimizer"], rel=1e-9)
        memset = mine[mine.name == "zero_grad"]  # the first optimizer-phase op, once its host issued it
        prog = next(p for p in r.facts.programs if p.rank == stage)
        assert min(b.x0 for b in grey) == prog.release()[int(memset.op.iloc[0])] and len(grey) <= 3


def test_hatched_idle_is_the_compute_streams_gaps_and_the_bubble(runs):
    """Hatch covers exactly the time a rank's compute stream is idle: before stage s's
    first forward, the s upstream forwards (the pipeline fill); over all ranks, hatch minus
    the exposed-communication strip, per step, is the summary's bubble_fraction."""
    for r in runs.values():
        d = drawn(r)
        step = float(r.spans.end_s.max())
        share, widened, starts = [], 0.0, []
        for stage in range(4):
            row = d.row(stage)
            mine = r.spans[(r.spans["rank"] == stage) & (r.spans.category == "compute")]
            busy = union(mine[["start_s", "end_s"]].to_numpy())
            hatch = d.of(row, "idle")
            memset = mine[mine.name == "zero_grad"]  # the memset opens the step (step_end.py)
            opened = float(memset.end_s.iloc[0])
            first = mine[mine.phase == "forward"].start_s.min()
            starts.append(first)
            # hatched from 0 until the memset starts: the host issuing the first op (sim/model/host.py)
            prog = next(p for p in r.facts.programs if p.rank == stage)
            assert busy[0, 0] == prog.release()[int(memset.op.iloc[0])] > 0
            assert hatch[0].x0 == 0.0 and hatch[0].x1 == pytest.approx(busy[0, 0], rel=1e-9)
            if stage:  # the fill: hatched from the memset until this stage's first forward
                fill = [b for b in hatch if b.x0 == pytest.approx(opened, rel=1e-9)]
                assert len(fill) == 1 and fill[0].x1 == pytest.approx(first, rel=1e-9)
            else:
                assert first >= opened
            assert sum(b.x1 - b.x0 for b in hatch) == pytest.approx(step - length(busy), rel=1e-9)
            red = d.of(row, "exposed")
            share.append((sum(b.x1 - b.x0 for b in hatch) - d.width(row, "exposed")) / step)
            widened += len(red) * d.px / step
        assert starts == sorted(starts) and len(set(starts)) == 4  # each stage waits for the one before
        bubble = r.summary["bubble_fraction"]
        assert bubble > 0.2
        # exposed strips are widened to at least a pixel: drawn hatch - red <= true bubble
        assert np.mean(share) <= bubble + 1e-12 and np.mean(share) >= bubble - widened / 4


def test_exposed_strip_of_the_critical_rank_is_the_summarys_exposed_comm():
    """The red strip under the critical rank's compute row is as wide as the summary's
    exposed_comm_s: each exposed interval is drawn as one bar widened to at least one pixel,
    so the drawn total lies in [exposed, exposed + bars * pixel]."""
    r = simulate(load_scenario(str(ROOT / "scenarios" / "straggler-dp.toml")))
    step = float(r.spans.end_s.max())
    crit = int(critical_rank(rank_times(r.spans, step))["rank"])
    d = drawn(r)
    row = d.row(crit)
    want = r.summary["exposed_comm_s"]
    got, n = d.width(row, "exposed"), len(d.of(row, "exposed"))
    assert want > 0 and n >= 1
    assert want <= got + 1e-12 and got <= want + n * d.px
    waiting = d.row(0)  # a rank that waits for the straggler shows much more exposed time
    assert d.width(waiting, "exposed") > 5 * want


def test_interleaved_chunks_have_their_own_shades():
    """Under interleaved 1F1B a rank holds two model chunks: blocks of the second are drawn
    in the paler shades, and per micro-batch and chunk the forward comes before the backward."""
    r = pipeline("interleaved", "parallel.virtual_stages=2")
    d = drawn(r)
    for stage in range(4):
        blocks = d.blocks(d.row(stage))
        kinds = {k for k, _ in blocks}
        assert kinds == set(MODEL)
        for mb in range(8):
            mine = [k for k, i in blocks if i == mb]
            assert mine.index("forward") < mine.index("backward")
            assert mine.index("forward2") < mine.index("backward2")
            assert sorted(mine) == sorted(MODEL)


def test_rl_timeline_shows_each_training_step_and_the_generating_engines():
    """``clustersim rl --timeline``: the trainer pool's row draws every training step as a
    forward block then a backward block (numbered with the step) in the shares of the
    trainer's simulated step, and each generator engine's row is in the forward colour
    exactly while the engine generates."""
    from sim.rl import exports
    from sim.rl.run import simulate_rl

    res = simulate_rl(load_scenario(str(ROOT / "scenarios" / "rl-llama3-8b-h100.toml"), ["rl.steps=3"]))
    result = exports.as_result(res)
    d = drawn(result, sorted(result.spans["rank"].unique().tolist()), px_width=FINE)
    row, steps = d.row(0), res.loop.steps
    blocks = [b for b in d.blocks(row) if b[0] in MODEL]
    assert blocks == [(k, s.step) for s in steps for k in ("forward", "backward")]
    fwd, bwd = res.loop.trainer.phase_shares()
    busy = sum(s.end - s.start for s in steps)
    for kind, share in (("forward", fwd), ("backward", bwd)):
        got, tol = d.width(row, kind), slack(compute_spans(result, 0), d.px, len(d.of(row, kind)))
        assert share * busy <= got + 1e-9 and got <= share * busy + tol
    wall, shown = res.summary["wall_s"], d.rows()
    engines = [g for g in exports.shown_engines(res.loop.generators) if g.gpus[0] in shown]
    assert len(engines) >= 2  # the rows that fit
    for g in engines:
        gen = [(a, wall if b is None else min(b, wall)) for a, b, kind, *_ in g.segments if kind == "generate"]
        want = length(union(np.array(gen, dtype=float).reshape(-1, 2)))
        row = d.row(g.gpus[0])
        got, tol = d.width(row, "forward"), slack(compute_spans(result, g.gpus[0]), d.px, len(d.of(row, "forward")))
        assert want > 0 and want <= got + 1e-9 and got <= want + tol
