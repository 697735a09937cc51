"""``parallel.grad_reduce_in_fp32`` (sim/parallel/dp.py): Megatron's fp32 gradient buffer, as
Megatron-LM before Megatron-Core forced it for bf16. Closed forms read off the spans:

- the data-parallel bytes per rank grow by exactly the gradients' extra 2 bytes per parameter
  on the reduction's wire ((n-1)/n of the message for ZeRO's reduce-scatter, 2(n-1)/n for
  DDP's all-reduce); the parameter all-gather stays bf16;
- the gradient buffer's memset moves 4 bytes per parameter, and Adam needs no cast of the
  gradient (34 bytes per parameter in two launches instead of 40 in three);
- the gradient memory doubles; the planner's estimate reads the same definition;
- zero = 3 with it exits 2 naming the key.

Run: ``python -m pytest tests/test_grad_reduce_fp32.py``
"""

import pytest

from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import HBM_EFFICIENCY, LAUNCH_S
from sim.parallel import layer_program
from sim.parallel.params import rank_params
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


def test_fsdp_refuses_it_naming_the_key():
    with pytest.raises(InputError) as err:
        scenario(zero=3, grad_reduce_in_fp32=True)
    assert err.value.key == "parallel.grad_reduce_in_fp32"


def test_a_bad_value_exits_2_naming_the_key(tmp_path):
    from conftest import clustersim

    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\nzero = 1\n')
    for value in ("1", "yes"):
        p = clustersim("run", str(path), "--set", f"parallel.grad_reduce_in_fp32={value}")
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "parallel.grad_reduce_in_fp32" in lines[0], p.stderr


def test_the_planner_estimate_prices_fp32_gradients_like_the_simulation():
    """A tp 8 pipeline whose data-parallel reduce-scatter runs after the backward (Megatron-LM
    of early 2023): the planner's estimate of each gradient width within 2.5% of its simulation,
    and the fp32 one slower."""
    from sim.plan.inputs import request_of
    from sim.plan.published import estimate_of

    got = {}
    for flag in (False, True):
        d = {"model": {"name": "GPT", "layers": 8, "hidden": 8192, "heads": 64, "ffn_hidden": 32768,
                       "vocab": 131072},
             "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "recompute": "selective"},
             "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 128},
             "parallel": {"tp": 8, "pp": 2, "dp": 8, "zero": 1, "sequence_parallel": True, "virtual_stages": 2,
                          "schedule": "interleaved", "overlap_grad_reduce": False, "overlap_param_gather": False,
                          "grad_reduce_in_fp32": flag}}
        s = scenario_from_dict(d)
        estimate = float(estimate_of(request_of(d | {"name": "t"}), s)["estimate_s"].iat[0])
        got[flag] = (estimate, simulate(s).summary["step_time_s"])
        assert estimate == pytest.approx(got[flag][1], rel=0.025), flag
    assert got[True][0] > got[False][0] and got[True][1] > got[False][1]
