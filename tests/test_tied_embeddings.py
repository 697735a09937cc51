"""Tied embeddings (``model.tied_embeddings``) on a pipeline (sim/parallel/dp.py
``embedding_grad_sync``, sim/parallel/params.py ``holds_one_embedding``), as Megatron runs them
(NVIDIA/Megatron-LM 285068c8 megatron/model/module.py ``initialize_word_embeddings``,
megatron/optimizer/optimizer.py ``allreduce_word_embedding_grads``). Closed forms read off the spans:

- on one stage the output layer reuses the embedding: the data-parallel bytes fall by exactly
  the matrix's gradient on the wire;
- with pp > 1 the last stage keeps its own copy (its gradient reduced over DP as untied), and the
  first and last stages all-reduce its gradient, ``vocab x hidden / tp`` elements at the gradient buffer's
  bytes, over each (first, last) pair of the same tp / dp coordinates; no middle stage takes part;
- that all-reduce is on the step's critical path: the step grows by exactly its duration.

Run: ``python -m pytest tests/test_tied_embeddings.py``
"""

import pytest

from sim.engine.kinds import Category
from sim.input.load import scenario_from_dict
from sim.parallel import layer_program
from sim.parallel.dp import EMBEDDING_SYNC
from sim.step import simulate

VOCAB, HIDDEN = 8192, 1024
MODEL = {"layers": 4, "hidden": HIDDEN, "heads": 8, "vocab": VOCAB}


def scenario(tied, pp=2, tp=1, gpus=16, **parallel):
    return scenario_from_dict({"model": {**MODEL, "tied_embeddings": tied},
                               "training": {"seq_len": 1024, "global_batch": 32},
                               "cluster": {"topology": "dgx-h100", "gpus": gpus},
                               "parallel": {"pp": pp, "tp": tp, "dp": gpus // (pp * tp), "dp_algo": "ring",
                                            **parallel}})


def syncs(result):
    sp = result.spans
    return sp[sp.name == EMBEDDING_SYNC]


def test_one_stage_reuses_the_matrix_and_reduces_it_once():
    runs = {tied: simulate(scenario(tied, pp=1, gpus=8)) for tied in (False, True)}
    saved = runs[False].summary["comm_bytes_per_gpu"][Category.DP] - runs[True].summary["comm_bytes_per_gpu"][Category.DP]
    assert saved == pytest.approx(2 * 7 / 8 * 2 * VOCAB * HIDDEN, rel=1e-9)  # ring all-reduce of bf16 gradients
    assert syncs(runs[True]).empty


@pytest.mark.parametrize("fp32, tp", [(False, 1), (True, 2)])
def test_the_first_and_last_stages_all_reduce_their_copies(fp32, tp):
    s = scenario(True, pp=4, tp=tp, zero=1, grad_reduce_in_fp32=fp32)
    untied = simulate(scenario(False, pp=4, tp=tp, zero=1, grad_reduce_in_fp32=fp32))
    result = simulate(s)
    nbytes = (4 if fp32 else 2) * VOCAB * HIDDEN / tp
    # the copy's gradient reduces over DP as untied; on top, half the ranks (stages 0 and 3 of 4)
    # each send a 2-rank all-reduce's 2 (n-1)/n = 1 message
    extra = result.summary["comm_bytes_per_gpu"][Category.DP] - untied.summary["comm_bytes_per_gpu"][Category.DP]
    assert extra == pytest.approx(2 / 4 * nbytes, rel=1e-12)
    spans = syncs(result)
    layout = layer_program.context(s, "h100-sxm").layout
    assert set(spans.stage) == {0, 3}
    assert {layout.coords(r)[Category.PP] for r in spans["rank"]} == {0, 3}
    assert (spans.bytes == nbytes).all()
    assert (spans.category == Category.DP).all()


def test_the_step_grows_by_the_all_reduce():
    runs = {tied: simulate(scenario(tied, overlap_grad_reduce=False)) for tied in (False, True)}
    spans = syncs(runs[True])
    assert len(spans) == 2  # rank 0 and its last-stage partner (folded copies aside)
    duration = float(spans.end_s.max() - spans.start_s.max())  # from the last member's arrival
    assert duration > 0
    grown = runs[True].summary["step_time_s"] - runs[False].summary["step_time_s"]
    assert grown == pytest.approx(duration, abs=1e-8)  # (within 10 ns: the syncs after it line up anew)
