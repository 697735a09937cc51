"""Several training jobs on one cluster: each job's step, and its slowdown from the others.

``clustersim run A.toml B.toml --shared-fabric [--placement packed|spread|nodes:0-3/4-7]``
places every job on whole nodes of one cluster (:mod:`.placement`), builds each job's
rank programs as if alone, relabels them onto the job's GPUs (rank ids, collective
groups and keys, so that calls of different jobs never meet), and runs all of them in
one Engine on one Network: where the jobs' traffic crosses the same links (a shared
spine, a NIC) max-min fairness splits them. Each job is then run alone at the same
place; its slowdown is its shared step time over that.

Every rank is simulated (folding is off): folding assumes the ranks of a stage see the
same network, which another job's traffic breaks. Jobs must agree on the cluster
(topology, GPU, overrides, GPUs per node); the cluster is the first job's, with
``--cluster-nodes`` nodes (default: as many as the jobs need). Each job keeps its own
stragglers, jitter and link faults, mapped through its placement (:func:`cluster_faults`);
"alone" is the job at its place with only its own faults, and a perturbed job's
``straggler_cost_s`` is, as ``run`` prices it, that step minus the clean one.
"""

from dataclasses import dataclass
import time

from .. import bounds, collectives
from ..engine.ops import Collective, RankProgram
from ..errors import InputError
from ..hardware.faults import compute_scale, perturbed
from ..input.load import clean_copy
from ..hardware import specs
from ..input.choices import MicroBatches
from ..input.scenario import Scenario
from ..outputs.metrics import summarize
from ..parallel.memory import peak_memory
from ..parallel.program import Context
from ..step import build, build_topology, execute
from .placement import gpu_map, node_lists


@dataclass
class Job:
    """One job of a shared run: its scenario, nodes, programs and how it went."""

    scenario: Scenario
    nodes: list[int]
    gpus: list[int]  # job rank -> cluster GPU
    ctx: Context | None = None
    programs: list = None
    summary: dict = None
    alone_step_s: float = 0.0

    def report(self) -> dict:
        """The job's summary (CONTRACT.md keys) with its place and slowdown."""
        shared = self.summary["step_time_s"]
        return {"name": self.scenario.name, "nodes": self.nodes, "summary": self.summary,
                "alone_step_time_s": self.alone_step_s, "slowdown": shared / self.alone_step_s}


def run_shared(scenarios: list[Scenario], placement: str = "packed", cluster_nodes: int | None = None) -> dict:
    """Simulate the jobs together and each alone; the report of every job."""
    t0 = time.perf_counter()
    steady = [i for i, s in enumerate(scenarios) if s.simulation.micro_batches is MicroBatches.STEADY]
    if steady:  # (the jobs' micro-batches interleave on the shared links: no job's step is its own line)
        raise InputError("simulation.micro_batches", f"job {steady[0]} ({scenarios[steady[0]].name}) asks for "
                                                     "'steady', which extrapolates one job's step alone; jobs sharing "
                                                     "a fabric run every micro-batch: remove it")
    per_node = _check_cluster(scenarios)
    needs = [_nodes_needed(s, per_node, i) for i, s in enumerate(scenarios)]
    total = cluster_nodes if cluster_nodes is not None else sum(needs)
    if total < 1:
        raise InputError("--cluster-nodes", f"expected a positive number of nodes, got {total}")
    if total * per_node > bounds.GPUS.hi:  # (1e9 nodes hung building the graph)
        raise InputError("--cluster-nodes", f"{total:,} nodes of {per_node} GPUs is past {bounds.GPUS.hi:,} GPUs "
                                            f"({bounds.GPUS.why})")
    jobs = [Job(s, nodes, gpu_map(nodes, per_node)) for s, nodes in zip(scenarios, node_lists(placement, needs, total))]
    cluster = _cluster(scenarios[0], total * per_node)
    topo = build_topology(_with_faults(cluster, [f for job in jobs for f in cluster_faults(job, per_node)]))
    for j, job in enumerate(jobs):
        _build(job, j, topo)
    name = "+".join(s.name for s in scenarios)
    engine, spans, _wall = execute(name, topo, [p for job in jobs for p in job.programs], _scale(jobs, topo))
    for j, job in enumerate(jobs):
        job.summary = _summary(job, spans[spans["rank"].isin(job.gpus)])
        job.alone_step_s = _alone(job, j, cluster, per_node)
        if perturbed(job.scenario):  # as `run` prices them: the job alone, with and without its perturbations
            job.summary["straggler_cost_s"] = job.alone_step_s - _alone(job, j, cluster, per_node, clean=True)
    return {"num_gpus": topo.num_gpus, "placement": placement, "jobs": [job.report() for job in jobs],
            "sim_events": engine.events, "sim_wall_s": round(time.perf_counter() - t0, 3)}


def _cluster(first: Scenario, gpus: int) -> Scenario:
    """The shared cluster: the first job's (all jobs describe the same), ``gpus`` GPUs, no faults."""
    return first.model_copy(update={"cluster": first.cluster.model_copy(update={"gpus": gpus, "nodes": None,
                                                                                 "faults": []})})


def _with_faults(cluster: Scenario, faults: list) -> Scenario:
    return cluster.model_copy(update={"cluster": cluster.cluster.model_copy(update={"faults": faults})})


def cluster_faults(job: Job, per_node: int) -> list:
    """The job's ``[[cluster.faults]]`` on the shared cluster: a GPU's NIC and a server's NICs
    move with the job's placement (job GPU r -> cluster GPU gpus[r], job node n -> nodes[n]);
    a spine is the shared fabric's own and stays where it is named (every job crosses it)."""
    out = []
    for f in job.scenario.cluster.faults:
        moved = {}
        if f.gpu_nic is not None:
            moved["gpu_nic"] = job.gpus[f.gpu_nic]
        if f.node_nics is not None:
            moved["node_nics"] = job.nodes[f.node_nics]
        out.append(f.model_copy(update=moved))
    return out


def _alone(job: Job, j: int, cluster: Scenario, per_node: int, clean: bool = False) -> float:
    """The job's step at its place on the cluster with no other job: its own faults only
    (``clean``: none, and no stragglers or jitter either)."""
    alone = Job(clean_copy(job.scenario) if clean else job.scenario, job.nodes, job.gpus)
    topo = build_topology(_with_faults(cluster, [] if clean else cluster_faults(job, per_node)))
    _build(alone, j, topo)
    return float(execute(alone.scenario.name, topo, alone.programs, _scale([alone], topo))[1].end_s.max())


def _check_cluster(scenarios: list[Scenario]) -> int:
    """GPUs per node; every job must describe the same cluster (and be a training step:
    an [rl] scenario runs with `clustersim rl`, as `run` says)."""
    for s in scenarios:
        if s.rl is not None:
            raise InputError("rl", f"job {s.name!r} is an [rl] scenario: it runs with `clustersim rl`, not on a "
                                   "shared fabric of training steps")
        if s.cluster.segment:
            raise InputError("cluster.segment", f"job {s.name!r}: Slurm segments place one job's nodes; on a shared "
                                                "fabric the jobs' nodes are placed by --placement")
    def cluster_of(s):
        c = s.cluster
        return (c.topology, c.gpu, dict(c.topology_overrides), c.gpus_per_node)

    first = cluster_of(scenarios[0])
    for s in scenarios[1:]:
        if cluster_of(s) != first:
            raise InputError("cluster", f"job {s.name!r} describes another cluster ({cluster_of(s)}) than "
                                        f"{scenarios[0].name!r} ({first}); jobs of a shared fabric share one")
    c = scenarios[0].cluster
    return c.gpus_per_node or int(c.topology_overrides.get("gpus_per_node", specs.load_spec(c.topology).gpus_per_node))


def _nodes_needed(s: Scenario, per_node: int, i: int) -> int:
    if s.cluster.gpus % per_node:
        raise InputError("--placement", f"job {i} ({s.name}) has {s.cluster.gpus} GPUs, not whole nodes of {per_node}")
    return s.cluster.gpus // per_node


def _build(job: Job, j: int, topo) -> None:
    """The job's programs, built as if alone (every rank simulated) and moved onto its GPUs."""
    s = job.scenario.model_copy(update={"parallel": job.scenario.parallel.model_copy(update={"fold": False})})
    job.scenario = s
    job.ctx, programs = build(s, topo, domains=[int(topo.domains[g]) for g in job.gpus], check=False)
    if s.parallel.dp_algo in collectives.NEEDS_FABRIC:  # (checked where the programs land)
        _check_algorithms(programs, job, topo)
    job.programs = [relabel(p, job.gpus, j) for p in programs]


def _check_algorithms(programs, job: Job, topo) -> None:
    try:
        collectives.check_programs([relabel(p, job.gpus, 0) for p in programs], topo, "parallel.dp_algo")
    except InputError as exc:
        raise InputError(exc.key, f"job {job.scenario.name!r}: {exc.reason}") from None


def relabel(prog: RankProgram, gpus: list[int], job: int) -> RankProgram:
    """A job's rank program moved onto cluster GPUs ``gpus`` (rank r -> gpus[r]); its
    collectives' keys carry the job, so two jobs' calls never meet."""
    calls: dict[int, Collective] = {}
    ops = []
    for op in prog.ops:
        c = op.comm
        if c is not None:
            moved = calls.get(id(c))
            if moved is None:
                moved = calls[id(c)] = Collective(("job", job) + c.key, c.op, tuple(gpus[g] for g in c.group),
                                                  c.nbytes, c.algo, tuple(tuple(gpus[g] for g in s) for s in c.siblings),
                                                  c.shares, c.sms)
            op = op._replace(comm=moved)
        ops.append(op)
    return RankProgram(gpus[prog.rank], ops, holds_sms=prog.holds_sms)


def _scale(jobs: list[Job], topo):
    """compute slowdown(gpu, now) of every job's stragglers, on cluster GPU ids."""
    rules = {}
    for job in jobs:
        fn = compute_scale(job.scenario, topo)
        if fn is not None:
            rules.update({g: (fn, r) for r, g in enumerate(job.gpus)})
    if not rules:
        return None
    return lambda gpu, now: rules[gpu][0](rules[gpu][1], now) if gpu in rules else 1.0


def _summary(job: Job, spans) -> dict:
    """The job's CONTRACT.md summary from its own spans (ranks back to job ranks)."""
    back = {g: r for r, g in enumerate(job.gpus)}
    spans = spans.assign(rank=spans["rank"].map(back))
    gpu = job.ctx.compute.gpu
    return summarize(job.scenario, job.ctx, spans, peak_memory(job.ctx), gpu.hbm_bytes, gpu.peak_flops)
