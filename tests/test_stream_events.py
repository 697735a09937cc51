"""A stream is the event of its own op's end and of its host's release (sim/engine/core.py
``Stream``): a compute op, a wait for the host and a collective only its rank simulates
allocate no event object, and the times are what the closed forms say.

Closed form: one stream of n compute ops of d seconds, each costing the host h > d to issue,
ends op i at (i + 1) h + d (the host issues op i at (i + 1) h; the GPU is idle between ops).
Run ``python -m pytest -q tests/test_stream_events.py``.
"""

import numpy as np
import pytest

from conftest import spec_topology
from sim.collectives.kinds import CollectiveOp
from sim.engine import clock, core, network
from sim.engine.core import Engine
from sim.engine.kinds import Category
from sim.engine.ops import Collective, Op, RankProgram

TOPO = spec_topology(8)
N, D, H = 50, 1e-5, 3e-5  # ops, seconds of GPU time each, seconds of host time to issue each


@pytest.fixture
def wakes(monkeypatch):
    """Counts every :class:`sim.engine.clock.Wake` made while the test runs."""
    made = []

    class Counted(clock.Wake):
        __slots__ = ()

        def __init__(self, callbacks):
            made.append(1)
            super().__init__(callbacks)

    for module in (clock, core, network):
        monkeypatch.setattr(module, "Wake", Counted)
    return made


def test_host_bound_compute_ops_make_no_event_and_end_at_the_closed_form(wakes):
    prog = RankProgram(0, [Op(f"k{i}", Category.COMPUTE, "compute", D, deps=(i - 1,) if i else (), issue=H)
                           for i in range(N)])
    engine = Engine(TOPO, [prog])
    engine.run()
    assert np.array(engine.times[0].end) == pytest.approx([(i + 1) * H + D for i in range(N)], rel=1e-12)
    assert engine.events == 2 * N  # a release wait and an end per op
    assert not wakes


def test_a_collective_of_one_simulated_member_ends_its_op_without_a_done_event(wakes):
    call = Collective(("ar", 0, 0), CollectiveOp.ALL_REDUCE, (0, 1, 2, 3), 1e6)
    progs = [RankProgram(r, [Op("ar", Category.DP, "dp", comm=call)]) for r in (0,)]
    engine = Engine(TOPO, progs)
    engine.run()
    phases = len(engine.schedule_of(call).phases)
    # one wake for each phase's latency and one for its end: none for the op's end (the stream's own)
    assert len(wakes) == 2 * phases
    assert engine.times[0].end[0] > 0.0 and engine.collectives_run == 1
