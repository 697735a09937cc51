"""clustersim: a discrete-event simulator of GPU clusters training large language models.

Data flows one way: scenario -> rank programs -> engine -> spans -> metrics / plots.

>>> import sim
>>> result = sim.simulate(sim.load_scenario("scenarios/llama3-8b-fsdp-h100.toml"))  # doctest: +SKIP
>>> result.summary["mfu"]  # doctest: +SKIP
"""

from .input.load import load_scenario
from .version import __version__

__all__ = ["__version__", "load_scenario", "simulate", "sweep"]


def simulate(scenario, **kwargs):
    """Simulate one optimizer step of ``scenario``; returns a :class:`sim.outputs.result.Result`
    (keywords as :func:`sim.step.simulate`)."""
    from .step import simulate as _simulate

    return _simulate(scenario, **kwargs)


def sweep(scenario, grid, **kwargs):
    """Run a grid of overrides; returns a pandas DataFrame (see :mod:`sim.studies.sweeps`)."""
    from .studies.sweeps import sweep as _sweep

    return _sweep(scenario, grid, **kwargs)
