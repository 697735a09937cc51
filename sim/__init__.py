"""clustersim: a discrete-event simulator of GPU clusters training large language models.

Data flows one way: scenario -> rank programs -> engine -> spans -> metrics / plots.

>>> import sim
>>> result = sim.simulate(sim.load_scenario("scenarios/llama3-8b-fsdp-h100.toml"))  # doctest: +SKIP
>>> result.summary["mfu"]  # doctest: +SKIP
"""

from .input.load import load_scenario
from .version import __version__

__all__ = ["__version__", "load_scenario", "simulate", "simulate_rl", "sweep"]


def simulate(scenario, **kwargs):
    """Simulate one optimizer step of ``scenario``; returns a :class:`sim.outputs.result.Result`
    (keywords as :func:`sim.step.simulate`)."""
    from .step import simulate as _simulate

    return _simulate(scenario, **kwargs)


def simulate_rl(scenario, **kwargs):
    """Run the RL loop of a scenario with an ``[rl]`` section; returns a
    :class:`sim.rl.run.RLResult` (``.summary``: the JSON of ``clustersim rl``)."""
    from .rl.run import simulate_rl as _simulate_rl

    return _simulate_rl(scenario, **kwargs)


def sweep(scenario, grid, **kwargs):
    """Run a grid of overrides; returns a pandas DataFrame (see :mod:`sim.sweeps.grid`)."""
    from .sweeps.grid import sweep as _sweep

    return _sweep(scenario, grid, **kwargs)
