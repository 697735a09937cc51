"""Where each job of a shared-fabric run sits: whole nodes of one cluster.

``packed`` gives job 0 the first nodes, job 1 the next, and so on; ``spread`` deals the
nodes out in turn (job 0 node 0, job 1 node 1, job 0 node 2, ...) until each job has
its share; ``nodes:0-3,8/4-7`` names each job's nodes, jobs separated by ``/``, in the
order of the scenario files. Job rank r runs on the r % per_node-th GPU of its
(r // per_node)-th node. Bad placements (overlapping, outside the cluster, the wrong
number of nodes) are input errors naming ``--placement``.
"""

from .. import bounds
from ..errors import InputError

KEY = "--placement"


def node_lists(spec: str, needs: list[int], cluster_nodes: int) -> list[list[int]]:
    """The nodes of each job (``needs[j]`` nodes for job j) on a cluster of ``cluster_nodes``."""
    if sum(needs) > cluster_nodes:
        raise InputError(KEY, f"the jobs need {sum(needs)} nodes but the cluster has {cluster_nodes}")
    if spec == "packed":
        starts = [sum(needs[:j]) for j in range(len(needs))]
        return [list(range(s, s + n)) for s, n in zip(starts, needs)]
    if spec == "spread":
        return _spread(needs)
    if spec.startswith("nodes:"):
        return _explicit(spec[len("nodes:"):], needs, cluster_nodes)
    raise InputError(KEY, f"expected packed, spread or nodes:LIST/LIST (e.g. nodes:0-3/4-7), got {spec!r}")


def _spread(needs: list[int]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in needs]
    node, j = 0, 0
    while any(len(o) < n for o, n in zip(out, needs)):
        if len(out[j]) < needs[j]:
            out[j].append(node)
            node += 1
        j = (j + 1) % len(needs)
    return out


def _explicit(text: str, needs: list[int], cluster_nodes: int) -> list[list[int]]:
    parts = text.split("/")
    if len(parts) != len(needs):
        raise InputError(KEY, f"names nodes for {len(parts)} jobs, but there are {len(needs)} (separate jobs with /)")
    out, owner = [], {}
    for j, (part, need) in enumerate(zip(parts, needs)):
        nodes = _parse_list(part)
        for n in nodes:
            if n >= cluster_nodes:
                raise InputError(KEY, f"node {n} is outside the cluster ({cluster_nodes} nodes; see --cluster-nodes)")
            if n in owner:
                raise InputError(KEY, f"node {n} is given to job {owner[n]} and job {j}: placements overlap")
            owner[n] = j
        if len(nodes) != need:
            raise InputError(KEY, f"job {j} needs {need} nodes, {len(nodes)} given")
        out.append(nodes)
    return out


def _parse_list(part: str) -> list[int]:
    nodes: list[int] = []
    try:
        for item in filter(None, part.split(",")):
            lo, _, hi = item.partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
            if first < 0 or last < first:
                raise ValueError
            if last >= bounds.GPUS.hi:  # (a huge range was an instant MemoryError)
                raise InputError(KEY, f"{part!r}: node {last:,} is past the largest cluster ({bounds.GPUS.why})")
            nodes += range(first, last + 1)
    except ValueError:
        raise InputError(KEY, f"{part!r}: expected node numbers and ranges like 0-3,8") from None
    if len(set(nodes)) != len(nodes):
        raise InputError(KEY, f"{part!r} names a node twice")
    return nodes


def gpu_map(nodes: list[int], per_node: int) -> list[int]:
    """Job rank -> cluster GPU."""
    return [n * per_node + i for n in nodes for i in range(per_node)]
