"""The routing rules of sim/hardware/rails.py, stated once for the router and for folding:
PXN relays, the NICs a GPU's flows cross, and whose routes a failed NIC changes.

Run: ``python -m pytest tests/test_rails.py``
"""

import numpy as np

from sim.hardware.rails import failed_nic_reach, nics_carrying, pxn_relay
from sim.hardware.specs import load_spec
from sim.hardware.topology import build
from sim.hardware.gpus import gpu_preset


def test_pxn_relays_through_the_source_servers_gpu_on_the_destinations_rail():
    domains = np.arange(32) // 8  # four servers, one NVLink domain each
    assert pxn_relay(1, 12, 8, domains) == 4  # GPU 12 is on rail 4: GPU 4's NIC
    assert pxn_relay(4, 12, 8, domains) == 4  # already on that rail: no relay
    two_per_domain = np.arange(32) // 2  # a server of four 2-GPU domains: the relay must share src's
    assert pxn_relay(1, 12, 8, two_per_domain) == 1
    assert pxn_relay(0, 9, 8, two_per_domain) == 1


def test_one_pair_and_many_pairs_agree():
    rng = np.random.default_rng(0)
    for size in (8, 4, 2):
        domains = np.arange(40) // size
        src, dst = rng.integers(0, 40, 500), rng.integers(0, 40, 500)
        many = pxn_relay(src, dst, 8, domains)
        assert many.tolist() == [pxn_relay(int(a), int(b), 8, domains) for a, b in zip(src, dst)]


def test_the_topologys_routes_leave_by_the_relays_nic():
    topo = build(load_spec("dgx-h100"), 32, gpu_preset("h100-sxm"))
    nic_link = {topo.link_ends.index((("gpu", g), ("nic", g))): g for g in range(32)}
    for a, b in ((1, 12), (4, 12), (7, 30), (9, 2)):
        used = [nic_link[lid] for lid in topo.route(a, b).links.tolist() if lid in nic_link]
        assert used == [pxn_relay(a, b, 8, topo.domains)]


def test_the_nics_a_gpu_crosses_are_its_peers_relays_outside_its_domain():
    domains = np.arange(32) // 8
    assert nics_carrying(1, np.array([0, 1, 2, 12, 20, 27]), 8, domains) == {4, 3}
    assert nics_carrying(1, np.array([0, 5]), 8, domains) == set()


def test_a_failed_nic_reaches_its_server_and_its_scalable_unit():
    spec = load_spec("dgx-h100")  # 8 GPUs a server, 32 servers a unit
    own, unit = failed_nic_reach(33, spec, 1024)
    assert (own.start, own.stop, unit.start, unit.stop) == (264, 272, 256, 512)
    own, unit = failed_nic_reach(33, spec, 300)  # a cluster ending inside the unit
    assert (own.stop, unit.stop) == (272, 300)
