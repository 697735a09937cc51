"""The network's max-min solve per connected component against one joint solve, on one of
``bench/step.py``'s cases: CPU seconds of ``sim.simulate`` each way (in one process, the
component solve first), the solver's counters, and whether the summary (without the
engine's own cost) and the spans table hash the same.

Run: ``python bench/components.py CASE [KEY=VALUE ...]`` (``--joint-first``: time the joint
solve first, to see what warm caches are worth to the second run), e.g.
``python bench/components.py qwen training.global_batch=128`` (docs/scaling.md's table).
"""

import hashlib
import json
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim  # noqa: E402
import step as bench_step  # noqa: E402
from sim.engine import maxmin, network  # noqa: E402
from sim.input.load import scenario_from_dict  # noqa: E402

UNSTABLE = ("sim_wall_s", "sim_events")


def load(name: str, overrides: list[str]):
    """The case's scenario with its own overrides and extra sections, then ``overrides``."""
    _label, scenario, own, extra = bench_step.CASES[name]
    data = json.loads(json.dumps(scenario)) if isinstance(scenario, dict) else tomllib.loads(Path(scenario).read_text())
    for section, value in (extra or {}).items():
        data[section] = {**data.get(section, {}), **value} if isinstance(value, dict) else value
    return scenario_from_dict(data, list(own) + overrides)


def timed(s, networks: list) -> tuple[str, str, float]:
    """(summary hash, spans hash, CPU seconds) of one simulation."""
    t0 = time.process_time()
    r = sim.simulate(s, force=True)
    cpu = time.process_time() - t0
    summary = {k: v for k, v in r.summary.items() if k not in UNSTABLE}
    return (hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16],
            hashlib.sha256(r.spans.to_csv(index=False).encode()).hexdigest()[:16], cpu)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--joint-first"]
    name, overrides = args[0], args[1:]
    networks: list = []
    init = network.Network.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        networks.append(self)

    network.Network.__init__ = recording
    s = load(name, overrides)
    solve = maxmin.ComponentRates.solve
    if "--joint-first" in sys.argv:
        maxmin.ComponentRates.solve = lambda self, sets, keys, joint: joint(list(range(len(sets))))
        print(f"joint only (first): {timed(s, networks)[2]:.2f} s CPU")
        maxmin.ComponentRates.solve = solve
        networks.clear()
    new = timed(s, networks)
    solves = sum(n.joint_solves for n in networks)
    comps = [n.components for n in networks]
    print(f"per component: {new[2]:.2f} s CPU; {solves:,} joint solves; components solved "
          f"{sum(c.solves for c in comps):,}, found {sum(c.hits for c in comps):,}, "
          f"joint fallbacks {sum(c.joint_fallbacks for c in comps):,}")
    maxmin.ComponentRates.solve = lambda self, sets, keys, joint: joint(list(range(len(sets))))
    old = timed(s, networks)
    print(f"joint only: {old[2]:.2f} s CPU; results {'identical' if old[:2] == new[:2] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
