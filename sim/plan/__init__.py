"""The layout planner (``clustersim plan``): every parallel layout of a model on a cluster,
checked by the loader's rules and the memory rule, ranked by a fast analytic estimate,
the best simulated in full, the winner explained. See docs/plan.md.

Modules, in the order a search uses them: :mod:`.inputs` (what to plan), :mod:`.space`
(the layouts), :mod:`.rules` and :mod:`.fit` (which are valid, why not), :mod:`.stages`
(per-stage facts from the simulator's own code), :mod:`.layers`, :mod:`.comm` and
:mod:`.estimate` (the fast estimate), :mod:`.cost` and :mod:`.select` (which to
simulate), :mod:`.explain` (what limits a layout), :mod:`.rank` (the table),
:mod:`.driver` (the search), :mod:`.report` (output).
"""

from .inputs import request
from .driver import Plan, search

__all__ = ["request", "search", "Plan"]
