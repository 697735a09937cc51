"""MegaScale's fabric (topologies/megascale-a100.toml; Jiang et al., NSDI 2024, Sec. 3.6): ToR
uplinks twice a NIC's bandwidth, flows hashed onto one spine (ECMP), 64 servers per ToR set; the
ms-g175-* validation rows run on it (docs/strong_scaling.md)."""

import numpy as np
import pytest

from conftest import time_phase
from sim.collectives.schedule import Phase
from sim.hardware import specs
from sim.studies.validation import load_rows, modern_scenario

NODE = 8  # GPUs per server
SU = 64 * NODE  # GPUs under one set of ToRs


def spine_of(topo, a: int, b: int) -> str:
    """The spine a flow a -> b is hashed onto."""
    (spine,) = {n for link in topo.route(a, b).links for n in topo.link_ends[link] if n[0] == "spine"}
    return spine


def test_the_preset_is_what_sec_3_6_states(preset_topology):
    spec = specs.load_spec("megascale-a100")
    assert (spec.routing, spec.nodes_per_su, spec.spines, spec.gpu) == (specs.Routing.ECMP, 64, 32, "a100-80gb")
    topo = preset_topology("megascale-a100", 2 * SU)
    route = topo.route(0, SU)  # rail 0 of server 0 -> rail 0 of server 64, the next set of ToRs
    caps = topo.caps[route.links]
    nic, up = topo.caps[route.links[1]], caps[2]
    assert up == pytest.approx(2 * nic, rel=1e-12)  # "each uplink is double of a downlink"
    assert (route.weights == 1).all()  # hashed onto one spine, not sprayed
    assert topo.route(0, 8).links.size == topo.route(0, SU - 8).links.size  # 64 servers share a ToR


def test_a_hashed_uplink_slows_a_flow_only_when_three_share_it(preset_topology):
    """k flows hashed onto one uplink of 2 NICs' bandwidth each move at min(NIC, 2 NIC / k):
    the time of B more bytes is B / NIC for k = 2 and 3 B / (2 NIC) for k = 3."""
    topo = preset_topology("megascale-a100", 2 * SU)
    sources = [0, NODE, 2 * NODE]  # rail 0 of servers 0-2: one ToR
    spine = spine_of(topo, sources[0], SU)
    dests = [SU]
    for s in sources[1:]:  # destinations on rail 0 across the fabric whose hash meets the first flow's spine
        dests.append(next(d for d in range(SU + NODE, 2 * SU, NODE)
                          if d not in dests and spine_of(topo, s, d) == spine))
    nic = topo.caps[topo.route(0, SU).links[1]]

    def seconds(k: int, nbytes: float) -> float:
        src, dst = np.array(sources[:k]), np.array(dests[:k])
        return time_phase(topo, Phase(src, dst, np.arange(k), np.full(k, nbytes), 1))

    B = 1e9
    assert seconds(2, 2 * B) - seconds(2, B) == pytest.approx(B / nic, rel=1e-9)
    assert seconds(3, 2 * B) - seconds(3, B) == pytest.approx(3 * B / (2 * nic), rel=1e-9)


def test_only_the_megascale_rows_name_a_topology():
    rows = {r.id: r for r in load_rows()}
    ms = [i for i in rows if i.startswith("ms-g175-")]
    assert len(ms) == 8
    assert {rows[i].scenario["cluster"]["topology"] for i in ms} == {"megascale-a100"}
    assert rows["l3-405-8192"].scenario["cluster"]["topology"] == "dgx-h100"
    assert modern_scenario({"id": "x", "model": "m", "gpu": "a100-80gb", "num_gpus": "8"})["cluster"]["topology"] \
        == "dgx-a100"  # an empty column keeps the GPU's DGX preset
