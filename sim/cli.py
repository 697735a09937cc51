"""The ``clustersim`` command line (CONTRACT.md).

Each subcommand lives in the module that owns it, which exposes ``add_parser(subparsers)``
and ``run(args) -> int``. Invalid input exits 2 with one line naming the key and the
reason; an internal error exits 1.
"""

import argparse
import importlib
import os
import sys
import traceback

from .errors import InputError

COMMANDS = ("sim.commands.run", "sim.commands.collective", "sim.commands.validate",
            "sim.commands.sweep", "sim.commands.plot", "sim.commands.study", "sim.commands.rl",
            "sim.labs.numerics", "sim.labs.routing", "sim.commands.campaign")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"clustersim: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand that is installed."""
    parser = _Parser(prog="clustersim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, dispatch, map errors to exit codes."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"clustersim {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("clustersim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal error: say so, keep the traceback for debugging
        if os.environ.get("CLUSTERSIM_DEBUG"):
            traceback.print_exc()
        print(f"clustersim {args.command}: internal error: {type(exc).__name__}: {exc} "
              "(set CLUSTERSIM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
