"""One RL run: ``simulate_rl(scenario) -> RLResult`` (``clustersim rl SCENARIO``).

Builds the cluster's topology and flow network, the generator engines' cost models, the
trainer's step-time line and the weight-transfer route, runs the loop of
:mod:`sim.rl.loop` for ``rl.steps`` training steps and summarizes it
(:mod:`sim.rl.summary`). Trainer GPUs are the cluster's first ``trainer_gpus``,
generators the next ``generator_gpus``, ``generator_tp`` consecutive GPUs per engine.
"""

from dataclasses import dataclass, field
import time

import simpy

from ..engine.network import Network
from ..errors import InputError
from ..hardware.gpus import gpu_preset
from ..input.choices import RLMode
from ..input.scenario import Scenario
from ..model.transformer import dims, total_params
from ..step import build_topology
from . import transfer
from .inference import ELEM, allreduce_line, engine_cost
from .loop import Generator, Loop, Prompts
from .summary import summarize
from .trainer import Trainer


@dataclass
class RLResult:
    """``summary``: the JSON of ``clustersim rl``; the rest feeds timelines and studies."""

    summary: dict
    scenario: Scenario
    loop: Loop
    topology: object
    info: dict = field(default_factory=dict)


def staleness_bound(s: Scenario) -> int:
    """k of the staleness gate: 0 in sync, ``max_staleness`` (default 1) otherwise."""
    if s.rl.mode is RLMode.SYNC:
        return 0
    return 1 if s.rl.max_staleness is None else s.rl.max_staleness


def engine_groups(s: Scenario) -> list[tuple[int, ...]]:
    """The GPUs of every generator engine."""
    rl = s.rl
    first = rl.trainer_gpus
    return [tuple(range(first + i, first + i + rl.generator_tp)) for i in range(0, rl.generator_gpus, rl.generator_tp)]


def build(s: Scenario, record_links: bool = False, costs=None):
    """(env, loop, topology, facts) ready to run; ``costs``: a cost model per engine to use
    instead of the scenario's (tests use it for the decode-bound limit)."""
    if s.rl is None:
        raise InputError("rl", "the scenario has no [rl] section (see CONTRACT.md: clustersim rl)")
    topo = build_topology(s)
    gpu = gpu_preset(s.cluster.gpu or topo.spec.gpu)
    d, rl = dims(s.model), s.rl
    groups = engine_groups(s)
    if costs is None:
        costs = _costs(s, d, gpu, topo, groups)
    trainer = Trainer(s, topo.spec.gpus_per_node)
    trainer.prepare()
    env = simpy.Environment()
    net = Network(env, topo)
    if record_links:
        net.log = []
    k = staleness_bound(s)
    prompts = Prompts(env, s, s.training.global_batch, k, rl.mode is RLMode.PIPELINE, len(groups))
    gens = [Generator(env, i, g, c, prompts, rl.mode) for i, (g, c) in enumerate(zip(groups, costs))]
    weight_bytes = total_params(d, s.model.tied_embeddings) * ELEM
    receivers = tuple(x for g in groups for x in g)
    phases = transfer.phases(s, topo, rl.trainer_gpus, receivers, weight_bytes)
    loop = Loop(env, s, gens, prompts, trainer, net, phases, (0,) + receivers, weight_bytes)
    return env, loop, topo, {"k": k, "weight_bytes": weight_bytes, "peak_flops": gpu.peak_flops, "gpu": gpu.name}


def _costs(s, d, gpu, topo, groups):
    rl = s.rl
    out, by_shape = [], {}
    for g in groups:
        shape = tuple(int(topo.domains[x]) - int(topo.domains[g[0]]) for x in g)
        if shape not in by_shape:
            by_shape[shape] = engine_cost(d, s.model.tied_embeddings, gpu, rl.generator_tp, rl.memory_fraction,
                                          rl.prompt_tokens + rl.lengths.max, rl.max_seqs, allreduce_line(topo, g))
        out.append(by_shape[shape])
    return out


def simulate_rl(s: Scenario, record_links: bool = False, costs=None) -> RLResult:
    """Run the RL loop of ``s``; ``record_links`` keeps the network's rate log for traces."""
    t0 = time.perf_counter()
    env, loop, topo, facts = build(s, record_links, costs)
    wall = loop.run()
    summary = summarize(s, loop, wall, facts)
    summary["sim_wall_s"] = round(time.perf_counter() - t0, 3)
    return RLResult(summary, s, loop, topo, {**facts, "link_log": loop.net.log,
                                             "link_bytes": loop.net.bytes_by_link})
