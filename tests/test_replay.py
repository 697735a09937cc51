"""A program built with replayed steps (sim/parallel/replay.py) is the program built step
by step: every op of every simulated rank (names, streams, durations, issue costs, deps,
micro-batches, collective keys, groups, siblings) and what copies retime, over schedules,
overlaps, FSDP, recompute, CUDA graphs and uneven experts; and steps were replayed.

Run: ``python -m pytest tests/test_replay.py``
"""

import dataclasses

import pytest

from sim.hardware.specs import load_spec
from sim.input.load import scenario_from_dict
from sim.parallel import replay
from sim.parallel.workload import build_rank, make_context
from test_copies import MOE, SMALL, same_program

MTP = {**MOE, "layers": 3, "mtp_layers": 1}
LAYOUTS = {
    "1f1b-sp-overlap": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "zero": 1, "sequence_parallel": True,
                                "tp_comm_overlap": True}, {}, 256),
    "interleaved-cp": (SMALL, {"tp": 2, "pp": 2, "cp": 2, "dp": 4, "virtual_stages": 2,
                               "schedule": "interleaved"}, {"recompute": "selective"}, 128),
    "gpipe-full-recompute": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "schedule": "gpipe"}, {"recompute": "full"}, 256),
    "fsdp-pp": (SMALL, {"pp": 2, "dp": 16, "zero": 3}, {}, 512),
    "fsdp": (SMALL, {"dp": 32, "zero": 3}, {}, 1024),
    "cuda-graphs-compile": (SMALL, {"tp": 2, "pp": 2, "dp": 8}, {"cuda_graphs": True, "compile": True}, 256),
    "cp-torch": (SMALL, {"cp": 2, "pp": 2, "dp": 8, "cp_impl": "torch"}, {"recompute": "op"}, 256),
    "cp-all-gather-fsdp": (SMALL, {"tp": 2, "cp": 2, "pp": 2, "dp": 4, "zero": 3, "cp_impl": "all_gather",
                                   "virtual_stages": 2, "schedule": "interleaved"}, {}, 128),
    "moe-skew-overlap": (MOE, {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "expert_tp": 1, "sequence_parallel": True,
                               "virtual_stages": 2, "schedule": "interleaved", "stage_layers": [0, 1, 1, 0],
                               "ep_comm_overlap": True}, {}, 256),
    "moe-mtp-overlap": (MTP, {"dp": 32, "ep": 4, "ep_comm_overlap": True}, {}, 1024),
    "moe-zb-h1": (MOE, {"pp": 2, "dp": 16, "ep": 4, "schedule": "zb-h1"}, {}, 512),
    "zb-v": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "schedule": "zb-v"}, {}, 256),
    "dualpipe": (SMALL, {"tp": 2, "pp": 2, "dp": 8, "schedule": "dualpipe"}, {}, 256),
}


def context(name: str):
    model, parallel, training, batch = LAYOUTS[name]
    bucket = {} if parallel.get("zero") == 3 else {"grad_bucket_mb": 8}
    s = scenario_from_dict({"model": model, "training": {"seq_len": 4096 if "cp" in parallel else 1024,
                                                         "global_batch": batch, **bucket, **training},
                            "cluster": {"topology": "dgx-h100", "gpus": 32, "topology_overrides": {"nodes_per_su": 2}},
                            "parallel": {**parallel, "fold": False},
                            "stragglers": [{"ranks": [5], "slowdown": 1.3}]})
    spec = dataclasses.replace(load_spec("dgx-h100"), nodes_per_su=2)
    return make_context(s, [r // 8 for r in range(32)], "h100-sxm", fabric=spec)


def counting(monkeypatch) -> list:
    """Patch StepMemo.run to count the steps it replayed."""
    replays, run = [], replay.StepMemo.run

    def counted(self, step, build):
        built = []
        out = run(self, step, lambda: built.append(1) or build())
        replays.append(not built)
        return out
    monkeypatch.setattr(replay.StepMemo, "run", counted)
    return replays


@pytest.mark.parametrize("columns_from", [0, 10 ** 9])  # (every step replayed by columns; every one op by op)
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_replayed_program_is_the_program_built_step_by_step(name, columns_from, monkeypatch):
    monkeypatch.setattr(replay, "COLUMNS_FROM", columns_from)
    ctx = context(name)
    replays = counting(monkeypatch)
    for rank in sorted(ctx.simulated)[:4] + sorted(ctx.simulated)[-2:]:
        monkeypatch.setattr(replay, "ENABLED", True)
        fast = build_rank(ctx, rank)
        monkeypatch.setattr(replay, "ENABLED", False)
        slow = build_rank(ctx, rank)
        same_program(fast.program, slow.program)
        assert [op.sync for op in fast.program.ops] == [op.sync for op in slow.program.ops]
        assert [op.phase for op in fast.program.ops] == [op.phase for op in slow.program.ops]
        assert fast.varying == slow.varying
    assert sum(replays) > len(replays) / 3  # most steady-state steps were replayed, not built


def test_a_step_unlike_its_template_is_built(monkeypatch):
    """A builder whose steps differ from micro-batch to micro-batch (here: durations grow
    with the micro-batch) is never replayed: each check against the template fails."""
    ctx = context("1f1b-sp-overlap")
    from sim.parallel import program

    timed = program.timed
    monkeypatch.setattr(program.RankBuilder, "compute", _growing(program.RankBuilder.compute))
    for enabled in (True, False):
        monkeypatch.setattr(replay, "ENABLED", enabled)
        built = build_rank(ctx, 0).program
        if enabled:
            fast = built
    same_program(fast, built)
    assert program.timed is timed


def _growing(compute):
    def grown(self, name, kernels, deps=(), layer=-1, mb=-1, **kw):
        index = compute(self, name, kernels, deps, layer, mb, **kw)
        op = self.program.ops[index]
        self.program.ops[index] = op._replace(duration=op.duration * (1 + max(mb, 0)))
        return index
    return grown


def test_rekeyed_is_the_call_under_another_key_field_for_field():
    """sim/engine/ops.py ``rekeyed`` (what a replayed step's collectives are made by) sets every
    slot: equal to the constructor's call, each other field the same object."""
    from sim.collectives.kinds import Algorithm, CollectiveOp
    from sim.engine.ops import Collective, rekeyed
    call = Collective(("tp", 3, 7, 1), CollectiveOp.ALL_TO_ALL, (4, 5), 123.5, Algorithm.RING, ((6, 7),),
                      ((1.0, 2.0), (3.0, 4.0)), 0.25)
    new = rekeyed(call, ("tp", 3, 8, 1))
    assert new == Collective(("tp", 3, 8, 1), call.op, call.group, call.nbytes, call.algo, call.siblings,
                             call.shares, call.sms)
    assert hash(new) == hash(Collective(("tp", 3, 8, 1), *(getattr(call, f) for f in Collective.__slots__[1:])))
    assert all(getattr(new, f) is getattr(call, f) for f in Collective.__slots__[1:])


def test_rekeyed_all_is_rekeyed_call_by_call():
    """sim/engine/ops.py ``rekeyed_all`` (a replayed step's collectives, set slot by slot over
    all of them) gives what ``rekeyed`` gives one call at a time: equal, every other field the
    same object, each under its own key."""
    from sim.collectives.kinds import Algorithm, CollectiveOp
    from sim.engine.ops import Collective, rekeyed, rekeyed_all
    calls = [Collective(("tp", 3, 7, k), CollectiveOp.ALL_TO_ALL, (4, 5 + k), 123.5 + k, Algorithm.RING, ((6, 7),),
                        ((1.0, 2.0), (3.0, 4.0)) if k else None, 0.25 * k) for k in range(3)]
    keys = [("tp", 3, 9 + k, k) for k in range(3)]
    new = rekeyed_all(calls, iter(keys))
    assert new == [rekeyed(c, k) for c, k in zip(calls, keys)]
    assert [c.key for c in new] == keys
    assert all(getattr(n, f) is getattr(c, f) for n, c in zip(new, calls) for f in Collective.__slots__[1:])
    assert rekeyed_all([], iter(())) == []
