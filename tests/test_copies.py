"""A copied program (sim/parallel/copies.py) is the program the rank builds itself, op by
op: names, streams, durations, dependencies, and for collectives the key, group, bytes,
algorithm, shares and siblings. Checked for every rank of several layouts, unfolded and
folded around a straggler.

Run: ``python -m pytest tests/test_copies.py``
"""

import dataclasses

import numpy as np
import pytest

from sim.hardware.specs import load_spec
from sim.input.load import scenario_from_dict
from sim.parallel import copies
from sim.parallel.workload import build_rank, make_context

SMALL = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 4, "vocab": 32000, "mlp": "swiglu", "ffn_hidden": 2816}
MOE = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 2, "vocab": 1024, "mlp": "swiglu", "ffn_hidden": 3584,
       "moe": {"experts": 8, "top_k": 2, "routing": "token_choice", "skew": 0.5}}
LAYOUTS = {
    "ptd-sp-zero1": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "zero": 1, "sequence_parallel": True}, 32),
    "interleaved": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "virtual_stages": 2, "schedule": "interleaved"}, 64),
    "cp-tp": (SMALL, {"tp": 2, "cp": 2, "dp": 8}, 32),
    "fsdp": (SMALL, {"dp": 32, "zero": 3}, 32),
    "moe-skew-pp": (MOE, {"pp": 2, "dp": 16, "ep": 4, "zero": 1}, 32),
    "dp-inner-order": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "order": "dp-tp-cp-pp"}, 32),
    # uneven loads: one program per stage, each copy's local experts retimed for its slice
    "moe-skew-folded-overlap": (MOE, {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "expert_tp": 1, "sequence_parallel": True,
                                      "virtual_stages": 2, "schedule": "interleaved", "stage_layers": [0, 1, 1, 0],
                                      "ep_comm_overlap": True}, 64),
    "moe-skew-zb": (MOE, {"pp": 2, "dp": 16, "ep": 4, "schedule": "zb-h1"}, 32),  # split experts: per slice
}


def context(name: str, fold: bool, stragglers=()):
    model, parallel, batch = LAYOUTS[name]
    bucket = {} if parallel.get("zero") == 3 else {"grad_bucket_mb": 8}  # (FSDP has no buckets: exit 2)
    s = scenario_from_dict({"model": model, "training": {"seq_len": 4096 if "cp" in name else 1024,
                                                         "global_batch": batch, **bucket},
                            "cluster": {"topology": "dgx-h100", "gpus": 32, "topology_overrides": {"nodes_per_su": 2}},
                            "parallel": {**parallel, "fold": fold}, "stragglers": list(stragglers)})
    spec = dataclasses.replace(load_spec("dgx-h100"), nodes_per_su=2)
    return make_context(s, [r // 8 for r in range(32)], "h100-sxm", fabric=spec)


def same_program(a, b) -> None:
    assert len(a.ops) == len(b.ops)
    for x, y in zip(a.ops, b.ops):
        assert (x.name, x.category, x.stream, x.duration, x.deps, x.layer, x.micro_batch, x.stage, x.issue) == \
               (y.name, y.category, y.stream, y.duration, y.deps, y.layer, y.micro_batch, y.stage, y.issue)
        if x.comm is None or y.comm is None:
            assert x.comm is None and y.comm is None
            continue
        cx, cy = x.comm, y.comm
        assert (cx.key, cx.op, cx.group, cx.nbytes, cx.algo, cx.shares) == (cy.key, cy.op, cy.group, cy.nbytes,
                                                                             cy.algo, cy.shares)
        assert [tuple(g) for g in cx.siblings] == [tuple(g) for g in cy.siblings]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("fold", [False, True])
def test_a_copy_is_the_program_the_rank_builds(name, fold):
    ctx = context(name, fold, [{"ranks": [5], "slowdown": 1.3}] if fold else [])
    built = {}
    sig = copies.signatures(ctx)
    copied = 0
    retimed = 0
    for rank in sorted(ctx.simulated):
        own = build_rank(ctx, rank)
        base = built.setdefault(sig[rank], own)
        if base is not own:
            copy = copies.copy_program(ctx, base.program, rank, base.varying)
            same_program(copy, own.program)
            assert copy.release() == own.program.release()
            assert copy.anchors() == own.program.anchors()  # (shared with the base when not retimed)
            copied += 1
            retimed += ctx.layout.ep_index(rank) != ctx.layout.ep_index(base.rank)
    assert copied > 0
    assert (retimed > 0) == (name.startswith("moe-skew") and name != "moe-skew-zb")  # (zero-bubble: per slice)


def test_jitter_scales_each_rank_by_its_own_draws():
    from sim.hardware.faults import jitter_fn

    model, parallel, batch = LAYOUTS["ptd-sp-zero1"]
    s = scenario_from_dict({"model": model, "training": {"seq_len": 1024, "global_batch": batch},
                            "cluster": {"topology": "dgx-h100", "gpus": 32}, "parallel": parallel,
                            "jitter": {"sigma": 0.1}, "seed": 3})
    ctx = make_context(s, [r // 8 for r in range(32)], "h100-sxm")
    draw = jitter_fn(s)
    progs = {p.rank: p for p in copies.programs(ctx, lambda r: build_rank(ctx, r))}
    assert sorted(progs) == list(range(32))
    for rank in (0, 9, 31):
        plain = build_rank(ctx, rank).program
        want = [op.duration * draw(rank, i) if op.comm is None else 0.0 for i, op in enumerate(plain.ops)]
        assert [op.duration for op in progs[rank].ops] == want
    plain = build_rank(ctx, 0).program
    first = next(i for i, op in enumerate(plain.ops) if op.comm is None)
    stage0 = [r for r in progs if ctx.layout.coords(r)["pp"] == 0]
    assert len({progs[r].ops[first].duration for r in stage0}) == len(stage0) == 16  # every rank its own draws
    mean = np.mean([progs[r].ops[first].duration for r in stage0])
    np.testing.assert_allclose(mean / plain.ops[first].duration, 1, atol=0.1)


@pytest.mark.parametrize("name", ["moe-skew-folded-overlap", "ptd-sp-zero1"])
def test_the_members_of_a_group_share_its_copied_calls(name):
    """Copies of one call for the same renamed group are one Collective and one Op
    (sim/parallel/copies.py ``shared``): per instance (key) and pipeline stage, at most two
    objects, the stage's base rank's own and its copies' (a pipeline send and its receive,
    the step's gradient-norm all-reduce: those of each stage); without the sharing an expert
    group's or a DP group's every copy holds its own."""
    ctx = context(name, False)
    progs = copies.programs(ctx, lambda r: build_rank(ctx, r))
    objects, members = {}, {}
    for prog in progs:
        stage = ctx.layout.coords(prog.rank)["pp"]
        for i, op in enumerate(prog.ops):  # (i: a program may issue two calls of one key, a bucket's)
            if op.comm is not None:
                objects.setdefault((op.comm.key, stage, i), set()).add(id(op.comm))
                members[op.comm.key, stage, i] = members.get((op.comm.key, stage, i), 0) + 1
    assert max(len(ids) for ids in objects.values()) <= 2
    assert max(members.values()) > 2  # (groups of more than two members in a stage were copied)


def test_copyable_asks_the_folding_about_each_distinct_group_once():
    """``copies.copyable``: the folding is asked about every group value the program's calls
    meet (equal tuples built apart count once, a compute op none), and one it cannot locate
    makes the program not copyable."""
    from types import SimpleNamespace
    from sim.collectives.kinds import CollectiveOp
    from sim.engine.kinds import Category
    from sim.engine.ops import Collective, Op, RankProgram
    from sim.parallel import copies
    groups = [(0, 1), tuple([0, 1]), (0, 2), (0, 1)]
    assert groups[0] is not groups[1]
    base = RankProgram(0, [Op("x", Category.COMPUTE, "compute", 1.0)]
                       + [Op(f"c{k}", Category.TP, "tp", 0.0, Collective(("c", k), CollectiveOp.ALL_REDUCE, g, 8.0))
                          for k, g in enumerate(groups)])
    asked = []
    for unknown, expected in ((None, True), ((0, 2), False)):
        asked.clear()
        ctx = SimpleNamespace(folding=SimpleNamespace(locate=lambda g: asked.append(g) or (None if g == unknown else 1)))
        assert copies.copyable(ctx, base) is expected
        assert sorted(asked) == [(0, 1), (0, 2)] if expected else (0, 2) in asked and len(asked) <= 2
