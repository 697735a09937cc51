"""A collective's schedule with its siblings' traffic (sim/engine/traffic.py merged_schedule)
renames the first group's schedule for every sibling whose members share NVLink domains
the same way: that must equal scheduling every group on its own and merging the phases,
for every algorithm (they depend on a group only through its order and that pattern).

Run: ``python -m pytest tests/test_merged_schedule.py``
"""

import dataclasses

import numpy as np
from hypothesis import assume, given, settings, strategies as st

from sim import collectives
from sim.collectives.schedule import merge
from sim.engine.traffic import SiblingGroups, merged_schedule, same_domain_pattern
from sim.hardware import specs, topology
from sim.hardware.gpus import gpu_preset

SPEC = dataclasses.replace(specs.load_spec("dgx-h100"), gpus_per_domain=4, gpus_per_node=4)
TOPO = topology.build(SPEC, 128, gpu_preset("h100-sxm"))  # 32 domains of 4
CALLS = [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_reduce", "hierarchical"), ("all_gather", "ring"),
         ("all_gather", "hierarchical"), ("reduce_scatter", "hierarchical"), ("all_to_all", "direct"),
         ("send_recv", "direct"), ("ring_shift", "direct"), ("all_reduce", "auto"), ("broadcast", "ring"),
         # in-switch reduction (hops end at the NVSwitch: built group by group), PAT, protocols
         ("all_reduce", "nvls"), ("reduce_scatter", "nvls"), ("all_gather", "pat"), ("all_reduce", "ring:ll"),
         ("all_reduce", "tree:ll128")]


def by_hand(op, algo, groups, nbytes):
    parts = [collectives.schedule(op, algo, g, nbytes, tuple(int(d) for d in TOPO.domains[list(g)]), None,
                                  TOPO.fabric) for g in groups]
    return [merge([p.phases[i] for p in parts]) for i in range(len(parts[0].phases))]


@st.composite
def families(draw):
    """A group and siblings: the same positions mapped into other domains (same pattern),
    sometimes one sibling of another pattern."""
    op, algo = draw(st.sampled_from(CALLS))
    n = 2 if op == "send_recv" else draw(st.integers(2, 8))
    pattern = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    assume(max(pattern.count(d) for d in range(3)) <= 4)  # a domain holds 4 GPUs
    groups = []
    for _ in range(draw(st.integers(1, 5))):
        doms = draw(st.permutations(range(32)))[:3]
        slots = {d: list(np.random.default_rng(len(groups)).permutation(4)) for d in doms}
        groups.append(tuple(int(doms[p] * 4 + slots[doms[p]].pop()) for p in pattern))
    if algo != "hierarchical" and draw(st.booleans()):  # (hierarchical's phase count depends on the pattern)
        groups.append(tuple(int(x) for x in draw(st.permutations(range(128)))[:n]))
    return op, algo, groups, draw(st.sampled_from([1e3, 5e6, 3e8]))


@given(families())
@settings(max_examples=80, deadline=None)
def test_renamed_schedule_equals_every_group_scheduled(family):
    op, algo, groups, nbytes = family
    if any(len(set(g)) < len(g) for g in groups):
        return
    assume(not any(collectives.unsupported(op, algo, tuple(int(d) for d in TOPO.domains[list(g)]), TOPO.fabric)
                   for g in groups))  # (NVLS needs GPUs sharing a domain, PAT one GPU per node)
    got = merged_schedule(op, algo, groups[0], SiblingGroups(np.array(groups[1:], dtype=np.int64).reshape(
        -1, len(groups[0]))), nbytes, TOPO).phases
    want = by_hand(op, algo, groups, nbytes)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for field in ("src", "dst", "chain", "nbytes"):
            assert getattr(a, field).tolist() == getattr(b, field).tolist()
        assert (a.steps, a.latency_scale, a.overhead, a.wire) == (b.steps, b.latency_scale, b.overhead, b.wire)


def test_domain_pattern():
    doms = np.array([[1, 1, 2, 3], [5, 5, 0, 9], [5, 0, 0, 9], [4, 4, 7, 7]])
    assert same_domain_pattern(doms).tolist() == [True, True, False, False]


def test_a_group_alone_shares_the_cached_schedules_hops():
    """A collective without siblings is its cached schedule's phases as ``merge([phase])``
    makes them (same dtypes, values, label and factors), holding the same arrays, not copies
    (a world-wide tree at 131,072 GPUs is 2M hops a phase)."""
    for op, algo in CALLS:
        group = (0, 1, 2, 3) if "nvls" in algo else tuple(range(0, 128, 4 if algo == "pat" else 3))
        doms = tuple(int(d) for d in TOPO.domains[list(group)])
        cached = collectives.schedule(op, algo, group, 1e6, doms, None, TOPO.fabric)
        alone = merged_schedule(op, algo, group, (), 1e6, TOPO)
        assert len(alone.phases) == len(cached.phases)
        for got, phase in zip(alone.phases, cached.phases):
            want = merge([phase])
            for field in ("src", "dst", "chain", "nbytes"):
                a, b = getattr(got, field), getattr(want, field)
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
            assert (got.steps, got.label, got.latency_scale, got.overhead, got.wire) == (
                want.steps, want.label, want.latency_scale, want.overhead, want.wire)
            assert got.src is phase.src and got.dst is phase.dst and got.nbytes is phase.nbytes
