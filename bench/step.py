"""Wall time and peak memory of simulating one training step at scale.

Run: ``python bench/step.py`` (``--quick``: skip the 1k-16k scaling sweep; ``--only NAME``
(or ``--case``): one of issue 28's cases alone, repeatable, ``--set K=V`` overriding it;
``--force``: simulate a case the work estimate refuses, to time it; ``--steady``: time each
case in steady-state mode too, with its step's difference from the exact one). Each case runs
in its own subprocess, so its peak RSS is its own; it prints wall and CPU seconds (on a
shared machine wall time carries other people's load: the load average is printed first),
peak RSS, and each figure as a fraction of its target. Targets:
- Llama-3-70B FSDP on 1,024 H100 (seq 8192, 1 sequence per GPU): < 5 s, < 2 GB (issue 3)
- Llama-3-405B (scenarios/llama3-405b-16k-h100.toml: TP 8, PP 16, DP 128, seq 8192,
  16M-token batch, 1F1B) on 16,384 H100: < 60 s, < 4 GB (issue 4), and how wall time grows
  from 1k to 16k GPUs (log-log slope)
- the same scenario under perturbations (issue 15), each case's time including the clean
  run it is priced against (``straggler_cost_s``, sim/step.py): one rank 1.2x slower
  <= 10 s and <= 2 GB (folded by sim/parallel/folding.py); one NIC at half bandwidth
  <= 10 s; lognormal jitter (sigma 0.05) on every rank <= 60 s (sampled mode above 1,024
  GPUs, sim/parallel/jitter.py); and the clean step on 131,072 H100 (DP 1,024, still 16
  micro-batches per pipeline) <= 10 s and <= 2 GB.

Issue 28's cases (:data:`CASES`, each <= 10 s wall and <= 1.5 GB): DeepSeek-V3 on 1,024 H100,
Qwen3-235B-A22B on 256 H100 (2,048 and 8,192 sequences), Llama 3.1 405B on 1,024 H100
(pp 8 v 8 cp 2), GPT 1T on 3,072 A100, GPT 530B on 2,520 A100 (the published_runs.csv row:
pp 35 x dp 9), and the 405B straggler and 131,072-GPU cases above under 1F1B and under the
interleaved schedule Meta used (pp 16 v 4).

Measured in one run (load average 2.9 on 2 cores), wall / target, peak RSS / target:
70B FSDP 1k 0.85 s (0.17), 0.15 GB (0.08); 405B 16k 1.71 s (0.03), 0.28 GB (0.07), slope
0.13 from 1k to 16k; + one straggler 5.05 s (0.50), 0.47 GB (0.23), 64 ranks simulated;
+ a half-bandwidth NIC 4.75 s (0.48), 0.47 GB; + sigma 0.05 jitter 18.37 s (0.31), 1.35 GB,
512 ranks sampled; 131,072 GPUs clean 8.42 s (0.84), 1.29 GB (0.65).
The network solved per connected component (docs/scaling.md): ``qwen`` at 128 sequences
(``training.global_batch=128``), 214.4 s CPU with joint max-min solves only -> 154.4 s,
results identical (load average 8-9 on 2 cores, both in one process).
Building the MoE programs (one per stage, copies retime their experts; CPU seconds, load
average 6-12): ``qwen`` 263.6 s -> 58.9 s (15,173,728 ops, unchanged); DeepSeek-V3 at 512
sequences 27.4 s -> 8.3 s. The ``qwen`` case is still refused by the work estimate, now ~2,059 s
and 24.9 GiB with its uneven all-to-alls priced (``python bench/work.py --case qwen-128``: 257 s
CPU, 2.02 GB at 128 sequences, load 11-13; docs/scaling.md), and was not timed whole; ~14.3 GiB since
the all-to-alls' memory is capped at the bounded rate memos (0.744 GB measured at 128 sequences against
1.29 GB estimated). Memory per op shared by copies and the engine's waits as arrays (main 9e986e0 -> i28-moe,
docs/scaling.md): ``dsv3`` on 128 GPUs at 64 sequences 0.375 -> 0.333 GB, ``qwen`` on 128 GPUs 0.282 -> 0.262 GB,
``qwen`` at 128 sequences 0.744 -> 0.648 GB (145.7 -> 135.5 s CPU). ``gpt-530b`` simulates 315 ranks, the exact fold (docs/scaling.md).
The engine's per-event cost (docs/scaling.md, CPU seconds before -> after, load average 5-13):
``gpt-530b`` at ``training.global_batch=315`` 103.4 s -> 85.1 s (engine 88.5 -> 74.2 s,
3,584,333 events); ``405b-straggler-v4`` 16.9 s -> 14.9 s; 405B 16k 6.1-6.7 s -> 5.9 s;
+ jitter 76.5 s -> 65.6 s.
Steady-state mode (``python bench/step.py --only 405b-1k --steady``, load average ~9 on 2
cores): exact 406.6 s wall, 95.9 s CPU, 2.57 GB, 5,148,986 events; steady (16, 24, 32
micro-batches extrapolated to 192) 157.2 s wall, 38.7 s CPU, 0.76 GB, 1,948,544 events;
step and MFU 3.4e-13 from exact (2.5x less CPU). ``gpt-1t --steady --force``: exact 1,251.5 s
wall, 188.7 s CPU, 3.78 GB; steady (64, 65, 66 of 512) 135.1 s wall, 85.4 s CPU, 0.95 GB,
step 2.2e-13 from exact. The 405B 16k/131k cases (16 micro-batches on pp 16) and gpt-530b
are not eligible: the three runs would simulate more than the step (docs/scaling.md).
Steady-state steps replayed, the spans table built by columns (docs/scaling.md, CPU seconds
before -> after, main e297de4 and this tree in turn, load average 3.6-4.8): ``405b-1k`` 79.1 s
-> 66.7 s CPU (145 -> 110 s wall), peak RSS 2.57 -> 2.12 GB (5,148,986 events); at
``training.global_batch=384`` the part outside the engine 7.3 -> 3.6 s (load 7-12); ``dsv3``
at 512 sequences, building the programs 10.1 s -> 7.6 s.
A joint re-solve's per-transfer Python done on all chains at once (docs/scaling.md): ``qwen`` on 128 GPUs
(``training.global_batch=64 model.layers=32 cluster.gpus=128 parallel.dp=8 parallel.ep=16``), CPU median
28.5 s -> 25.3 s over 7 runs each (two pairs run side by side: 29.1 -> 25.3 s, 28.5 -> 25.1 s), same summary.
Memory per op (main 491f3bf and this tree in turn, load average 1.8-3.0): ``405b-1k`` peak RSS
2.12 -> 1.95 GB with the engine's ``held_by``/``arrived`` filled once as meetings end, -> 1.79 GB
with the spans table built without its consolidation copy and the engine's times released once
its columns hold them (the peak was in building that table); at ``training.global_batch=384``
0.65 -> 0.58 GB. Results identical (``python bench/fingerprint.py``).
The fat tree indexed as arrays (sim/hardware/tree_arrays.py: no NetworkX graph unless read),
the world-wide tree all-reduce built and routed as arrays, int32 compiled entries (docs/scaling.md,
CPU seconds main -> this tree, two pairs back to back, load average 7-13): ``405b-131k-v4``
26.3, 28.0 s -> 13.9, 13.7 s, peak RSS 2.48 -> 1.56 GB; ``405b-131k`` 22.5, 23.9 s -> 9.1, 9.5 s,
2.45 -> 1.53 GB; ``405b-straggler-v4`` 18.2, 18.0 s -> 15.9, 14.6 s; ``405b-straggler`` 10.2,
10.3 s -> 9.8, 8.0 s. Same summaries (``python bench/fingerprint.py``: identical).
Then (main b2945af and this tree in turn, load average 3-12, docs/scaling.md): the engine's
times, host release times and stream indices as float64/int64 arrays, the spans table sorted
first and built a column at a time, the summary's per-rank sums over slices and runs of
ranks: ``405b-1k`` peak RSS 1.78 -> 1.46 GB (target 1.5), 77.1 -> 71.4 s CPU (wall still
200 s at load 5.5). Memory per op there now: the programs ~320 bytes (the op tuple 136, deps
~80 with their index ints, a collective and its key ~180 for the 42% of ops that are one),
the engine ~70 bytes after the run, the spans table ~123 bytes per row.
The world-wide tree phases' memory (docs/scaling.md; ``python bench/step.py --only CASE``, main
f671ec9 and this tree back to back, twice, load average ~6 then 2.6-3.9): compiled phases cached
by digests of their hops checked against the arrays (no ``tobytes()`` copies held), ``routes``'
links released once read, a collective without siblings sharing its cached schedule's arrays.
Peak RSS ``405b-131k-v4`` 1.56 -> 1.30 GB (target 1.5), ``405b-131k`` 1.53 -> 1.28 GB,
``405b-straggler-v4`` 0.62 -> 0.55 GB, ``405b-straggler`` 0.60 -> 0.53 GB. CPU seconds unchanged
within the load's spread (``405b-131k-v4`` 12.73, 12.92 -> 12.64, 13.35 s; ``405b-straggler-v4``
15.41, 11.02 -> 14.95, 11.48 s): both still over 10 s here. Results identical
(``python bench/fingerprint.py``; ``clustersim validate --rows dg-l405-2048,MH-462B-6144 --json``).
Stop 47 (i28-moe, docs/scaling.md): a refused case prints REFUSED and the estimate's line. The work
estimate's 900 B an op was 1.14-2.00x the measured peaks (``python bench/work.py --case NAME``); at
650 B ``gpt-1t`` runs (estimated 3.2 GiB, was 4.4 GiB: refused): 872 s wall, 200.8 s CPU, 2.04 GB
at load ~10 (``--force``). ``dsv3``, ``qwen``, ``qwen-8k`` stay refused by their CPU (~2,000-8,000 s),
``gpt-530b`` by its memory estimate (4.5 GiB; its ~450 s of CPU is past the budget too).
"""

import argparse
import json
import math
import os
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time, tomllib
t0 = time.perf_counter()
import sim
from sim.input.load import scenario_from_dict
data = json.loads(sys.argv[1][1:]) if sys.argv[1].startswith("=") else tomllib.loads(open(sys.argv[1]).read())
for section, value in json.loads(sys.argv[2]).items():  # extra sections merge into the file's
    data[section] = {**data.get(section, {}), **value} if isinstance(value, dict) else value
s = scenario_from_dict(data, sys.argv[3:])
r = sim.simulate(s, force=os.environ.get("BENCH_FORCE") == "1")
wall = time.perf_counter() - t0
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "cpu_s": use.ru_utime + use.ru_stime, "rss_bytes": use.ru_maxrss * 1024,
                  "events": r.summary["sim_events"], "engine_s": r.summary["sim_wall_s"],
                  "step_s": r.summary["step_time_s"], "mfu": r.summary["mfu"], "gpus": r.summary["num_gpus"],
                  "simulated": len(r.facts.simulated_ranks), "cost_s": r.summary.get("straggler_cost_s"),
                  "steady": {k: r.summary[k] for k in ("micro_batches", "micro_batches_simulated", "extrapolated",
                                                       "steady_fallback") if k in r.summary}}))
"""
LLAMA_405B = "scenarios/llama3-405b-16k-h100.toml"
GB = 1e9  # the issues' targets are in decimal gigabytes


def measure(scenario: str | dict, *overrides: str, extra: dict | None = None) -> dict:
    """Load + simulate in a fresh interpreter (``scenario``: a TOML path or the scenario's
    sections; ``extra``: sections merged into them, e.g. stragglers or cluster faults); wall
    and CPU seconds, peak RSS. ``--force`` (BENCH_FORCE=1) runs past the work budget."""
    source = scenario if isinstance(scenario, str) else "=" + json.dumps(scenario)
    env = {**os.environ, "BENCH_FORCE": "1" if FORCE else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, source, json.dumps(extra or {}), *overrides],
                         capture_output=True, text=True, env=env)
    if out.returncode:  # the work estimate's refusal (or any error): its last line
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(label: str, m: dict, wall_target: float, rss_target: float | None = None) -> None:
    """One line: figures, each as a fraction of its target, OK or MISSED (REFUSED: the work
    estimate's refusal, sim/work.py, or another error, its last line)."""
    if "error" in m:
        print(f"{label}: REFUSED\n    {m['error']}")
        return
    ok = m["wall_s"] <= wall_target and (rss_target is None or m["rss_bytes"] <= rss_target)
    fig = f"{m['wall_s']:.2f} s wall ({m['wall_s'] / wall_target:.2f} of {wall_target:.0f} s)"
    if rss_target is not None:
        fig += f", peak RSS {m['rss_bytes'] / GB:.2f} GB ({m['rss_bytes'] / rss_target:.2f} of {rss_target / GB:.1f} GB)"
    else:
        fig += f", peak RSS {m['rss_bytes'] / GB:.2f} GB"
    cost = f", straggler_cost {m['cost_s'] * 1e3:.1f} ms" if m.get("cost_s") is not None else ""
    print(f"{label}: {fig}: {'OK' if ok else 'MISSED'}\n    {m['cpu_s']:.2f} s CPU, engine {m['engine_s']:.2f} s, "
          f"{m['events']:,} events, {m['simulated']:,} of {m['gpus']:,} ranks simulated; "
          f"step {m['step_s']:.3f} s{cost}, MFU {m['mfu']:.1%}")


def scaling() -> None:
    """Llama-3-405B layout from 1k to 16k GPUs (16 micro-batches per pipeline throughout)."""
    rows = []
    for gpus in (1024, 2048, 4096, 8192, 16384):
        dp = gpus // 128
        m = measure(LLAMA_405B, f"cluster.nodes={gpus // 8}", f"parallel.dp={dp}", f"training.global_batch={16 * dp}")
        rows.append((gpus, m["wall_s"]))
        print(f"  {gpus:>6} GPUs: {m['wall_s']:.2f} s wall, {m['cpu_s']:.2f} s CPU, peak RSS {m['rss_bytes'] / GB:.2f} GB")
    slope = (math.log(rows[-1][1]) - math.log(rows[0][1])) / (math.log(rows[-1][0]) - math.log(rows[0][0]))
    print(f"  log-log slope of wall time vs GPUs, 1k -> 16k: {slope:.2f} "
          f"(1.0 = linear in GPUs; the rest is topology build and sibling traffic)")


def perturbed() -> None:
    """Issue 15: the 405B step on 16,384 GPUs with a straggler, a degraded NIC, jitter on
    every rank; and the clean step on 131,072 GPUs."""
    show("  + GPU 1,234's NIC at half bandwidth", measure(LLAMA_405B, extra={
        "cluster": {"faults": [{"gpu_nic": 1234, "factor": 0.5}]}}), 10)
    show("  + lognormal jitter, sigma 0.05, on every rank", measure(LLAMA_405B, extra={
        "jitter": {"sigma": 0.05}}), 60)


def _h100(gpus: int) -> dict:
    return {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": gpus}


def _moe(preset: str, gpus: int, batch: int, recompute: str, precision: str, **parallel) -> dict:
    """A MoE preset as published layouts run it: SP, TP and EP communication overlapped."""
    return {"name": preset, "model": {"preset": preset},
            "training": {"seq_len": 4096, "global_batch": batch, "micro_batch": 1, "recompute": recompute,
                         "precision": precision},
            "cluster": _h100(gpus),
            "parallel": {"sequence_parallel": True, "tp_comm_overlap": True, "ep_comm_overlap": True, **parallel}}


def _published(row_id: str) -> dict:
    """The scenario `clustersim validate` makes of one row of sim/data/published_runs.csv."""
    from sim.studies.validation import legacy_rows
    return next(r.scenario for r in legacy_rows() if r.id == row_id)


def _gpt_1t() -> dict:
    """GPT 1T of Narayanan et al. 2021 Table 1 (128 layers, hidden 25600, 160 heads) on 3,072
    A100, by the validation rules of the N21 rows (full recompute, DDP), 1F1B."""
    from sim.studies.validation import legacy_scenario
    return legacy_scenario({"source": "N21-T1", "model": "GPT", "params": "1T", "layers": "128", "hidden": "25600",
                            "heads": "160", "ffn_hidden": "102400", "vocab": "51200", "seq_len": "2048",
                            "global_batch_seqs": "3072", "gpu": "a100-80gb", "num_gpus": "3072", "tp": "8",
                            "pp": "64", "dp": "6", "notes": "activation recompute"})


INTERLEAVED = ("parallel.schedule=interleaved", "parallel.virtual_stages=4")  # Meta's pp 16 v 4
STRAGGLER = {"stragglers": [{"ranks": [1234], "slowdown": 1.2}]}
CLEAN_131K = ("cluster.nodes=16384", "parallel.dp=1024", "training.global_batch=16384")
LLAMA_405B_1K = {"name": "llama3.1-405b-1k", "model": {"preset": "llama3.1-405b"},
                 "training": {"seq_len": 8192, "global_batch": 1536, "micro_batch": 1, "precision": "fp8"},
                 "cluster": _h100(1024),
                 "parallel": {"tp": 8, "pp": 8, "virtual_stages": 8, "dp": 8, "cp": 2, "sequence_parallel": True,
                              "tp_comm_overlap": True}}
# Issue 28's cases: name -> (label, scenario, overrides, extra sections); each <= 10 s, <= 1.5 GB.
CASES = {
    "dsv3": ("DeepSeek-V3, 1,024 H100 (tp 2 pp 8 v 4 dp 64 ep 64, FP8)",
             _moe("deepseek-v3", 1024, 8192, "selective", "fp8", tp=2, pp=8, virtual_stages=4, dp=64, ep=64,
                  expert_tp=1, stage_layers=[1] + [2] * 30 + [0]), (), None),
    "qwen": ("Qwen3-235B-A22B, 256 H100 (tp 2 pp 8 v 4 dp 16 ep 32, 2,048 seqs)",
             _moe("qwen3-235b-a22b", 256, 2048, "selective", "bf16", tp=2, pp=8, virtual_stages=4, dp=16, ep=32,
                  expert_tp=1), (), None),
    "405b-1k": ("Llama 3.1 405B, 1,024 H100 (tp 8 pp 8 v 8 dp 8 cp 2, FP8)", LLAMA_405B_1K, (), None),
    "qwen-8k": ("Qwen3-235B-A22B, 256 H100, 8,192 seqs, no recompute, FP8",
                _moe("qwen3-235b-a22b", 256, 8192, "none", "fp8", tp=2, pp=8, virtual_stages=4, dp=16, ep=32,
                     expert_tp=1), (), None),
    "gpt-1t": ("GPT 1T, 3,072 A100 (tp 8 pp 64 dp 6, full recompute)", _gpt_1t(), (), None),
    "gpt-530b": ("GPT 530B (published_runs.csv: tp 8 pp 35 dp 9), 2,520 A100", _published("N21-T1-529.6B-2520"),
                 (), None),
    "405b-straggler": ("Llama-3-405B 16,384 H100, one rank (1,234) 1.2x slower, 1F1B", LLAMA_405B, (), STRAGGLER),
    "405b-straggler-v4": ("  the same, interleaved (pp 16 v 4)", LLAMA_405B, INTERLEAVED, STRAGGLER),
    "405b-131k": ("Llama-3-405B layout, 131,072 H100 (DP 1,024), clean, 1F1B", LLAMA_405B, CLEAN_131K, None),
    "405b-131k-v4": ("  the same, interleaved (pp 16 v 4)", LLAMA_405B, CLEAN_131K + INTERLEAVED, None),
}
FORCE = False


STEADY = False  # --steady: each case also in steady-state mode (sim/steady.py)


def run_case(name: str, *more: str) -> None:
    """One case of :data:`CASES` (``more``: overrides after the case's own); with ``--steady``
    also in steady-state mode, with its step's relative difference from the exact one."""
    label, scenario, overrides, extra = CASES[name]
    exact = measure(scenario, *overrides, *more, extra=extra)
    show(f"{label} [{name}]{' ' + ' '.join(more) if more else ''}", exact, 10, 1.5 * GB)
    if STEADY:
        steady = measure(scenario, *overrides, *more, "simulation.micro_batches=steady", extra=extra)
        show("    steady-state mode", steady, 10, 1.5 * GB)
        if "error" in exact or "error" in steady:
            return
        st = steady["steady"]
        what = (f"extrapolated from {st['micro_batches_simulated']} to {st['micro_batches']} micro-batches"
                if st.get("extrapolated") else f"exact ({st.get('steady_fallback')})")
        rel = abs(steady["step_s"] - exact["step_s"]) / exact["step_s"]
        mfu = abs(steady["mfu"] - exact["mfu"]) / exact["mfu"]
        print(f"    {what}; step {rel:.1e} and MFU {mfu:.1e} from exact; wall {exact['wall_s'] / steady['wall_s']:.1f}x "
              f"faster, CPU {exact['cpu_s'] / steady['cpu_s']:.1f}x")


def main() -> None:
    global FORCE, STEADY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1k-16k scaling sweep")
    parser.add_argument("--only", "--case", choices=sorted(CASES), action="append",
                        help="run only this case of issue 28 (repeatable)")
    parser.add_argument("--force", action="store_true", help="simulate past the work budget (timing a refusal)")
    parser.add_argument("--steady", action="store_true",
                        help="also time each case in steady-state mode ([simulation] micro_batches = \"steady\")")
    parser.add_argument("--set", dest="more", action="append", default=[], metavar="KEY=VALUE",
                        help="with --only: an override after the case's own (e.g. training.global_batch=512)")
    args = parser.parse_args()
    FORCE, STEADY = args.force, args.steady
    print(f"load average (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.only:
        for name in args.only:
            run_case(name, *args.more)
        return
    show("Llama-3-70B FSDP, 1,024 H100", measure("scenarios/llama3-70b-fsdp-1k-h100.toml"), 5, 2 * GB)
    show("Llama-3-405B 4D, 16,384 H100", measure(LLAMA_405B), 60, 4 * GB)
    perturbed()
    for name in CASES:
        run_case(name)
    if not args.quick:
        print("Llama-3-405B layout, wall time vs GPU count:")
        scaling()
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
