"""NCCL's protocols: LL, LL128 and Simple trade latency (alpha) for bandwidth (beta).

LL sends 8-byte lines of 4 bytes of data and a 4-byte flag (half the wire for data, the
lowest latency); LL128 sends 128-byte lines with an 8-byte flag; Simple sends plain data
and synchronises with a flag per chunk (NVIDIA/nccl src/device/prims_ll.h,
prims_ll128.h, prims_simple.h). The factors here are NCCL's own tuner model
(NVIDIA/nccl src/graph/tuning.cc, ``ncclTopoTuneModel``):

- bandwidth fraction (of Simple's): ring LL 0.5, ring LL128 0.92; tree LL 1/3.8, tree
  LL128 7/9 in one node and 120/128 across nodes. It is applied as extra bytes on the
  wire (``Phase.wire`` = 1 / fraction: links carry that much per byte of payload), so a
  protocol's traffic also loads shared links in that proportion; the payload a GPU
  sends (``comm_bytes_per_gpu``) does not change.
- per-step latency: the ratio of NCCL's predicted latency for the protocol to Simple's
  for the same communicator (``sim.collectives.tuner.latency``: ``baseLatencies`` plus
  ``hwLatencies`` per NVLink or network step, e.g. ring NVLink LL 0.6 / LL128 1.9 /
  Simple 3.4 us per step, network 2.7 / 4.0 / 14). An 8-GPU ring: LL 15 / 56 us.

Simple is the flow model as calibrated (factor 1 on both): its per-step latency is the
path latency of ``sim.hardware.gpus.LINK_LATENCY``. Algorithms other than ring and tree
(NVLS, CollNet, PAT, hierarchical, direct) run Simple only, as in NCCL.
"""

from dataclasses import replace

from .kinds import Algorithm

PROTOCOLS = ("ll", "ll128", "simple")
WITH_PROTOCOLS = (Algorithm.RING, Algorithm.TREE)


def bandwidth_fraction(algo: str, proto: str, one_node: bool) -> float:
    """Share of Simple's bandwidth the protocol reaches (tuning.cc refinements)."""
    if proto == "simple":
        return 1.0
    if algo == Algorithm.RING:
        return 0.5 if proto == "ll" else 0.92
    if proto == "ll":
        return 1 / 3.8
    return 7 / 9 if one_node else 120 / 128


def apply(phases: tuple, fraction: float, scale: float) -> tuple:
    """``phases`` run with a protocol reaching ``fraction`` of Simple's bandwidth and
    ``scale`` times its per-step latency."""
    return tuple(replace(p, wire=1 / fraction, latency_scale=scale) for p in phases)
