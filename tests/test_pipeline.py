"""Pipeline parallelism: bubbles, where they sit, activation traffic, stage splits and
the activation memory each schedule keeps in flight.

Uniform stages (no TP/DP traffic, vocab 128 so the embedding and logits are negligible,
layers divisible by p, long sequences so point-to-point latency and the optimizer are
small next to a micro-batch) let the closed forms hold:
- GPipe / 1F1B: idle fraction of the step (p-1)/(m+p-1); interleaved with v chunks
  (p-1)/(v*m+p-1) (Narayanan et al. 2021, section 2.2; the validation README).
- The seeds: at the start, the stages holding the last layers idle; at the end of the
  batch's forward sweep, the stages holding the first layers idle.

Run: ``python -m pytest tests/test_pipeline.py``
"""

import numpy as np
import pytest

from sim.model.compute import ATTENTION_KERNEL

from conftest import assert_input_error, clustersim

from sim.input.load import scenario_from_dict
from sim.parallel.memory import stage_memory
from sim.outputs.metrics import rank_times
from sim.parallel.pp import split_layers
from sim.step import simulate
from sim.parallel.workload import make_context

H, HEADS, VOCAB = 1024, 8, 128


def pp_scenario(p, m, schedule="1f1b", v=1, layers=None, seq=32768, stage_layers=None, tp=1, fold=True):
    parallel = {"pp": p, "tp": tp, "schedule": schedule, "virtual_stages": v, "fold": fold}
    if stage_layers:
        parallel["stage_layers"] = stage_layers
    return scenario_from_dict({"model": {"layers": layers or 2 * p * v, "hidden": H,
                                         "heads": HEADS, "vocab": VOCAB},
                               "training": {"seq_len": seq, "global_batch": m},
                               "cluster": {"topology": "dgx-h100", "gpus": p * tp}, "parallel": parallel})


def pp_run(*args, **kwargs):
    return simulate(pp_scenario(*args, **kwargs))


# --- bubble fraction ------------------------------------------------------------------

@pytest.mark.parametrize("p, m, schedule, v", [
    (4, 8, "1f1b", 1), (4, 8, "gpipe", 1), (4, 16, "1f1b", 1), (4, 16, "gpipe", 1),
    (8, 16, "1f1b", 1), (8, 8, "gpipe", 1),
    (4, 8, "interleaved", 2), (4, 8, "interleaved", 4), (8, 16, "interleaved", 2)])
def test_bubble_fraction_matches_the_closed_form(p, m, schedule, v):
    result = pp_run(p, m, schedule, v)
    expected = (p - 1) / (v * m + p - 1)
    assert result.summary["bubble_fraction"] == pytest.approx(expected, rel=0.02)


def test_interleaving_shrinks_the_bubble_by_v():
    plain = pp_run(4, 8, "1f1b").summary
    inter = pp_run(4, 8, "interleaved", 4).summary
    # idle / ideal = (p-1)/m for 1F1B, (p-1)/(v m) interleaved
    ratio = lambda f: f / (1 - f)
    assert ratio(inter["bubble_fraction"]) == pytest.approx(ratio(plain["bubble_fraction"]) / 4, rel=0.03)


def test_every_uniform_stage_idles_the_same():
    result = pp_run(4, 8, "1f1b")
    per_rank = rank_times(result.spans, result.summary["step_time_s"])
    assert per_rank.idle_s.min() == pytest.approx(per_rank.idle_s.max(), rel=0.02)


# --- where the bubbles sit ------------------------------------------------------------

def passes(result, rank):
    """(micro_batch, direction) -> (start, end) of that pass's compute on ``rank``."""
    sp = result.spans
    c = sp[(sp["rank"] == rank) & (sp.category == "compute") & (sp.micro_batch >= 0)]
    c = c.assign(d=np.where(c.name.str.endswith("_bwd"), "B", "F"))
    g = c.groupby(["micro_batch", "d"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    return {k: (r.start, r.end) for k, r in g.iterrows()}


def test_gpipe_bubbles_sit_where_the_seeds_say():
    p, m = 4, 8
    result = pp_run(p, m, "gpipe")
    stage = {s: passes(result, s) for s in range(p)}  # rank s is stage s (tp = dp = 1)
    t_f = stage[1][(0, "F")][1] - stage[1][(0, "F")][0]
    t_b = stage[1][(0, "B")][1] - stage[1][(0, "B")][0]
    # GEMMs: dgrad + wgrad = 2x; flash attention 2.5x the FLOPs at the backward kernel's
    # lower efficiency (ATTENTION_KERNEL: at most the ratio of the curves' maxima)
    (fwd, _), (bwd, _) = ATTENTION_KERNEL["h100-sxm"]["cudnn"]
    assert 2 * t_f <= t_b <= 2.5 * fwd / bwd * t_f
    # start of the step (t0: after the gradient buffer's memset, sim/parallel/step_end.py):
    # stage s waits s forward passes; the last stages idle
    t0 = stage[0][(0, "F")][0]
    for s in range(p):
        assert stage[s][(0, "F")][0] - t0 == pytest.approx(s * t_f, rel=0.02, abs=1e-12)
    # end of the batch's forward sweep: the first stages are done and idle while the last
    # ones still compute; stage 0 then waits (p-1)(t_f + t_b) for the first gradient
    last_f = {s: stage[s][(m - 1, "F")][1] for s in range(p)}
    assert last_f[0] - t0 == pytest.approx(m * t_f, rel=0.02)
    assert last_f[p - 1] - t0 == pytest.approx((m + p - 1) * t_f, rel=0.02)
    first_b = min(stage[0][(mb, "B")][0] for mb in range(m))
    assert first_b - last_f[0] == pytest.approx((p - 1) * (t_f + t_b), rel=0.03)
    # the backward sweep mirrors it: the last stage finishes (p-1) backward passes before
    # the first, so at the very end of the step the last stages idle
    last_b = {s: max(stage[s][(mb, "B")][1] for mb in range(m)) for s in range(p)}
    assert last_b[0] - last_b[p - 1] == pytest.approx((p - 1) * t_b, rel=0.03)


def test_1f1b_last_stage_starts_late_and_finishes_early():
    p, m = 4, 8
    result = pp_run(p, m, "1f1b")
    stage = {s: passes(result, s) for s in range(p)}
    t_f = stage[0][(0, "F")][1] - stage[0][(0, "F")][0]
    first = [stage[s][(0, "F")][0] for s in range(p)]
    last = [max(e for (_, d), (_, e) in stage[s].items() if d == "B") for s in range(p)]
    assert first == sorted(first) and first[-1] == pytest.approx((p - 1) * t_f, rel=0.02)
    assert last == sorted(last, reverse=True)


# --- activation traffic ---------------------------------------------------------------

@pytest.mark.parametrize("p, m, schedule, v, tp", [
    (4, 8, "1f1b", 1, 1), (4, 4, "gpipe", 1, 1), (4, 8, "interleaved", 2, 1), (2, 4, "1f1b", 1, 2)])
def test_pp_moves_only_boundary_activations(p, m, schedule, v, tp):
    """Each of the v*p - 1 boundaries carries b*s*h*2 bytes per micro-batch forward and
    the same gradient back; with TP each tp rank sends 1/tp (Megatron's scatter/gather).
    Per GPU: 2 * m * A * (v*p - 1) / p on average; stage 0 and p-1 (v = 1) send m * A."""
    seq = 2048
    result = pp_run(p, m, schedule, v, seq=seq, tp=tp, fold=False)
    act = seq * H * 2 / tp
    mean = result.summary["comm_bytes_per_gpu"]["pp"]
    assert mean == pytest.approx(2 * m * act * (v * p - 1) / p, rel=1e-9)
    sent = result.spans[result.spans.category == "pp"].groupby("rank").bytes.sum()
    stage_of = lambda r: r // tp
    if v == 1:
        for rank, nbytes in sent.items():
            boundary_sends = 1 if stage_of(rank) in (0, p - 1) else 2
            assert nbytes == pytest.approx(boundary_sends * m * act, rel=1e-9)
    assert all(result.summary["comm_bytes_per_gpu"][a] == 0.0 for a in ("ep", "cp"))
    dp = result.spans[result.spans.category == "dp"]  # only the step-end syncs of sim/parallel/step_end.py
    assert set(dp.name) <= {"grad_norm_ar", "loss_ar"} and dp.bytes.max() <= 8 * 2


# --- stage splits ---------------------------------------------------------------------

def test_default_split_puts_the_remainder_in_the_middle():
    assert [len(r) for r in split_layers(126, 16, None)] == [7] + [8] * 14 + [7]
    assert [len(r) for r in split_layers(10, 4, None)] == [2, 3, 3, 2]
    assert [len(r) for r in split_layers(16, 4, None)] == [4, 4, 4, 4]
    assert [len(r) for r in split_layers(16, 4, [7, 3, 3, 3])] == [7, 3, 3, 3]


def layers_per_stage(result) -> list[int]:
    sp = result.spans
    body = sp[(sp.layer >= 0) & (sp.layer < result.scenario.model.layers)]
    per = body.groupby("stage").layer.unique()
    return [len(per[s]) for s in sorted(per.index)]


def test_llama3_405b_like_126_layers_on_16_stages():
    result = pp_run(16, 16, "1f1b", layers=126, seq=512)
    assert layers_per_stage(result) == [7] + [8] * 14 + [7]
    result = pp_run(4, 4, "1f1b", layers=10, seq=512, stage_layers=[1, 4, 4, 1])
    assert layers_per_stage(result) == [1, 4, 4, 1]


# --- chunks holding only the embedding or the loss -------------------------------------

@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (4, 4, 8), (8, 4, 8)])
def test_embedding_and_loss_chunks_take_two_chunk_times_off_the_step(p, v, m):
    """One layer per chunk: the step is (v m + p - 1) chunk-times, the bubble (p-1)/(v m)
    of the work. With the first chunk holding only the embedding and the last only the
    loss (Megatron's account-for-embedding/loss-in-pipeline-split; vocab 128 makes both
    nearly free), the pipeline fills and drains one chunk sooner: (v m + p - 3)."""
    n = p * v
    uniform = pp_run(p, m, "interleaved", v, layers=n, stage_layers=[1] * n).summary
    ends = pp_run(p, m, "interleaved", v, layers=n - 2, stage_layers=[0] + [1] * (n - 2) + [0]).summary
    assert uniform["bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1), rel=0.05)
    assert ends["step_time_s"] == pytest.approx(uniform["step_time_s"] * (v * m + p - 3) / (v * m + p - 1), rel=0.01)


def test_llama3_405b_on_128_chunks_with_embedding_and_loss_chunks():
    """The issue's layout: pp 16 x 8 virtual stages, one layer per chunk, the first chunk
    only the embedding and the last only the output layer (126 layers, 128 chunks; the
    default split cannot place 126 layers on 128 chunks)."""
    layout = [0] + [1] * 126 + [0]
    s = scenario_from_dict({"model": {"preset": "llama3-405b"},
                            "training": {"seq_len": 8192, "global_batch": 16, "recompute": "selective"},
                            "cluster": {"topology": "dgx-h100", "gpus": 128},
                            "parallel": {"tp": 8, "pp": 16, "virtual_stages": 8, "schedule": "interleaved",
                                         "sequence_parallel": True, "stage_layers": layout}})
    result = simulate(s)
    sp = result.spans[(result.spans.category == "compute") & (result.spans.phase != "optimizer")]
    stages = sp.groupby("layer").stage.unique()
    assert list(stages[-1]) == [0] and list(stages[126]) == [15]  # embedding / output layer alone
    assert all(list(stages[l]) == [(l + 1) % 16] for l in range(126))  # layer l is chunk l + 1
    chunk0 = sp[(sp.stage == 0) & (sp.micro_batch == 0) & (sp.layer < 15)]
    assert set(chunk0.name) == {"embedding_fwd", "embedding_bwd"}
    assert 0 < result.summary["bubble_fraction"] < 0.2 and result.summary["step_time_s"] > 0


def test_an_empty_chunk_that_holds_nothing_is_an_input_error():
    proc = clustersim("run", "scenarios/gpt-1.7b-ptd-interleaved-a100.toml", "--set",
                      "parallel.stage_layers=[12, 0, 6, 6]")  # chunk 1: no layer, no embedding, no loss
    assert_input_error(proc, "parallel.stage_layers")
    assert "entry 1 is 0" in proc.stderr


def test_an_imbalanced_split_is_held_by_its_slowest_stage():
    """With per-layer time u and stage times t_s: the bottleneck stage alone is busy
    m * max t_s, and a pipeline is never slower than (m-1) max t_s + sum t_s."""
    p, m = 4, 8
    balanced = pp_run(p, m, "1f1b", layers=16).summary["step_time_s"]
    skewed = pp_run(p, m, "1f1b", layers=16, stage_layers=[7, 3, 3, 3]).summary["step_time_s"]
    u = balanced / ((m + p - 1) * 4)
    assert skewed > balanced
    assert m * 7 * u <= skewed <= ((m - 1) * 7 + 16) * u * 1.01


# --- activation memory follows the schedule -------------------------------------------

def layers_alive(result, rank) -> int:
    """Most (micro-batch, layer) activations held at once on ``rank``, from the executed
    timeline: +1 when a layer's forward starts, -1 when its backward ends."""
    sp = result.spans
    body = (sp.layer >= 0) & (sp.layer < result.scenario.model.layers)
    c = sp[(sp["rank"] == rank) & (sp.category == "compute") & (sp.micro_batch >= 0) & body]
    events = []
    for _, g in c.groupby(["micro_batch", "layer"]):
        bwd = g.name.str.endswith("_bwd")
        events += [(g[~bwd].start_s.min(), 1), (g[bwd].end_s.max(), -1)]
    held = peak = 0
    for _, delta in sorted(events):  # at equal times the -1 (a freed buffer) goes first
        held += delta
        peak = max(peak, held)
    return peak


def korthikanti(seq, layers) -> float:
    """Activation bytes one micro-batch keeps per stage: 34 s b h per layer (Korthikanti
    et al. 2022, Table 2, flash attention: no 5as/h term; tp = 1)."""
    return 34 * seq * H * layers


@pytest.mark.parametrize("schedule, v, held", [("1f1b", 1, 4), ("gpipe", 1, 8), ("interleaved", 2, 11)])
def test_stage_0_activation_memory_follows_the_schedule(schedule, v, held):
    """Stage 0 of p=4, m=8: 1F1B keeps p micro-batches, GPipe m, interleaved 1F1B
    2(p-1) + (v-1)p + 1 = 11 chunk-micro-batches of L/(vp) layers each."""
    p, m, seq = 4, 8, 1024
    s = pp_scenario(p, m, schedule, v, layers=16, seq=seq, fold=False)
    layers_per_chunk = 16 // (p * v)
    mem = stage_memory(make_context(s, [0] * p, "h100-sxm"), 0)
    assert mem.activations == pytest.approx(korthikanti(seq, layers_per_chunk) * held, rel=1e-9)
    # the executed timeline agrees: layers of stage 0 alive at once = held * layers per chunk
    assert layers_alive(simulate(s), 0) == held * layers_per_chunk


def test_interleaving_costs_more_memory_than_1f1b_and_less_than_gpipe():
    p, m = 4, 8
    act = {}
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1)):
        s = pp_scenario(p, m, schedule, v, layers=16, seq=1024)
        act[schedule] = stage_memory(make_context(s, [0] * p, "h100-sxm"), 0).activations
    assert act["1f1b"] < act["interleaved"] < act["gpipe"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_1f1b_stage_s_keeps_p_minus_s_micro_batches(stage):
    p, m, seq = 4, 8, 1024
    s = pp_scenario(p, m, "1f1b", layers=16, seq=seq, fold=False)
    assert layers_alive(simulate(s), stage) == (p - stage) * 4  # 4 layers per stage
    mem = stage_memory(make_context(s, [0] * p, "h100-sxm"), stage)
    logits = 4 * seq * VOCAB if stage == p - 1 else 0  # fp32 logits of one micro-batch
    assert mem.activations == pytest.approx(korthikanti(seq, 4) * (p - stage) + logits, rel=1e-9)
