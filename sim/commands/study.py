"""``clustersim study NAME [--out-dir DIR] [--quick] [--workers N] [--dask ADDR]``.

Example: ``clustersim study fsdp-crossover --quick``: sweeps the study's bundled scenario
(sim/studies/scenarios/NAME.toml, shipped with the package), prints its table, summary and findings, and writes
``out/study-NAME.png``, ``out/study-NAME.csv`` and ``out/study-NAME-summary.csv``. The default folder
``out/`` is not tracked; ``--out-dir plots`` replaces the figures the repository ships (do that only
with a full run, never ``--quick``).
"""

import importlib
from pathlib import Path

from .. import campaign, rl, studies
from ..errors import InputError

DEFAULT_OUT = "out"  # untracked (.gitignore); the shipped figures live in plots/
ROOMS = (studies, campaign, rl)  # each registers its studies: ``STUDIES``, name -> its module there


def registry(rooms=ROOMS) -> dict[str, str]:
    """Every study: name -> the module that defines it (imported only when it runs)."""
    out: dict[str, str] = {}
    for room in rooms:
        for name, module in room.STUDIES.items():
            if name in out:
                raise ValueError(f"duplicate study {name}: {out[name]} and {room.__name__}.{module}")
            out[name] = f"{room.__name__}.{module}"
    return out


STUDIES = registry()


def get(name: str):
    """The module of study ``name``, or InputError listing the known ones."""
    if name not in STUDIES:
        raise InputError("study", f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return importlib.import_module(STUDIES[name])


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("study", help="run a bundled study (sweep + table + plot) answering a seed question")
    p.add_argument("name", choices=sorted(STUDIES), help="which study")
    p.add_argument("--out-dir", default=DEFAULT_OUT,
                   help=f"where the PNG and CSVs go (default: {DEFAULT_OUT}/; --out-dir plots replaces the shipped "
                        "figures)")
    p.add_argument("--quick", action="store_true", help="fewer points (well under a minute)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--dask", metavar="ADDR", help="run the sweep on a dask.distributed scheduler")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the study and print what it found."""
    from ..studies.base import run_study

    from ..sweeps.pool import check_workers

    check_workers(args.workers)
    module = get(args.name)
    report = run_study(args.name, module, Path(args.out_dir), args.quick, args.workers, args.dask, args.quiet)
    print(f"# {report.title}{' (quick)' if args.quick else ''}\n")
    print(module.report_text(report.table, report.summary))
    print()
    for line in report.notes:
        print(f"- {line}")
    print()
    for what, path in report.paths.items():
        print(f"wrote {what}: {path}")
    return 0
