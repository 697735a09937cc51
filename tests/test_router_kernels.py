"""The MoE router's kernel launches (``model.moe.router_kernels``, sim/model/layers.py ``router``).

Closed forms: the routing part moves the same bytes in N launches as in one, so a router
forward on the GPU is slower by exactly (N - 1) x ``LAUNCH_S`` (sim/model/compute.py) and costs
the host (N - 1) x ``KERNEL_ISSUE_S`` more to issue (sim/model/host.py); its backward, two
launches per forward launch (``Kernel.backward``), 2 (N - 1) of each. The DeepSeek-V3
validation row carries Megatron-Core's unfused count (72 with the gating GEMM). Bad values
exit 2 naming the key. Run ``python -m pytest -q tests/test_router_kernels.py``.
"""


import pytest

from conftest import assert_input_error, clustersim
from sim.errors import InputError
from sim.hardware.gpus import gpu_preset
from sim.input.load import scenario_from_dict
from sim.model import host
from sim.model.compute import LAUNCH_S, ComputeModel
from sim.model.layers import Shard, backward
from sim.model.moe_kernels import router
from sim.model.transformer import Dims
from sim.step import build, build_topology
from sim.studies import validation

N = 72


def _spec(**moe) -> dict:
    return {"model": {"layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                      "moe": {"experts": 8, "top_k": 2, "routing": "uniform", **moe}},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallel": {"tp": 1, "pp": 1, "dp": 8, "ep": 8},
            "cluster": {"gpu": "h100-sxm", "topology": "dgx-h100", "gpus": 8}}


def _router_ops(spec: dict) -> dict:
    s = scenario_from_dict(spec)
    ops = build(s, build_topology(s))[1][0].ops
    return {name: [op for op in ops if op.name == name] for name in ("router_fwd", "router_bwd")}


def test_the_router_kernels_cost_their_launches_and_nothing_else():
    d = Dims(layers=2, h=7168, a=128, g=128, f=18432, v=129280, mats=3, experts=256, top_k=8, f_expert=2048)
    sh = Shard(tokens=2048, seq=4096, micro=1, tp=1, sp=False, flash=True)
    model = ComputeModel(gpu_preset("h100-sxm"))
    one, many = router(d, sh), router(d, sh, N)
    assert sum(k.bytes for k in many) == sum(k.bytes for k in one)
    assert model.time(many) - model.time(one) == pytest.approx((N - 1) * LAUNCH_S, rel=1e-12)
    assert model.time(backward(many)) - model.time(backward(one)) == pytest.approx(2 * (N - 1) * LAUNCH_S, rel=1e-12)
    assert host.issue_s(many) - host.issue_s(one) == pytest.approx(
        (N - 1) * (host.KERNEL_ISSUE_S + host.STEP_PYTHON_S), rel=1e-12)


def test_a_step_charges_each_router_pass_its_launches_on_the_gpu_and_the_host():
    base, more = _router_ops(_spec()), _router_ops(_spec(router_kernels=N))
    for name, launches in (("router_fwd", N - 1), ("router_bwd", 2 * (N - 1))):
        assert len(more[name]) == len(base[name]) > 0
        for a, b in zip(base[name], more[name]):
            assert b.duration - a.duration == pytest.approx(launches * LAUNCH_S, rel=1e-9)
            assert b.issue - a.issue == pytest.approx(launches * (host.KERNEL_ISSUE_S + host.STEP_PYTHON_S), rel=1e-9)


def test_the_default_is_one_launch():
    assert scenario_from_dict(_spec()).model.moe.router_kernels == 1


def test_the_deepseek_row_carries_megatrons_unfused_count():
    rows = {r.id: r for r in validation.load_rows()}
    assert rows["dg-dsv3-1024"].scenario["model"]["moe"]["router_kernels"] == N - 1
    assert all("router_kernels" not in r.scenario["model"].get("moe", {}) for r in rows.values()
               if r.id != "dg-dsv3-1024")


@pytest.mark.parametrize("value", [0, 4097, 1.5, "many", True])
def test_bad_values_are_refused_naming_the_key(value):
    with pytest.raises(InputError) as err:
        scenario_from_dict(_spec(router_kernels=value))
    assert err.value.key == "model.moe.router_kernels"


def test_a_bad_value_exits_2_through_the_cli(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[model]\nlayers = 2\nhidden = 1024\nheads = 8\nvocab = 8192\n[model.moe]\nexperts = 8\n'
                    'router_kernels = 0\n[training]\nseq_len = 1024\nglobal_batch = 8\n'
                    '[cluster]\ntopology = "dgx-h100"\ngpus = 8\n[parallel]\ndp = 8\nep = 8\n')
    assert_input_error(clustersim("run", str(path), timeout=120), "model.moe.router_kernels")
