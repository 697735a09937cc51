"""Training campaigns: days, cost and goodput of a whole run with failures, checkpoints and
restarts, built on the step simulation.

Run ``clustersim campaign scenarios/llama3-405b-16k-h100.toml --tokens 15e12`` or
``clustersim study goodput-vs-scale``; docs/campaign.md has the model and the measured figures.

Modules: ``failures`` (the Llama 3 failure table and per-device rates), ``checkpoint`` (size
from the layout, cost over storage, Young/Daly), ``trials`` (the simulation, vectorised over
seeded trials), ``build`` (scenario + step time + options -> campaign), ``summary`` (the
JSON object and report), ``optimum`` and ``plots`` (ETTR vs interval, one run's progress),
``study`` (goodput vs scale).
"""

STUDIES = {"goodput-vs-scale": "study"}  # study name -> its module here (sim.commands.study)
