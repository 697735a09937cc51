"""Chrome/Perfetto trace export: every span present, valid JSON, no overlap within a
thread, flows paired, link counters, the rank selector, the CLI."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_input_error, clustersim
from sim import load_scenario, simulate
from sim.input.load import scenario_from_dict
from sim.outputs.rank_selection import parse_ranks, select_ranks
from sim.outputs.trace import IDLE_MIN_S, chrome_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
PIPE = {"name": "trace-pipe", "model": {"layers": 8, "hidden": 1024, "heads": 8, "vocab": 4096},
        "training": {"seq_len": 1024, "global_batch": 8},
        "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"pp": 4, "tp": 2, "fold": False}}


@pytest.fixture(scope="module")
def pipe():
    return simulate(scenario_from_dict(PIPE), record_links=True)


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] not in ("idle", "host")]


def test_every_span_appears_with_its_start_and_duration(pipe):
    trace = chrome_trace(pipe, "all")
    got = {(e["args"]["op"], e["tid"] // 64, e["name"]): (e["ts"], e["dur"]) for e in x_events(trace)}
    sp = pipe.spans
    assert len(got) == len(sp)
    for r in sp.itertuples():
        ts, dur = got[(r.op, r.rank, r.name)]
        assert ts == pytest.approx(r.start_s * 1e6, rel=1e-9, abs=1e-9)
        assert dur == pytest.approx((r.end_s - r.start_s) * 1e6, rel=1e-9, abs=1e-9)


def test_trace_file_is_valid_json_nonempty_per_rank(pipe, tmp_path):
    path = tmp_path / "t.json"
    write_trace(pipe, str(path), "all")
    trace = json.loads(path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in range(8):
        assert f"rank {rank} compute" in names
        assert sum(1 for e in x_events(trace) if e["tid"] // 64 == rank) > 10
    cats = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert cats == {"compute", "tp", "pp", "idle", "dp", "host"}
    # dp = 1: no gradient collective; the one dp op is the step-end gradient-norm sync over tp x pp
    assert {e["name"] for e in x_events(trace) if e["cat"] == "dp"} == {"grad_norm_ar"}
    for rank in range(8):  # the host thread: what the rank's host issued, ending when it issued its last op
        host = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "host" and e["tid"] // 64 == rank]
        prog = next(p for p in pipe.facts.programs if p.rank == rank)
        assert f"rank {rank} host" in names and host[0]["ts"] == 0.0
        assert host[-1]["ts"] + host[-1]["dur"] == pytest.approx(prog.release()[-1] * 1e6, rel=1e-9)


def test_no_overlap_within_a_thread(pipe):
    by_thread = {}
    for e in chrome_trace(pipe, "all")["traceEvents"]:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for iv in by_thread.values():
        iv.sort()
        for (a0, a1), (b0, b1) in zip(iv, iv[1:]):
            assert b0 >= a1 - 1e-6 * max(1.0, a1)


def test_idle_fills_the_compute_gaps_of_a_pipeline(pipe):
    trace = chrome_trace(pipe, "all")
    step_us = pipe.summary["step_time_s"] * 1e6
    for rank in range(8):
        busy = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == rank * 64]
        total = sum(e["dur"] for e in busy)  # compute + idle cover the step on the compute thread
        assert total == pytest.approx(step_us, rel=1e-6, abs=IDLE_MIN_S * 1e6)  # (shorter gaps are not drawn)
        idle = sum(e["dur"] for e in busy if e["cat"] == "idle")
        assert idle > 0.1 * step_us  # four stages, eight micro-batches: bubble (p-1)/(m+p-1) = 27%


def test_pipeline_sends_flow_to_their_recvs(pipe):
    trace = chrome_trace(pipe, "all")
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    # 3 boundaries x 8 micro-batches x (activation + gradient) x 2 tp ranks
    assert len(starts) == 3 * 8 * 2 * 2
    for i, s in starts.items():
        assert ends[i]["ts"] >= s["ts"] and ends[i]["tid"] != s["tid"]


def test_flow_ends_sit_inside_the_send_and_the_recv(pipe):
    events = chrome_trace(pipe, "all")["traceEvents"]
    slices = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append(e)

    def enclosing(ev):
        return [x for x in slices.get((ev["pid"], ev["tid"]), []) if x["ts"] < ev["ts"] < x["ts"] + x["dur"]]

    flows = [e for e in events if e["ph"] in "sf"]
    assert flows
    for ev in flows:
        inside = enclosing(ev)
        assert len(inside) == 1  # binds to exactly one slice, strictly inside it
        assert inside[0]["name"].startswith("send" if ev["ph"] == "s" else "recv")


def test_link_counters_are_the_busiest_links_within_capacity(pipe):
    counters = [e for e in chrome_trace(pipe, "all")["traceEvents"] if e["ph"] == "C"]
    assert counters
    names = {e["name"] for e in counters}
    assert 1 <= len(names) <= 8
    assert all(0 <= e["args"]["util %"] <= 100 * (1 + 1e-6) for e in counters)
    assert max(e["args"]["util %"] for e in counters) > 50  # the busiest link is busy at some point
    # bytes under each counter track equal the bytes the network says the link carried
    from sim.outputs.trace import link_series

    totals = pipe.facts.link_bytes
    for lid, (t, r) in link_series(pipe).items():
        assert np.sum(r[:-1] * np.diff(t)) == pytest.approx(totals[lid], rel=1e-6)


def test_without_recording_there_are_no_counters():
    r = simulate(scenario_from_dict(PIPE))
    assert not [e for e in r.to_chrome_trace()["traceEvents"] if e["ph"] == "C"]


def test_rank_selector():
    assert parse_ranks("0,8,16-19", 32) == [0, 8, 16, 17, 18, 19]
    assert parse_ranks(" 3 , 1-2 ,3", 4) == [1, 2, 3]
    for bad in ("x", "5-2", "0,99", "-1", ",", "1-"):
        with pytest.raises(Exception) as e:
            parse_ranks(bad, 32)
        assert "--trace-ranks" in str(e.value)


def test_default_selection_of_a_16k_run_is_small_and_has_every_stage():
    r = simulate(load_scenario(str(ROOT / "scenarios" / "llama3-405b-16k-h100.toml")))
    ranks = select_ranks(r, None)
    layout = r.facts.layout
    assert {layout.coords(x)["pp"] for x in ranks} == set(range(16))
    assert len(ranks) <= 24
    trace = r.to_chrome_trace()
    assert trace["otherData"]["ranks_shown"] == ranks
    json.dumps(trace)  # serializable
    # a folded rank maps to the simulated rank of its stage
    assert select_ranks(r, "8191") == [x for x in r.facts.simulated_ranks if layout.coords(x)["pp"] == 7][:1]


def test_stragglers_and_faulty_nics_are_always_in_the_default_selection():
    from sim.input.scenario import LinkFault, Straggler

    s = load_scenario(str(ROOT / "scenarios" / "jitter-dp-1k.toml"))
    s = s.model_copy(update={"stragglers": [Straggler(ranks=[777], slowdown=1.2)],
                             "cluster": s.cluster.model_copy(update={"faults": [LinkFault(gpu_nic=500)]})})
    r = simulate(s, baseline=False)
    assert len(r.facts.simulated_ranks) > 100  # faults and stragglers switch folding off
    ranks = select_ranks(r, None)
    assert {777, 500} <= set(ranks) and len(ranks) <= 32


def test_folded_ranks_map_to_the_simulated_rank_they_equal():
    """Uneven expert loads: whole expert groups are simulated; a folded rank must map to
    the member at its own expert position, whose compute matches an unfolded run."""
    from sim.outputs.rank_selection import representative

    over = ["model.moe.skew=0.5", "parallel.dp=8", "parallel.pp=2", "parallel.ep=4"]
    path = str(ROOT / "scenarios" / "mixtral-small-ep-h100.toml")
    folded = simulate(load_scenario(path, over))
    exact = simulate(load_scenario(path, over + ["parallel.fold=false"]))
    assert len(folded.facts.simulated_ranks) < 16

    def compute(r, rank):
        sp = r.spans
        c = sp[(sp["rank"] == rank) & (sp.category == "compute")]
        return (c.end_s - c.start_s).to_numpy()

    loads = set()
    for rank in range(16):
        rep = representative(folded, rank)
        assert rep in folded.facts.simulated_ranks
        np.testing.assert_allclose(compute(folded, rep), compute(exact, rank), rtol=1e-9)
        loads.add(round(float(compute(exact, rank).sum()), 9))
    assert len(loads) > 2  # the ranks really differ: a wrong mapping would be caught


def test_cli_trace_and_selector(tmp_path):
    out = tmp_path / "t.json"
    p = clustersim("run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml", "--trace", str(out), "--trace-ranks", "0-1,8")
    assert p.returncode == 0, p.stderr
    trace = json.loads(out.read_text())
    assert trace["otherData"]["ranks_shown"] == [0, 8]  # ranks 1 and 0 share a timeline when folded
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert "identical ranks" in " ".join(names)  # a folded rank's thread says what it stands for
    assert [e for e in trace["traceEvents"] if e["ph"] == "C"]  # --trace records link use


@pytest.mark.parametrize("args, key", [(["--trace", "t.json", "--trace-ranks", "0,x"], "--trace-ranks"),
                                       (["--trace", "t.json", "--trace-ranks", "0-99"], "--trace-ranks"),
                                       (["--trace-ranks", "0"], "--trace-ranks"),
                                       (["--trace", "t.txt"], "--trace")])
def test_cli_bad_trace_flags_exit_2_with_one_line(args, key, tmp_path):
    p = clustersim("run", "scenarios/straggler-dp.toml", *[str(tmp_path / a) if a.startswith("t.") else a for a in args])
    assert_input_error(p, key)


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_cli_spans_round_trip(tmp_path, ext):
    import pandas as pd

    out = tmp_path / f"spans.{ext}"
    p = clustersim("run", "scenarios/straggler-dp.toml", "--spans", str(out), "--json")
    assert p.returncode == 0, p.stderr
    got = pd.read_csv(out) if ext == "csv" else pd.read_parquet(out)
    want = simulate(load_scenario(str(ROOT / "scenarios" / "straggler-dp.toml"))).spans
    assert list(got.columns) == list(want.columns) and len(got) == len(want)
    assert np.allclose(got.end_s - got.start_s, want.end_s - want.start_s, rtol=1e-12, atol=0)
    assert (got.name == want.name).all() and (got["rank"] == want["rank"]).all()
