"""Studies: bundled scenarios swept and analysed to answer the seeds' questions.

Run ``clustersim study fsdp-crossover`` (or ``--quick`` for fewer points); each study
writes ``out/study-NAME.png``, its table ``out/study-NAME.csv`` and a per-curve
summary ``out/study-NAME-summary.csv`` (``--out-dir plots`` regenerates the shipped ones), and
prints both tables.

A study is a module with ``TITLE``, ``points(quick)`` (labelled override dicts swept over
``sim/studies/scenarios/NAME.toml``), ``analyze(rows)`` and ``plot(table, summary, path)``;
:func:`sim.studies.base.run_study` drives them.
"""

# study name -> its module in this room; the capabilities register their own studies in
# their rooms (``sim.campaign.STUDIES``, ``sim.rl.STUDIES``) and the command line
# (:mod:`sim.commands.study`) assembles them all
STUDIES: dict[str, str] = {
    "fsdp-crossover": "fsdp_crossover",
    "domain-size": "domain_size",
    "batch-floor": "batch_floor",
    "pipeline-bubbles": "pipeline_bubbles",
}

