"""PNG timelines: interval arithmetic (property tests), waits, row selection, PNGs for
small and 16k-GPU runs, `clustersim plot` (the gallery command: tests/test_output_folders.py)."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import assert_input_error, clustersim
from sim import load_scenario, simulate
from sim.outputs.metrics import subtract as _subtract, union as _union
from sim.outputs.timeline import _fit_ranks, _rows, _shown_ranks, exposed_comm, plot_timeline
from sim.outputs.timeline_rows import LANE_OVERLAP, MAX_ROWS, lanes, waits

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"

intervals = st.lists(st.tuples(st.integers(0, 100), st.integers(1, 20)), max_size=12).map(
    lambda xs: np.array([(a, a + w) for a, w in xs], dtype=float).reshape(-1, 2))


def covered(iv, t):
    return bool(((iv[:, 0] <= t) & (t < iv[:, 1])).any()) if len(iv) else False


@given(intervals, intervals)
@settings(max_examples=200, deadline=None)
def test_subtract_is_set_difference(a, b):
    ua, ub = _union(a), _union(b)
    diff = _subtract(ua, ub)
    assert (np.diff(diff, axis=0)[:, 0] > 0).all() if len(diff) > 1 else True
    for t in np.arange(0, 125, 0.5):
        assert covered(diff, t) == (covered(a, t) and not covered(b, t))


@pytest.fixture(scope="module")
def straggler():
    return simulate(load_scenario(str(ROOT / "scenarios" / "straggler-dp.toml")))


def test_waits_end_when_the_straggler_arrives(straggler):
    sp = straggler.spans
    from sim.outputs.rank_selection import representative

    w = waits(straggler, straggler.facts.simulated_ranks)  # folded: rank 3 and one for the 15 others
    waiting = {r for r, *_ in w}
    assert waiting and 3 not in waiting  # everyone waits but the straggler
    assert {representative(straggler, r) for r in range(16) if r != 3} == waiting
    slow_dp = sp[(sp["rank"] == 3) & (sp.category == "dp")]
    arrivals = set(np.round(slow_dp.start_s, 12))
    for rank, kind, a, b, stream in w:
        assert kind == "dp" and stream == "dp" and b > a and round(b, 12) in arrivals


def test_exposed_comm_of_a_waiting_rank_is_its_wait_for_the_straggler(straggler):
    sp = straggler.spans
    exp = exposed_comm(sp, 0)
    r0 = sp[sp["rank"] == 0]
    comp_end = r0[(r0.category == "compute") & (r0.phase != "optimizer")].end_s.max()
    dp_end = r0[r0.name == "dp_ar"].end_s.max()
    # (its wait for the straggler's slower optimizer at the step-end loss all-reduce is idle:
    # that span starts when the straggler arrives, sim/outputs/result.py)
    loss = r0[r0.name == "loss_ar"]
    slow_opt = sp[(sp["rank"] == 3) & (sp.name == "optimizer")].end_s.max()
    assert len(loss) == 1 and float(loss.start_s.iloc[0]) == pytest.approx(slow_opt, rel=1e-12)
    assert len(exp) == 2 and exp[0] == pytest.approx([comp_end, dp_end], rel=1e-12)
    assert exp[1] == pytest.approx([slow_opt, float(loss.end_s.iloc[0])], rel=1e-12)  # the sync's own transfer


def test_rows_fit_and_keep_the_straggler(straggler):
    ranks = _fit_ranks(straggler, list(range(16)))
    assert 3 in ranks and len(_rows(straggler, ranks)) <= MAX_ROWS and ranks[0] == 0


def _measure(iv):
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


@pytest.mark.parametrize("path, over", [("sim/studies/gallery_scenarios/fsdp-prefetch.toml", []),
                                        ("sim/studies/gallery_scenarios/pipeline.toml", []),
                                        ("scenarios/gpt-1.7b-ptd-interleaved-a100.toml", [])])
def test_streams_sharing_a_row_do_not_hide_each_other(path, over):
    r = simulate(load_scenario(str(ROOT / path), over))
    sp, step = r.spans, float(r.spans.end_s.max())
    split = 0
    for (rank, kind), g in sp[~sp.category.isin(["compute", "idle"])].groupby(["rank", "category"]):
        lane = lanes(g, step)
        assert set(lane) == set(g.stream)
        split += max(lane.values()) > 0
        busy = {st: _union(x[["start_s", "end_s"]].to_numpy()) for st, x in g.groupby("stream")}
        for a in busy:
            for b in busy:
                if a < b and lane[a] == lane[b]:
                    both = _measure(busy[a]) - _measure(_subtract(busy[a], busy[b]))
                    assert both <= max(LANE_OVERLAP[0] * min(_measure(busy[a]), _measure(busy[b])),
                                       LANE_OVERLAP[1] * step) + 1e-12
    if "fsdp" in path:  # all-gathers and reduce-scatters overlap: two rows
        assert split


def test_folded_ranks_are_drawn_as_their_representative():
    r = simulate(load_scenario(str(ROOT / "sim" / "studies" / "gallery_scenarios" / "fsdp-prefetch.toml")))
    assert r.facts.folded
    assert _shown_ranks(r, [5, 63]) == r.facts.simulated_ranks
    assert _shown_ranks(r, "5") == r.facts.simulated_ranks


def test_png_for_eight_ranks(tmp_path):
    r = simulate(load_scenario(str(ROOT / "sim" / "studies" / "gallery_scenarios" / "pipeline.toml")))
    out = tmp_path / "p.png"
    plot_timeline(r, str(out), "all")
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 20_000


def test_png_for_a_16k_gpu_run(tmp_path):
    r = simulate(load_scenario(str(ROOT / "scenarios" / "llama3-405b-16k-h100.toml")))
    out = tmp_path / "big.png"
    plot_timeline(r, str(out))
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 20_000


def test_cli_plot_and_run_timeline(tmp_path):
    p = clustersim("plot", "scenarios/straggler-dp.toml", "-o", str(tmp_path / "a.png"), "--ranks", "0-3",
                "--start-ms", "50", "--end-ms", "150")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG and "wrote" in p.stdout
    p = clustersim("run", "scenarios/straggler-dp.toml", "--timeline", str(tmp_path / "b.png"), "--json")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, key", [(["-o", "x.jpg"], "--out"), (["--ranks", "a"], "--ranks"),
                                       (["--start-ms", "9", "--end-ms", "3"], "--end-ms"),
                                       (["--start-ms", "-1"], "--start-ms")])
def test_cli_plot_bad_input_exits_2(args, key):
    p = clustersim("plot", "scenarios/straggler-dp.toml", *args)
    assert_input_error(p, key)
