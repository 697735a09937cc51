"""The seeds' hierarchical collectives across NVLink domains.

All-reduce: reduce-scatter inside each domain (every GPU ends with the domain-reduced
sum of a 1/k shard), all-reduce of the shards across domains between corresponding
GPUs, all-gather inside the domain. Only B/k per GPU crosses the slow inter-domain links,
and all k GPUs of a domain drive their NICs at once. All-gather and reduce-scatter use
the two halves of the same idea. Every phase is a flat ring on its subgroup.
"""

from . import ring
from .schedule import merge


def _split(group, domains):
    """Subgroups inside each domain, and k rings across domains: ring j joins member j of
    every domain (k = the largest domain's member count; a smaller domain's member
    j mod size holds several of the k shards and joins several rings)."""
    per_domain = ring.domain_members(group, domains)
    k = max(len(m) for m in per_domain)
    dom_of = dict(zip(group, domains))
    inside = [tuple(m) for m in per_domain]
    across = [tuple(m[j % len(m)] for m in per_domain) for j in range(k)]
    return inside, across, k, dom_of


def _rings(fn, subgroups, dom_of, nbytes, label, mesh=False):
    phases = [fn(g, tuple(dom_of[r] for r in g), nbytes, mesh)[0] for g in subgroups if len(g) > 1]
    return (merge(phases, label),) if phases else ()


def all_reduce(group, domains, nbytes, mesh=False):
    """Reduce-scatter in domains, all-reduce across, all-gather in domains (``mesh``: the
    in-domain rings run on an xGMI mesh, :mod:`.ring`)."""
    inside, across, k, dom = _split(group, domains)
    return (_rings(ring.reduce_scatter, inside, dom, nbytes, "hier reduce_scatter (domain)", mesh)
            + _rings(ring.all_reduce, across, dom, nbytes / k, "hier all_reduce (across)")
            + _rings(ring.all_gather, inside, dom, nbytes, "hier all_gather (domain)", mesh))


def all_gather(group, domains, nbytes, mesh=False):
    """All-gather across domains (B/k per subgroup), then inside each domain (B)."""
    inside, across, k, dom = _split(group, domains)
    return (_rings(ring.all_gather, across, dom, nbytes / k, "hier all_gather (across)")
            + _rings(ring.all_gather, inside, dom, nbytes, "hier all_gather (domain)", mesh))


def reduce_scatter(group, domains, nbytes, mesh=False):
    """Reduce-scatter inside each domain (B), then across domains (B/k)."""
    inside, across, k, dom = _split(group, domains)
    return (_rings(ring.reduce_scatter, inside, dom, nbytes, "hier reduce_scatter (domain)", mesh)
            + _rings(ring.reduce_scatter, across, dom, nbytes / k, "hier reduce_scatter (across)"))
