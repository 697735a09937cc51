"""``clustersim calibrate INPUT... [--topology T] [--gpu G] [--scenario S ...] --out PROFILE.toml [--json]``
and ``clustersim calibrate --check PROFILE.toml``; also the ``--calibration PROFILE.toml`` flag
that run, collective, plan, sweep, campaign and validate share.

Example: ``clustersim calibrate examples/calibration/gb200-nvl72-1rack_all_reduce_perf.txt --topology gb200-nvl72
--out gb200.toml`` (docs/calibrate.md).
"""

import json
from pathlib import Path

from ..errors import InputError
from ..hardware import calibration


def add_calibration_flag(p) -> None:
    """The ``--calibration PROFILE.toml`` flag of the commands that simulate."""
    p.add_argument("--calibration", metavar="PROFILE.toml", default=None,
                   help="a calibration profile written by `clustersim calibrate` (overrides cluster.calibration)")


def calibration_path(args) -> str | None:
    """``--calibration`` checked (the file is read once here: a bad one is exit 2 naming the
    flag) and made absolute, or None."""
    if not getattr(args, "calibration", None):
        return None
    calibration.load(args.calibration, "--calibration")
    return str(Path(args.calibration).resolve())


def calibration_overrides(args) -> list[str]:
    """``--set`` items with ``cluster.calibration`` from ``--calibration`` appended."""
    path = calibration_path(args)
    return list(args.overrides) + ([f"cluster.calibration={json.dumps(path)}"] if path else [])


def calibration_profile(args):
    """The profile ``--calibration`` names, read (or None)."""
    return calibration.load(args.calibration, "--calibration") if getattr(args, "calibration", None) else None


def add_parser(sub) -> None:
    """Register the subcommand."""
    p = sub.add_parser("calibrate", help="fit a calibration profile to nccl-tests tables, training logs and "
                                         "PyTorch profiler traces of your own cluster")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="nccl-tests/rccl-tests output (.txt), training logs (with --scenario), Kineto traces (.json[.gz])")
    p.add_argument("--topology", default=None, help="topology the fit starts from (default: the scenario's, or dgx-h100)")
    p.add_argument("--gpu", default=None, help="GPU preset (default: the scenario's, or the topology's)")
    p.add_argument("--scenario", action="append", default=[], metavar="S",
                   help="the scenario that produced a log or trace, in the order of those inputs (repeatable; "
                        "one scenario serves every log and trace)")
    p.add_argument("--out", default=None, metavar="PROFILE.toml", help="where to write the profile")
    p.add_argument("--check", metavar="PROFILE.toml", default=None,
                   help="re-run the inputs a profile was fitted on against it, and report the residuals")
    p.add_argument("--picture", metavar="PNG", default=None,
                   help="with traces: draw traced vs simulated compute, exposed communication and idle")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    """Fit (or check) and report."""
    from ..calibrate import check_profile, fit_profile
    from ..calibrate.report import print_report

    if args.check:
        if args.inputs or args.out:
            raise InputError("--check", "takes only the profile: its inputs are the ones it records")
        report = check_profile(args.check)
    else:
        if not args.inputs:
            raise InputError("INPUT", "give at least one nccl-tests table, training log or trace")
        if not args.out:
            raise InputError("--out", "required: the profile file to write (.toml)")
        report = fit_profile(args.inputs, args.topology, args.gpu, args.scenario, args.out, args.picture)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print_report(report)
    return 0
