"""Which collective a call is travels as a :class:`sim.collectives.kinds.CollectiveOp`
member from the builders to the engine (which tells a send/recv by identity), and prints as
the plain strings it replaced.

Run: ``python -m pytest tests/test_collective_ops.py``
"""

import json

import pytest

from sim.collectives import OPS, schedule
from sim.collectives.kinds import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, RING_SHIFT, SEND_RECV,
                                   CollectiveOp)
from sim.collectives.tuner import comm_of
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
