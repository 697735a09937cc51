"""Which collective a call is, as a type: :class:`CollectiveOp`; which algorithm runs it:
:class:`Algorithm`.

Set where a call is built (the builders of :mod:`sim.parallel`, the RL trainer's weight
broadcast, the collective benchmarks) and read by the algorithms' table
(:data:`sim.collectives.ALGORITHMS`), NCCL's tuner (:mod:`sim.collectives.tuner`), the
engine (a send/recv's idle wait, :mod:`sim.engine.core`) and the outputs, which compare
members by identity instead of strings. Text from outside (the command line's ``--op``, a
calibration file's or an nccl-tests table's op) becomes a member once, where it is read
(``CollectiveOp(text)``). The members are ``StrEnum``: JSON, CSV, f-strings and the Chrome
trace write their plain value, unchanged from the strings they replace.

Run: ``python -m pytest -q tests/test_collective_ops.py``
"""

from enum import StrEnum

from ..input.choices import Algorithm  # (the scenario declares parallel.dp_algo with it; re-exported)


class CollectiveOp(StrEnum):
    """One collective operation, named as NCCL's (and nccl-tests') ``ncclAllReduce`` etc."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"  # one point-to-point transfer, src -> dst (pipeline stages)
    RING_SHIFT = "ring_shift"  # every member sends to the next in the group at once (CP's K/V ring)


ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, SEND_RECV, RING_SHIFT = CollectiveOp
