"""Data, fully sharded and tensor parallelism against the seeds' closed forms.

- Comms volume per GPU per step in parameter bytes: DP all-reduce 2x, FSDP 3x (the seeds),
  times (N-1)/N for a ring.
- TP: 2 all-reduces per layer forward and 2 backward (RS/AG pairs with SP), each moving
  2(t-1)/t * b*s*h*2 bytes per GPU, on the critical path.
- Overlap emerges from streams and dependencies: DP buckets under backward, FSDP's
  all-gather of layer l+1 under layer l's compute.
- The seeds' FSDP crossover: compute time falls as 1/N, comm time does not, so the step
  time stops improving near N* = compute(N) * N / comm.
- ZeRO memory: 16 bytes per parameter, sharded 12 -> +2 -> +2 (Rajbhandari et al. 2020).

Run: ``python -m pytest tests/test_strategies.py``
"""

import numpy as np
import pytest

from sim.hardware.gpus import FABRIC_EFFICIENCY, gpu_preset
from sim.input.load import scenario_from_dict
from sim.outputs.metrics import length, overlap, union
from sim.step import simulate

# A small Llama-like model with layers far above the DDP bucket size (25 MiB), so every
# gradient bucket is large; the volume tests pin rings (dp_algo = "ring"), whose closed
# form they check (NCCL's tuner would take NVLS in one H100 node: tested separately).
SMALL = {"layers": 4, "hidden": 2048, "heads": 16, "vocab": 32000, "mlp": "swiglu", "ffn_hidden": 5632}


def small_params(m=SMALL) -> int:
    """Total parameters from the architecture: attention 4h^2, SwiGLU 3hf, 2 norms per
    layer, final norm, untied embedding and output layer."""
    h, f, L, V = m["hidden"], m["ffn_hidden"], m["layers"], m["vocab"]
    return L * (4 * h * h + 3 * h * f + 2 * h) + h + 2 * V * h


def run(model=SMALL, gpus=16, training=None, cluster=None, **parallel):
    training = {"seq_len": 2048, "global_batch": gpus, **(training or {})}
    return simulate(scenario_from_dict({"model": model, "training": training,
                                        "cluster": {"topology": "dgx-h100", "gpus": gpus, **(cluster or {})},
                                        "parallel": parallel}))


NVLS_OFF = {"topology_overrides": {"nvls": False}}  # NCCL_NVLS_ENABLE=0: rings, as the closed forms assume


def spans_of(result, rank=0, category=None, prefix=None):
    sp = result.spans[result.spans["rank"] == rank]
    if category:
        sp = sp[sp.category == category]
    if prefix:
        sp = sp[sp.name.str.startswith(prefix)]
    return sp


def intervals(sp) -> np.ndarray:
    return union(sp[["start_s", "end_s"]].to_numpy())


# --- comms volume ---------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [8, 16])
@pytest.mark.parametrize("zero, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_dp_bytes_per_gpu_are_2x_or_3x_param_bytes(gpus, zero, factor):
    """DDP all-reduce 2x; ZeRO-1/2 reduce-scatter + parameter all-gather 2x; FSDP
    all-gather fwd + all-gather bwd + reduce-scatter 3x -- of 2 * params bytes (bf16),
    times (N-1)/N. One micro-batch per GPU (global_batch = dp)."""
    result = run(gpus=gpus, dp=gpus, zero=zero, dp_algo="ring")
    expected = factor * 2 * small_params() * (gpus - 1) / gpus
    assert result.summary["comm_bytes_per_gpu"]["dp"] == pytest.approx(expected, rel=0.01)


def test_ddp_in_one_h100_node_takes_nvls_and_sends_1_plus_1_over_n():
    """auto on one DGX H100 node picks NVLS for the gradient buckets (nccl-tests issue 309:
    NVLS from 2 MB): each GPU sends its buffer up once plus its reduced shard, B(1 + 1/N),
    instead of the ring's 2B(N-1)/N."""
    result = run(gpus=8, dp=8, zero=0)
    expected = 2 * small_params() * (1 + 1 / 8)
    assert result.summary["comm_bytes_per_gpu"]["dp"] == pytest.approx(expected, rel=0.01)


def test_fsdp_regathers_every_micro_batch():
    """With m micro-batches per step FSDP gathers each layer in every forward and
    backward (PyTorch FSDP's default reshard) and reduce-scatters once: (2m + 1) x."""
    m = 3
    result = run(gpus=8, dp=8, zero=3, training={"global_batch": 8 * m})
    expected = (2 * m + 1) * 2 * small_params() * 7 / 8
    assert result.summary["comm_bytes_per_gpu"]["dp"] == pytest.approx(expected, rel=0.01)


# --- tensor parallelism ---------------------------------------------------------------

TP_MODEL = {"layers": 3, "hidden": 1024, "heads": 8, "vocab": 128}
SEQ = 1024


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_per_layer_bytes_and_critical_path(tp, sp, free_host):
    result = run(TP_MODEL, gpus=tp, training={"seq_len": SEQ, "global_batch": 1}, cluster=NVLS_OFF, tp=tp,
                 sequence_parallel=sp)
    comm = spans_of(result, category="tp")
    act = 1 * SEQ * TP_MODEL["hidden"] * 2  # b*s*h bf16 bytes
    layers = comm[(comm.layer >= 0) & (comm.layer < TP_MODEL["layers"])]
    per_layer = layers.groupby("layer").name.apply(sorted)
    if sp:  # all-gather before, reduce-scatter after each sublayer, both directions; backward
        # also re-gathers each column-parallel GEMM's saved input for its wgrad (Megatron)
        want = sorted(["attn_ag", "attn_rs", "mlp_ag", "mlp_rs", "attn_grad_ag", "attn_grad_rs",
                       "mlp_grad_ag", "mlp_grad_rs", "attn_input_ag", "mlp_input_ag"])
        per_call = (tp - 1) / tp * act
    else:  # one all-reduce after each sublayer forward, one of its input gradient backward
        want = sorted(["attn_ar", "mlp_ar", "attn_grad_ar", "mlp_grad_ar"])
        per_call = 2 * (tp - 1) / tp * act
    assert all(names == want for names in per_layer) and len(per_layer) == TP_MODEL["layers"]
    assert np.allclose(comm.bytes, per_call, rtol=1e-12)
    # plus the vocab-parallel embedding (forward) and output layer (backward): 2 more
    # all-reduces, or 2 more RS/AG pairs with SP
    calls = (4 if not sp else 10) * TP_MODEL["layers"] + (2 if not sp else 4)
    assert len(comm) == calls
    assert result.summary["comm_bytes_per_gpu"]["tp"] == pytest.approx(calls * per_call, rel=1e-9)
    # critical path: no compute runs while a forward collective or the gather of an output
    # gradient is in flight, and the compute after it starts only once it has finished;
    # the backward's input side (gather of the saved input, reduction of the input
    # gradient) runs beside the dgrad and wgrad GEMMs (Megatron's async collectives)
    compute = spans_of(result, category="compute").sort_values("start_s")
    side = comm.name.str.endswith("_input_ag") | comm.name.isin(["attn_grad_rs", "mlp_grad_rs", "attn_grad_ar",
                                                                 "mlp_grad_ar"])
    blocking, beside = comm[~side], comm[side & (comm.layer >= 0) & (comm.layer < TP_MODEL["layers"])]
    assert overlap(intervals(blocking), intervals(compute)) == pytest.approx(0.0, abs=1e-12)
    for end in blocking.end_s:
        later = compute[compute.start_s >= end - 1e-12]
        earlier = compute[compute.start_s < end - 1e-12]
        assert (earlier.end_s <= end + 1e-12).all() and len(later) > 0
    assert len(beside) == TP_MODEL["layers"] * (4 if sp else 2)
    for _, call in beside.iterrows():  # each runs under a GEMM of its layer's backward
        assert overlap(intervals(beside.loc[[_]]), intervals(compute)) > 0
    step_end = spans_of(result, category="dp")  # the gradient-norm all-reduce over the tp group (step_end.py)
    assert list(step_end.name) == ["grad_norm_ar"] and (step_end.start_s >= compute[compute.name == "grad_norm"].end_s.max()).all()
    busy = length(union(np.vstack([intervals(compute), intervals(comm), intervals(step_end)])))  # no idle: one rank, no pipeline
    assert result.summary["step_time_s"] == pytest.approx(busy, rel=1e-9)


def test_tp8_all_reduce_in_an_h100_node_takes_nvls():
    """With NVLS on (NCCL's default on H100), the 2 MiB TP all-reduces of 8 GPUs go through
    the switch: B(1 + 1/N) sent per GPU per call instead of the ring's 2B(N-1)/N."""
    result = run(TP_MODEL, gpus=8, training={"seq_len": SEQ, "global_batch": 1}, tp=8)
    comm = spans_of(result, category="tp")
    act = 1 * SEQ * TP_MODEL["hidden"] * 2
    assert np.allclose(comm.bytes, act * (1 + 1 / 8), rtol=1e-12)


# --- overlap emerges ------------------------------------------------------------------

def test_ddp_buckets_overlap_backward():
    result = run(gpus=16, dp=16, zero=0)
    dp, compute = spans_of(result, category="dp"), spans_of(result, category="compute")
    backward = compute[compute.name.str.endswith("_bwd")]
    hidden = overlap(intervals(dp), intervals(compute))
    assert hidden > 0.3 * (dp.end_s - dp.start_s).sum()
    assert dp.start_s.min() < backward.end_s.max()  # the first bucket goes out mid-backward
    assert result.summary["exposed_comm_s"] < (dp.end_s - dp.start_s).sum() - hidden * 0.99


def layer_compute_end(result, layer, direction="fwd"):
    sp = spans_of(result, category="compute")
    sp = sp[(sp.layer == layer) & sp.name.str.endswith(direction)]
    return sp.end_s.max(), sp.start_s.min()


def test_fsdp_prefetch_overlaps_the_next_layers_gather():
    on = run(gpus=16, dp=16, zero=3)
    off = run(gpus=16, dp=16, zero=3, training={"fsdp_prefetch": False})
    assert on.summary["step_time_s"] < off.summary["step_time_s"]
    assert on.summary["exposed_comm_s"] < off.summary["exposed_comm_s"]
    for result, prefetch in ((on, True), (off, False)):
        gathers = spans_of(result, prefix="fsdp_ag_fwd")
        for layer in range(SMALL["layers"] - 1):
            end_l, _ = layer_compute_end(result, layer)
            start_next = gathers[gathers.layer == layer + 1].start_s.min()
            if prefetch:
                assert start_next < end_l  # gather(l+1) under compute(l)
            else:
                assert start_next >= end_l - 1e-12
    # with prefetch some of the gather time hides under compute
    dp, compute = spans_of(on, category="dp"), spans_of(on, category="compute")
    assert overlap(intervals(dp), intervals(compute)) > 0


# --- the seeds' FSDP crossover --------------------------------------------------------

def fsdp_step(n: int, seq: int, batch: int):
    """llama3-8b FSDP on n GPUs of DGX H100, one micro-batch per GPU (the seeds' picture:
    each GPU processes its share at once, so FSDP gathers each layer once per pass)."""
    s = scenario_from_dict({"model": {"preset": "llama3-8b"},
                            "training": {"seq_len": seq, "global_batch": batch, "micro_batch": batch // n},
                            "cluster": {"topology": "dgx-h100", "gpus": n}, "parallel": {"dp": n, "zero": 3}})
    return simulate(s).summary


def test_fsdp_crossover_where_the_seeds_predict():
    """Compute = 6 * tokens * params / (N * FLOP/s_eff) falls with N; comm = 3 * params
    * 2 bytes / W is flat, W = GPUs per NVLink domain * per-GPU NIC bandwidth (NCCL runs a
    ring channel per NIC; the seeds' 'NVLink domain size x InfiniBand bandwidth'). The
    step time stops improving near N* = compute(N) * N / comm.

    256 sequences of 512 tokens put N* inside 8..256 on real DGX H100 bandwidth.
    """
    seq, batch = 512, 256
    params = 8.03e9  # Llama 3 8B
    gpu = gpu_preset("h100-sxm")
    nic = gpu.nic_bw * FABRIC_EFFICIENCY["ib"]  # bytes/s per GPU, NCCL-measured share of line rate
    comm = 3 * params * 2 / (8 * nic)  # seconds per step, flat in N
    ns = [8, 16, 32, 64, 128, 256]
    steps = {n: fsdp_step(n, seq, batch)["step_time_s"] for n in ns}
    compute_8 = steps[8]  # 8 GPUs in one NVLink domain: compute dominates
    flops_eff = 6 * batch * seq * params / (8 * compute_8)
    n_star = 6 * batch * seq * params / (flops_eff * comm)
    assert 16 <= n_star <= 256
    # the knee of the simulated curve: where ideal 1/N scaling from N=8 meets the floor
    floor = min(steps.values())
    n_knee = 8 * steps[8] / floor
    assert n_star / 2 <= n_knee <= 2 * n_star
    # well below N*, doubling the GPUs nearly halves the step; above it, it no longer helps
    for n in ns[:-1]:
        speedup = steps[n] / steps[2 * n]
        if 2 * n <= n_star / 2:
            assert speedup > 1.8
        if n >= n_star:
            assert speedup < 1.25
    # beyond the crossover the step is held by communication of at least the flat comm time
    assert steps[256] >= 0.9 * comm


# --- memory ---------------------------------------------------------------------------

@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_shard_weights_gradients_and_adam_state(zero):
    n = 16
    mem = run(gpus=n, dp=n, zero=zero).memory
    p = small_params()
    assert mem.weights == pytest.approx(2 * p / (n if zero >= 3 else 1), rel=1e-9)
    assert mem.gradients == pytest.approx(2 * p / (n if zero >= 2 else 1), rel=1e-9)
    assert mem.optimizer == pytest.approx(12 * p / (n if zero >= 1 else 1), rel=1e-9)


def test_zero_stages_reduce_memory_in_order():
    totals = [run(gpus=16, dp=16, zero=z).summary["memory_per_gpu_bytes"] for z in range(4)]
    assert totals[0] > totals[1] > totals[2] > totals[3]


def test_gpt3_175b_on_8_gpus_without_sharding_does_not_fit():
    s = scenario_from_dict({"model": {"preset": "gpt3-175b"}, "training": {"seq_len": 2048, "global_batch": 8},
                            "cluster": {"topology": "dgx-a100", "gpus": 8}, "parallel": {"dp": 8, "zero": 0}})
    summary = simulate(s).summary
    assert summary["fits_in_memory"] is False
    assert summary["memory_per_gpu_bytes"] >= 16 * 174e9  # 16 bytes per parameter, unsharded
