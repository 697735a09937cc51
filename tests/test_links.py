"""Compiled phases (sim/engine/links.py): the structure cache keyed by digests checked
against the hop arrays, and a large phase's weights held as codes into their distinct values,
each compared with what the phase's routes say, bit for bit.
Run ``python -m pytest -q tests/test_links.py``.
"""

import numpy as np

from conftest import run_phase, spec_topology
from sim.collectives.schedule import Phase
from sim.collectives.tree import all_reduce_arrays
from sim.engine import links
from sim.engine.links import PhaseCache, coded_weights
from sim.hardware.paths import routes

TOPO = spec_topology(512)  # 64 nodes over several leaves: a world-wide tree crosses the spines, sprayed


def world_tree():
    """The two phases of a tree all-reduce over every GPU (8 per NVLink domain)."""
    return all_reduce_arrays(np.arange(512).reshape(64, 8), 1e8)


def test_coded_weights_give_back_every_weight_bit_for_bit():
    w = np.tile([1.0, 0.25, 1 / 3, 0.125, 1 / 3], 20_000)
    values, codes = coded_weights(w)
    assert codes is not None and codes.dtype == np.uint8 and values.tolist() == [1.0, 0.25, 1 / 3, 0.125]
    assert values[codes].tobytes() == w.tobytes()


def test_weights_that_codes_cannot_hold_exactly_stay_as_they_are():
    few = np.ones(100)
    assert coded_weights(few)[1] is None  # small: nothing to save
    for odd in (0.0, -0.0, np.nan):  # 0.0 and -0.0 compare equal; NaN equals nothing
        w = np.ones(links.CODED_ENTRIES + 10)
        w[7] = odd
        values, codes = coded_weights(w)
        assert codes is None and values is w
    many = np.arange(1, links.CODED_ENTRIES + 2, dtype=float)  # more than 256 distinct values
    assert coded_weights(many)[1] is None


def test_a_compiled_phase_is_its_routes(monkeypatch):
    monkeypatch.setattr(links, "CODED_ENTRIES", 0)  # code every phase's weights
    for phase in world_tree():
        compiled = PhaseCache(TOPO).get(phase)
        entry_link, entry_weight, lengths, latency = routes(TOPO, phase.src, phase.dst)
        assert compiled.weight_codes is not None and len(compiled.weight_values) > 1  # sprayed: 1 and 1/k
        assert compiled.entry_weight.tobytes() == entry_weight.tobytes()
        assert compiled.links[compiled.link_index].tolist() == entry_link.tolist()
        assert compiled.entry_chain.tolist() == np.repeat(phase.chain, lengths).tolist()
        assert compiled.step_latency == latency.max()
        held = compiled.entry_chain.nbytes + compiled.link_index.nbytes + compiled.weight_codes.nbytes
        assert held == 9 * len(entry_link)  # int32 chain, int32 link position, uint8 weight code


def test_coded_and_plain_weights_run_the_same_floats(monkeypatch):
    results = []
    for coded in (0, 1 << 40):
        monkeypatch.setattr(links, "CODED_ENTRIES", coded)
        for phase in world_tree():
            net = run_phase(TOPO, phase)
            results.append((net.env.now, net.bytes_by_link.tobytes()))
    assert results[:2] == results[2:]


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
