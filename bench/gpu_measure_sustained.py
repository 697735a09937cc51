"""Do FP8 GEMMs keep their rate over seconds of back-to-back work? One real GPU.

Run on a machine with one NVIDIA GPU and PyTorch (never in CI):
``OUT=dir python bench/gpu_measure_sustained.py`` writes ``dir/measure.json``. It reuses
bench/gpu_measure.py's output and section helpers (TF32 off). Sections:

- ``env``: as bench/gpu_measure.py.
- ``sustained``: each GEMM shape below, BF16 (``F.linear``) and FP8 (``torch._scaled_mm``,
  e4m3, tensor-wise scales, fast accumulation as Transformer Engine's forward GEMM), replayed
  as a CUDA graph of ``inner`` GEMMs (~25 ms a replay) back to back for ``SECONDS`` seconds,
  one CUDA-event pair per replay; ``nvidia-smi`` samples the SM clock, power draw, temperature
  and active clock-throttle reasons every 100 ms meanwhile. Per run: the first replay's rate,
  the median over the first 0.5 s and over the last 2 s, and the samples' medians in the last
  2 s. The GPU idles 2 s between runs (the clock at each run's start is in its samples).
  The question it answers (issue 27's FP8 rows): the short, graphed timings this project's
  GEMM curves come from (bench/gpu_measure.py ``gemm``, bench/gpu_measure_te_fp8.py) may run
  at a clock that seconds of FP8 work at full tensor rate cannot hold under the 700 W limit.
  Shapes: Grok-1's expert at expert-TP 4 (8,192 tokens; gate+up fused, down), its QKV at TP 4
  (4,096 tokens, cp 2), Llama 3.1 405B's up projection at TP 8 cp 2, Llama 3.1 70B's at TP 4,
  and a square 8,192 GEMM.
"""

import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_measure as gm  # noqa: E402  (output and section helpers)

SECONDS = float(os.environ.get("SECONDS_PER_RUN", "6"))
SHAPES = (  # (name, tokens m, out n, in k)
    ("grok1_expert_etp4_up", 8192, 16384, 6144), ("grok1_expert_etp4_down", 8192, 6144, 8192),
    ("grok1_qkv_tp4", 4096, 2048, 6144), ("l405_tp8_cp2_up", 4096, 13312, 16384),
    ("l70_tp4_up", 8192, 14336, 8192), ("square_8192", 8192, 8192, 8192))
SMI = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active",
       "--format=csv,noheader,nounits", "-lms", "100"]


def smi_fields() -> None:
    """Newer drivers call the throttle reasons "clocks_event_reasons": use whichever this one knows."""
    q = SMI[1].split("=", 1)[1]
    if subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True).returncode:
        SMI[1] = SMI[1].replace("clocks_throttle_reasons", "clocks_event_reasons")


def gemm_fn(m: int, n: int, k: int, fp8: bool):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    if not fp8:
        return lambda: F.linear(x, w)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    return lambda: torch._scaled_mm(xf, wf.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True)


def smi_rows(path: str, t0: float, t1: float) -> list:
    """nvidia-smi's samples (seconds since t0, clock MHz, power W, temperature C, throttle mask)."""
    rows = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
                "0." + parts[0].split(".")[1])
            rows.append((round(ts - t0, 2), float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
        except (ValueError, IndexError):
            continue
    return [r for r in rows if -0.5 <= r[0] <= t1 - t0 + 0.5]


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def one_run(name: str, m: int, n: int, k: int, fp8: bool) -> dict:
    fn = gemm_fn(m, n, k, fp8)
    flops = 2.0 * m * n * k
    per = gm.timed(fn, reps=5, warm=3)
    inner = max(1, int(0.025 / per))
    replay = gm.graphed(fn, inner)
    torch.cuda.synchronize()
    time.sleep(2.0)
    log = os.path.join(tempfile.gettempdir(), f"smi_{name}_{'fp8' if fp8 else 'bf16'}.csv")  # kept in the JSON
    smi = subprocess.Popen(SMI, stdout=open(log, "w"), stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    t0 = time.time()
    events, stamps = [], []
    while time.time() - t0 < SECONDS:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        replay()
        e.record()
        events.append((s, e))
        if len(events) % 8 == 0:
            e.synchronize()
        stamps.append(time.time() - t0)
    torch.cuda.synchronize()
    t1 = time.time()
    time.sleep(0.3)
    smi.terminate()
    smi.wait()
    secs = [s.elapsed_time(e) / 1e3 / inner for s, e in events]
    ends, acc = [], 0.0
    for v in secs:
        acc += v * inner
        ends.append(acc)
    rate = [flops / v / 1e12 for v in secs]
    first = [r for r, t in zip(rate, ends) if t <= 0.5]
    last = [r for r, t in zip(rate, ends) if t >= ends[-1] - 2.0]
    samples = smi_rows(log, t0, t1)
    tail = [r for r in samples if r[0] >= (t1 - t0) - 2.0]
    return {"shape": name, "m": m, "n": n, "k": k, "precision": "fp8" if fp8 else "bf16",
            "inner": inner, "replays": len(secs), "gpu_busy_s": round(ends[-1], 3),
            "short_timed_tflops": flops / per / 1e12, "first_replay_tflops": rate[0],
            "first_0p5s_tflops": median(first), "last_2s_tflops": median(last),
            "last_over_first": median(last) / median(first) if first and last else None,
            "last_2s_sm_mhz": median([r[1] for r in tail]), "last_2s_power_w": median([r[2] for r in tail]),
            "last_2s_temp_c": median([r[3] for r in tail]),
            "throttle_masks": sorted({r[4] for r in samples}), "smi_samples": samples}


@gm.section
def sustained():
    smi_fields()
    rows = []
    for name, m, n, k in SHAPES:
        for fp8 in (False, True):
            rows.append(one_run(name, m, n, k, fp8))
            r = rows[-1]
            print(name, r["precision"], round(r["first_0p5s_tflops"] or 0), "->", round(r["last_2s_tflops"] or 0),
                  "TFLOP/s;", r["last_2s_sm_mhz"], "MHz", r["last_2s_power_w"], "W", r["throttle_masks"], flush=True)
            torch.cuda.empty_cache()
    return {"method": f"CUDA graph of inner GEMMs (~25 ms) replayed back to back for {SECONDS} s, CUDA events "
                      "per replay; nvidia-smi -lms 100 beside (clocks.sm, power.draw, temperature.gpu, "
                      "clocks_throttle_reasons.active); 2 s idle before each run; random normal data "
                      "(weights x 0.02)", "rows": rows}


if __name__ == "__main__":
    gm.main("/tmp/gpu_measure_sustained", (("env", gm.env), ("sustained", sustained)))
