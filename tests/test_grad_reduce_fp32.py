"""``parallel.grad_reduce_in_fp32`` (sim/parallel/dp.py): Megatron's fp32 gradient buffer, as
Megatron-LM before Megatron-Core forced it for bf16. Closed forms read off the spans:

- the data-parallel bytes per rank grow by exactly the gradients' extra 2 bytes per parameter
  on the reduction's wire ((n-1)/n of the message for ZeRO's reduce-scatter, 2(n-1)/n for
  DDP's all-reduce); the parameter all-gather stays bf16;
- the gradient buffer's memset moves 4 bytes per parameter, and Adam needs no cast of the
  gradient (34 bytes per parameter in two launches instead of 40 in three);
- the gradient memory doubles; the planner's estimate reads the same definition;
- FSDP (zero = 3, sim/parallel/fsdp.py, PyTorch FSDP2's reduce_dtype = float32): the
  reduce-scatter's wire bytes double, and with m micro-batches each layer's unsharded gradients
  are accumulated by kernels of their own, 6 bytes a parameter on the first micro-batch (the
  cast) and 10 on the m - 1 others (the fp32 add), one launch per parameter tensor, before the
  reduce-scatter reads them; one micro-batch accumulates nothing; the planner's estimate charges
  the same kernels;
- zero = 3 with dp * cp = 1 (no FSDP group) exits 2 naming the key.

Run: ``python -m pytest tests/test_grad_reduce_fp32.py``
"""

import pytest

from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import HBM_EFFICIENCY, LAUNCH_S
from sim.parallel import layer_program
from sim.parallel.params import layer_params, rank_params, stage_layer_ids
from sim.step import simulate

MODEL = {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 8192}
H100 = gpu_preset("h100-sxm")


def scenario(gpus=8, **parallel):
    return scenario_from_dict({"model": MODEL, "training": {"seq_len": 1024, "global_batch": gpus},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": {"dp": gpus, "dp_algo": "ring", **parallel}})


def params(s) -> float:
    return sum(rank_params(layer_program.context(s, "h100-sxm"), 0))


def seconds(result, name) -> float:
    sp = result.spans
    frame = sp[(sp["rank"] == 0) & (sp.name == name)]
    return float((frame.end_s - frame.start_s).sum())


def streamed(nbytes: float, launches: int) -> float:
    return launches * LAUNCH_S + nbytes / (H100.hbm_bw * HBM_EFFICIENCY)


@pytest.mark.parametrize("zero, wire", [(0, 2 * 7 / 8), (1, 7 / 8)])
def test_fp32_gradients_add_two_bytes_per_parameter_to_the_reduction(zero, wire):
    runs = {flag: simulate(scenario(zero=zero, grad_reduce_in_fp32=flag)) for flag in (False, True)}
    p = params(scenario(zero=zero))
    extra = runs[True].summary["comm_bytes_per_gpu"]["dp"] - runs[False].summary["comm_bytes_per_gpu"]["dp"]
    assert extra == pytest.approx(wire * 2 * p, rel=1e-9)
    assert seconds(runs[True], "zero_grad") == pytest.approx(streamed(4 * p, 1), rel=1e-12)
    shard = p / (8 if zero else 1)
    assert seconds(runs[True], "optimizer") == pytest.approx(streamed((16 + 12 + 4 + 2) * shard, 2), rel=1e-12)
    assert seconds(runs[False], "optimizer") == pytest.approx(streamed((2 + 4 + 16 + 12 + 4 + 2) * shard, 3), rel=1e-12)
    assert runs[True].memory.gradients == pytest.approx(2 * runs[False].memory.gradients, rel=1e-12)


def test_the_reduction_after_the_backward_takes_longer_and_the_planner_reads_it():
    s = {flag: scenario(zero=1, grad_reduce_in_fp32=flag, overlap_grad_reduce=False) for flag in (False, True)}
    runs = {flag: simulate(s[flag]) for flag in s}
    assert seconds(runs[True], "zero_rs") > 1.5 * seconds(runs[False], "zero_rs")
    assert runs[True].summary["step_time_s"] > runs[False].summary["step_time_s"]
    assert layer_program.grad_bytes(s[True].parallel) == 4 and layer_program.grad_bytes(s[False].parallel) == 2


def fsdp_run(flag: bool, micro: int):
    s = scenario(zero=3, grad_reduce_in_fp32=flag)
    s = s.model_copy(update={"training": s.training.model_copy(update={"global_batch": 8 * micro})})
    return s, simulate(s)


def test_fsdp_reduce_scatters_fp32_and_accumulates_with_kernels_of_its_own():
    m = 4
    (s, bf16), (_, fp32) = fsdp_run(False, m), fsdp_run(True, m)
    ctx = layer_program.context(s, "h100-sxm")
    layers = [sum(layer_params(ctx, l)) for l in stage_layer_ids(ctx, 0)]  # embedding, 2 blocks, output
    extra = fp32.summary["comm_bytes_per_gpu"]["dp"] - bf16.summary["comm_bytes_per_gpu"]["dp"]
    assert extra == pytest.approx(7 / 8 * 2 * sum(layers), rel=1e-9)  # the reduce-scatters only: gathers stay bf16
    sp = fp32.spans
    acc = sp[(sp["rank"] == 0) & (sp.name == "fsdp_grad_acc")]
    assert len(acc) == m * len(layers) and seconds(bf16, "fsdp_grad_acc") == 0.0
    tensors = [1, 2 + 4 + 2, 2 + 4 + 2, 1]  # a (default, gelu) block: two norms, wq wk wv wo, the MLP's two matrices
    cast = sum(streamed(6 * n, k) for n, k in zip(layers, tensors))
    add = sum(streamed(10 * n, k) for n, k in zip(layers, tensors))
    assert float((acc.end_s - acc.start_s).sum()) == pytest.approx(cast + (m - 1) * add, rel=1e-9)
    rs = sp[(sp["rank"] == 0) & (sp.name == "fsdp_rs")]
    for layer, start in zip(rs.layer, rs.start_s):  # each reduce-scatter reads the finished sum
        assert start >= acc[acc.layer == layer].end_s.max()
    grown = fp32.memory.gathered - bf16.memory.gathered  # two layers' gradients at 4 bytes, one fresh bf16
    assert grown == pytest.approx((2 * 2 + 2) * max(layers), rel=1e-12)


def test_fsdp_with_one_micro_batch_only_reduce_scatters_wider():
    (_, bf16), (_, fp32) = fsdp_run(False, 1), fsdp_run(True, 1)
    assert seconds(fp32, "fsdp_grad_acc") == 0.0
    assert seconds(fp32, "fsdp_rs") > 1.5 * seconds(bf16, "fsdp_rs")


def test_fsdp_without_a_group_refuses_it_naming_the_key(tmp_path):
    from conftest import assert_refusals

    with pytest.raises(InputError) as err:
        scenario(zero=3, grad_reduce_in_fp32=True, dp=1, tp=8)
    assert err.value.key == "parallel.grad_reduce_in_fp32"
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ntp = 8\nzero = 3\n')
    assert_refusals(path, [(["parallel.grad_reduce_in_fp32=true"], "parallel.grad_reduce_in_fp32")])


def test_a_bad_value_exits_2_naming_the_key(tmp_path):
    from conftest import clustersim

    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\nzero = 1\n')
    for value in ("1", "yes"):
        p = clustersim("run", str(path), "--set", f"parallel.grad_reduce_in_fp32={value}")
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "parallel.grad_reduce_in_fp32" in lines[0], p.stderr


def _estimate_and_step(parallel: dict) -> tuple[float, float]:
    """The planner's estimate and the simulated step of a tp 8 GPT on 128 H100 with ``parallel``."""
    from sim.plan.inputs import request_of
    from sim.plan.published import estimate_of

    d = {"model": {"name": "GPT", "layers": 8, "hidden": 8192, "heads": 64, "ffn_hidden": 32768, "vocab": 131072},
         "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "recompute": "selective"},
         "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 128},
         "parallel": {"tp": 8, "pp": 2, "dp": 8, "sequence_parallel": True, "virtual_stages": 2,
                      "schedule": "interleaved"} | parallel}
    s = scenario_from_dict(d)
    return float(estimate_of(request_of(d | {"name": "t"}), s)["estimate_s"].iat[0]), simulate(s).summary["step_time_s"]


def test_the_planner_estimate_prices_fp32_gradients_like_the_simulation():
    """A tp 8 pipeline whose data-parallel reduce-scatter runs after the backward (Megatron-LM
    of early 2023): the planner's estimate of each gradient width within 2.5% of its simulation,
    and the fp32 one slower."""
    got = {}
    for flag in (False, True):
        got[flag] = _estimate_and_step({"zero": 1, "overlap_grad_reduce": False, "overlap_param_gather": False,
                                        "grad_reduce_in_fp32": flag})
        assert got[flag][0] == pytest.approx(got[flag][1], rel=0.025), flag
    assert got[True][0] > got[False][0] and got[True][1] > got[False][1]


def test_the_planner_estimate_moves_with_fsdp_fp32_gradients_as_the_simulation_does():
    """FSDP under an interleaved pipeline, 8 micro-batches: the estimate's error against the
    simulation (whatever it is for FSDP with PP) is the same, within half a point, with fp32
    gradients as with bf16 ones: it charges the accumulation kernels and the wider reduce-scatter."""
    ratio = {flag: _estimate_and_step({"zero": 3, "grad_reduce_in_fp32": flag}) for flag in (False, True)}
    assert ratio[True][0] > ratio[False][0] and ratio[True][1] > ratio[False][1]
    assert ratio[True][0] / ratio[True][1] == pytest.approx(ratio[False][0] / ratio[False][1], abs=0.005)
