"""bench/chain_census.py's census: which boundaries between a stream's consecutive ops a chain
could run inside one event, on programs whose answer is known in closed form.

One stream of n compute ops, each depending on the one before and issued at once: every one of
the n - 1 boundaries is chainable (one chain of n ops). An op of another stream reading op k's
end makes that boundary observed and splits the chain in two; a host slower than the GPU (each
op costs h > d to issue) leaves a gap at every boundary; an op issued after a host wait that
ends while the op before it runs is not chainable either.
Run ``python -m pytest -q tests/test_chain_census.py``.
"""

from collections import Counter

from conftest import bench_module, spec_topology
from sim.engine.core import Engine
from sim.engine.kinds import Category
from sim.engine.ops import Op, RankProgram

census = bench_module("chain_census").census
TOPO = spec_topology(8)
N, D, H = 12, 1e-5, 3e-5  # ops, seconds of GPU time each, seconds of host time to issue each


def _counted(ops: list[Op]) -> tuple[Counter, Counter]:
    engine = Engine(TOPO, [RankProgram(0, ops)])
    engine.run()
    totals, chains = Counter(), Counter()
    census(engine, totals, chains)
    return totals, chains


def _stream(issue: float = 0.0) -> list[Op]:
    return [Op(f"k{i}", Category.COMPUTE, "compute", D, deps=(i - 1,) if i else (), issue=issue) for i in range(N)]


def test_a_stream_issued_at_once_is_one_chain():
    totals, chains = _counted(_stream())
    assert totals["pairs"] == N - 1 and totals["events"] == N and chains == {N: 1}


def test_an_end_read_by_another_stream_splits_the_chain():
    k = 4
    totals, chains = _counted(_stream() + [Op("reader", Category.COMPUTE, "other", D, deps=(k,))])
    assert totals["observed"] == 1 and totals["pairs"] == N - 2
    assert chains == {k + 1: 1, N - k - 1: 1}


def test_a_slow_host_leaves_a_gap_at_every_boundary():
    totals, chains = _counted(_stream(issue=H))
    assert totals["gap"] == N - 1 and totals["pairs"] == 0 and not chains


def test_an_op_issued_after_a_host_wait_that_ends_during_the_op_before_is_not_chainable():
    # k1 is issued after the host waits for s (sync), which ends at D / 2: after k0 started at 0,
    # before k0 ends at D, when k1 starts; a chain made when k0 started could not know k1's issue
    ops = [Op("k0", Category.COMPUTE, "compute", D), Op("s", Category.COMPUTE, "other", D / 2, sync=True),
           Op("k1", Category.COMPUTE, "compute", D, deps=(0,))]
    totals, chains = _counted(ops)
    assert totals["host_pending"] == 1 and totals["pairs"] == 0 and not chains
