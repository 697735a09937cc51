"""Weight transfer from the trainer pool to the generator pool over the cluster's fabric.

Run ``clustersim rl scenarios/rl-llama3-8b-h100.toml`` (``[rl] weight_route``).

After each optimizer step the trainer sends the new policy, ``total params * 2`` bytes
(bf16), to every generator GPU. The transfer is a phase on the cluster's flow network
(:class:`sim.engine.network.Network`): routed hop by hop through NVLink, PCIe, NICs and the
IB fat tree of the scenario's topology (its link faults included) and sharing every link
max-min fairly with whatever else is in flight on it. Two routes:

- ``broadcast``: PipelineRL's: the trainer's rank 0 broadcasts every parameter tensor to
  all inference workers with one NCCL communicator (ServiceNow/PipelineRL,
  pipelinerl/finetune_loop.py ``WeightUpdateManager.send_weight_update``; the vLLM side,
  pipelinerl/vllm1.py ``receive_weight_update``, receives the full tensor on every TP
  worker and loads its shard). NCCL's pipelined ring broadcast (sim/collectives/ring.py),
  one channel per GPU of a generator node, all leaving through rank 0's links: about
  W / (rank 0's NIC) once the generators sit on other nodes.
- ``p2p``: every GPU holding a distinct shard of the trainer's parameters (every trainer
  GPU under ZeRO-3, else the data-parallel rank-0 replica) writes straight to every
  generator GPU the share of its shard that GPU's engine needs: W / (sources * tp) bytes
  per pair, all pairs at once (RDMA point-to-point, as in Perplexity's "Journey to
  2-second inter-node RL weight transfer", Lequn Chen 2025). Many NICs carry it, and the
  pairs contend with each other on every shared link.
"""

import numpy as np

from ..collectives import schedule
from ..collectives.kinds import BROADCAST
from ..collectives.schedule import chains_phase
from ..engine.kinds import Category
from ..input.choices import WeightRoute
from ..parallel.layout import Layout


def sources(s, trainer_gpus: int) -> tuple[int, ...]:
    """Trainer GPUs holding distinct parameter shards (see the module docstring)."""
    if s.parallel.zero >= 3:
        return tuple(range(trainer_gpus))
    layout = Layout.from_parallel(s.parallel)
    return tuple(r for r in range(trainer_gpus) if layout.coords(r)[Category.DP] == 0)


def phases(s, topo, trainer_gpus: int, generators: tuple[int, ...], nbytes: float) -> tuple:
    """The phases of one transfer of ``nbytes`` (the whole model) to every generator GPU."""
    if s.rl.weight_route is WeightRoute.BROADCAST:
        group = (0,) + tuple(generators)
        return schedule(BROADCAST, "ring", group, float(nbytes), tuple(int(topo.domains[g]) for g in group)).phases
    src = sources(s, trainer_gpus)
    pairs = [[(a, b)] for a in src for b in generators]
    per_pair = nbytes / (len(src) * s.rl.generator_tp)
    return (chains_phase(pairs, np.full(len(pairs), per_pair), 1, "p2p weights"),)


def run(net, transfer_phases):
    """SimPy generator: the phases one after another on ``net``."""
    for phase in transfer_phases:
        yield from net.run(phase)
