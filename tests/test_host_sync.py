"""The host's waits (``Op.sync``, sim/engine/ops.py ``RankProgram.anchors``): after a sync op
the host's clock jumps to that op's end, so whatever is issued after it starts no earlier
than that end plus its own issue time; and the MoE forward emits one such wait per layer and
micro-batch where Megatron-Core's alltoall dispatcher does (sim/parallel/ep.py).

Closed form: op 0 costs a to issue and takes G seconds of GPU time, op 1 is a sync op on
another stream after op 0 costing c, op 2 takes g and costs X to issue. Without the wait the
host had issued op 2 long before op 0 ended (a + c + X < a + G), so the step is a + G + g;
with it the step is a + G + X + g: slower by exactly X. Run ``python -m pytest -q tests/test_host_sync.py``.
"""

import pytest

from conftest import spec_topology
from sim.engine.core import Engine
from sim.engine.ops import Op, RankProgram
from sim.engine.kinds import Category, Phase
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.step import build, build_topology

TOPO = spec_topology(8)
G, g, A, C, X = 1e-3, 2e-4, 1e-6, 3e-6, 5e-5


def _run(sync: bool, sync_deps=(0,)) -> tuple[Engine, RankProgram]:
    prog = RankProgram(0, [
        Op("long", Category.COMPUTE, "compute", G, issue=A),
        Op("d2h", Category.COMPUTE, "ep", 0.0, deps=sync_deps, issue=C, sync=sync),
        Op("after", Category.COMPUTE, "compute", g, issue=X),
    ])
    engine = Engine(TOPO, [prog])
    engine.run()
    return engine, prog


def test_a_sync_exposes_exactly_the_issue_time_of_what_follows():
    free, _ = _run(False)
    held, prog = _run(True)
    assert free.times[0].end[-1] == pytest.approx(A + G + g, abs=1e-15)
    assert held.times[0].end[-1] == pytest.approx(A + G + X + g, abs=1e-15)
    assert held.times[0].end[-1] - free.times[0].end[-1] == pytest.approx(X, abs=1e-15)
    assert prog.issued(held.times[0].end) == pytest.approx([A, A + C, A + G + X], abs=1e-15)


def test_the_host_waits_for_its_sync_op_only():
    """A sync op with no deps ends when issued (a + c): the host runs on and op 2 waits for
    op 0 on its stream only, as without the wait."""
    held, _ = _run(True, sync_deps=())
    assert held.times[0].end[1] == pytest.approx(A + C, abs=1e-15)
    assert held.times[0].end[-1] == pytest.approx(A + G + g, abs=1e-15)


def test_a_program_without_sync_ops_has_no_anchors():
    _, prog = _run(False)
    assert prog.anchors() is None
    assert prog.issued([1.0, 2.0, 3.0]) == prog.release()


def test_a_copy_shares_its_bases_host_waits_and_they_are_its_own():
    """``RankProgram.share_host`` (program copies): the copy's release times and anchors
    are its base's, computed once, and what the copy's own ops give."""
    _, base = _run(True)
    base.released = base._anchored = None  # (nothing computed yet: share_host must do it)
    copy = RankProgram(1, list(base.ops))
    copy.share_host(base)
    own = RankProgram(2, list(base.ops))
    assert copy.anchors() is base.anchors() and copy.anchors() == own.anchors() is not None
    assert copy.release() is base.release() and copy.release() == own.release()
    assert copy.anchors()[0].tolist() == [-1, -1, 1]  # op 2 issued after the sync op 1


def _moe(routing: str, ep: int = 8, **moe) -> dict:
    return {"model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                      "moe": {"experts": 8, "top_k": 2, "routing": routing, **moe}},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": ep},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 8}}


def _syncs(spec: dict) -> list[Op]:
    s = scenario_from_dict(spec)
    return [op for op in build(s, build_topology(s))[1][0].ops if op.sync]


def test_dropless_moe_waits_once_per_layer_and_micro_batch_in_the_forward():
    s = scenario_from_dict(_moe("uniform"))
    ops = build(s, build_topology(s))[1][0].ops
    waits = [i for i, op in enumerate(ops) if op.sync]
    micro = s.training.global_batch // s.parallel.dp // s.training.micro_batch
    assert len(waits) == s.model.layers * micro
    assert {ops[i].phase for i in waits} == {Phase.FORWARD}
    for i in waits:  # dropless: the permutation was issued before the wait, the dispatch after it
        assert ops[i - 1].name == "permute_fwd" and ops[i + 1].name.startswith("a2a_dispatch_fwd")
        assert ops[i].issue == pytest.approx(host.D2H_SYNC_S)


def test_no_wait_when_padded_to_capacity_or_without_expert_parallelism():
    assert _syncs(_moe("token_drop")) == []  # drop_and_pad: Megatron knows the sizes
    assert _syncs(_moe("uniform", ep=1)) == []
    capped = _syncs(_moe("token_drop", pad_to_capacity=False))  # before_permutation_1
    assert len(capped) == 4


def test_the_host_track_counts_the_wait_after_the_sync():
    """The GPU waited X for the host after the sync (op 2 ready at a + G, issued at
    a + G + X), and the host track's last span ends there, not at the static a + c + X."""
    from sim.outputs.host import spans, waits
    from sim.outputs.result import spans_frame

    engine, prog = _run(True)
    table = spans_frame(engine)
    assert waits(table, [prog])[0] == pytest.approx(A + X, abs=1e-15)  # (op 0 waited a for its issue too)
    assert spans([prog], spans_table=table)["end_s"].max() == pytest.approx(A + G + X, abs=1e-15)


def _anchors_op_by_op(ops):
    """RankProgram.anchors as it was computed before (main f2cbd7f): one Python step per op."""
    from array import array
    anchor, offset, a, since = array("q"), array("d"), -1, 0.0
    for i, op in enumerate(ops):
        since += op.issue
        anchor.append(a)
        offset.append(since)
        if op.sync:
            a, since = i, 0.0
    return (anchor, offset) if a >= 0 else None


@pytest.mark.parametrize("seed", range(6))
def test_anchors_by_stretches_are_the_op_by_op_floats(seed):
    """Random issue costs (sums that round), sync ops anywhere: first, last, adjacent, none."""
    import random
    rnd = random.Random(seed)
    for n in (0, 1, 2, 3, 17, 400):
        for p_sync in (0.0, 0.05, 0.5, 1.0):
            ops = [Op(f"o{i}", Category.COMPUTE, "compute", 0.0, issue=rnd.random() * 1e-5,
                      sync=rnd.random() < p_sync) for i in range(n)]
            if n and seed % 2:
                ops[-1] = ops[-1]._replace(sync=True)
            want, got = _anchors_op_by_op(ops), RankProgram(0, ops).anchors()
            assert (want is None) == (got is None)
            if want is not None:
                assert list(got[0]) == list(want[0])
                assert [x.hex() for x in got[1]] == [x.hex() for x in want[1]]
