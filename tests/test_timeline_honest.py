"""Timelines that do not mislead at full zoom (issue 31), read from what the picture draws:
the red exposed-communication area against the summary's exposed communication for
``clustersim plan --timeline`` (the README's planner example) and ``clustersim run
--timeline``, pixel columns that hold the share of time busy (never a span widened to a
pixel), the labels saying exactly which ranks a folded row stands for, the time unit, the
window named in the title, titles inside the figure, and a stream of a kind the timeline
does not know drawn as a row of its own.

Run: ``python -m pytest tests/test_timeline_honest.py``
"""

import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from conftest import assert_input_error, clustersim  # noqa: E402
from sim import load_scenario, simulate  # noqa: E402
from sim.outputs import timeline  # noqa: E402
from sim.outputs.metrics import critical_rank, rank_times, union  # noqa: E402
from sim.outputs.timeline_paint import pixel_bars, time_unit  # noqa: E402
from test_timeline_drawn import read  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def captured(monkeypatch):
    """Every timeline the code under test draws: (result, what its Axes show, the figure's
    titles and x labels), read before the figure is saved."""
    seen = []
    real_draw, real_figure = timeline.draw, timeline.timeline_figure

    def draw(ax, result, *a, **k):
        features = real_draw(ax, result, *a, **k)
        seen.append({"result": result, "ax": ax, "features": features})
        return features

    def figure(*a, **k):
        fig = real_figure(*a, **k)
        for item, ax in zip(seen[-len(fig.axes):], fig.axes):
            item["drawn"] = read(ax, item["features"]["window"][1] - item["features"]["window"][0],
                                 timeline.PX_WIDTH)
            item["title"], item["xlabel"] = ax.get_title(loc="left"), ax.get_xlabel()
            item["fits"] = _texts_inside(fig)
        return fig

    monkeypatch.setattr(timeline, "draw", draw)
    monkeypatch.setattr(timeline, "timeline_figure", figure)
    return seen


def _texts_inside(fig) -> bool:
    """No title, label or legend entry runs past the figure's right edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in (ax.title, ax._left_title, *ax.get_yticklabels()) if t.get_text()]
    texts += [t for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    return all(t.get_window_extent(renderer).x1 <= fig.bbox.x1 + 0.5 for t in texts)


def _red_area(item) -> tuple[float, float]:
    """(red strip area drawn on the critical rank's compute row, the summary's exposed comm)."""
    result = item["result"]
    step = float(result.spans.end_s.max())
    crit = int(critical_rank(rank_times(result.spans, step))["rank"])
    row = item["drawn"].row(crit)
    return item["drawn"].width(row, "exposed"), result.summary["exposed_comm_s"]


def test_plan_timeline_red_area_is_the_summarys_exposed_comm(tmp_path, captured):
    """``clustersim plan llama3.1-70b --gpus 1024 ... --timeline best.png`` (README): the
    winner of docs/out's stored run (tp 4, dp 256, zero 3, tp overlap) drawn by the plan
    command's own timeline code; its red area is within 10% of the summary's exposed comm."""
    from sim.commands.plan import _timeline
    from sim.plan import request

    req = request("llama3.1-70b", 1024, "dgx-h100", None, 8192, 8388608, None, [], None)
    best = dict(tp=4, pp=1, dp=256, cp=1, ep=1, expert_tp=4, virtual_stages=1, zero=3, schedule="1f1b",
                tp_comm_overlap=True, ep_comm_overlap=False, micro_batch=1, recompute="none")
    stored = (ROOT / "docs" / "out" / ("clustersim-plan-llama3.1-70b-gpus-1024-topology-dgx-h100-seq-len-8192-"
                                        "global-batch-tokens-8388608-out-plan.csv-timeline-best.png.out")).read_text()
    assert "best: tp 4 x pp 1 x dp 256 x cp 1, zero 3, recompute none, micro-batch 1, tp overlap" in stored
    out = tmp_path / "best.png"
    _timeline(req, types.SimpleNamespace(table=pd.DataFrame([best])), str(out), True)
    assert out.read_bytes()[:8] == PNG
    (item,) = captured
    got, want = _red_area(item)
    assert want > 0 and abs(got - want) <= 0.10 * want, (got, want)
    (rank,) = item["features"]["ranks"]  # one row of ranks: its tp row is as busy as its tp spans
    sp = item["result"].spans
    tp_busy = _busy(sp[(sp["rank"] == rank) & (sp.category == "tp")])
    assert tp_busy < 0.5 * item["features"]["step"]  # (the widened drawing looked ~100% busy)
    assert item["drawn"].width("tp", "tp") == pytest.approx(tp_busy, rel=1e-9)
    assert item["xlabel"] == "time (s)"  # a 6.8 s step: seconds, not 6,840 ms
    assert item["fits"]  # the long title is wrapped inside the figure


def test_run_timeline_red_area_is_the_summarys_exposed_comm(tmp_path, captured):
    """``clustersim run --timeline`` of an interleaved step whose exposed communication is a
    few ms in hundreds of sub-pixel gaps: the red area stays within 10% of the summary's
    (a strip widened to a pixel per gap drew several times as much)."""
    from sim.cli import main

    out = tmp_path / "t.png"
    assert main(["run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml", "--timeline", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    (item,) = captured
    got, want = _red_area(item)
    assert want > 0 and abs(got - want) <= 0.10 * want, (got, want)
    assert item["xlabel"] == "time (ms)" and item["fits"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 99), st.floats(0.001, 3)), min_size=1, max_size=40), st.floats(0.05, 2))
def test_pixel_columns_hold_the_time_busy(spans, px):
    """Drawn area (width x share of the band filled) is the covered time, at any pixel
    width; no bar is narrower than the spans' own extent nor widened beyond it."""
    iv = np.array([(a, a + w) for a, w in spans])
    x0, x1, fill = pixel_bars(iv, 0.0, 100.0, px)
    covered = union(iv)
    covered = np.clip(covered, 0, 100)
    want = float((covered[:, 1] - covered[:, 0]).sum())
    assert float(((x1 - x0) * fill).sum()) == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert ((fill > 0) & (fill <= 1)).all()
    assert ((x1 - x0)[fill < 1] == pytest.approx(px)) if (fill < 1).any() else True


def test_a_sub_pixel_barcode_is_a_column_filled_to_its_share():
    """Ten spans each a twentieth of a pixel in one pixel column: one bar a pixel wide, half
    full (not ten pixels of solid colour)."""
    px = 1.0
    iv = np.array([(0.1 * i, 0.1 * i + 0.05) for i in range(10)])
    x0, x1, fill = pixel_bars(iv, 0.0, 100.0, px)
    assert list(zip(x0, x1, fill)) == [(0.0, 1.0, pytest.approx(0.5))]


@pytest.mark.parametrize("lo, hi, unit", [(0, 1.5e-3, "us"), (0.2, 0.201, "us"), (0, 0.18, "ms"),
                                          (0, 4.9, "ms"), (0, 6.84, "s"), (0, 400.0, "s")])
def test_time_unit(lo, hi, unit):
    assert time_unit(lo, hi)[0] == unit


@pytest.fixture(scope="module")
def straggler():
    return simulate(load_scenario(str(ROOT / "scenarios" / "straggler-dp.toml")))


def test_folding_labels_say_which_ranks_each_row_stands_for(tmp_path, captured):
    """``clustersim run scenarios/straggler-dp.toml --timeline s.png --timeline-window
    100:100.5``: 16 ranks, rank 3 slow; rank 0's row stands for the 15 others exactly, the
    title says the rows cover all 16 and names the window, the axis is in microseconds."""
    from sim.cli import main

    assert main(["run", "scenarios/straggler-dp.toml", "--timeline", str(tmp_path / "s.png"),
                 "--timeline-window", "100:100.5"]) == 0
    (item,) = captured
    rows = item["drawn"].rows()
    assert rows[0] == "rank 0 (dp0) = ranks 0-2,4-15  compute"
    assert rows[3] == "rank 3 (dp3) SLOW  compute"
    assert "the rows stand for all 16 (2 simulated)" in item["title"]
    assert "window 100,000-100,500 us of the 198.1 ms step" in item["title"]  # the summary's (tests/golden/straggler-dp.json)
    assert item["xlabel"] == "time (us)" and item["fits"]


def _busy(sp) -> float:
    iv = union(sp[["start_s", "end_s"]].to_numpy())
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def test_a_stream_of_an_unknown_kind_gets_a_row_of_its_own(straggler):
    """A stream of a kind the timeline does not know ('marker' here; the host's issue spans,
    sim/outputs/host.py, came in this way) is drawn as a row of its own under each rank, its
    area its busy time, and is not counted as exposed communication."""
    import dataclasses

    sp = straggler.spans
    host = sp[sp.category == "compute"].copy()
    host["stream"], host["category"], host["name"] = "marker", "marker", "issue"
    host["end_s"] = host.start_s + 0.2 * (host.end_s - host.start_s)
    result = dataclasses.replace(straggler, spans=pd.concat([sp, host], ignore_index=True))
    fig, ax = plt.subplots(figsize=(14, 6))
    try:
        features = timeline.draw(ax, result, "all", legend=False)
        d = read(ax, float(sp.end_s.max()), timeline.PX_WIDTH, kinds=("marker",))
    finally:
        plt.close(fig)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels.count("marker") == len(features["ranks"]) == 2 and "marker" in features["kinds"]
    assert {b.row for b in d.bars if b.kind == "marker"} == {"marker"}
    got = sum((b.x1 - b.x0) * b.fill for b in d.bars if b.kind == "marker")
    want = sum(_busy(host[host["rank"] == r]) for r in features["ranks"])
    assert want > 0 and got == pytest.approx(want, rel=1e-9)
    for r in features["ranks"]:  # the red strip is what it was without the host stream
        exposed = timeline.exposed_comm(sp, r)
        assert features["exposed_s"][r] == pytest.approx(float((exposed[:, 1] - exposed[:, 0]).sum()), rel=1e-12)


@pytest.mark.parametrize("text, want", [("100:250", (0.1, 0.25)), ("0.1s:0.25s", (0.1, 0.25)),
                                        ("500us:", (5e-4, None)), (":20ms", (0.0, 0.02))])
def test_timeline_window_parses_units(text, want):
    from sim.outputs.timeline_paint import parse_window

    got = parse_window(text)
    assert got[0] == pytest.approx(want[0]) and (got[1] == pytest.approx(want[1]) if want[1] else got[1] is None)


@pytest.mark.parametrize("text", ["9:3", "abc", "5", "-1:3", "nan:1", "1:inf"])
def test_bad_timeline_window_is_one_line_naming_the_flag(text):
    from sim.errors import InputError
    from sim.outputs.timeline_paint import parse_window

    with pytest.raises(InputError, match="--timeline-window"):
        parse_window(text)


def test_cli_timeline_window_needs_a_timeline():
    """Checked before the simulation, exit 2 in one line."""
    assert_input_error(clustersim("run", "scenarios/straggler-dp.toml", "--timeline-window", "1:2"),
                       "--timeline-window")


def test_rl_timeline_title_counts_the_scenarios_gpus(tmp_path, captured):
    """``clustersim rl --timeline``: the title gives the cluster's GPU count (the shipped
    picture once said 24 for a 32-GPU scenario) and each pool's; here with 8 generator GPUs."""
    from sim.rl import exports
    from sim.rl.run import simulate_rl

    s = load_scenario(str(ROOT / "scenarios" / "rl-llama3-8b-h100.toml"), ["rl.steps=2", "rl.generator_gpus=8"])
    exports.plot(simulate_rl(s), str(tmp_path / "rl.png"))
    (item,) = captured
    title = " ".join(item["title"].split())
    assert s.cluster.gpus == 32
    assert "(16 trainer + 8 generator GPUs, 8 unused)" in title and "rl-llama3-8b-h100: 32 GPUs" in title
    assert item["fits"]
