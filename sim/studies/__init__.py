"""Studies: bundled scenarios swept and analysed to answer the seeds' questions.

Run ``clustersim study fsdp-crossover`` (or ``--quick`` for fewer points); each study
writes ``plots/study-NAME.png``, its table ``plots/study-NAME.csv`` and a per-curve
summary ``plots/study-NAME-summary.csv``, and prints both tables.

A study is a module with ``TITLE``, ``points(quick)`` (labelled override dicts swept over
``sim/studies/scenarios/NAME.toml``), ``analyze(rows)`` and ``plot(table, summary, path)``;
:func:`sim.studies.base.run_study` drives them.
"""

import importlib

from ..errors import InputError

STUDIES: dict[str, str] = {}


def _register(name: str, module: str) -> None:
    if name in STUDIES:
        raise ValueError(f"duplicate study {name}")
    STUDIES[name] = module


_register("fsdp-crossover", "sim.studies.fsdp_crossover")
_register("domain-size", "sim.studies.domain_size")
_register("batch-floor", "sim.studies.batch_floor")
_register("pipeline-bubbles", "sim.studies.pipeline_bubbles")
_register("goodput-vs-scale", "sim.campaign.study")  # a capability's study: imported by name only
_register("rl-stragglers", "sim.rl.study")  # whole RL runs, not steps: the module drives its points


def get(name: str):
    """The module of study ``name``, or InputError listing the known ones."""
    if name not in STUDIES:
        raise InputError("study", f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return importlib.import_module(STUDIES[name])
