"""Which collective a call is travels as a :class:`sim.collectives.kinds.CollectiveOp`
member from the builders to the engine (which tells a send/recv by identity), which algorithm
runs it as an :class:`~sim.collectives.kinds.Algorithm`, and both print as the plain strings
they replaced.

Run: ``python -m pytest tests/test_collective_ops.py``
"""

import json

import pytest

from sim.collectives import ALGOS, DEFAULT_FABRIC, OPS, pick_algorithm, schedule
from sim.collectives.kinds import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, RING_SHIFT, SEND_RECV,
                                   Algorithm, CollectiveOp)
from sim.collectives.tuner import candidates, comm_of
from sim.parallel.workload import build_programs
from test_copies import context

# layout (tests/test_copies.py) -> the collectives its builders must issue
EXPECTED = {
    "ptd-sp-zero1": {ALL_GATHER, REDUCE_SCATTER, SEND_RECV, ALL_REDUCE},  # SP, pipeline, ZeRO-1, loss/norm sync
    "cp-tp": {RING_SHIFT, ALL_REDUCE},  # CP's K/V ring, TP's partial sums
    "fsdp": {ALL_GATHER, REDUCE_SCATTER},
    "moe-skew-pp": {ALL_TO_ALL, ALL_GATHER, SEND_RECV},  # token dispatch/combine, the routing counts
}


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_every_built_call_carries_a_member(layout):
    seen = set()
    for program in build_programs(context(layout, fold=True)):
        for op in program.ops:
            if op.comm is not None:
                assert type(op.comm.op) is CollectiveOp, (op.name, op.comm.op)
                seen.add(op.comm.op)
    assert EXPECTED[layout] <= seen


def test_members_print_as_the_strings_they_replaced():
    text = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv", "ring_shift"]
    assert [str(op) for op in OPS] == text
    assert [f"{op}" for op in OPS] == text and json.dumps(list(OPS)) == json.dumps(text)
    assert json.dumps({ALL_REDUCE: ALL_REDUCE}) == '{"all_reduce": "all_reduce"}'


def test_text_becomes_the_member_where_it_enters():
    assert schedule("send_recv", "direct", (0, 1), 1e6, (0, 0)).op is SEND_RECV
    assert comm_of("all_reduce", (0, 0, 1, 1), None).op is ALL_REDUCE
    with pytest.raises(ValueError):
        CollectiveOp("allreduce")  # (only calibrate/nccl knows nccl-tests' binary spellings)


def test_every_built_call_carries_an_algorithm_member():
    """The scenario's parallel.dp_algo text becomes an Algorithm where a builder issues the call."""
    for layout in sorted(EXPECTED):
        algos = {op.comm.algo for p in build_programs(context(layout, fold=True)) for op in p.ops if op.comm}
        assert algos and all(type(a) is Algorithm for a in algos), (layout, algos)


def test_algorithms_print_as_the_strings_they_replaced():
    text = ["ring", "tree", "nvls", "nvls_tree", "collnet", "pat", "hierarchical", "direct", "auto"]
    assert [str(a) for a in ALGOS] == text and json.dumps(list(ALGOS)) == json.dumps(text)
    found = candidates(ALL_REDUCE, 1 << 20, (0, 0, 1, 1), DEFAULT_FABRIC)  # NCCL's order: tree first
    assert found[0].algo is Algorithm.TREE and all(type(c.algo) is Algorithm for c in found)
    assert {c.name for c in found} >= {"tree", "ring", "ring:ll", "tree:ll128"}
    assert type(pick_algorithm(ALL_TO_ALL, (0, 1), 1e6, (0, 1))) is Algorithm


def test_the_command_line_algorithm_becomes_the_member_once_checked():
    from types import SimpleNamespace
    from sim.commands.collective import _check_args
    from sim.errors import InputError

    args = SimpleNamespace(algo="tree", proto=None, op="all_reduce", gpus=8, explain=False)
    _check_args(args)
    assert args.algo is Algorithm.TREE
    with pytest.raises(InputError) as exc:
        _check_args(SimpleNamespace(algo="tree2", proto=None, op="all_reduce", gpus=8, explain=False))
    assert exc.value.reason == "unknown algorithm 'tree2'; known: " + ", ".join(ALGOS)


def test_layer_collectives_carry_their_axis_as_a_category():
    """LayerCollective.axis and LayerOp.category (what the planner and the census read) are
    Category members, and ``collectives(Category.TP)`` finds the tensor-parallel calls."""
    import sim
    from sim.engine.kinds import Category
    from sim.parallel import layer_program

    s = sim.load_scenario("scenarios/gpt-1.7b-ptd-interleaved-a100.toml")
    found = [lp for lp in layer_program.programs(s, s.cluster.gpu or "a100").values() if lp is not None]
    calls = [c for lp in found for c in lp.collectives()]
    assert calls and all(type(c.axis) is Category for c in calls)
    assert all(type(op.category) is Category for lp in found for op in lp.ops)
    tp = [c for lp in found for c in lp.collectives(Category.TP)]
    assert {c.axis for c in tp} == {Category.TP} and len(tp) == sum(lp.by_category()[Category.TP] for lp in found) > 0
