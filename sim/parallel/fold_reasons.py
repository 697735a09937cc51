"""Why a scenario's stages are simulated by more than one rank each: the census of folding's
reasons (stage alone, stragglers, faults, each group type's placement column). Read by
``python bench/fold_census.py`` and docs/scaling.md, "What the slowest rows simulate more than
once"; the count itself is :func:`sim.parallel.census.simulated_ranks`.

Run: ``python -m pytest tests/test_folding_domains.py tests/test_segment.py``
"""

import numpy as np

from ..hardware.rails import placement
from ..input.load import topology_spec
from . import folding as fo, workload
from .census import simulated_ranks, uneven_routing
from .layout import Layout


def fold_reasons(s) -> dict[str, int]:
    """Why a stage's ranks are simulated more than once: the ranks simulated (classes refined
    and closed as :func:`sim.parallel.folding.fold` does) with the stage and expert position
    alone (``"stage"``), and with each other source of difference the labels read added on its
    own: ``"stragglers"``, ``"faults"``, and ``"TYPE.COLUMN"`` for a group type whose groups
    differ in which members share a placement column (``domain``, ``server``, ``unit``, ``rail``:
    :func:`sim.hardware.rails.placement`). Only sources that add ranks are listed, e.g.
    ``{"stage": 8, "pp.domain": 32, ...}``: pipelines that cross NVLink domains at different
    stages (docs/scaling.md, "What the slowest rows simulate more than once"). Where the
    workload does not fold the classes (:func:`workload.can_fold`: ``parallel.fold`` off, jitter,
    a perturbed step on another fabric) ``"unfolded"`` gives the ranks it simulates instead."""
    layout = Layout.from_parallel(s.parallel)
    spec, world = topology_spec(s), layout.world
    domains = np.arange(world) // spec.gpus_per_domain  # (as simulated_ranks)
    tables = fo.group_tables(layout)

    positions = fo.positions(tables, world, uneven_routing(s, layout))

    def ranks(extra: list) -> int:
        classes = fo.refine(fo.dense(positions + extra), tables)
        return int(fo.closure(classes, tables).sum())

    out = {"stage": ranks([])}
    if not workload.can_fold(s, spec):
        out["unfolded"] = simulated_ranks(s)  # (sampled jitter: its replicas, sim.parallel.jitter)
    for name, codes in (("stragglers", fo.scale_codes(s, world, spec.gpus_per_node)),
                        ("faults", fo.link_codes(s, tables, world, spec, domains))):
        if codes.any():
            out[name] = ranks([codes])
    where = placement(spec, domains, world)
    for t in fo.distinct(tables):
        for k, column in enumerate(PLACEMENT):
            n = ranks([fo.shape_ids(t, where[:, [k]])[t.row_of]])
            if n > out["stage"]:
                out[f"{t.name}.{column}"] = n
    return out


PLACEMENT = ("domain", "server", "unit", "rail")  # the columns of sim.hardware.rails.placement, in order
