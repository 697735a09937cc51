"""Training campaigns (issue 19): the failure table's derivation, checkpoint sizes, the
vectorised simulation against an event-by-event SimPy oracle on the same draws, the closed
forms (Young/Daly optimum, expected wall time, lost work per failure), the Llama 3 405B
reproduction, determinism and the CLI's exit-2 cases.

Run: ``python -m pytest -q tests/test_campaign.py``
"""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import simpy

from conftest import assert_input_error, clustersim
from sim import load_scenario
from sim.cli import main
from sim.campaign import study
from sim.campaign.build import Options, build
from sim.campaign.checkpoint import CheckpointCost, checkpoint_size, daly_interval, young_interval
from sim.campaign.failures import (HARDWARE, PLANNED, REFERENCE_DEVICES, SOFTWARE, WINDOW_HOURS, Fleet,
                                   derived_rate, load_table)
from sim.campaign.trials import Campaign, default_draws, expected_wall_s, run
from sim.model.transformer import dims, total_params

LLAMA = "scenarios/llama3-405b-16k-h100.toml"
SMALL = "scenarios/llama3-8b-fsdp-h100.toml"  # 64 GPUs, 8 nodes
LLAMA_STEP_S = 9.844  # `clustersim run scenarios/llama3-405b-16k-h100.toml`: 9.8437 s


def one_class(rate_per_s: float, kind: int = SOFTWARE, **fields) -> Campaign:
    """A campaign with a single failure class and an injected step time."""
    base = dict(step_s=60.0, steps=20_000, interval=27, ckpt=CheckpointCost(60.0, 0.0, 30.0, 60.0),
                rates=np.array([rate_per_s]), kinds=np.array([kind]), detect_s=60.0, restart_s=300.0)
    return Campaign(**{**base, **fields})


# ---------------------------------------------------------------- the failure table

def test_default_table_is_the_llama3_table_and_its_rates_are_derived():
    table = load_table()
    counts = {r.cause: r.count for r in table.rows}
    assert sum(counts.values()) == 466 and counts["Planned Maintenance"] == 47  # section 3.3.4
    assert counts["Faulty GPU"] == 148 and counts["GPU HBM3 Memory"] == 72 and counts["Network Switch/Cable"] == 35
    for r in table.rows:
        assert r.rate_per_device_hour == pytest.approx(derived_rate(r.count, r.scales_with), rel=1e-6), r.cause
    reference = Fleet(REFERENCE_DEVICES["gpu"], REFERENCE_DEVICES["node"])
    assert table.rates(reference).sum() * WINDOW_HOURS * 3600 == pytest.approx(466, rel=1e-6)
    hardware = sum(r.count for r in table.rows if r.kind == "hardware" and r.category != "Unplanned Maintenance")
    assert hardware / 419 == pytest.approx(0.773, abs=0.001)  # the paper's "about 78%" hardware


def test_rates_scale_with_what_each_class_scales_with():
    table = load_table()
    small, big = table.rates(Fleet(1024, 128)), table.rates(Fleet(8192, 1024))
    scales = np.array([r.scales_with for r in table.rows])
    assert np.allclose(big[scales == "gpu"], 8 * small[scales == "gpu"])
    assert np.allclose(big[scales == "node"], 8 * small[scales == "node"])
    assert np.array_equal(big[scales == "job"], small[scales == "job"])


# ---------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("overrides", [[], ["parallel.dp=8", "parallel.tp=8", "parallel.zero=1"],
                                       ["parallel.dp=16", "parallel.pp=4", "parallel.zero=0"]])
def test_checkpoint_holds_14_bytes_per_parameter_whatever_the_layout(overrides):
    s = load_scenario(SMALL, overrides)
    ckpt = checkpoint_size(s)
    assert ckpt.total_bytes == pytest.approx(14 * total_params(dims(s.model), s.model.tied_embeddings), rel=1e-5)
    assert ckpt.per_gpu_bytes >= ckpt.total_bytes / s.cluster.gpus


def test_llama3_checkpoint_per_gpu_is_in_the_papers_range():
    ckpt = checkpoint_size(load_scenario(LLAMA))
    assert 5.6e12 < ckpt.total_bytes < 5.8e12
    assert 1e6 < ckpt.per_gpu_bytes < 4e9  # "1 MB to 4 GB per GPU" (Llama 3 paper, section 3.3.1)


# ---------------------------------------------------------------- the oracle

def oracle(c: Campaign, gaps: np.ndarray, classes: np.ndarray) -> tuple[float, int, np.ndarray]:
    """Event by event in SimPy: each step, snapshot and write-wait is a timeout, a failure an
    interrupt at the cumulative sum of the gaps. Returns (wall, interruptions, by class)."""
    env = simpy.Environment()
    st = {"done": 0, "durable": 0, "writes": [], "wall": None, "hw_ready": 0.0, "count": 0,
          "by": np.zeros(len(c.rates), dtype=int), "pool": None if c.spares is None else [0.0] * c.spares}

    def train():
        st["done"], st["writes"], write_end = st["durable"], [], None
        while True:
            for _ in range(c.interval):
                yield env.timeout(c.step_s)
                st["done"] += 1
                if st["done"] == c.steps:
                    return
            if write_end is not None and write_end > env.now:
                yield env.timeout(write_end - env.now)  # the previous write must end first
            yield env.timeout(c.ckpt.stall_s)
            write_end = env.now + c.ckpt.write_s
            st["writes"].append((write_end, st["done"]))

    def node_at(now):
        if st["pool"] is None:
            return now
        pool = sorted(st["pool"] + [now + c.repair_s])
        st["pool"] = pool[1:]
        return pool[0]

    def down(cls, running):
        while True:
            st["count"] += 1
            st["by"][cls] += 1
            kind = c.kinds[cls]
            lead = (c.ckpt.save_s if running else 0.0) if kind == PLANNED else c.detect_s
            if kind == HARDWARE:
                st["hw_ready"] = max(st["hw_ready"], node_at(env.now))
            up = max(env.now + lead, st["hw_ready"]) + c.restart_s + c.ckpt.load_s
            try:
                yield env.timeout(up - env.now)
                return
            except simpy.Interrupt as failure:
                cls, running = failure.cause, False

    def job():
        try:
            yield env.timeout(c.restart_s)  # first launch
        except simpy.Interrupt as failure:
            yield from down(failure.cause, False)
        while True:
            try:
                yield from train()
                st["wall"] = env.now
                return
            except simpy.Interrupt as failure:
                kept = [s for end, s in st["writes"] if end <= env.now]
                planned = c.kinds[failure.cause] == PLANNED
                st["durable"] = st["done"] if planned else max(kept, default=st["durable"])
                yield from down(failure.cause, True)

    def failures(proc):
        for gap, cls in zip(gaps, classes):
            yield env.timeout(gap)
            if st["wall"] is not None:
                return
            proc.interrupt(int(cls))

    proc = env.process(job())
    env.process(failures(proc))
    env.run()
    return st["wall"], st["count"], st["by"]


def recorded_draws(c: Campaign, log: list):
    draw = default_draws(c)

    def replay(rng, n):
        gaps, classes = draw(rng, n)
        log.append((gaps, classes))
        return gaps, classes

    return replay


MIXED = dict(step_s=10.0, steps=6_000, interval=20, rates=np.array([1 / 7200, 1 / 18000, 1 / 36000]),
             kinds=np.array([HARDWARE, SOFTWARE, PLANNED]), detect_s=60.0, restart_s=300.0)


@pytest.mark.parametrize("ckpt, spares", [(CheckpointCost(1.0, 50.0, 30.0, 51.0), 1),  # async, one spare
                                          (CheckpointCost(25.0, 0.0, 25.0, 25.0), None)])  # sync, no pool limit
def test_vectorised_trials_equal_the_event_by_event_oracle(ckpt, spares):
    c = Campaign(**MIXED, ckpt=ckpt, spares=spares, repair_s=3 * 3600.0)
    log = []
    out = run(c, 8, seed=3, draws=recorded_draws(c, log))
    gaps = np.array([g for g, _ in log])
    classes = np.array([k for _, k in log])
    assert out.interruptions.sum() > 40 and (spares is None or out.waits.sum() > 0)  # the pool was exhausted
    for i in range(8):
        wall, count, by = oracle(c, gaps[:, i], classes[:, i])
        assert out.wall_s[i] == pytest.approx(wall, rel=1e-9)
        assert out.interruptions[i] == count and np.array_equal(out.by_cause[i], by)


# ---------------------------------------------------------------- closed forms

def test_mean_wall_time_matches_dalys_closed_form():
    for k in (7, 27, 108):
        c = one_class(1 / 21600, interval=k)
        o = run(c, 400, seed=1)
        assert o.wall_s.mean() == pytest.approx(expected_wall_s(c), rel=0.004), k


def test_best_interval_is_young_daly_within_the_discretisation():
    c = one_class(1 / 21600)  # M = 6 h, C = 60 s, one step = 60 s
    young = young_interval(c.ckpt.stall_s, 21600)  # 1,610 s = 26.8 steps
    daly = daly_interval(c.ckpt.stall_s, 21600)  # 1,570 s = 26.2 steps
    exact = min(range(1, 300), key=lambda k: expected_wall_s(dataclasses.replace(c, interval=k)))
    assert abs(exact - young / c.step_s) <= 1 and abs(exact * c.step_s - daly) <= c.step_s
    grid = [max(1, round(exact * f)) for f in (0.25, 0.5, 1, 2, 4)]
    walls = [run(dataclasses.replace(c, interval=k), 300, seed=2).wall_s.mean() for k in grid]
    assert int(np.argmin(walls)) == 2  # the simulated optimum (same draws at every interval)


def test_lost_work_per_failure_is_half_an_interval_plus_overheads():
    c = one_class(1 / 21600, steps=100_000, interval=15, ckpt=CheckpointCost(30.0, 0.0, 30.0, 30.0))
    o = run(c, 100, seed=4)
    lam, cycle = 1 / 21600, c.cycle_s  # 930 s
    running = (o.interruptions - o.during_restart).sum()
    lost = o.lost_s.sum() / running
    assert lost == pytest.approx(1 / lam - cycle / math.expm1(lam * cycle), rel=0.02)  # truncated exponential
    assert lost == pytest.approx(cycle / 2, rel=0.02)
    down = (o.down_s.sum() - 100 * c.restart_s) / running  # less each trial's first launch
    assert down == pytest.approx(math.expm1(lam * c.restart_cost_s) / lam, rel=0.02)  # restarts can fail too
    assert lost + down == pytest.approx(cycle / 2 + c.restart_cost_s, rel=0.02)


def test_async_checkpoints_win_when_storage_is_slow():
    sync = one_class(1 / 21600, interval=10, ckpt=CheckpointCost(300.0, 0.0, 300.0, 300.0))
    async_ = dataclasses.replace(sync, ckpt=CheckpointCost(5.0, 300.0, 300.0, 305.0))
    assert run(async_, 50, 0).wall_s.mean() < 0.9 * run(sync, 50, 0).wall_s.mean()


def test_spares_shorten_the_waits():
    table = load_table()
    rates = table.rates(Fleet(16384, 2048))
    c = Campaign(LLAMA_STEP_S, 100_000, 26, CheckpointCost(2.84, 0.0, 2.84, 2.84), rates, table.kinds, 120.0, 600.0)
    walls = [run(dataclasses.replace(c, spares=n, repair_s=24 * 3600.0), 50, 0).wall_s.mean() for n in (4, 8, 64)]
    assert walls[0] > 1.02 * walls[1] > 1.02 * walls[2]  # ~6.6 nodes in repair on average
    assert walls[2] == run(c, 50, 0).wall_s.mean()  # 64 spares never run out: as if unbounded


# ---------------------------------------------------------------- Llama 3 405B

@pytest.fixture(scope="module")
def llama3():
    """The default campaign on the 16k-GPU scenario for ~54 days, with the simulated step time."""
    c, facts = build(load_scenario(LLAMA), LLAMA_STEP_S, Options(tokens=7.3e12))
    return c, facts, run(c, 200, seed=0)


def test_llama3_interruptions_match_the_paper_by_cause(llama3):
    c, _, o = llama3
    days = o.wall_s / 86400
    assert days.mean() == pytest.approx(54, abs=1.5)
    assert np.mean(o.interruptions / days) == pytest.approx(466 / 54, rel=0.01)  # 8.6 per day
    per_54_days = o.by_cause.sum(axis=0) / days.sum() * 54
    for row, n in zip(load_table().rows, per_54_days):
        assert abs(n - row.count) < 4 * math.sqrt(row.count / len(days)) + 0.2, row.cause


def test_llama3_effective_training_time_is_above_90_percent(llama3):
    c, facts, o = llama3
    ettr = c.steps * c.step_s / o.wall_s
    assert ettr.mean() > 0.90 and np.percentile(ettr, 10) > 0.895
    assert c.interval * c.step_s == pytest.approx(facts.young_s, abs=c.step_s / 2)  # the default interval


# ---------------------------------------------------------------- the command line

def campaign_cli(*args, scenario=SMALL):
    return clustersim("campaign", scenario, "--tokens", "2e9", "--step-time-s", "1.5", *args)


def test_same_seed_same_json_other_seed_other_json(capsys):
    outputs = []
    for extra in ([], [], ["--seed", "7"]):
        assert main(["campaign", SMALL, "--tokens", "2e9", "--step-time-s", "1.5", "--json", "--trials", "30",
                     *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]
    s = json.loads(outputs[0])
    assert {"days", "ettr", "interruptions", "interruptions_by_cause", "gpu_hours", "p10", "p50", "p90"} <= s.keys()
    assert "cost_usd" not in s and s["p10"] <= s["p50"] <= s["p90"]


HEADER = "cause,kind,scales_with,rate_per_device_hour\n"


@pytest.mark.parametrize("args, key", [
    (["--tokens", "-1"], "--tokens"), (["--storage-gbps", "0"], "--storage-gbps"),
    (["--spares", "9"], "--spares"), (["--restart-min", "nan"], "--restart-min"), (["--trials", "0"], "--trials"),
    (["--repair-hours", "5"], "--repair-hours"), (["--plot-run", "x.svg"], "--plot-run"),
    (["--restart-min", "1e5"], "--restart-min"), (["--seed", "-1"], "--seed"),
    (["--failures", HEADER + "GPU,hardware,gpu,1e-6\nbug,software,job,-0.01\n"],
     "--failures row 2 column rate_per_device_hour"),
    (["--failures", HEADER + "GPU,hardware,gpu,nan\n"], "--failures row 1 column rate_per_device_hour"),
    (["--failures", HEADER + "GPU,hardware,rack,1e-6\n"], "--failures row 1 column scales_with"),
    (["--failures", "cause,kind,scales_with,rate_per_device_hour,mtbf\nGPU,hardware,gpu,1e-6,3\n"],
     "--failures column mtbf"),
])
def test_bad_input_exits_2_naming_the_key(args, key, tmp_path, capsys):
    if args[0] == "--failures":
        (tmp_path / "table.csv").write_text(args[1])
        args = ["--failures", str(tmp_path / "table.csv")]
    code = main(["campaign", SMALL, "--tokens", "2e9", "--step-time-s", "1.5", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and key in err, err


@pytest.mark.parametrize("args, key", [(["--storage-gbps", "0"], "--storage-gbps"), (["--spares", "9"], "--spares"),
                                       (["--failures", "sim/data/README.md"], "--failures")])
def test_bad_input_through_the_console_exits_2(args, key):
    assert_input_error(campaign_cli(*args), key)


@pytest.mark.parametrize("args, key", [
    (["--tokens", "2e14", "--trials", "100000"], "--trials"),  # ~14,600 rounds x 1e5 trials: ~590 s
    (["--tokens", "2.5e16", "--trials", "100"], "--tokens"),  # issue 30: 302 s; ~1.8M rounds
])
def test_a_campaign_past_the_work_budget_is_refused_naming_what_drives_it(args, key):
    proc = clustersim("campaign", LLAMA, "--step-time-s", "9.84", *args)
    assert_input_error(proc, key)
    assert "--force" in proc.stderr


@pytest.mark.slow  # a timing test (CPU of this machine, now 3.4x under the estimate at 3,000 trials): bench/campaign.py
def test_the_campaign_cost_estimate_follows_measured_cpu():
    """A measured point of the trials loop against :func:`cpu_seconds` (within 3x: the
    machine's load varies, what matters is that rounds x trials is what grows)."""
    import time
    from sim.campaign.trials import cpu_seconds, run

    c, _ = build(load_scenario(LLAMA), LLAMA_STEP_S, Options(tokens=15e12))
    t0 = time.process_time()
    run(c, 3000, 0)
    took = time.process_time() - t0
    assert cpu_seconds(c, 3000) / 3 < took < 3 * cpu_seconds(c, 3000)


def test_a_run_that_cannot_finish_exits_2():
    proc = clustersim("campaign", LLAMA, "--tokens", "2e12", "--step-time-s", "9.8", "--spares", "0",
                      "--trials", "20")
    assert_input_error(proc, "--spares")


def test_end_to_end_with_a_simulated_step(tmp_path):
    run_png, interval_png = tmp_path / "run.png", tmp_path / "interval.png"
    proc = clustersim("campaign", SMALL, "--tokens", "5e10", "--trials", "20", "--gpu-hour-usd", "2.5", "--json",
                      "--plot-run", str(run_png), "--plot-interval", str(interval_png))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["cost_usd"] == pytest.approx(2.5 * s["gpu_hours"]) and 0 < s["ettr"] < 1
    assert s["gpu_hours"] == pytest.approx(64 * s["days"] * 24)
    assert sum(s["time_shares"].values()) == pytest.approx(1)
    for png in (run_png, interval_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert "simulating one step" in proc.stderr


# ---------------------------------------------------------------- the goodput-vs-scale study

def test_crossover_is_interpolated_in_log2_of_the_gpu_count():
    assert study.crossover([1, 2, 4], [0.1] * 3, [0.0, 0.05, 0.15]) == pytest.approx(2**1.5)
    assert study.crossover([1, 2], [0.1] * 2, [0.2, 0.3]) == 1 and study.crossover([1, 2], [0.1] * 2, [0, 0]) is None


def test_goodput_study_finds_failures_overtaking_communication():
    rows = pd.DataFrame({"gpus": [1024, 16384, 131072], "step_time_s": [9.83, 9.84, 9.87], "mfu": [0.276] * 3,
                         "exposed_comm_s": [0.82, 0.83, 0.86], "fits_in_memory": [False, True, True],
                         "error": [None] * 3})
    table, summary, notes = study.analyze(rows)
    default, fast = (table[table["variant"] == v] for v, _ in study.VARIANTS)
    assert np.all(np.diff(default["failure_loss"]) > 0) and np.all(fast["failure_loss"].values
                                                                    < default["failure_loss"].values)
    assert default["mtbf_h"].iloc[1] == pytest.approx(54 * 24 / 466, rel=1e-5)  # the reference fleet
    assert 1024 < summary["crossover_gpus"].iloc[0] < 131072 and notes
