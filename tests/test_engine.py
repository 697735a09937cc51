"""The engine's own mechanics: streams driven by callbacks behave exactly like SimPy
processes, the network's shortcuts give exactly the general path's times, who held
whom in a collective, and the garbage collector's pause.

The two property tests run random programs (several streams per rank, dependencies
across streams, zero durations, overlapping collectives inside and across servers)
through the engine and through a reference, and demand identical spans.
Run ``python -m pytest -q tests/test_engine.py``.
"""

import gc

from hypothesis import given, settings, strategies as st
import pytest

from conftest import spec_topology
from sim.collectives.kinds import ALL_REDUCE, SEND_RECV, CollectiveOp
from sim.engine.core import Engine
from sim.engine.ops import Collective, Op, RankProgram
from sim.engine.network import Network
from sim.outputs.result import spans_frame

TOPO = spec_topology(16)  # two servers of 8: groups that span both share the fabric
STREAMS = ("compute", "a", "b")


class ProcessEngine(Engine):
    """Reference: every stream a SimPy process yielding the events it waits for (how the
    engine ran before its streams became callbacks)."""

    def run(self) -> None:
        for prog in self.programs:
            by_stream: dict[str, list[int]] = {}
            for i, op in enumerate(prog.ops):
                by_stream.setdefault(op.stream, []).append(i)
            for indices in by_stream.values():
                self.env.process(self._stream(prog, indices))
        self.env.run()

    def _stream(self, prog, indices):
        env, rank, times, waiters = self.env, prog.rank, self.times[prog.rank], self._waiters[prog.rank]
        for i in indices:
            op = prog.ops[i]
            for d in op.deps:
                if times.end[d] < 0.0:  # (NOT_YET)
                    if d not in waiters:
                        waiters[d] = env.event()
                    yield waiters[d]
            start = env.now
            if op.comm is None:
                scale = self.compute_scale(rank, start) if self.compute_scale else 1.0
                yield env.timeout(op.duration * scale)
                sent = 0.0
            else:
                meeting = self.arrive(op.comm, rank, i)
                yield meeting.done
                start = meeting.start if op.comm.op is SEND_RECV else start
                sent = meeting.sent.get(rank, 0.0)
            times.start[i], times.sent[i], times.end[i] = start, sent, env.now
            waiter = waiters.pop(i, None)
            if waiter is not None:
                waiter.succeed()


class GeneralNetwork(Network):
    """The network without its shortcuts: every transfer solved and ended the general way."""

    def _inject(self, plan, on_done, _event=None) -> None:
        plan.alone = None  # forget the rates and wake-up of running alone
        super()._inject(plan, on_done)

    def _ends_untouched(self, act) -> bool:
        return False


class UncachedEngine(Engine):
    """The engine with a call's bytes, members and phases worked out afresh at every
    arrival (as before ``Engine._shape_of`` cached them by the call's fields but its key)."""

    def _shape_of(self, call):
        self._member_bytes, self._schedules, self._expected = {}, {}, {}
        return self.member_bytes(call), self._expected_members(call.group), self.schedule_of(call).phases


@st.composite
def programs(draw):
    """Programs built step by step; every member of a collective adds it at the same
    step and ops depend only on earlier steps, so no program can deadlock."""
    ranks = draw(st.lists(st.sampled_from(range(16)), min_size=2, max_size=5, unique=True))
    progs = {r: RankProgram(r) for r in ranks}
    for step in range(draw(st.integers(3, 14))):
        kind = draw(st.sampled_from(["compute", "compute", "all_reduce", "all_gather", "all_to_all", "send_recv"]))
        if kind == "compute":
            members = [draw(st.sampled_from(ranks))]
        elif kind == "send_recv":
            members = draw(st.lists(st.sampled_from(ranks), min_size=2, max_size=2, unique=True))
        else:
            members = draw(st.lists(st.sampled_from(ranks), min_size=2, max_size=len(ranks), unique=True))
        nbytes = draw(st.sampled_from([1e3, 1e6, 8e6, 6.4e7]))
        algo = "direct" if kind in ("send_recv", "all_to_all") else draw(st.sampled_from(["ring", "auto"]))
        call = None if kind == "compute" else Collective((kind, step), CollectiveOp(kind), tuple(sorted(members)),
                                                         nbytes, algo)
        for r in members:
            prog = progs[r]
            deps = tuple(draw(st.sets(st.sampled_from(range(len(prog.ops))), max_size=2))) if prog.ops else ()
            if kind == "compute":
                duration = draw(st.sampled_from([0.0, 1e-6, 2e-5, 3e-4]))
                prog.add(Op(f"c{step}", "compute", "compute", duration=duration, deps=deps))
            else:
                prog.add(Op(f"{kind}{step}", "dp", draw(st.sampled_from(STREAMS[1:])), comm=call, deps=deps))
    return list(progs.values())


def run(engine_class, progs, network_class=Network, scale=None):
    engine = engine_class(TOPO, progs, scale)
    engine.net = network_class(engine.env, TOPO)
    engine.run()
    return engine


def slow_rank_one(rank: int, _now: float) -> float:
    return 1.5 if rank == 1 else 1.0


@settings(max_examples=60, deadline=None)
@given(programs(), st.booleans())
def test_callback_streams_run_exactly_as_simpy_processes(progs, straggler):
    scale = slow_rank_one if straggler else None
    engine, reference = run(Engine, progs, scale=scale), run(ProcessEngine, progs, scale=scale)
    assert spans_frame(engine).equals(spans_frame(reference))
    assert engine.held_by == reference.held_by and engine.arrived == reference.arrived
    # the same events, less the start and the end of each process
    streams = sum(len({op.stream for op in p.ops}) for p in progs)
    assert engine.events == reference.events - 2 * streams


@settings(max_examples=60, deadline=None)
@given(programs())
def test_network_shortcuts_give_the_general_paths_times(progs):
    fast, general = run(Engine, progs), run(Engine, progs, GeneralNetwork)
    assert spans_frame(fast).equals(spans_frame(general))
    assert (fast.net.bytes_by_link == general.net.bytes_by_link).all()


@settings(max_examples=40, deadline=None)
@given(programs())
def test_shapes_cached_by_all_but_the_key_give_the_uncached_times(progs):
    cached, fresh = run(Engine, progs), run(UncachedEngine, progs)
    assert spans_frame(cached).equals(spans_frame(fresh))
    assert cached.held_by == fresh.held_by and cached.events == fresh.events


def test_calls_alike_but_for_their_key_share_one_shape_and_bytes_tell_them_apart():
    call = lambda k, nbytes: Collective(("ar", k), ALL_REDUCE, tuple(range(8)), nbytes, "ring")
    calls = [call(0, 1e6), call(1, 1e6), call(2, 8e6)]
    progs = [RankProgram(r, [Op(f"ar{k}", "dp", "dp", comm=c) for k, c in enumerate(calls)]) for r in range(8)]
    engine = run(Engine, progs)
    assert len(engine._shapes) == 2
    assert engine._shape_of(calls[0]) is engine._shape_of(calls[1])
    assert engine._shape_of(calls[2])[0][0] == 8 * engine._shape_of(calls[0])[0][0]  # (a ring: bytes scale)


def test_a_plans_latency_is_its_phases():
    progs = [RankProgram(r, [Op("ar", "dp", "dp", comm=Collective(("ar",), ALL_REDUCE, tuple(range(16)), 1e6, "ring"))])
             for r in range(16)]
    engine = run(Engine, progs)
    assert engine.net._plans
    for phase, plan in engine.net._plans.items():
        assert plan.latency == phase.steps * plan.compiled.step_latency * phase.latency_scale + phase.overhead > 0


def test_repeated_lone_collective_takes_the_shortcut_and_the_same_time():
    call = lambda k: Collective(("ar", k), ALL_REDUCE, tuple(range(8, 16)), 6.4e7, "ring")
    progs = [RankProgram(r, [Op(f"ar{k}", "dp", "dp", comm=call(k)) for k in range(3)]) for r in range(8, 16)]
    engine = run(Engine, progs)
    spans = spans_frame(engine)
    durations = (spans.end_s - spans.start_s)[spans["rank"] == 8].to_list()
    assert durations[1] == pytest.approx(durations[0], rel=1e-12) and durations[2] == pytest.approx(durations[0], rel=1e-12)
    plan = next(iter(engine.net._plans.values()))
    assert plan.finished == 3 and plan.alone is not None and plan.alone[2]  # all chains end together


def test_held_by_names_the_last_member_and_arrived_the_wait_start():
    call = Collective(("x",), ALL_REDUCE, (0, 1), 1e6, "ring")
    progs = [RankProgram(0, [Op("x", "dp", "comm", comm=call)]),
             RankProgram(1, [Op("work", "compute", "compute", duration=1e-3), Op("x", "dp", "comm", comm=call, deps=(0,))])]
    engine = run(Engine, progs)
    assert engine.held_by == {(0, 0): (1, 1)}
    assert engine.arrived == {(0, 0): 0.0}
    assert engine.times[0].end[0] == engine.times[1].end[1] > 1e-3


def test_garbage_collector_is_back_as_it_was_after_a_run_and_after_a_deadlock():
    prog = RankProgram(0, [Op("c", "compute", "compute", duration=1e-3)])
    run(Engine, [prog])
    assert gc.isenabled()
    x = Collective(("x",), ALL_REDUCE, (0, 1), 1e6, "ring")
    y = Collective(("y",), ALL_REDUCE, (0, 1), 1e6, "ring")
    stuck = [RankProgram(0, [Op("x", "dp", "comm", comm=x), Op("y", "dp", "comm", comm=y)]),
             RankProgram(1, [Op("y", "dp", "comm", comm=y), Op("x", "dp", "comm", comm=x)])]
    with pytest.raises(RuntimeError, match="deadlock"):
        run(Engine, stuck)
    assert gc.isenabled()
    gc.disable()
    try:
        run(Engine, [RankProgram(0, [Op("c", "compute", "compute", duration=1e-3)])])
        assert not gc.isenabled()  # a caller's choice is left alone
    finally:
        gc.enable()


def test_a_finished_run_leaves_no_stream_for_the_cycle_collector():
    """The streams' cycles are broken after the run (the pause's end defers the collector's
    pass over what the run left to its next full one: sim.engine.core.cycle_collector_paused)."""
    from sim.engine.core import Stream

    gc.collect()
    gc.disable()
    try:
        progs = [RankProgram(r, [Op("c", "compute", "compute", duration=1e-3),
                                 Op("x", "dp", "comm", comm=Collective(("x",), ALL_REDUCE, (0, 1), 1e6, "ring"),
                                    deps=(0,))]) for r in (0, 1)]
        run(Engine, progs)
        assert not [o for o in gc.get_objects() if type(o) is Stream]
    finally:
        gc.enable()


def test_stream_indices_are_the_per_op_loops_streams_and_order():
    """sim/engine/ops.py ``stream_indices`` (one stable sort) against the loop it replaced: a
    dict of each stream's op indices in program order, streams in order of their first op,
    equal names one stream (names built at run time are equal, not identical, objects)."""
    import random
    from sim.engine.kinds import Category
    from sim.engine.ops import stream_indices
    rnd = random.Random(7)
    for n in (0, 1, 5, 300):
        names = ["compute", "tp", "".join(["p", "p_send"]), "pp_send", "dp"]
        ops = [Op(f"o{i}", Category.COMPUTE, rnd.choice(names[:rnd.randint(1, 5)]), 1e-6) for i in range(n)]
        by_name: dict = {}
        for i, op in enumerate(ops):
            by_name.setdefault(op.stream, []).append(i)
        assert [list(a) for a in stream_indices(ops)] == list(by_name.values())
        assert all(a.typecode == "q" for a in stream_indices(ops))
