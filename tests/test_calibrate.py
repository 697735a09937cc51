"""clustersim calibrate: round trips through tables and logs the simulator printed, the shipped
published table, traces (one test-written, one real from Holistic Trace Analysis), bad inputs."""

import gzip
import json
from pathlib import Path
import subprocess
import sys
import tomllib

import pytest

from sim.calibrate import fabric, nccl
from sim.collectives.kinds import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL
from sim.hardware.calibration import Calibration
from sim.model.compute import SUSTAINED

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "calibration"
TINY = """name = "{name}"
[model]
layers = 4
hidden = 1024
heads = 16
vocab = 32000
[training]
seq_len = 2048
global_batch = 16
[cluster]
topology = "dgx-h100"
gpus = 8
[parallel]
tp = {tp}
dp = {dp}
"""

# TINY is host-bound: at hidden 1024 each launch's issue cost (sim/model/host.py, with STEP_PYTHON_S)
# exceeds its kernel, so its step does not move with the compute or fabric constants. The fits'
# round trips run GPU-bound (every run's step elasticity in the sustained factor 0.67-0.74).
GPU_BOUND = TINY.replace("hidden = 1024\nheads = 16", "hidden = 8192\nheads = 64")


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def _tables(tmp_path, truth: Calibration) -> list[Path]:
    sizes = [2 ** k for k in range(3, 34, 3)]
    out = []
    for op, gpus in ((ALL_REDUCE, 8), (ALL_GATHER, 16)):
        table = nccl.Table("x", op, gpus, 0, "auto", True, tuple(nccl.Row(s, 1, 1, None, None, 0) for s in sizes))
        times = fabric.Bench([table], "dgx-h100", "h100-sxm").times(truth)
        path = tmp_path / f"{op}_perf.txt"
        path.write_text(nccl.render(op, gpus, 8, sizes, list(times)))
        out.append(path)
    return out


def test_round_trip_nccl_tests_recovers_a_modified_fabric(tmp_path):
    truth = Calibration(efficiency=(("ib", 0.60), ("nvlink", 0.70)), latency=(("ib", 1.5e-6), ("nvlink", 0.9e-6)))
    paths = _tables(tmp_path, truth)
    out = tmp_path / "p.toml"
    run = cli("calibrate", *paths, "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    prof = tomllib.loads(out.read_text())
    assert prof["fabric"]["efficiency"]["nvlink"] == pytest.approx(0.70, rel=0.02)
    assert prof["fabric"]["efficiency"]["ib"] == pytest.approx(0.60, rel=0.02)
    assert prof["fabric"]["latency_us"]["nvlink"] == pytest.approx(0.9, rel=0.02)
    assert prof["fabric"]["latency_us"]["ib"] == pytest.approx(1.5, rel=0.02)
    report = json.loads(run.stdout)
    assert all(abs(r["error"]) < 0.02 for t in report["nccl_tests"] for r in t["rows"])
    assert [i["sha256"] for i in prof["profile"]["inputs"]][0] == __import__("hashlib").sha256(paths[0].read_bytes()).hexdigest()
    check = cli("calibrate", "--check", out, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["unchanged_inputs"] == [True, True]


def _logs(tmp_path, truth: Calibration, runs) -> tuple[list[Path], list]:
    """Megatron-style logs of the steps each (template, tp, dp) of ``runs`` simulates under
    ``truth`` (the first iteration 1.5x: warm-up), and the ``--scenario`` arguments."""
    import sim
    from sim.calibrate.steps import Run, step_time

    logs, args = [], []
    for template, tp, dp in runs:
        path = tmp_path / f"tp{tp}-{len(logs)}.toml"
        path.write_text(template.format(name=f"tiny-tp{tp}", tp=tp, dp=dp))
        step = step_time(Run("x", sim.load_scenario(path), 0.0), truth)
        log = tmp_path / f"tp{tp}-{len(logs)}.log"
        log.write_text("using world size: 8, data-parallel size: %d\n" % dp + "".join(
            f" iteration {i}/100 | elapsed time per iteration (ms): {step * 1e3 * (1.5 if i == 1 else 1):.4f} |\n"
            for i in range(1, 6)))
        logs.append(log)
        args += ["--scenario", path]
    return logs, args


def test_round_trip_step_times_recover_the_sustained_factor(tmp_path):
    logs, args = _logs(tmp_path, Calibration(sustained=0.70), [(GPU_BOUND, tp, dp) for tp, dp in ((1, 8), (2, 4), (8, 1))])
    out = tmp_path / "p.toml"
    run = cli("calibrate", *logs, *args, "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    assert tomllib.loads(out.read_text())["compute"]["sustained"] == pytest.approx(0.70, rel=0.02)
    assert SUSTAINED["h100-sxm"] != pytest.approx(0.70, rel=0.02)  # the fit moved it
    assert all(abs(r["error"]) < 0.02 for r in json.loads(run.stdout)["runs"])
    assert all(r["in_fit"] and not r["host_bound"] for r in json.loads(run.stdout)["runs"])


def test_host_bound_logs_are_named_and_leave_the_factor_alone(tmp_path):
    """TINY's steps are host-bound at every factor from 0.7 up (the GPU waits for its host's
    issue, sim/model/host.py): they carry no information on the factor. Calibrate says so per run
    and keeps the preset, instead of reading the flat steps as any factor at all (before: 1.1,
    past the GPU's peak, exit 2); beside GPU-bound runs it fits from those alone."""
    truth = Calibration(sustained=0.70)
    logs, args = _logs(tmp_path, truth, [(TINY, tp, dp) for tp, dp in ((1, 8), (2, 4), (8, 1))])
    out = tmp_path / "p.toml"
    run = cli("calibrate", *logs, *args, "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert all(r["host_bound"] and not r["in_fit"] and r["host_wait_s"] > 0 for r in report["runs"])
    assert all(abs(r["error"]) < 0.02 for r in report["runs"])  # at the preset too: the steps do not move
    assert "sustained" not in tomllib.loads(out.read_text()).get("compute", {})
    (change,) = [c for c in report["changes"] if c["constant"] == "compute.sustained"]
    assert change["after"] is None and change["points"] == 0 and "3 of them host-bound" in change["note"]
    mixed, margs = _logs(tmp_path, truth, [(GPU_BOUND, 1, 8), (TINY, 2, 4), (GPU_BOUND, 2, 4)])
    run = cli("calibrate", *mixed, *margs, "--out", out, "--json")
    assert run.returncode == 0, run.stderr
    assert tomllib.loads(out.read_text())["compute"]["sustained"] == pytest.approx(0.70, rel=0.02)
    assert [(r["in_fit"], r["host_bound"]) for r in json.loads(run.stdout)["runs"]] == [
        (True, False), (False, True), (True, False)]


def test_published_gb200_table_is_reproduced_by_collective(tmp_path):
    out = tmp_path / "gb200.toml"
    table = EXAMPLES / "gb200-nvl72-1rack_all_reduce_perf.txt"
    run = cli("calibrate", table, "--topology", "gb200-nvl72", "--out", out)
    assert run.returncode == 0, run.stderr
    coll = cli("collective", "--op", "all_reduce", "--algo", "ring", "--proto", "auto", "--gpus", 72, "--topology",
               "gb200-nvl72", "--sizes", "512M:8G", "--calibration", out, "--json")
    assert coll.returncode == 0, coll.stderr
    measured = {r.bytes: (r.time_s + r.time_in_s) / 2 * 1e6 for r in nccl.parse(table).rows}
    for row in json.loads(coll.stdout):
        assert row["time_us"] == pytest.approx(measured[row["bytes"]], rel=0.05)


def _trace(path: Path, e_max: float, half: float, peak: float = 989e12, world: int = 8, issue_us: float = 20.0) -> None:
    """A Kineto trace as PyTorch writes one: CPU operators on a thread, the launches inside
    them (cuda_runtime, with a correlation id) and the kernels (with the same id) on the GPU;
    BF16 GEMMs of six shapes at ``e_max * x / (x + half)`` of ``peak``, causal flash attention
    forward at ``0.5 * keys / (keys + 100)``, an all-reduce of 64 MiB. The host issues a launch
    every ``issue_us``; a kernel starts 5 us after the last one or 4 us after its launch call
    returned, whichever is later (at 20 us the GPU, 1 ms behind, never waits for the host)."""
    events, corr, cpu, gpu = [], 1, 0.0, 1000.0

    def launch(op: str, args: dict, kernel: str, dur: float, cat: str = "cpu_op"):
        nonlocal corr, cpu, gpu
        start = max(gpu, cpu + 2 + 3 + 4)
        events.append({"ph": "X", "cat": cat, "name": op, "pid": 1, "tid": 1, "ts": cpu, "dur": 10, "args": args})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": cpu + 2, "dur": 3, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                       "args": {"correlation": corr}})
        corr, cpu, gpu = corr + 1, cpu + issue_us, start + dur + 5

    bf16 = ["c10::BFloat16"] * 3
    for rep in range(2):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{rep}", "pid": 1, "tid": 2,
                       "ts": cpu, "dur": 1})
        for m in (64, 128, 256, 512, 1024, 4096):
            flops = 2 * m * 4096 * 4096
            launch("aten::mm", {"Input Dims": [[m, 4096], [4096, 4096]], "Input type": bf16},
                   "sm90_xmma_gemm_bf16bf16_bf16f32", flops / (peak * e_max * m / (m + half)) * 1e6)
        for seq in (512, 1024, 2048, 4096):
            flops = 4 * 32 * seq * seq * 128 * 0.5
            keys = seq / 2
            launch("aten::_scaled_dot_product_flash_attention",
                   {"Input Dims": [[1, 32, seq, 128]] * 3, "Input type": bf16,
                    "Concrete Inputs": ["", "", "", "0.", "True", "False", ""]},
                   "flash_fwd_kernel", flops / (peak * 0.5 * keys / (keys + 100)) * 1e6)
        launch("nccl:all_reduce", {"Input Dims": [[32 * 2**20]], "Input type": ["c10::BFloat16"]},
               "ncclDevKernel_AllReduce_RING_LL(ncclDevComm*)", 300.0, cat="user_annotation")
    data = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": world}, "traceEvents": events}
    path.write_bytes(gzip.compress(json.dumps(data).encode()))


def test_trace_fits_the_gemm_curve_and_compares_with_the_simulated_step(tmp_path):
    trace, scen = tmp_path / "rank0.json.gz", tmp_path / "s.toml"
    _trace(trace, 0.6, 200.0)
    scen.write_text(TINY.format(name="tiny", tp=2, dp=4))
    out, png = tmp_path / "p.toml", tmp_path / "b.png"
    run = cli("calibrate", trace, "--scenario", scen, "--out", out, "--picture", png, "--json")
    assert run.returncode == 0, run.stderr
    compute = tomllib.loads(out.read_text())["compute"]
    assert compute["gemm_kernel"] * SUSTAINED["h100-sxm"] == pytest.approx(0.6, rel=0.02)
    assert compute["gemm_half_size"] == pytest.approx(200.0, rel=0.02)
    top, half = compute["attention_forward"]
    assert (top * SUSTAINED["h100-sxm"], half) == (pytest.approx(0.5, rel=0.02), pytest.approx(100, rel=0.02))
    entry = json.loads(run.stdout)["traces"][0]
    classes = {c["class"]: c for c in entry["classes"]}
    assert classes["nccl:all_reduce 64.0 MiB"]["time_s"] == pytest.approx(300e-6)
    shapes = entry["gemm_shapes"]
    assert shapes[0]["min_dim"] == 4096 and shapes[0]["traced_eff"] == pytest.approx(shapes[0]["calibrated_eff"], rel=0.02)
    assert set(entry["simulated"]) == {"compute_s", "exposed_comm_s", "idle_s", "host_wait_s", "step_s"}
    assert png.stat().st_size > 1000


def test_a_host_bound_trace_fits_the_same_curves_and_names_its_wait(tmp_path):
    """The fits read each kernel's GPU-side span only, so a trace whose host issues a launch every
    2 ms (each kernel shorter: the GPU idles between, waiting for the host) fits exactly the
    constants of the GPU-bound one; its breakdown counts every idle gap as waiting for the host
    (HTA's host wait: the launch began after the previous kernel ended), the GPU-bound one none."""
    fits = {}
    for issue in (20.0, 2000.0):
        trace, out = tmp_path / f"r{issue:.0f}.json.gz", tmp_path / f"p{issue:.0f}.toml"
        _trace(trace, 0.6, 200.0, issue_us=issue)
        run = cli("calibrate", trace, "--out", out, "--json")
        assert run.returncode == 0, run.stderr
        fits[issue] = tomllib.loads(out.read_text())["compute"], json.loads(run.stdout)["traces"][0]["traced"]
    (free_fit, free), (bound_fit, bound) = fits[20.0], fits[2000.0]
    assert bound_fit == free_fit and bound_fit["gemm_kernel"] * SUSTAINED["h100-sxm"] == pytest.approx(0.6, rel=0.02)
    assert free["host_wait_s"] == 0.0 and free["idle_s"] > 0
    # 22 kernels in 2 steps: 21 gaps, each 2 ms less the kernel before it plus its launch, 2 + 3 + 4 us
    assert bound["host_wait_s"] == pytest.approx(bound["idle_s"], rel=1e-9)
    assert bound["host_wait_s"] > 10 * (2000 - 300) * 1e-6 and bound["step_s"] > 10 * 2000e-6


def test_real_hta_trace_is_read(tmp_path):
    run = cli("calibrate", EXAMPLES / "hta_sampled_rank-0.json.gz", "--out", tmp_path / "p.toml", "--json")
    assert run.returncode == 0, run.stderr
    entry = json.loads(run.stdout)["traces"][0]
    classes = {c["class"]: c["kernels"] for c in entry["classes"]}
    assert classes["gemm"] == 432 and entry["steps"] == 2
    assert sum(n for name, n in classes.items() if name.startswith("nccl:")) == 10
    assert classes["nccl:all_to_all 400.0 MiB"] == 2  # the c10d call's bytes, found through the launch
    assert sum(g["launches"] for g in entry["gemm_shapes"]) > 0 and not entry["gemm_shapes"][0]["half"]


@pytest.mark.parametrize("case", ["truncated", "cut_row", "other_framework", "no_steps", "wrong_world"])
def test_bad_inputs_exit_2_naming_file_and_line(tmp_path, case):
    good = (EXAMPLES / "gb200-nvl72-1rack_all_reduce_perf.txt").read_text().splitlines()
    scen = tmp_path / "s.toml"
    scen.write_text(TINY.format(name="tiny", tp=2, dp=4))
    extra = []
    if case == "truncated":
        path, line = tmp_path / "ar.txt", len(good) - 2
        path.write_text("\n".join(good[:-2]) + "\n")
    elif case == "cut_row":
        path, line = tmp_path / "ar.txt", 10
        path.write_text("\n".join(good[:9] + [good[9][:40]] + good[10:]) + "\n")
    elif case == "other_framework":
        path, line = tmp_path / "jax.json", 1
        path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "fusion", "ts": 0, "dur": 1}]}))
    elif case == "no_steps":
        path, line, extra = tmp_path / "run.log", 2, ["--scenario", scen]
        path.write_text("starting\nloss 1.0\n")
    else:
        path, line, extra = tmp_path / "run.log", 1, ["--scenario", scen]
        path.write_text("using world size: 64\n elapsed time per iteration (ms): 120.0\n")
    run = cli("calibrate", path, *extra, "--out", tmp_path / "p.toml")
    assert run.returncode == 2, run.stderr
    assert f"{path}:{line}:" in run.stderr and "Traceback" not in run.stderr


def test_profile_flows_through_scenario_key_and_flag_alike(tmp_path):
    (tmp_path / "slow.toml").write_text("[fabric.efficiency]\nnvlink = 0.4\nib = 0.5\n\n[fabric.latency_us]\nnvlink = 3.0\n"
                                        "\n[compute]\ngpu = \"h100-sxm\"\nsustained = 0.6\n")
    plain = GPU_BOUND.format(name="tiny", tp=2, dp=4)  # TINY is host-bound: the constants would not show
    (tmp_path / "plain.toml").write_text(plain)
    (tmp_path / "keyed.toml").write_text(plain.replace('gpus = 8', 'gpus = 8\ncalibration = "slow.toml"'))
    steps = {}
    for name, extra in (("plain", []), ("keyed", []), ("flag", ["--calibration", tmp_path / "slow.toml"])):
        run = cli("run", tmp_path / ("plain.toml" if name == "flag" else f"{name}.toml"), "--json", *extra)
        assert run.returncode == 0, run.stderr
        steps[name] = json.loads(run.stdout)["step_time_s"]
    assert steps["keyed"] == steps["flag"] > steps["plain"] * 1.2


def test_compute_model_takes_the_profile_constants():
    from sim.hardware.gpus import gpu_preset
    from sim.model.compute import GEMM_KERNEL, ComputeModel

    cal = Calibration(gpu="h100-sxm", sustained=0.5, gemm_kernel=0.7, gemm_half_size=64.0)
    m = ComputeModel(gpu_preset("h100-sxm"), calibration=cal)
    assert m.e_max == pytest.approx(0.35)
    assert m.efficiency(64) == pytest.approx(0.35 / 2)
    assert m.e_max_fp8 == pytest.approx(0.5 * GEMM_KERNEL["h100-sxm"]["fp8"] * 0.7 / GEMM_KERNEL["h100-sxm"]["bf16"])


@pytest.mark.parametrize("text, says", [("[fabric.efficiency]\nnvlink = 1.5\n", "fabric.efficiency.nvlink"),
                                        ("[fabric.efficiency]\nethernet = 0.5\n", "unknown link kind"),
                                        ("[compute]\ngpu = \"b200\"\nsustained = 0.7\n", "fitted on 'b200'")])
def test_bad_profile_exits_2(tmp_path, text, says):
    (tmp_path / "p.toml").write_text(text)
    run = cli("collective", "--op", "all_reduce", "--gpus", 8, "--topology", "dgx-h100", "--calibration",
              tmp_path / "p.toml") if "b200" not in text else cli(
        "run", "llama3-8b-fsdp-h100", "--calibration", tmp_path / "p.toml")
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("text, framework, step", [
    ("[NeMo I] MEMBER: 1/8\nEpoch 0: 10/100 train_step_timing in s=9.0\nEpoch 0: 11/100 train_step_timing in s=2.5\n"
     "Epoch 0: 12/100 train_step_timing in s=2.7\nEpoch 0: 13/100 train_step_timing in s=2.6\n", "nemo", 2.6),
    ("world_size=8\nstep:  1  loss: 9.1  memory: 30GiB(40%)  tps: 100  tflops: 1  mfu: 1%\n"
     "step:  2  loss: 8.1  memory: 30GiB(40%)  tps: 2,048  tflops: 300  mfu: 30.1%\n"
     "step:  3  loss: 7.1  memory: 30GiB(40%)  tps: 2,048  tflops: 300  mfu: 30.1%\n", "torchtitan", 32768 / (2048 * 8)),
    ("Num processes: 8\n{'loss': 1.2, 'step_time': 0.5}\n{'train_runtime': 50.0, 'train_steps_per_second': 2.0}\n",
     "hf", 0.5),
])
def test_log_formats(tmp_path, text, framework, step):
    from sim.calibrate import logs

    path = tmp_path / "run.log"
    path.write_text(text)
    log = logs.parse(path, 32768, 8)
    assert (log.framework, log.world) == (framework, 8)
    assert log.step_s == pytest.approx(step)


def test_older_nccl_tests_format_and_alltoall_in_place(tmp_path):
    old = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
           "#   Rank  0 Pid   1320 on host-a device  0 [0x00] Tesla V100-SXM2-16GB\n"
           "#   Rank  1 Pid   2066 on host-b device  0 [0x00] Tesla V100-SXM2-16GB\n"
           "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
           "           8             2     float     sum    30.00    0.00    0.00  0e+00    31.00    0.00    0.00  0e+00\n"
           "        1024           256     float     sum    40.00    0.03    0.03  0e+00    42.00    0.02    0.02  0e+00\n"
           "# Avg bus bandwidth    : 0.01\n")
    path = tmp_path / "x.txt"
    path.write_text(old)
    t = nccl.parse(path)
    assert t.op is ALL_REDUCE and (t.gpus, t.hosts) == (2, 2)  # the table's text read as the member
    assert t.time_s(t.rows[1]) == pytest.approx(41e-6)
    a2a = tmp_path / "alltoall_perf.log"
    a2a.write_text(old.replace("sum", "none").replace("    31.00    0.00    0.00  0e+00", "      N/A     N/A     N/A    N/A"))
    t = nccl.parse(a2a)
    assert t.op is ALL_TO_ALL and t.rows[0].time_in_s is None and t.time_s(t.rows[0]) == pytest.approx(30e-6)


def test_rccl_tests_file_with_several_collectives(tmp_path):
    one = (EXAMPLES / "gb200-nvl72-1rack_all_reduce_perf.txt").read_text().splitlines()[3:]
    gather = [line.replace("     sum", "    none") for line in one]
    text = "\n".join(one + ["#", "# Collective test concluded: all_reduce_perf", "", "======== all_gather_perf ========"]
                     + gather + ["# Collective test concluded: all_gather_perf"]) + "\n"
    path = tmp_path / "rccl_run.txt"
    path.write_text(text)
    tables = nccl.parse_all(path)
    assert [(t.op, t.gpus, len(t.rows)) for t in tables] == [("all_reduce", 72, 5), ("all_gather", 72, 5)]
    assert tables[1].rows[0].line == len(one) + 4 + 6


def test_readme_walk_through(tmp_path):
    """The README's three commands (after the install): calibrate on the shipped table, plan with it."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Calibrating to your own cluster"):]
    block = section[section.index("```") + 4:section.index("```", section.index("```") + 3)].strip().splitlines()
    assert block[0] == "pip install -e ." and len(block) == 3
    cal, plan = (line.split()[1:] for line in block[1:])
    profile = str(tmp_path / "gb200.toml")
    run = cli(*[profile if a == "gb200.toml" else a for a in cal], cwd=ROOT)
    assert run.returncode == 0, run.stderr
    plans = {}
    for name, extra in (("calibrated", []), ("preset", None)):
        args = [profile if a == "gb200.toml" else a for a in plan] + ["--json"]
        if extra is None:
            i = args.index("--calibration")
            args = args[:i] + args[i + 2:]
        out = cli(*args, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        plans[name] = json.loads(out.stdout)["layouts"][0]
    assert plans["calibrated"]["step_time_s"] != plans["preset"]["step_time_s"]  # the profile reached the planner
