"""Library objects from a script's flags (tuning options, the database), and the checks of those flags."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from .running import check_positive, check_seed


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
