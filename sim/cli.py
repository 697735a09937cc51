"""The ``clustersim`` command line (CONTRACT.md).

Each subcommand lives in the module that owns it, which exposes ``add_parser(subparsers)``
and ``run(args) -> int``. Invalid input exits 2 with one line naming the key and the
reason; an internal error exits 1; ``clustersim`` alone prints the usage and the
subcommands and exits 2.
"""

import argparse
import importlib
import os
import re
import sys
import traceback

from .errors import InputError
from .version import __version__

COMMANDS = ("sim.commands.run", "sim.commands.collective", "sim.commands.validate",
            "sim.commands.sweep", "sim.commands.plot", "sim.commands.study", "sim.commands.rl",
            "sim.labs.numerics", "sim.labs.routing", "sim.commands.campaign", "sim.commands.plan",
            "sim.commands.calibrate")
DESCRIPTION = ("clustersim simulates GPU clusters training large language models: step time, MFU, "
               "exposed communication, memory per GPU and timelines of a model x training x cluster x "
               "parallel layout described in TOML.")
EPILOG = ("Start with: clustersim run llama3-8b-fsdp-h100 (a bundled example), or clustersim run "
          "SCENARIO.toml. 'clustersim COMMAND -h' explains a command. Bad input exits 2 with one line "
          "naming the key and the reason.")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"clustersim: error: {message}\n")


def plain(text: str) -> str:
    """reStructuredText markup a docstring may carry, as plain text for ``--help``:
    ``x`` -> x, :mod:`sim.x` -> sim.x, `x` -> x.

    >>> plain("The ``clustersim`` CLI, see :mod:`sim.cli` and `CONTRACT`.")
    'The clustersim CLI, see sim.cli and CONTRACT.'
    """
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand that is installed."""
    parser = _Parser(prog="clustersim", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    for action in sub._choices_actions:  # `clustersim COMMAND -h` opens with what the command does
        command = sub.choices[action.dest]
        action.help = plain(action.help or "")
        command.description = plain(command.description or action.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse, dispatch, map errors to exit codes."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # no subcommand: say what there is, exit 2 as for any usage error
        parser.print_help(sys.stderr)
        return 2
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
