"""How every script runs: logging, exit statuses, one ``error:`` line for bad input, Ctrl-C, flag checks.

Bad input raises :class:`~ansor.errors.AnsorError`; :func:`run_main` turns it into one line ``error: ...``
on stderr and exit status 2 (1 for an error that is not the input's, such as Ray dying mid-run: the
exception's ``exit_code``), and Ctrl-C into a short message and exit status 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Optional

from ..errors import AnsorError, short_message
from ..arguments import EXIT_BAD_INPUT, check_environment

#: Exit statuses of every script.
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")


class OpenLog:
    """The log a tuning run is appending to: after Ctrl-C the message names it, for ``--resume``."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None

    def interrupted(self) -> str:
        if self.path is None:
            return "interrupted"
        return f"interrupted: finished measurements are in {self.path}; rerun with --resume"


def run_main(run: Callable[[argparse.Namespace], int], args: argparse.Namespace,
             log: Optional[OpenLog] = None) -> int:
    """Set up logging (``args.verbose``), check the environment, then call ``run(args)``: bad input
    (:class:`AnsorError`) -> ``error: ...`` and 2, Ctrl-C -> 130 (naming ``log``'s file if one is open)."""
    setup_logging(getattr(args, "verbose", False))
    try:
        check_environment()
        return run(args)
    except AnsorError as err:
        print(f"error: {short_message(err, None, pick='joined')}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        print(f"\n{log.interrupted() if log else 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED


def run_tuning_main(run: Callable[[argparse.Namespace, OpenLog], int], args: argparse.Namespace) -> int:
    """:func:`run_main` for a command that tunes into a log: ``run`` sets ``log.path`` while it appends,
    so Ctrl-C can name the log."""
    log = OpenLog()
    return run_main(lambda a: run(a, log), args, log)
