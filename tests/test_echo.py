"""``clustersim run``'s text summary echoes what ran (sim/outputs/echo.py): overrides show up in
the model, precision, knobs and collectives rows, and MFU names its peak. Through the CLI."""

import re

from conftest import clustersim


def _rows(stdout: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^(\S.*?)\s{2,}(.*)$", stdout, re.M)}


def test_default_summary_names_model_precision_knobs_and_tuner_choice():
    proc = clustersim("run", "scenarios/straggler-dp.toml")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert rows["model"].startswith("gpt-1.7b (preset): ")
    assert rows["precision"].startswith("bf16: every GEMM at 989 TFLOP/s dense BF16")
    assert rows["parallel knobs"].startswith("zero 0, sequence parallel off, TP comm overlap off, recompute none")
    # NCCL's tuner (auto) on 2 DGX H100 nodes: NVLS tree for the gradient buckets, tree with the
    # LL protocol for the step-end gradient-norm sync of one fp32 (sim/parallel/step_end.py)
    assert rows["collectives"] == "dp all_reduce: nvls_tree x26, tree:ll x1"
    assert rows["MFU"].endswith("of the dense BF16 peak (989 TFLOP/s)")


def test_overrides_show_in_the_summary():
    proc = clustersim("run", "scenarios/straggler-dp.toml", "--set", "parallel.dp_algo=ring",
                      "--set", "training.precision=fp8", "--set", "model.preset=qwen3-8b",
                      "--set", "training.recompute=full", "--set", "parallel.zero=1")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert rows["model"].startswith("qwen3-8b (preset): 8.19B parameters")  # model card: 8.2B
    assert rows["precision"].startswith("fp8: transformer linear layers at 1,979 TFLOP/s dense FP8")
    assert rows["parallel knobs"].startswith("zero 1, sequence parallel off, TP comm overlap off, recompute full, "
                                             "dp_algo ring")
    algos = {seg.split(": ")[0]: set(re.findall(r"(\w+)(?::\w+)? x\d+", seg))  # algo[:protocol] xN
             for seg in rows["collectives"].split("; ")}
    # the gradient reduce-scatters and parameter gathers run the forced ring; the step-end syncs of
    # a few bytes (gradient norm, loss: sim/parallel/step_end.py) keep NCCL's tuner (tree, LL)
    assert algos == {"dp all_gather": {"ring"}, "dp reduce_scatter": {"ring"}, "dp all_reduce": {"tree"}}
    bf16, fp8 = map(float, re.findall(r"([\d.]+)% of the dense (?:BF16|FP8)", rows["MFU"]))
    tflops = float(rows["TFLOP/s per GPU"])
    assert abs(bf16 - 100 * tflops / 989) < 0.06 and abs(fp8 - 100 * tflops / 1979) < 0.06
