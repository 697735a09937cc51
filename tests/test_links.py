"""Compiled phases (sim/engine/links.py): the structure cache keyed by digests checked
against the hop arrays (no copy of the hops held), and what a compiled phase holds compared
with what the phase's routes say, bit for bit.
Run ``python -m pytest -q tests/test_links.py``.
"""

import numpy as np

from conftest import spec_topology
from sim.collectives.schedule import Phase
from sim.collectives.tree import all_reduce_arrays
from sim.engine import links
from sim.engine.links import PhaseCache
from sim.hardware.paths import routes

TOPO = spec_topology(512)  # 64 nodes over several leaves: a world-wide tree crosses the spines, sprayed


def world_tree():
    """The two phases of a tree all-reduce over every GPU (8 per NVLink domain)."""
    return all_reduce_arrays(np.arange(512).reshape(64, 8), 1e8)


def test_a_compiled_phase_is_its_routes():
    for phase in world_tree():
        compiled = PhaseCache(TOPO).get(phase)
        entry_link, entry_weight, lengths, latency = routes(TOPO, phase.src, phase.dst)
        assert len(np.unique(compiled.entry_weight)) > 1  # sprayed over the spines: 1 and 1/k
        assert compiled.entry_weight.tobytes() == entry_weight.tobytes()
        assert compiled.links[compiled.link_index].tolist() == entry_link.tolist()
        assert compiled.entry_chain.tolist() == np.repeat(phase.chain, lengths).tolist()
        assert compiled.step_latency == latency.max()
        held = compiled.entry_chain.nbytes + compiled.link_index.nbytes + compiled.entry_weight.nbytes
        assert held == 16 * len(entry_link)  # int32 chain, int32 link position, float64 weight


def test_the_cache_tells_phases_apart_by_their_arrays_not_the_digest(monkeypatch):
    monkeypatch.setattr(links, "_digest", lambda arrays, extra: b"same for all")  # every digest collides
    cache = PhaseCache(TOPO)
    up, down = world_tree()
    first = cache.get(up)
    copy = Phase(up.src.copy(), up.dst.copy(), up.chain.copy(), up.nbytes * 2, up.steps)  # same hops, other bytes
    assert cache.get(copy) is first
    assert cache.get(down) is not first and cache.get(down).key == 1
    wider = Phase(up.src, up.dst, up.chain, up.nbytes, up.steps, wire=2.0)  # a protocol's flags: other weights
    assert cache.get(wider).key == 2 and cache.count == 3
    shifted = Phase(up.src[:7] + 8, up.dst[:7] + 8, up.chain[:7], up.nbytes[:7], 1)  # one domain over
    alone = Phase(up.src[:7], up.dst[:7], up.chain[:7], up.nbytes[:7], 1)
    assert cache.get(alone).key == 3 and cache.get(shifted).key == 4  # a translated template, a new key
    assert cache.get(shifted).links.tolist() != cache.get(alone).links.tolist()
