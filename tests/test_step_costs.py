"""Per-step costs and the data-parallel knobs (sim/parallel/step_end.py, dp.py, zero.py,
fsdp.py): closed forms read off the spans.

- the optimizer step is HBM traffic: (grad cast 2 + 4, Adam 16 + 12, master copy 4 + 2)
  bytes per parameter of the rank's shard under Megatron, 28 under FSDP2, over the HBM
  bandwidth at the streaming efficiency, plus one launch per kernel; the gradient norm reads
  4 bytes per parameter and all-reduces one fp32 over every rank;
- ``overlap_grad_reduce = false`` moves every DP reduction after the backward and the step
  becomes the serial sum of backward, reduction and step end;
- ``reshard_after_forward = false`` has no backward all-gather and holds (all layers - two)
  gathered bf16 layers more;
- HSDP (``dp_shard``): each rank sends, per layer, the all-gathers and reduce-scatter over
  its shard group plus the all-reduce of its 1/dp_shard shard across the replicas (ring
  bytes: (n-1)/n and 2(n-1)/n of the message);
- every bad value of a new key exits 2 naming the key (CLI, through a subprocess).

Run: ``python -m pytest tests/test_step_costs.py``
"""


import pytest

from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model.compute import HBM_EFFICIENCY, LAUNCH_S
from sim.parallel import layer_program
from sim.parallel.params import layer_params, rank_params, stage_layer_ids
from sim.step import simulate

from conftest import assert_refusals

MODEL = {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 8192}
H100 = gpu_preset("h100-sxm")


def scenario(gpus=1, batch=None, model=MODEL, **parallel):
    return scenario_from_dict({"model": model, "training": {"seq_len": 1024, "global_batch": batch or gpus},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": {"dp": gpus, **parallel}})


def params_of(s) -> tuple[float, list[float]]:
    """(parameters rank 0 holds, each of its layers' parameters), from the layer split."""
    ctx = layer_program.context(s, "h100-sxm")
    sizes = [sum(layer_params(ctx, l)) for l in stage_layer_ids(ctx, 0)]
    assert sum(rank_params(ctx, 0)) == pytest.approx(sum(sizes), rel=1e-12)
    return sum(sizes), sizes


def span(result, name, rank=0):
    sp = result.spans
    return sp[(sp["rank"] == rank) & (sp.name == name)]


def seconds(frame) -> float:
    return float((frame.end_s - frame.start_s).sum())


def streamed(nbytes: float, launches: int) -> float:
    return launches * LAUNCH_S + nbytes / (H100.hbm_bw * HBM_EFFICIENCY)


@pytest.mark.parametrize("gpus, zero", [(1, 0), (8, 1), (8, 3)])
def test_optimizer_and_grad_norm_are_their_bytes_over_hbm_bandwidth(gpus, zero):
    s = scenario(gpus, zero=zero)
    result = simulate(s)
    shard = params_of(s)[0] / (gpus if zero else 1)
    per_param, launches = ((2 + 4) + (16 + 12) + (4 + 2), 3) if zero < 3 else (16 + 12, 1)
    assert seconds(span(result, "optimizer")) == pytest.approx(streamed(per_param * shard, launches), rel=1e-12)
    assert seconds(span(result, "grad_norm")) == pytest.approx(streamed(4 * shard, 1), rel=1e-12)
    norm = span(result, "grad_norm_ar")
    assert len(norm) == (gpus > 1) and result.spans[result.spans.name == "grad_norm_ar"]["rank"].nunique() == \
        len(result.facts.simulated_ranks) * (gpus > 1)
    zeroed = span(result, "zero_grad")
    assert len(zeroed) == (zero < 3)  # Megatron's memset of the bf16 gradient buffer; FSDP2 frees instead
    if zero < 3:
        assert seconds(zeroed) == pytest.approx(streamed(2 * params_of(s)[0], 1), rel=1e-12)


def test_without_grad_overlap_every_reduction_follows_the_backward_and_the_step_is_serial():
    model = {**MODEL, "layers": 8, "hidden": 2048, "heads": 16}
    runs = {flag: simulate(scenario(2, 8, model, zero=0, **({"ddp_bucket_mb": 16} if flag else {}),
                                    overlap_grad_reduce=flag)) for flag in (True, False)}
    late = runs[False]
    sp = late.spans[late.spans["rank"] == 0]
    backward_end = sp[(sp.category == "compute") & (sp.phase == "backward")].end_s.max()
    reduce = sp[sp.name == "dp_ar"]
    assert len(reduce) == 1 and (reduce.start_s >= backward_end - 1e-15).all()
    chain = ["dp_ar", "grad_norm", "grad_norm_ar", "optimizer", "loss_ar"]
    assert late.summary["step_time_s"] == pytest.approx(
        backward_end + sum(seconds(span(late, n)) for n in chain), rel=1e-12)
    early = runs[True].spans[runs[True].spans["rank"] == 0]
    buckets = early[early.name == "dp_ar"]
    end = early[(early.category == "compute") & (early.phase == "backward")].end_s.max()
    assert len(buckets) > 1 and (buckets.start_s < end).any()  # issued during the backward
    assert runs[True].summary["step_time_s"] < late.summary["step_time_s"] - 0.5 * seconds(reduce)


def test_keeping_gathered_parameters_drops_the_backward_gather_and_holds_the_layers():
    runs = {flag: simulate(scenario(8, 16, zero=3, reshard_after_forward=flag)) for flag in (True, False)}
    names = {flag: runs[flag].spans[runs[flag].spans["rank"] == 0].name for flag in runs}
    layers = len(params_of(scenario(8, zero=3))[1])
    assert (names[True] == "fsdp_ag_bwd").sum() == (names[True] == "fsdp_ag_fwd").sum() == 2 * layers
    assert (names[False] == "fsdp_ag_bwd").sum() == 0 and (names[False] == "fsdp_ag_fwd").sum() == 2 * layers
    total, sizes = params_of(scenario(8, zero=3))
    kept = runs[False].memory.gathered - runs[True].memory.gathered
    assert kept == pytest.approx((total - 2 * max(sizes)) * 2, rel=1e-12)  # bf16 weights of every other layer


def test_without_param_gather_overlap_the_gathers_follow_the_optimizer_and_block():
    runs = {flag: simulate(scenario(8, zero=1, overlap_param_gather=flag)) for flag in (True, False)}
    sp = {flag: runs[flag].spans[runs[flag].spans["rank"] == 0] for flag in runs}
    late, early = sp[False], sp[True]
    opt = late[late.name == "optimizer"].end_s.max()
    gathers = late[late.name == "zero_param_ag"]
    assert len(gathers) and (gathers.start_s >= opt - 1e-15).all()
    assert runs[False].summary["step_time_s"] == pytest.approx(gathers.end_s.max(), rel=1e-12)
    first_forward = early[(early.category == "compute") & (early.phase == "forward")].start_s.min()
    assert (early[early.name == "zero_param_ag"].start_s < first_forward).all()  # issued at the step's start
    assert runs[False].summary["step_time_s"] > runs[True].summary["step_time_s"]


@pytest.mark.parametrize("shard", [8, 4, 2])
def test_hsdp_traffic_per_rank_is_the_shard_groups_plus_the_replicas_all_reduce(shard):
    s = scenario(8, zero=3, dp_shard=shard, dp_algo="ring")
    result = simulate(s)
    total = 2 * params_of(s)[0]  # bf16 bytes of every layer the rank holds
    replicas = 8 // shard
    gathers = 2 * (shard - 1) / shard * total  # forward and backward all-gather (one micro-batch)
    scatter = (shard - 1) / shard * total
    across = 2 * (replicas - 1) / replicas * total / shard  # all-reduce of the 1/dp_shard shard
    syncs = 2 * (8 // replicas - 1) / (8 // replicas) * 4 + 2 * 7 / 8 * 8  # grad norm (one instance), loss
    assert result.summary["comm_bytes_per_gpu"]["dp"] == pytest.approx(gathers + scatter + across + syncs, rel=1e-9)
    assert result.memory.weights == pytest.approx(total / shard, rel=1e-12)  # bf16 shard of dp_shard ranks


CLI_BAD = [  # (overrides, the key the one-line refusal names): each new key once, through the CLI
    (["parallel.dp_shard=3"], "parallel.dp_shard"),  # does not divide dp = 8
    (["parallel.overlap_grad_reduce=1"], "parallel.overlap_grad_reduce"),  # not a boolean
    (["parallel.zero=3", "parallel.overlap_param_gather=false"], "parallel.overlap_param_gather"),
    (["parallel.ddp_bucket_mb=0"], "parallel.ddp_bucket_mb"),
    (["parallel.reshard_after_forward=false"], "parallel.reshard_after_forward"),  # zero 1
    (["training.grad_bucket_mb=8", "parallel.ddp_bucket_mb=8"], "training.grad_bucket_mb"),  # both names
]
RULES = [  # (overrides, key): the other refusals, in process
    ({"dp_shard": 0}, "parallel.dp_shard"), ({"ddp_bucket_mb": -1}, "parallel.ddp_bucket_mb"),
    ({"zero": 0, "dp_shard": 4}, "parallel.dp_shard"), ({"dp_shard": 1}, "parallel.dp_shard"),
    ({"zero": 3, "overlap_grad_reduce": False}, "parallel.overlap_grad_reduce"),
    ({"zero": 3, "ddp_bucket_mb": 8}, "parallel.ddp_bucket_mb"),
    ({"overlap_grad_reduce": False, "ddp_bucket_mb": 8}, "parallel.ddp_bucket_mb"),
    ({"zero": 0, "overlap_param_gather": True}, "parallel.overlap_param_gather"),
    ({"zero": 3, "reshard_after_forward": "no"}, "parallel.reshard_after_forward"),
]


def test_bad_values_of_every_new_key_exit_2_naming_it(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[training]\nseq_len = 1024\n'
                    'global_batch = 8\n[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\nzero = 1\n')
    assert_refusals(path, CLI_BAD)


@pytest.mark.parametrize("parallel, key", RULES)
def test_cross_field_rules_name_the_key(parallel, key):
    with pytest.raises(InputError) as err:
        scenario(8, **{"zero": 1, **parallel})
    assert err.value.key == key


def test_the_old_bucket_key_is_an_alias_of_the_one_definition():
    s = scenario_from_dict({"model": MODEL, "training": {"seq_len": 1024, "global_batch": 8, "grad_bucket_mb": 8},
                            "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": {"dp": 8, "zero": 1}})
    assert s.parallel.ddp_bucket_mb == 8 and s.training.grad_bucket_mb is None
    same = scenario(8, zero=1, ddp_bucket_mb=8)
    assert simulate(s).summary["step_time_s"] == simulate(same).summary["step_time_s"]
