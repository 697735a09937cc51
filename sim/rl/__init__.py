"""The RL loop: generator engines and a trainer pool on one cluster, with response-length
stragglers and in-flight weight updates (``clustersim rl SCENARIO``; docs/rl.md).

``sim.rl.run.simulate_rl(scenario) -> RLResult`` runs it (also ``sim.simulate_rl``). The
modules, bottom up: ``lengths`` (responses), ``inference`` (an engine's step costs),
``trainer`` (the training step of the trainer pool), ``transfer`` (weights over the fabric),
``loop`` (the SimPy simulation), ``summary`` and ``exports`` (what it measured, timelines),
``run`` (wiring), ``study`` (``clustersim study rl-stragglers``), ``validation`` (the decode
model against published vLLM runs).
"""

STUDIES = {"rl-stragglers": "study"}  # study name -> its module here (sim.commands.study)
