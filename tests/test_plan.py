"""clustersim plan: the rules are the loader's (counted exactly), memory is the
simulator's, the estimate's closed forms hold, the ranking is deterministic, an
interrupted search resumes to the same table, and bad flags exit 2 naming the flag."""

import json
from pathlib import Path
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.parallel import pp as pipeline
from sim.parallel import workload
from sim.parallel.memory import peak_memory
from sim.plan import driver, fit, inputs, rules, space
from sim.plan.estimate import Estimator
from sim.plan.stages import Stages

from conftest import assert_input_error, cli_env, clustersim, small_plan_json

TINY = """
name = "tiny"
[model]
layers = 2
hidden = 256
heads = 2
vocab = 1000
[training]
seq_len = 1024
global_batch = 4
[cluster]
topology = "dgx-h100"
gpus = 8
"""
SMALL_MOE = """
name = "small-moe"
[model]
layers = 3
hidden = 512
heads = 8
kv_heads = 4
vocab = 2000
mlp = "swiglu"
[model.moe]
experts = 4
top_k = 2
shared_experts = 1
dense_layers = 1
[training]
seq_len = 1024
global_batch = 8
[cluster]
topology = "dgx-h100"
gpus = 8
"""


def _request(tmp_path, text: str, **flags):
    path = tmp_path / "base.toml"
    path.write_text(text)
    return inputs.request(str(path), flags.get("gpus"), None, flags.get("gpu"), None, None, flags.get("precision"),
                          flags.get("overrides"))


def _table(req):
    stages = Stages(req.scenario)
    c = space.enumerate_layouts(space.Space(req.gpus, req.spec.gpus_per_domain, stages.dims.layers,
                                            req.scenario.training.seq_len, stages.dims.experts))
    return c, rules.codes(c, rules.fixed_of(req.scenario)), stages


def test_rejection_counts_by_hand(tmp_path):
    """2 heads, 2 layers, 8 GPUs, 4 sequences of 1024 tokens. The space: tp 1/2/4/8, pp 1/2
    (v 1 only: pp * v <= 2 layers), cp 1 (1024 tokens hold one 1024-token CP shard),
    schedules 1f1b, gpipe, zb-h1, dualpipe with pp 2 -> meshes (tp, pp): (1,1) (1,2)x4 (2,1)
    (2,2)x4 (4,1) (4,2)x4 (8,1) = 16; knobs 4 zero x 3 recompute x 3 micro-batch = 36, x2
    with TP overlap when tp > 1: 5 x 36 + 11 x 72 = 972. tp 4 and 8 do not divide 2 heads:
    6 meshes x 72 = 432. Batch floor (4 < dp x mb): dp 8 all 36; dp 4 (tp1 pp2 x4, tp2 pp1)
    mb 2 and 4: 4 x 24 + 48; dp 2 (tp2 pp2 x4) mb 4: 4 x 24 -> 276. ZB-H1 and DualPipe with
    zero 3: tp1 pp2 (mb 1: 3 each) and tp2 pp2 (mb 1, 2: 12 each) -> 30. DualPipe's
    micro-batches (4 / (dp x mb) at most 2 < 2 pp = 4): the other 9 + 36 -> 45. Valid: the
    144 of 1F1B and GPipe and ZB-H1's 9 + 36, all fit."""
    req = _request(tmp_path, TINY)
    c, code, stages = _table(req)
    assert len(c) == 972
    assert rules.counts(code) == {"tp_heads": 432, "batch_floor": 276, "zero_bubble_fsdp": 30,
                                  "dualpipe_micro_batches": 45}
    valid = c[code == 0]
    assert len(valid) == 189
    assert (fit.peak(valid, stages, req.scenario) < fit.capacity(gpu_preset(req.gpu).hbm_bytes)).all()


@pytest.mark.parametrize("text,flags", [(TINY, {}), (SMALL_MOE, {}), (SMALL_MOE, {"precision": "fp8"})])
def test_rules_are_the_loaders(tmp_path, text, flags):
    """The loader itself, on every candidate: it raises exactly the key of the first rule the
    planner counts the candidate under, and accepts the ones the planner calls valid."""
    req = _request(tmp_path, text, **flags)
    c, code, _ = _table(req)
    for row, k in zip(c.to_dict("records"), code):
        try:
            scenario_from_dict(req.data, space.overrides(row))
            raised = None
        except InputError as exc:
            raised = exc.key
        expected = rules.REASONS[k - 1].key if k else None
        assert raised == expected, (row, rules.REASONS[k - 1].id if k else "valid")
    assert len(set(code)) >= (3 if text == TINY else 7)  # valid + the reasons: the cases exercise most rules


@pytest.mark.parametrize("text,flags", [(TINY, {}), (SMALL_MOE, {}), (SMALL_MOE, {"precision": "fp8"}),
                                        (TINY, {"precision": "fp8", "overrides": ["training.fp8_params=true"]}),
                                        (SMALL_MOE, {"overrides": ["model.moe.routing=token_choice"]})])
def test_memory_is_the_simulators(tmp_path, text, flags):
    """The planner's vectorized peak equals sim.parallel.memory.peak_memory on every valid
    candidate (bit for bit: the same pieces summed in the same order); on every 4th of the
    MoE case's, to keep the test short."""
    req = _request(tmp_path, text, **flags)
    c, code, stages = _table(req)
    valid = c[code == 0]
    mine = fit.peak(valid, stages, req.scenario)
    valid, mine = (valid, mine) if len(valid) < 500 else (valid.iloc[::4], mine[::4])
    domains = [r // 8 for r in range(req.gpus)]
    for row, got in zip(valid.to_dict("records"), mine):
        s = scenario_from_dict(req.data, space.overrides(row))
        assert got == peak_memory(workload.make_context(s, domains, req.gpu)).total, row


def test_peak_in_flight_is_the_schedules():
    for schedule, vs in (("gpipe", (1,)), ("1f1b", (1,)), ("interleaved", (2, 3))):
        for p in (1, 2, 4, 5):
            for v in vs:
                for m in (1, 2, 3, 4, 7, 8, 12):
                    for combined in (False, True):
                        for stage in range(p):
                            order = pipeline.order(schedule, p, v, m, stage, combined)
                            assert pipeline.peak_in_flight(schedule, p, v, m, stage, combined) == \
                                pipeline.in_flight(order)


def test_estimate_bubble_is_the_closed_form(tmp_path):
    """Balanced stages without data parallelism: the estimate's bubble is (p - 1) / v of one
    micro-batch's stage time on the GPU (Narayanan et al. 2021), the rest m of them; ZB-H1 a third of it
    ((p-1)(F+B-W) vs (p-1)(F+B+W), equal passes), DualPipe (p/2-1)(F&B+B-3W) = (p-2) F of
    1F1B's 3 (p-1) F, DualPipeV (2p/2-1) 2 half-stage F = (p-1) F of interleaved v = 2's
    3 (p-1) F / 2."""
    text = TINY.replace("layers = 2", "layers = 8").replace("global_batch = 4", "global_batch = 16") \
        .replace("gpus = 8", "gpus = 4")
    req = _request(tmp_path, text)
    c, code, stages = _table(req)
    pick = c[(code == 0) & (c.tp == 1) & (c.dp == 1) & (c.pp == 4) & (c.micro_batch == 1) & (c.zero == 0)
             & (c.recompute == "none") & (c.cp == 1)]
    est = Estimator(req.scenario, stages, req.spec, req.gpu).frame(pick)
    for (_, row), (_, e) in zip(pick.iterrows(), est.iterrows()):
        micro, p, v = 16, 4, row.virtual_stages
        share = {"zb-h1": 1 / 3, "dualpipe": (p - 2) / (3 * (p - 1)), "dualpipev": 2 / 3}.get(row.schedule, 1)
        # the slowest stage's GPU time: its host's waits are not in the fill and drain (a host behind
        # its GPU issues the first micro-batches while the stage waits for its input)
        per_micro = (e.est_compute_s + e.est_recompute_s + e.est_tp_s + e.est_cp_s) / micro
        assert e.est_bubble_s <= (p - 1) / v * share * per_micro * (1 + 1e-12)
        assert e.est_bubble_s >= (p - 1) / v * share * per_micro * 0.8  # first/last stages add the embedding, loss
    assert {"zb-h1", "dualpipe", "dualpipev"} <= set(pick.schedule)


def _plan(tmp_path, **kw):
    req = _request(tmp_path, SMALL_MOE)
    return req, driver.search(req, top=5, budget=kw.pop("budget", 30), workers=1, quiet=True, **kw)


def test_ranking_is_deterministic_and_every_layout_fits(tmp_path):
    req, a = _plan(tmp_path)
    _, b = _plan(tmp_path)
    cols = [k for k in a.table.columns if k not in ("sim_wall_s", "sim_cpu_s")]  # (timings)
    pd.testing.assert_frame_equal(a.table[cols], b.table[cols])
    assert a.simulated >= 5 and a.table["simulated"].iloc[:a.simulated].all()
    hbm = gpu_preset(req.gpu).hbm_bytes
    assert (a.table.memory_per_gpu_bytes <= fit.capacity(hbm)).all() and a.table.fits_in_memory.all()
    assert a.evaluated + sum(a.rejected.values()) == a.candidates
    assert a.rank_correlation is not None and -1 <= a.rank_correlation <= 1


def _cli_plan(cwd: Path, out: str, *extra) -> subprocess.Popen:
    (cwd / "base.toml").write_text(SMALL_MOE.replace("global_batch = 8", "global_batch = 512"))  # (~1 s a simulation: room to interrupt)
    return subprocess.Popen([sys.executable, "-m", "sim", "plan", "base.toml", "--out", out, "--workers", "1",
                             "--budget", "60", *extra], cwd=cwd, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # SIGINT as in a terminal: a test run started in the background (a non-interactive
                            # shell's `&`) inherits it ignored, and the child's Ctrl-C would then do nothing
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_interrupted_search_resumes_to_the_same_table(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    proc = _cli_plan(cut, "plan.csv")
    sims = cut / "plan.sims.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if sims.exists() and len(sims.read_text().splitlines()) >= 2:  # header + a simulation (of ~24, 0.1 s each)
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    interrupted = proc.returncode == 130
    assert interrupted or proc.returncode == 0, err
    resumed = _cli_plan(cut, "plan.csv", "--json", "--quiet")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert json.loads(out)["resumed"] >= 1  # what was simulated before the interrupt
    fresh = _cli_plan(whole, "plan.csv", "--quiet")
    assert fresh.communicate(timeout=300)[0] is not None and fresh.returncode == 0
    a, b = (pd.read_csv(d / "plan.csv").drop(columns=["sim_wall_s", "sim_cpu_s"]) for d in (cut, whole))
    pd.testing.assert_frame_equal(a, b)
    assert interrupted, "the search finished before it could be interrupted"


def test_json_has_the_contract_keys():
    out = small_plan_json()
    assert {"evaluated", "rejected", "layouts"} <= set(out)
    assert len(out["layouts"]) == 3 and out["layouts"][0]["simulated"]
    keys = {"tp", "pp", "dp", "cp", "ep", "expert_tp", "virtual_stages", "zero", "recompute", "micro_batch",
            "schedule", "step_time_s", "mfu", "memory_per_gpu_bytes", "fits_in_memory", "simulated"}
    assert all(keys <= set(layout) for layout in out["layouts"])
    steps = [layout["step_time_s"] for layout in out["layouts"]]
    assert steps == sorted(steps) and all(layout["fits_in_memory"] for layout in out["layouts"])


@pytest.mark.parametrize("args,flag", [
    (["--gpus", "12"], "--gpus"),  # not whole 8-GPU nodes
    (["--global-batch-tokens", "100000"], "--global-batch-tokens"),  # not whole 4096-token sequences
    (["--gpu", "a100-80gb", "--topology", "dgx-a100", "--precision", "fp8"], "--precision"),
    (["--set", "parallel.tp=2"], "--set"),
    (["--topology", "nowhere"], "--topology"),
    (["--top", "0"], "--top"),
    (["--headroom", "1.5"], "--headroom"),
    (["--out", "plan.txt"], "--out"),
    (["--gpus", "1000000000000000000"], "--gpus"),  # issue 30: a divisor search without end
    (["--gpus", "2097152"], "--gpus"),  # past the largest cluster (sim/bounds.py GPUS)
])
def test_bad_flags_exit_2_naming_the_flag(args, flag):
    base = {"--gpus": "16", "--topology": "dgx-h100", "--seq-len": "4096", "--global-batch-tokens": "262144"}
    for key, value in zip(args[::2], args[1::2]):
        base[key] = value
    argv = [x for kv in base.items() for x in kv if kv[0] != "--set"] + (["--set", base["--set"]] if "--set" in base else [])
    assert_input_error(clustersim("plan", "llama3.1-8b", *argv, "--budget", "0"), flag)


def test_sequences_shorter_than_a_cp_shard_still_plan_without_cp():
    """issue 30: --seq-len below 1,024 found no layout ("no layout of 0 fits"): cp = 1 is always a choice."""
    proc = clustersim("plan", "llama3.1-8b", "--gpus", "8", "--topology", "dgx-h100", "--seq-len", "512",
                      "--global-batch-tokens", "65536", "--top", "3", "--budget", "0", "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert {layout["cp"] for layout in json.loads(proc.stdout)["layouts"]} == {1}


def test_unknown_model_names_the_argument():
    assert_input_error(clustersim("plan", "no-such-model", "--gpus", "8", "--topology", "dgx-h100", "--seq-len", "8",
                                  "--global-batch-tokens", "64"), "MODEL_OR_SCENARIO")


def test_work_budget_refusals_are_counted_rejections(tmp_path, monkeypatch):
    """A pick sim.work.check refuses is a counted rejection (``work_budget``), left out of the
    table, never simulated, never a crash; the counts still add up to every candidate."""
    from sim import work

    from sim.sweeps import pool

    _, whole = _plan(tmp_path)
    monkeypatch.setattr(work, "BUDGET_S", 1e-9)  # every simulation is past it
    # the workers must see the patch: forked, not spawned (the pool spawns when another thread is
    # alive, which a test run earlier in this process may have left; CI of stop 45 hit it)
    monkeypatch.setattr(pool.threading, "active_count", lambda: 1)
    _, refused = _plan(tmp_path)
    assert refused.simulated == 0 and refused.rejected["work_budget"] == len(refused.refused) >= 5
    assert set(refused.refused) >= set(whole.table.position[whole.table.simulated].head(5))
    assert not set(refused.table.position) & set(refused.refused)
    assert refused.evaluated + sum(refused.rejected.values()) == refused.candidates
    assert all(why.startswith(("training.", "model.", "parallel.", "cluster.")) for why in refused.refused.values())


# issue 29: the planner on each new GPU and topology (bench/plan.py runs the large GB200 and MI355X searches)
NEW_PARTS = [("dgx-b200", "b200"), ("dgx-b200", "b300"), ("gb200-nvl72", "gb200"), ("gb300-nvl72", "gb300"),
             ("dgx-h800", "h800"), ("amd-xgmi", "mi300x"), ("amd-xgmi", "mi325x"), ("amd-xgmi", "mi355x")]


def test_plan_runs_on_every_new_gpu_and_topology():
    """Each search exits 0 with a simulated best layout that fits its GPU's memory, and its MFU is
    against that GPU's own peak: MFU x peak x step is the step's model FLOPs per GPU, which is the
    same on every part (same model, tokens and GPU count), so it must agree across the eight."""
    flops = {}
    for topology, gpu in NEW_PARTS:
        proc = clustersim("plan", "llama3.1-8b", "--gpus", "8", "--topology", topology, "--gpu", gpu,
                          "--seq-len", "4096", "--global-batch-tokens", "131072", "--top", "1", "--budget", "1",
                          "--workers", "1", "--json", "--quiet")
        assert proc.returncode == 0, (topology, gpu, proc.stderr)
        best = json.loads(proc.stdout)["layouts"][0]
        assert best["simulated"] and best["fits_in_memory"], (topology, gpu, best)
        assert best["memory_per_gpu_bytes"] <= gpu_preset(gpu).hbm_bytes
        assert 0 < best["mfu"] < 1
        flops[gpu] = best["mfu"] * gpu_preset(gpu).peak_flops * best["step_time_s"]
    assert max(flops.values()) == pytest.approx(min(flops.values()), rel=1e-9), flops
