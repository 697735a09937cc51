"""Two compute ops of a stream run as one event (sim/engine/chains.py): the same times, the
same order of events at equal times (who arrived last at a collective), the same event count.

Random programs with many exact ties (durations of a few binary fractions of a second) run
with merging and without, and as SimPy processes; the ties that would put a merged event on
the wrong side of another are built by hand and must split the merge.
Run ``python -m pytest -q tests/test_chains.py``.
"""

from hypothesis import given, settings, strategies as st

from conftest import spec_topology
from sim.collectives.kinds import ALL_REDUCE, SEND_RECV
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.outputs.result import spans_frame
from test_engine import ProcessEngine

TOPO = spec_topology(16)


def run(progs, merging=True, scale=None, engine_class=Engine):
    engine = engine_class(TOPO, progs, scale, merging=merging)
    engine.run()
    return engine


def compute(name, duration, deps=()):
    return Op(name, "compute", "compute", duration=duration, deps=deps)


def meet(key, ranks, deps):
    return Op(key, "dp", "comm", comm=Collective((key,), ALL_REDUCE, ranks, 1e6, "ring"), deps=deps)


def test_a_stream_of_compute_ops_runs_in_pairs_at_the_closed_form_times():
    progs = [RankProgram(0, [compute(f"c{i}", 0.25) for i in range(7)])]
    merged, plain = run(progs), run(progs, merging=False)
    assert list(merged.times[0].end) == [0.25 * (i + 1) for i in range(7)] == list(plain.times[0].end)
    assert list(merged.times[0].start) == [0.25 * i for i in range(7)]
    assert merged.chains.fired == 3 and plain.chains.fired == 0  # (0, 1), (2, 3), (4, 5); 6 alone
    assert merged.events == plain.events == 7


def side(name, duration, deps=()):
    return Op(name, "compute", "side", duration=duration, deps=deps)


def test_a_stream_that_reads_the_first_ops_end_gets_it_or_splits_the_merge():
    """Stream "side" depends on a, the first of the merged pair (a, b): asked at time 0 (before
    a ends) the merge is split and a's own event wakes it at 1 s; asked at 1.5 s (after) a's
    end is written then and read."""
    early = [RankProgram(0, [compute("a", 1.0), compute("b", 2.0), side("s", 0.25, deps=(0,))])]
    late = [RankProgram(0, [compute("a", 1.0), compute("b", 2.0), side("w", 1.5), side("s", 0.25, deps=(0,))])]
    for progs, start, fired, splits in ((early, 1.0, 0, 1), (late, 1.5, 1, 0)):
        merged = run(progs)
        assert merged.times[0].start[len(progs[0].ops) - 1] == start
        assert (merged.chains.fired, merged.chains.splits) == (fired, splits)
        assert spans_frame(merged).equals(spans_frame(run(progs, merging=False)))
        assert spans_frame(merged).equals(spans_frame(run(progs, engine_class=ProcessEngine)))


def test_an_event_at_the_merged_time_queued_before_the_first_op_ends_splits_the_merge():
    """Rank 0 runs a (1 s) then b (1 s); rank 1 runs x (2 s), queued after a at time 0, so x's
    end (2 s) is queued before b's would be (at 1 s): x ends first, rank 0 arrives last."""
    progs = [RankProgram(0, [compute("a", 1.0), compute("b", 1.0), meet("m", (0, 1), (1,))]),
             RankProgram(1, [compute("x", 2.0), meet("m", (0, 1), (0,))])]
    merged, reference = run(progs), run(progs, engine_class=ProcessEngine)
    assert merged.held_by == reference.held_by == {(1, 1): (0, 2)}
    assert merged.chains.splits == 1 and merged.chains.fired == 0
    assert spans_frame(merged).equals(spans_frame(run(progs, merging=False)))


def test_two_merges_ending_together_keep_the_order_of_their_first_ops_ends():
    """Both ranks' pairs end at 3 s; the one whose first op ends first would have queued its
    second op's end first. Merged in that order they stay merged; in the other order the later
    one is not merged and the earlier one is split (its first op's end put back)."""
    meet_at = lambda deps: meet("m", (0, 1), deps)
    same_order = [RankProgram(0, [compute("a", 1.0), compute("b", 2.0), meet_at((1,))]),
                  RankProgram(1, [compute("a", 2.0), compute("b", 1.0), meet_at((1,))])]
    other_order = [RankProgram(0, [compute("a", 2.0), compute("b", 1.0), meet_at((1,))]),
                   RankProgram(1, [compute("a", 1.0), compute("b", 2.0), meet_at((1,))])]
    for progs, last, fired, splits in ((same_order, 1, 2, 0), (other_order, 0, 0, 1)):
        merged, reference = run(progs), run(progs, engine_class=ProcessEngine)
        assert merged.held_by == reference.held_by == {(1 - last, 2): (last, 2)}
        assert (merged.chains.fired, merged.chains.splits) == (fired, splits)


@st.composite
def tied_programs(draw):
    """Mostly compute, durations of a few binary fractions (exact sums: many equal times),
    sparse deps, some all-reduces and sends between the ranks."""
    ranks = draw(st.lists(st.sampled_from(range(16)), min_size=2, max_size=4, unique=True))
    progs = {r: RankProgram(r) for r in ranks}
    for step in range(draw(st.integers(4, 24))):
        kind = draw(st.sampled_from(["compute"] * 5 + ["all_reduce", "send_recv"]))
        members = ([draw(st.sampled_from(ranks))] if kind == "compute" else
                   draw(st.lists(st.sampled_from(ranks), min_size=2, max_size=2 if kind == "send_recv" else len(ranks),
                                 unique=True)))
        op = ALL_REDUCE if kind == "all_reduce" else SEND_RECV
        call = None if kind == "compute" else Collective((kind, step), op, tuple(sorted(members)), 1e6,
                                                         "ring" if kind == "all_reduce" else "direct")
        for r in members:
            prog = progs[r]
            deps = tuple(draw(st.sets(st.sampled_from(range(len(prog.ops))), max_size=1))) if prog.ops else ()
            if call is None:
                prog.add(compute(f"c{step}", draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])), deps))
            else:
                prog.add(Op(f"{kind}{step}", "dp", draw(st.sampled_from(["a", "b"])), comm=call, deps=deps))
    return list(progs.values())


@settings(max_examples=150, deadline=None)
@given(tied_programs(), st.booleans())
def test_merging_changes_no_time_no_order_and_no_event_count(progs, straggler):
    scale = (lambda rank, now: 1.5 if rank == progs[0].rank and now >= 0.5 else 1.0) if straggler else None
    merged, plain = run(progs, scale=scale), run(progs, merging=False, scale=scale)
    reference = run(progs, scale=scale, engine_class=ProcessEngine)
    assert spans_frame(merged).equals(spans_frame(plain))
    assert spans_frame(merged).equals(spans_frame(reference))
    assert merged.held_by == plain.held_by == reference.held_by and merged.arrived == plain.arrived
    assert merged.events == plain.events
