"""Slurm segments on NVL72 racks (``cluster.segment``: :func:`sim.hardware.specs.segmented`).
``sbatch --segment=N`` with the block topology plugin places each N consecutive nodes of the
job in one block, here one GB200 NVL72 rack (one NVLink domain, one scalable unit of leaves);
Megatron-Bridge and NeMo's performance scripts ask for segments of 16 nodes on 32 nodes or
more (sim/data/README.md, "slurm_segment").

Checked: the graph the simulator builds puts each GPU behind the NVSwitch and the leaf of the
domain computed by hand, segmented and packed; the segmented 512-GPU GB200 405B row folds to
one rank a stage (its packed placement to 64); bad values exit 2 naming the key.

Run: ``python -m pytest tests/test_segment.py``
"""

import copy

import pytest

from conftest import assert_refusals
from sim.input.load import scenario_from_dict
from sim.parallel import census
from sim.parallel.fold_reasons import fold_reasons
from sim.step import build_topology
from sim.studies.validation import load_rows

GPUS, PER = 512, 4  # 128 GB200 compute trays of 4 GPUs


def gb200(segment=None, gpus=GPUS) -> dict:
    cluster = {"topology": "gb200-nvl72", "gpus": gpus} | ({"segment": segment} if segment else {})
    return {"name": "segment", "model": {"preset": "llama3-8b"}, "cluster": cluster, "parallel": {"dp": gpus},
            "training": {"seq_len": 1024, "global_batch": gpus, "micro_batch": 1}}


def wiring(segment):
    """(NVSwitch, leaf) index of every GPU in the graph the simulator builds."""
    graph = build_topology(scenario_from_dict(gb200(segment))).graph
    out = []
    for g in range(GPUS):
        (nvsw,) = [n[1] for n in graph.neighbors(("gpu", g)) if n[0] == "nvsw"]
        (leaf,) = [n[1] for n in graph.neighbors(("nic", g)) if n[0] == "leaf"]
        out.append((nvsw, leaf))
    return out


@pytest.mark.parametrize("segment", [None, 16, 8])
def test_each_segment_sits_in_its_own_domain_and_unit(segment):
    # Packed: 72 GPUs (18 trays, one rack = one scalable unit) a domain, the 8th rack holding
    # the last 512 - 7 x 72 = 8 GPUs. Segmented: nodes n of segment n // segment in rack
    # n // segment, so GPU g in rack g // (4 segment); the rack's leaves serve only those nodes.
    rack_gpus = 72 if segment is None else PER * segment
    expected = [(g // rack_gpus, g // rack_gpus) for g in range(GPUS)]
    assert wiring(segment) == expected
    if segment == 16:  # where the two placements part: GPUs 64-71 leave rack 0, 136-143 rack 1 ...
        assert expected[64] == (1, 1) and expected[71] == (1, 1) and expected[72] == (1, 1)
        assert wiring(None)[64] == (0, 0) and wiring(None)[72] == (1, 1)
        assert len({d for d, _ in expected}) == 8


def test_segmented_512_gpu_gb200_row_folds_to_one_rank_a_stage():
    """nb_gb200_l405b_512g_fp8: tp 4 x cp 2 x dp 8 = 64 GPUs a stage, pp 8 (Megatron-Core's order
    tp, cp, dp, pp): stage s on GPUs 64 s .. 64 s + 63, exactly segment s's rack, so every pipeline
    send leaves the rack and no replica differs from another; packed, the 72-GPU racks' edges
    fall inside stages at every 8th GPU, one dp replica's, so each replica crosses at its own
    stages: dp = 8 classes a stage, 64 ranks."""
    row = next(r for r in load_rows() if r.id == "nb_gb200_l405b_512g_fp8")
    assert row.scenario["cluster"]["segment"] == 16  # 128 nodes: the largest divisor <= 18
    segmented = scenario_from_dict(row.scenario)
    packed = copy.deepcopy(row.scenario)
    del packed["cluster"]["segment"]
    assert fold_reasons(segmented) == {"stage": 8}
    assert census.simulated_ranks(segmented) == 8
    assert census.simulated_ranks(scenario_from_dict(packed)) == 64


CLI_BAD = [
    (["cluster.segment=2"], "cluster.segment"),  # dgx-h100: an NVLink domain of one node
    (["cluster.topology='gb200-nvl72'", "cluster.gpus=128", "parallel.dp=128", "training.global_batch=128",
      "cluster.segment=19"], "cluster.segment"),  # 19 x 4 = 76 GPUs > the rack's 72
    (["cluster.topology='gb200-nvl72'", "cluster.gpus=128", "parallel.dp=128", "training.global_batch=128",
      "cluster.segment=12"], "cluster.segment"),  # 32 nodes are not whole segments of 12
    (["cluster.topology='gb200-nvl72'", "cluster.gpus=128", "parallel.dp=128", "training.global_batch=128",
      "cluster.segment=0"], "cluster.segment"),  # not a count
]


def test_bad_segments_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\npreset = "llama3-8b"\n[training]\nseq_len = 1024\nglobal_batch = 64\n'
                    'micro_batch = 1\n[cluster]\ntopology = "dgx-h100"\ngpus = 64\n[parallel]\ndp = 64\n')
    assert_refusals(path, CLI_BAD)


def test_segment_sets_the_domain_and_unit_sizes():
    s = scenario_from_dict(gb200(16, 128))
    assert (s.cluster.segment, build_topology(s).spec.gpus_per_domain, build_topology(s).spec.nodes_per_su) == (16, 64, 16)


def test_a_segment_is_refused_on_a_shared_fabric_and_read_by_the_studies(tmp_path):
    """A shared fabric places each job with --placement, so a job's segment would do nothing
    there: refused naming the key. The studies' hardware summary sees the segment's domain."""
    from conftest import assert_input_error, clustersim
    from sim.studies.base import hardware
    body = ('[model]\npreset = "llama3-8b"\n[training]\nseq_len = 1024\nglobal_batch = 128\nmicro_batch = 1\n'
            '[cluster]\ntopology = "gb200-nvl72"\ngpus = 128\nsegment = 16\n[parallel]\ndp = 128\n')
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text('name = "a"\n' + body)
    b.write_text('name = "b"\n' + body)
    assert_input_error(clustersim("run", str(a), str(b), "--shared-fabric"), "cluster.segment")
    assert hardware(a, {}).domain == 64
    assert hardware(a, {"cluster.segment": 8}).domain == 32
