"""The inference cost model against published vLLM runs: decode steps and whole runs.

Run ``python -m sim.rl.validation`` (``--fit`` also searches the decode efficiency).

``sim/data/inference_measured.csv`` holds four vLLM 0.6.0 ``benchmark_serving`` runs
published by Lambda Labs (LambdaLabsML/vllm-benchmark, ``results/prompt_N/...json``):
Llama 3 8B on one H100 and Llama 3 70B on eight (TP 8), bf16, 10 or 80 ShareGPT prompts
sent at once. Each row keeps every request's prompt and output length and first-token
time, the run's duration, and the inter-token times of one long request (``ref_request``).

**Decode step time** (the check ``tests/test_rl.py`` asserts, within 15%): the runs used
vLLM's multi-step scheduling (10 decode steps per round: each inter-token time in the
file covers 10 tokens, ~72 ms for Llama 3 8B), and every running request advances in the
same rounds. So the reference request's rounds are the engine's clock: in each round
after the last prefill, the running requests (started, with tokens left to emit) and
their context are known, and round / 10 is the measured time of one decode step at that
batch size, which :meth:`~sim.rl.inference.EngineCost.decode_step` predicts.

**Whole runs** (printed, not asserted): the same requests replayed on one engine from
t = 0 (admit what fits, prefill, decode to the next completion, ...), the loop the RL
generators run. vLLM spreads the prefills of 80 prompts over its first second (a
2,048-token budget per prefill, decode rounds in between), which the replay prefills at
once, so the replay of the 80-prompt runs ends early. A request that returned no text
still ran its prefill: it counts as one token (and as not running when it has no
first-token time).
"""

import argparse
import csv
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..hardware import specs, topology
from ..hardware.gpus import gpu_preset
from ..input.presets import model_preset
from ..input.scenario import Model
from ..model.transformer import dims
from .inference import DECODE_HBM_EFFICIENCY, EngineCost, allreduce_line, engine_cost

DATA = Path(__file__).resolve().parents[1] / "data" / "inference_measured.csv"
MAX_SEQS = 256  # vLLM 0.6 default max_num_seqs
MEMORY_FRACTION = 0.9  # vLLM default gpu_memory_utilization
STEPS_PER_ROUND = 10  # the runs' --num-scheduler-steps: one inter-token time per 10 tokens


def rows() -> list[dict]:
    """The measured runs, lengths as int lists."""
    return [dict(r, input_lens=list(r["input_lens"]), output_lens=list(r["output_lens"])) for r in _rows()]


@lru_cache(maxsize=None)
def _rows() -> tuple:
    with open(DATA, newline="") as f:
        out = []
        for r in csv.DictReader(f):
            r["input_lens"] = [int(x) for x in r["input_lens"].split()]
            r["output_lens"] = [max(1, int(x)) for x in r["output_lens"].split()]
            out.append(r)
        return tuple(out)


def row_cost(row: dict, eta: float = DECODE_HBM_EFFICIENCY) -> EngineCost:
    """The engine of a row: its model, GPU and TP on one DGX H100 server."""
    model = Model(**{k: v for k, v in model_preset(row["model"]).items()})
    d = dims(model.model_copy(update={"kv_heads": model.kv_heads or model.heads}))
    gpu, tp = gpu_preset(row["gpu"]), int(row["tp"])
    return engine_cost(d, model.tied_embeddings, gpu, tp, MEMORY_FRACTION, int(row["max_model_len"]), MAX_SEQS,
                       allreduce=_allreduce(row["gpu"], tp), eta=eta)


@lru_cache(maxsize=None)
def _allreduce(gpu: str, tp: int) -> tuple[float, float]:
    spec = specs.load_spec("dgx-h100")
    return allreduce_line(topology.build(spec, max(tp, spec.gpus_per_node), gpu_preset(gpu)), tuple(range(tp)))


def replay(cost: EngineCost, prompts: list[int], outputs: list[int]) -> tuple[float, np.ndarray]:
    """(duration s, time per output token of each request after its first) of the
    requests on one engine, all arriving at t = 0, admitted in order as slots free."""
    waiting = list(range(len(prompts)))
    running: dict[int, int] = {}  # request -> tokens still to generate
    first, end = np.zeros(len(prompts)), np.zeros(len(prompts))
    t = 0.0
    while waiting or running:
        admit = waiting[:max(0, cost.slots - len(running))]
        waiting = waiting[len(admit):]
        if admit:
            t += cost.prefill([prompts[i] for i in admit])
            for i in admit:
                first[i] = t
                running[i] = outputs[i] - 1  # the prefill step emits the first token
        context = sum(prompts[i] + outputs[i] - left for i, left in running.items())
        k = min(running.values())
        t += cost.decode_span(len(running), context, k)
        for i in list(running):
            running[i] -= k
            if running[i] == 0:
                end[i] = t
                del running[i]
    out = np.array(outputs)
    tpot = np.where(out > 1, (end - first) / np.maximum(out - 1, 1), np.nan)
    return t, tpot


def decode_samples(row: dict) -> list[tuple[int, int, float]]:
    """(running requests, context tokens, measured seconds per decode step) of every
    multi-step round of the reference request after the run's last prefill."""
    ttft = [float(x) for x in row["ttfts_s"].split()]
    rounds = np.array([float(x) for x in row["ref_chunks_ms"].split()]) / 1e3
    ref, prompts, outputs = int(row["ref_request"]), row["input_lens"], row["output_lens"]
    starts = ttft[ref] + np.concatenate([[0.0], np.cumsum(rounds)])
    last_prefill = max(ttft)
    emitted = [1] * len(prompts)  # the prefill step emits each request's first token
    out = []
    for c, seconds in enumerate(rounds):
        running = [i for i in range(len(prompts))
                   if 0 < ttft[i] <= starts[c] + 1e-3 and emitted[i] < outputs[i]]
        context = sum(prompts[i] + emitted[i] + STEPS_PER_ROUND // 2 for i in running)
        for i in running:
            emitted[i] += STEPS_PER_ROUND
        if c > 0 and starts[c] > last_prefill + 1e-3 and running:
            out.append((len(running), context, seconds / STEPS_PER_ROUND))
    return out


def compare(eta: float = DECODE_HBM_EFFICIENCY) -> list[dict]:
    """Per run: the decode-step errors (mean, min, max over its rounds) and the replayed
    duration against the measured one."""
    out = []
    for r in rows():
        cost = row_cost(r, eta)
        steps = np.array([cost.decode_step(b, c) / m - 1 for b, c, m in decode_samples(r)])
        duration, _ = replay(cost, r["input_lens"], r["output_lens"])
        measured = float(r["duration_s"])
        out.append({"id": r["id"], "rounds": len(steps), "step_error_mean": float(steps.mean()),
                    "step_error_min": float(steps.min()), "step_error_max": float(steps.max()),
                    "measured_s": measured, "predicted_s": duration, "duration_error": duration / measured - 1})
    return out


def fit(lo: float = 0.4, hi: float = 1.0, points: int = 121) -> float:
    """The efficiency whose worst run is best: min over eta of max over runs of the
    |mean decode-step error|."""
    grid = np.linspace(lo, hi, points)
    worst = [max(abs(c["step_error_mean"]) for c in compare(float(e))) for e in grid]
    return float(grid[int(np.argmin(worst))])


def main(argv=None) -> int:
    """Print the comparison (and the fitted efficiency with ``--fit``)."""
    p = argparse.ArgumentParser(prog="python -m sim.rl.validation", description=__doc__.splitlines()[0])
    p.add_argument("--fit", action="store_true", help="search the decode HBM efficiency")
    args = p.parse_args(argv)
    eta = fit() if args.fit else DECODE_HBM_EFFICIENCY
    print(f"decode HBM efficiency {eta:.3f}{' (fitted)' if args.fit else ''}")
    print(f"{'run':<21}{'rounds':>7}{'step error mean':>16}{'min':>8}{'max':>8}"
          f"{'run s':>8}{'replay s':>9}{'error':>8}")
    for c in compare(eta):
        print(f"{c['id']:<21}{c['rounds']:>7}{c['step_error_mean']:>+16.1%}{c['step_error_min']:>+8.1%}"
              f"{c['step_error_max']:>+8.1%}{c['measured_s']:>8.2f}{c['predicted_s']:>9.2f}{c['duration_error']:>+8.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
