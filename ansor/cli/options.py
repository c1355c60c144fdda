"""Library objects from a script's flags (tuning options, the database), and the checks of those flags."""

from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from ..arguments import MEMORY_GIB, PROBE_PROCESSES, ray_address_type
from ..task.timing import POOL_PROBE_PROCESSES


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
                         pretrained=not getattr(args, "no_pretrained", False),
                         builder=BuilderOptions(memory_gib=getattr(args, "build_memory_gib", None)))


def open_database(path: Optional[str]):
    """The :class:`~ansor.log.database.Database` of ``--database DIR``, or ``None``."""
    if not path:
        return None
    from ..log.database import Database
    return Database(path)


def add_ray_address_arg(parser: argparse.ArgumentParser) -> None:
    """``--ray-address`` of the tuning scripts."""
    parser.add_argument("--ray-address", default=None, type=ray_address_type,
                        help="join this Ray cluster instead of starting a local one (default: $RAY_ADDRESS, "
                             "else a local Ray listening on 127.0.0.1 only). Joining trusts the cluster: "
                             "candidates and their inputs go to its nodes, and anyone who can reach its ports "
                             "can run code as its user unless it was started with token authentication")


def add_pool_probe_arg(parser: argparse.ArgumentParser, when: str) -> None:
    """``--no-pool-probe`` of the commands that export a tuned network (``when``: the flag it goes with)."""
    parser.add_argument("--no-pool-probe", dest="pool_probe", action="store_false",
                        help=f"{when}do not time the tuned build under each TVM thread-pool setting "
                             "(thread binding, spinning) in fresh processes to name the fastest in the export "
                             "(the probe takes ~10 s per setting on 2 cores)")
    parser.add_argument("--pool-probe-processes", type=PROBE_PROCESSES, default=POOL_PROBE_PROCESSES, metavar="N",
                        help=f"{when}fresh processes per setting the probe times the build in (default "
                             f"{POOL_PROBE_PROCESSES}: one process's time varies with where its threads land; more "
                             "on a noisy machine)")


def add_build_memory_arg(parser: argparse.ArgumentParser) -> None:
    """``--build-memory-gib`` of the tuning scripts."""
    parser.add_argument("--build-memory-gib", type=MEMORY_GIB, default=None, metavar="G",
                        help="memory cap of each build worker in GiB; a build that needs more fails "
                             "(default: 3/4 of a node's memory / its CPUs, at least 2)")


def network_precision(args: argparse.Namespace, target, log: Optional[os.PathLike] = None):
    """The :class:`~ansor.task.precision.Precision` of ``--precision`` (or of ``log``'s name), checked
    against the target: bf16 on a target without the bf16 dot product is one error line."""
    from ..task.precision import Precision
    from .logs import precision_from_log_name
    from ..sketch.tensor_rules import require_bf16_unit
    text = args.precision or (precision_from_log_name(log) if log is not None else "fp32")
    precision = Precision(text)
    if precision.bf16:
        require_bf16_unit(target)
    return precision
