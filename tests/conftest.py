"""Shared test helpers: topologies built once, one phase timed alone, the CLI through a
subprocess and its one-line input errors."""

from functools import lru_cache
import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import simpy

from sim.hardware import specs, topology
from sim.hardware.gpus import gpu_preset
from sim import step
from sim.engine.network import Network


@lru_cache(maxsize=None)
def _preset_topology(name: str, gpus: int) -> topology.Topology:
    spec = specs.load_spec(name)
    return topology.build(spec, gpus, gpu_preset(spec.gpu))


@pytest.fixture
def preset_topology():
    """``preset_topology("dgx-h100", 16)``: a topology preset built once per session."""
    return _preset_topology


def run_transfers(topo, starts, on_network=None):
    """Start each (time, phase) transfer on one network (``on_network(net, env)`` first, if given);
    returns (network, end time of each)."""
    env = simpy.Environment()
    net = Network(env, topo)
    if on_network is not None:
        on_network(net, env)
    ends = {}

    def launch(i, at, phase):
        yield env.timeout(at)
        yield from net.run(phase)
        ends[i] = env.now

    for i, (at, phase) in enumerate(starts):
        env.process(launch(i, at, phase))
    env.run()
    return net, [ends[i] for i in range(len(starts))]


def spec_topology(gpus: int, **fields) -> topology.Topology:
    """A fat tree from a spec written inline, e.g. ``spec_topology(16, nic_gbps=5)``."""
    spec = specs.FatTreeSpec("test", **fields)
    return topology.build(spec, gpus, gpu_preset(spec.gpu))


def run_phase(topo: topology.Topology, phase) -> Network:
    """Run one phase alone on an idle network; the network keeps ``env.now`` and
    ``bytes_by_link``."""
    env = simpy.Environment()
    net = Network(env, topo)
    env.process(net.run(phase))
    env.run()
    return net


def time_phase(topo: topology.Topology, phase) -> float:
    """Simulated seconds of one phase running alone on an idle network."""
    return run_phase(topo, phase).env.now


REPO = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=None)
def bench_module(name: str):
    """``bench/NAME.py`` loaded as a module (the bench scripts are not a package), once per run."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli_env() -> dict:
    """The environment of a CLI subprocess: this checkout importable, no debug tracebacks."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CLUSTERSIM_DEBUG", None)
    return env


def clustersim(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m sim ARGS`` from the repository root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "sim", *args], capture_output=True, text=True, cwd=REPO,
                          env=cli_env(), timeout=timeout)


def small_plan_json() -> dict:
    """``clustersim plan --json`` of Llama 3.1 8B on one DGX H100 node, three layouts simulated
    (tests/test_plan.py's contract keys, tests/test_plan_picks.py's counts)."""
    proc = clustersim("plan", "llama3.1-8b", "--gpus", "8", "--topology", "dgx-h100", "--seq-len", "4096",
                      "--global-batch-tokens", "65536", "--top", "3", "--budget", "5", "--workers", "1", "--json",
                      "--quiet")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_input_error(proc: subprocess.CompletedProcess, key: str) -> None:
    """Bad input: exit 2, one line on stderr naming ``key``, never a traceback."""
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and key in proc.stderr and "Traceback" not in proc.stderr


def fp8_flag_refusals(key: str) -> list:
    """The three refusals of an FP8-only flag ``key``: set under BF16, a non-boolean value under FP8,
    and set under torchao's FP8 recipe (no Transformer Engine)."""
    return [([f"{key}=true"], key), (["training.precision='fp8'", f"{key}='yes'"], key),
            (["training.precision='fp8'", "training.fp8_recipe='torchao'", "training.compile=true", f"{key}=true"], key)]


def assert_refusals(path, cases) -> None:
    """``clustersim run PATH --set ...`` for each ``(sets, key)`` of ``cases``, all in forked children
    of one process (tests/forked_cli.py): each exits 2 with one line naming its key, no traceback."""
    jobs = [{"name": str(i), "args": ["run", str(path)] + [a for o in sets for a in ("--set", o)]}
            for i, (sets, _) in enumerate(cases)]
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "forked_cli.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, cwd=REPO, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)["outcomes"]
    for i, (_, key) in enumerate(cases):
        o = got[str(i)]
        lines = o["stderr"].strip().splitlines()
        assert o["code"] == 2 and len(lines) == 1 and key in lines[0] and "Traceback" not in o["stderr"], (key, o)


@pytest.fixture
def calls(monkeypatch):
    """Counts simulations run in this process (workers=1 runs points in-process)."""
    count = {"n": 0}
    real = step.simulate

    def counting(scenario, *args, **kwargs):
        count["n"] += 1
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(step, "simulate", counting)
    return count


HOST_COSTS = ("KERNEL_ISSUE_S", "GEMM_ISSUE_S", "GRAPH_LAUNCH_S", "SCHEDULE_PASS_S", "STEP_PYTHON_S")


def zero_host(mp: pytest.MonkeyPatch) -> None:
    """Zero sim/model/host.py's issue costs through ``mp`` (see :func:`free_host`): the
    per-kernel, graph and schedule costs and every kind's NCCL call. The caches keyed by a
    scenario's content (the RL trainer's steps, the planner's layer programs) get empty ones
    while it lasts: what they hold was issued by the real host (a test of the RL loop on a free
    host read the real host's trainer steps, cached by an earlier test of its file)."""
    from collections import OrderedDict

    from sim.model import host
    from sim.parallel import layer_program
    from sim.rl import trainer

    for name in HOST_COSTS:
        mp.setattr(host, name, 0.0)
    mp.setattr(host, "NCCL_CALL_S", dict.fromkeys(host.NCCL_CALL_S, 0.0))
    mp.setattr(trainer, "_simulate", lru_cache(maxsize=16)(trainer._simulate.__wrapped__))
    mp.setattr(layer_program, "_CACHE", OrderedDict())


@pytest.fixture
def free_host(monkeypatch):
    """A host that issues work in no time (sim/model/host.py's costs zeroed): for closed forms
    of one parallelism's own timing, which a host-bound toy model would otherwise hide behind
    waits for the host (the host's own closed forms: tests/test_host.py)."""
    zero_host(monkeypatch)


def host_wait_share(result) -> float:
    """The longest any simulated rank's GPU sat waiting for its host (sim/outputs/host.py
    ``waits``, what ``--report``'s host line reads), as a share of the step: a toy that checks
    a GPU-side mechanism with the host as modelled asserts this is small (not host-bound)."""
    from sim.outputs.host import waits

    return max(waits(result.spans, result.facts.programs).values()) / result.summary["step_time_s"]
