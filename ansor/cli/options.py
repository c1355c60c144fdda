"""Library objects from a script's flags (tuning options, the database), and the checks of those flags."""

from __future__ import annotations

import argparse
import os
from typing import Callable, Optional, Sequence

from .running import OpenLog, check_positive, check_seed, run_main


def run_tuning_main(run: Callable[[argparse.Namespace, OpenLog], int], args: argparse.Namespace) -> int:
    """:func:`~ansor.cli.running.run_main` for a script that tunes into a log: the flags every tuning script
    has are checked first, and ``run`` sets ``log.path`` while it appends, so Ctrl-C can name the log."""
    log = OpenLog()

    def checked(a: argparse.Namespace) -> int:
        check_tuning_flags(a)
        return run(a, log)

    return run_main(checked, args, log)


def check_tuning_flags(args: argparse.Namespace) -> None:
    """One-line errors for the flags every tuning script has: budget, round size, memory cap, seed."""
    check_positive("--n-trials", args.n_trials, "64")
    check_positive("--per-round", args.per_round, "16")
    check_positive("--build-memory-gib", args.build_memory_gib, "8")
    check_seed(args.seed)


def tuning_options(args: argparse.Namespace, callbacks: Sequence = ()):
    """The :class:`~ansor.tuning.TuningOptions` of a tuning script's flags (timing: the library default).

    ``--load-model`` wins over ``--cost-model``; ``callbacks`` see every result as it arrives.
    """
    from ..tuning import TuningOptions
    model = args.cost_model
    if args.load_model:
        from ..cost_model import load_model
        model = load_model(args.load_model)
    from ..tuning import BuilderOptions
    return TuningOptions(num_measure_trials=args.n_trials, num_measures_per_round=args.per_round,
                         early_stopping=getattr(args, "early_stopping", None), seed=args.seed,
                         measure_callbacks=list(callbacks), ray_address=args.ray_address, cost_model=model,
                         builder=BuilderOptions(memory_gib=getattr(args, "build_memory_gib", None)))


def open_database(path: Optional[str]):
    """The :class:`~ansor.database.Database` of ``--database DIR``, or ``None``."""
    if not path:
        return None
    from ..database import Database
    return Database(path)


def add_ray_address_arg(parser: argparse.ArgumentParser) -> None:
    """``--ray-address`` of the tuning scripts."""
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"),
                        help="join this Ray cluster instead of starting a local one (default: $RAY_ADDRESS, "
                             "else a local Ray listening on 127.0.0.1 only). Joining trusts the cluster: "
                             "candidates and their inputs go to its nodes, and anyone who can reach its ports "
                             "can run code as its user unless it was started with token authentication")


def add_build_memory_arg(parser: argparse.ArgumentParser) -> None:
    """``--build-memory-gib`` of the tuning scripts."""
    parser.add_argument("--build-memory-gib", type=float, default=None, metavar="G",
                        help="memory cap of each build worker in GiB; a build that needs more fails "
                             "(default: 3/4 of a node's memory / its CPUs, at least 2)")
