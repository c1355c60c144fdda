"""The ``ansor`` command: one subcommand per job, each with its own ``--help``.

``ansor tune-op``, ``tune``, ``evaluate``, ``export``, ``export-kernels``, ``train-model``, ``plot`` and
``bench``; ``python -m ansor`` is the same. The scripts under ``scripts/`` (``tune_test.py``,
``tune_network.py``, ...) run the same subcommands under their old names.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Optional, Sequence

from ..arguments import EXIT_BAD_INPUT, ArgumentParser
from .commands import COMMANDS

DESCRIPTION = """An Ansor-style auto-scheduler for tensor programs on Apache TVM.

Quick start:
  ansor tune --onnx model.onnx --minutes 10 --export deploy/     # tune a model, write a deployable build
  ansor tune-op --wkl matmul-512 --n-trials 64                   # tune one operator

Exit status of every command: 0 done, 1 failed (e.g. a wrong result), 2 bad input, 130 interrupted.
Run "ansor COMMAND --help" for a command's flags.
"""


def _description(command: ModuleType) -> str:
    describe = getattr(command, "description", None)
    text = describe() if describe else (command.__doc__ or command.SUMMARY)
    return text.replace("``", "")  # the docstrings' reST literals read as plain text in a terminal


def add_command(parser: ArgumentParser, command: ModuleType) -> None:
    """Give ``parser`` the command's flags and remember how to execute it."""
    command.add_arguments(parser)
    parser.set_defaults(execute=command.execute)


def build_parser(prog: str = "ansor") -> ArgumentParser:
    """The top-level parser with every subcommand."""
    from ..version import __version__
    parser = ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"ansor {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=ArgumentParser)
    for command in COMMANDS:
        add_command(sub.add_parser(command.NAME, help=command.SUMMARY, description=_description(command)), command)
    return parser


def command_parser(name: str, prog: str) -> ArgumentParser:
    """The parser of one subcommand, standing alone under another name (the scripts' spelling)."""
    command = next(c for c in COMMANDS if c.NAME == name)
    parser = ArgumentParser(prog=prog, description=_description(command))
    add_command(parser, command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``ansor [COMMAND] [FLAGS]``; returns the exit status (also of ``--help`` and of bad flags)."""
    return _execute(build_parser(), argv)


def run_script(name: str, prog: str, argv: Optional[Sequence[str]] = None) -> int:
    """A script under ``scripts/``: the subcommand ``name`` with the script's name in messages."""
    return _execute(command_parser(name, prog), argv)


def _execute(parser: ArgumentParser, argv: Optional[Sequence[str]]) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, or a bad flag (already reported on one line)
        return done.code if isinstance(done.code, int) else EXIT_BAD_INPUT
    if not hasattr(args, "execute"):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    return args.execute(args)


if __name__ == "__main__":
    sys.exit(main())
