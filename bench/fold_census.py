"""Why validation rows simulate the ranks they do: the folding census of each row, no simulation.

Run: ``python bench/fold_census.py [ID[,ID...]] [--set K=V ...]``: for each row of
``clustersim validate`` (all rows without IDs), one JSON line: GPUs, the layout (tp pp v dp cp
ep), micro-batches per pipeline, the ranks simulated (:func:`sim.parallel.census.simulated_ranks`)
and what makes them more than one a stage (:func:`sim.parallel.fold_reasons.fold_reasons`: ``stage``
is the count without any placement or perturbation; ``pp.domain`` = pipelines that leave their
NVLink domain at different stages, ``pp.unit`` = ... their scalable unit). ``--set`` overrides the
row's scenario (e.g. ``cluster.topology_overrides.gpus_per_domain=64``).
"""

import json
import sys

from sim.input.load import parse_value, scenario_from_dict
from sim.parallel import census
from sim.parallel.fold_reasons import fold_reasons
from sim.studies.validation import load_rows


def main(argv: list[str]) -> None:
    ids = set(argv[0].split(",")) if argv and not argv[0].startswith("-") else None
    sets = [a.split("=", 1) for a, flag in zip(argv[1:], argv) if flag == "--set"]
    overrides = {k: parse_value(v) for k, v in sets} or None
    for row in load_rows():
        if ids is not None and row.id not in ids:
            continue
        s = scenario_from_dict(row.scenario, overrides)
        p = s.parallel
        print(json.dumps({"row": row.id, "gpus": s.cluster.gpus,
                          "tp_pp_v_dp_cp_ep": [p.tp, p.pp, p.virtual_stages, p.dp, p.cp, p.ep],
                          "micro_batches": census.micro_batches(s), "simulated": census.simulated_ranks(s),
                          "reasons": fold_reasons(s)}))


if __name__ == "__main__":
    main(sys.argv[1:])
