"""Where a rank's compute time goes by phase (sim.outputs.metrics.rank_breakdown), checked
against what one GPU's step must be, worked out from the schedule rather than from op names.

A 2-layer GPT on one H100, one micro-batch, no communication: the compute stream runs the
gradient buffer's memset (micro-batch -1), the forward (embedding, layers 0..1 ascending,
then the logits at layer 2), then the backward (from the logits down to the embedding), then
the gradient norm and the optimizer (micro-batch -1; sim/parallel/step_end.py). So, from the
run without recomputation:

- optimizer O = the micro-batch -1 spans (step start and end);
- forward F = the other spans up to the first span at the top layer (the logits' forward);
  backward B = everything between;
- recomputation adds kernels and nothing else: recompute = busy(with) - busy(none), and
  under full recomputation it reruns each transformer layer's forward, so it also equals the
  forward spans at layers 0..L-1 (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models": full recomputation
  reruns the layer's forward; selective only the attention core).

Run: ``python -m pytest tests/test_metrics_phases.py``
"""

import numpy as np
import pytest

from sim import load_scenario, simulate
from sim.outputs.host import waits
from sim.outputs.metrics import length, rank_breakdown, union


def host_wait(result) -> float:
    """Seconds the one GPU waited for its host to issue work."""
    return waits(result.spans, result.facts.programs)[0]

TINY = """
name = "tiny-one-gpu"
seed = 0
[model]
layers = 2
hidden = 1024
heads = 8
vocab = 8192
[training]
seq_len = 1024
global_batch = 1
micro_batch = 1
[cluster]
topology = "dgx-h100"
gpus = 1
[parallel]
"""
LAYERS = 2
REL = 1e-12  # the same durations summed in another order


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("metrics") / "tiny.toml"
    path.write_text(TINY)
    return {rc: simulate(load_scenario(str(path), [f"training.recompute={rc}"]))
            for rc in ("none", "selective", "full")}


def by_hand(result) -> dict:
    """F, B, O of a run without recomputation, from the order of its spans and their layers."""
    sp = result.spans.sort_values("start_s", kind="stable")
    dur = (sp.end_s - sp.start_s).to_numpy()
    layer, mb = sp.layer.to_numpy(), sp.micro_batch.to_numpy()
    turn = int(np.flatnonzero(layer == LAYERS)[0])  # the logits' forward: the last forward span
    opt = mb < 0
    fwd = (np.arange(len(sp)) <= turn) & ~opt
    return {"forward": dur[fwd].sum(), "backward": dur[~fwd & ~opt].sum(), "optimizer": dur[opt].sum(),
            "layers_forward": dur[fwd & (layer >= 0) & (layer < LAYERS)].sum()}


def busy(result) -> float:
    return length(union(result.spans[["start_s", "end_s"]].to_numpy()))


def breakdown(result) -> dict:
    return rank_breakdown(result.spans, 0, result.summary["step_time_s"])


def test_the_tiny_step_is_what_the_docstring_says(runs):
    sp = runs["none"].spans.sort_values("start_s")
    assert set(sp.category) == {"compute"} and len(sp) == 23  # 1, 1 + 2*4 + 1 forward, 1 + 2*4 + 1 backward, 2
    assert sp.name.tolist()[:1] + sp.name.tolist()[-2:] == ["zero_grad", "grad_norm", "optimizer"]
    assert sp.layer.tolist()[1:12] == [-1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    # back to back, but for the waits for the host to issue the work (sim/outputs/host.py)
    assert busy(runs["none"]) + host_wait(runs["none"]) == pytest.approx(runs["none"].summary["step_time_s"], rel=REL)


def test_without_recomputation(runs):
    want, got = by_hand(runs["none"]), breakdown(runs["none"])
    assert got["compute_forward"] == pytest.approx(want["forward"], rel=REL)
    assert got["compute_backward"] == pytest.approx(want["backward"], rel=REL)
    assert got["compute_optimizer"] == pytest.approx(want["optimizer"], rel=REL)
    assert got["compute_recompute"] == 0.0
    assert got["idle"] == pytest.approx(host_wait(runs["none"]), rel=REL) and got["exposed_comm"] == 0.0


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_is_its_own_phase(runs, mode):
    """Forward and backward are the run without recomputation's; recompute is the extra busy time."""
    want, got = by_hand(runs["none"]), breakdown(runs[mode])
    extra = busy(runs[mode]) - busy(runs["none"])
    assert extra > 0
    assert got["compute_recompute"] == pytest.approx(extra, rel=1e-9)
    assert got["compute_forward"] == pytest.approx(want["forward"], rel=REL)
    assert got["compute_backward"] == pytest.approx(want["backward"], rel=REL)
    assert got["compute_optimizer"] == pytest.approx(want["optimizer"], rel=REL)


def test_full_recomputation_reruns_every_layers_forward(runs):
    want, got = by_hand(runs["none"]), breakdown(runs["full"])
    assert got["compute_recompute"] == pytest.approx(want["layers_forward"], rel=REL)
    selective = breakdown(runs["selective"])["compute_recompute"]
    assert 0 < selective < 0.25 * got["compute_recompute"]  # the attention core only
