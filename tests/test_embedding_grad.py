"""The word embeddings' weight gradient (sim/model/vocab.py ``embedding_weight_grad``,
sim/parallel/passes.py ``_embedding_grad``) and, under multi-token prediction on a pipeline, the
all-reduce of the two copies' gradients (sim/parallel/dp.py ``embedding_grad_sync``).

- PyTorch's embedding backward writes the whole [vocab/tp, hidden] gradient (zeroed, then the
  looked-up rows) and Megatron's DDP hook adds it into the gradient buffer: per lookup and
  micro-batch ``(2 + 2 + 2 g) vocab hidden / tp`` bytes in two launches, g the buffer's bytes
  per element (4 under ``grad_reduce_in_fp32``); by hand at DeepSeek-V3's shape;
- in a built step, the input embedding's backward and each MTP depth's input backward grow by
  exactly the compute model's time of those two kernels, and nothing else moves in them;
- with MTP and pp > 1, the first and last stages all-reduce the embedding's gradient
  (Megatron-Core 7094270c finalize_model_grads.py ``_allreduce_word_embedding_grads``), the
  ``vocab x hidden / tp`` elements at the buffer's bytes; none with pp = 1, none without MTP.

Run: ``python -m pytest tests/test_embedding_grad.py``
"""

import copy

import pytest

from sim.input.load import scenario_from_dict
from sim.model.layers import Shard
from sim.model.vocab import embedding_weight_grad
from sim.model.transformer import Dims
from sim.parallel import passes
from sim.parallel.dp import EMBEDDING_SYNC
from sim.parallel.workload import make_context
from sim.step import simulate

TINY_MOE = {"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 512, "vocab": 1000, "mlp": "swiglu",
            "moe": {"experts": 8, "top_k": 2, "dense_layers": 1, "routing": "uniform", "expert_ffn_hidden": 256}}


def scenario(mtp: int = 1, pp: int = 2, fp32: bool = True):
    par = {"tp": 2, "pp": pp, "dp": 8 // (2 * pp), "ep": 2, "sequence_parallel": True, "grad_reduce_in_fp32": fp32}
    return scenario_from_dict({"model": {**copy.deepcopy(TINY_MOE), "mtp_layers": mtp},
                               "training": {"seq_len": 512, "global_batch": 8},
                               "cluster": {"topology": "dgx-h100", "gpus": 8}, "parallel": par})


def test_bytes_by_hand_at_deepseek_v3s_shape():
    d = Dims(61, 7168, 128, 128, 18432, 129280, 3)
    sh = Shard(tokens=4096, seq=4096, micro=1, tp=2, sp=True, flash=True)
    zero, add = embedding_weight_grad(d, sh, 4)
    assert zero.bytes == 2 * 463_339_520  # 129,280 x 7,168 / 2 bf16 elements written
    assert add.bytes == (2 + 4 + 4) * 463_339_520  # bf16 read, fp32 buffer read and written
    assert zero.count == add.count == 1 and zero.flops == add.flops == 0
    assert sum(k.bytes for k in embedding_weight_grad(d, sh, 2)) == 8 * 463_339_520


def _ops(result, name):
    sp = result.spans
    return sp[sp.name == name]


@pytest.mark.parametrize("fp32", [True, False])
def test_each_lookup_backward_grows_by_the_two_kernels(fp32, monkeypatch):
    s = scenario(fp32=fp32)
    with_grad = simulate(s)
    monkeypatch.setattr(passes, "_embedding_grad", lambda b: ())
    without = simulate(s)
    ctx = make_context(s, [], "h100-sxm")
    extra = ctx.compute.time(embedding_weight_grad(ctx.dims, ctx.shard, 4 if fp32 else 2))
    assert extra > 0
    for name in ("embedding_bwd", "mtp_input_bwd"):
        a, b = _ops(with_grad, name), _ops(without, name)
        assert len(a) == len(b) == 4 * len(set(a["rank"]))  # once per micro-batch
        grown = (a.end_s - a.start_s).to_numpy() - (b.end_s - b.start_s).to_numpy()
        assert grown == pytest.approx([extra] * len(a), rel=1e-9), name
    for name in ("embedding_fwd", "mtp_input_fwd", "logits_bwd"):
        a, b = _ops(with_grad, name), _ops(without, name)
        assert ((a.end_s - a.start_s).to_numpy() == pytest.approx((b.end_s - b.start_s).to_numpy(), rel=1e-12))


@pytest.mark.parametrize("fp32", [True, False])
def test_mtp_on_a_pipeline_all_reduces_the_embedding_copies(fp32):
    s = scenario(fp32=fp32)
    spans = _ops(simulate(s), EMBEDDING_SYNC)
    ctx = make_context(s, [], "h100-sxm")
    assert set(spans.stage) == {0, 1}
    assert (spans.bytes == (4 if fp32 else 2) * 1000 * 256 / 2).all()
    assert _ops(simulate(scenario(mtp=0)), EMBEDDING_SYNC).empty  # untied, no MTP: nothing to keep equal
    assert _ops(simulate(scenario(pp=1)), EMBEDDING_SYNC).empty  # one stage holds the only copy
    assert ctx.dims.mtp == 1
