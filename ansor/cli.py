"""Helpers shared by the command-line scripts (``scripts/tune_test.py``, ``scripts/tune_network.py``,
``scripts/evaluate_networks.py``, ``scripts/plot_tuning_curve.py``).

They hold the conventions every script follows:

* bad input raises :class:`~ansor.errors.AnsorError`; :func:`run_main` turns it into one line
  ``error: ...`` on stderr and exit status 2 (1 for an error that is not the input's, such as Ray dying
  mid-run: the exception's ``exit_code``), and Ctrl-C into a short message and exit status 130;
* ``TVM_NUM_THREADS`` is set from the target's core count before the first kernel runs in the process
  (:func:`set_tvm_threads`);
* tuning goes through the library's API with its default measurement (:func:`tuning_options` turns the
  flags into :class:`~ansor.tuning.TuningOptions`);
* a network's log is called ``<network>-b<batch>.json``, so the network and batch of a log can be read back
  from its name (:func:`log_name`, :func:`network_from_log_name`).

Heavy modules (Ray, XGBoost, the networks) are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from .errors import AnsorError, RecordError

logger = logging.getLogger("ansor")

#: Exit statuses of every script.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

_LOG_NAME = re.compile(r"^(?P<network>.+)-b(?P<batch>\d+)$")


# --------------------------------------------------------------------------------------------- running
def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")


def run_main(run: Callable[[argparse.Namespace], int], args: argparse.Namespace,
             interrupted: Optional[Callable[[], str]] = None) -> int:
    """Call ``run(args)``: bad input (:class:`AnsorError`) -> ``error: ...`` and 2, Ctrl-C -> 130.

    ``interrupted`` returns the message printed after Ctrl-C (e.g. where the finished measurements are).
    """
    try:
        return run(args)
    except AnsorError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        message = interrupted() if interrupted else "interrupted"
        print(f"\n{message}", file=sys.stderr)
        return EXIT_INTERRUPTED


def one_line(text: str) -> str:
    """``text`` folded onto one line (TVM errors span many)."""
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip()) or "unknown error"


def check_positive(flag: str, value: Optional[float], example: str) -> None:
    """Raise a one-line :class:`AnsorError` unless ``value`` (when given) is positive."""
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise AnsorError(f"{flag} must be a positive number, got {value} (example: {flag} {example})")


#: Seeds go to Python's and NumPy's generators and to XGBoost, whose seed is a 32-bit integer.
MAX_SEED = 2 ** 31 - 1


def check_seed(seed: int) -> None:
    """Raise a one-line :class:`AnsorError` unless ``--seed`` is in 0..MAX_SEED."""
    if not 0 <= seed <= MAX_SEED:
        raise AnsorError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed} (example: --seed 0)")


# --------------------------------------------------------------------------------------------- targets
def set_tvm_threads(target) -> int:
    """Set ``TVM_NUM_THREADS`` to the target's core count unless the user set it; returns the count in force.

    TVM sizes its CPU thread pool once, from this variable, when the first kernel runs; Ray workers inherit
    the environment. Without it a 2-vCPU machine runs every kernel on one thread.
    """
    cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else 1
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    return int(os.environ["TVM_NUM_THREADS"])


def parse_target_and_threads(text: Optional[str], ray_address: Optional[str] = None):
    """:func:`~ansor.target.parse_target` then :func:`set_tvm_threads`; returns the target.

    A CUDA target given without ``arch`` gets the arch of a GPU of the Ray cluster (``ray_address``, else
    a local instance started just for the question); with no GPU there, TVM's default stays and
    measurement will say that no GPU can run the candidates.
    """
    from .target import is_gpu, parse_target
    target = parse_target(text)
    if is_gpu(target) and "arch" not in (text or ""):
        from .measure.ray_session import RaySession, cluster_cuda_arch
        session = RaySession.open(ray_address)
        try:
            arch = cluster_cuda_arch()
        finally:
            session.close()
        if arch:
            target = parse_target({**json.loads(str(target)), "arch": arch})
            logger.info("CUDA arch %s detected on the cluster's GPU", arch)
    set_tvm_threads(target)
    return target


def log_target(paths: Sequence[os.PathLike], keys: Optional[set[str]] = None) -> Optional[str]:
    """The target most records in ``paths`` were measured for (only records of ``keys`` if given)."""
    from .records import load_records
    counts = Counter(rec.task.target_str for rec in load_records(list(paths))
                     if keys is None or rec.workload_key in keys)
    return counts.most_common(1)[0][0] if counts else None


# ------------------------------------------------------------------------------------------------ logs
def check_log_file(log_file: Path, *, must_exist: bool = False, resume: bool = False) -> None:
    """One-line errors for a log that is a directory, unreadable, or (``must_exist``) missing."""
    if log_file.exists() and log_file.is_dir():
        raise RecordError(f"log {log_file} is a directory; give a file path (example: --log-file logs/mm.json)")
    if (resume or must_exist) and log_file.exists() and not os.access(log_file, os.R_OK):
        raise RecordError(f"cannot read log {log_file} (permission denied)")
    if must_exist and not log_file.exists():
        raise RecordError(f"log {log_file} does not exist")


def log_name(network: str, batch_size: int) -> str:
    """The default log file name of a network: ``<network>-b<batch>.json``."""
    return f"{network}-b{batch_size}.json"


def network_from_log_name(path: os.PathLike) -> Optional[tuple[str, int]]:
    """``(network, batch)`` from a log named ``<network>-b<batch>.json``, else ``None``."""
    match = _LOG_NAME.match(Path(path).stem)
    return (match["network"], int(match["batch"])) if match else None


# --------------------------------------------------------------------------------------------- measure
def tuning_options(args: argparse.Namespace, callbacks: Sequence = ()):
    """The :class:`~ansor.tuning.TuningOptions` of a tuning script's flags (timing: the library default).

    ``--load-model`` wins over ``--cost-model``; ``callbacks`` see every result as it arrives.
    """
    from .tuning import TuningOptions
    model = args.cost_model
    if args.load_model:
        from .cost_model import load_model
        model = load_model(args.load_model)
    from .tuning import BuilderOptions
    return TuningOptions(num_measure_trials=args.n_trials, num_measures_per_round=args.per_round,
                         early_stopping=getattr(args, "early_stopping", None), seed=args.seed,
                         measure_callbacks=list(callbacks), ray_address=args.ray_address, cost_model=model,
                         builder=BuilderOptions(memory_gib=getattr(args, "build_memory_gib", None)))


def open_database(path: Optional[str]):
    """The :class:`~ansor.database.Database` of ``--database DIR``, or ``None``."""
    if not path:
        return None
    from .database import Database
    return Database(path)


# -------------------------------------------------------------------------------------------- networks
def add_network_args(parser: argparse.ArgumentParser, *, for_logs: bool = False) -> None:
    """``--network``, ``--onnx`` and ``--batch-size``."""
    infer = " (default: read from the log's file name <network>-b<batch>.json)" if for_logs else ""
    parser.add_argument("--network", default=None, metavar="NAME",
                        help="built-in network: resnet-50, mobilenet-v2, resnet3d-18, bert, dcgan, tiny-cnn "
                             f"(an unknown name lists them){infer}")
    parser.add_argument("--onnx", default=None, metavar="FILE",
                        help="an ONNX model file instead of a built-in network (needs the onnx package)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B",
                        help="batch size (default 1; for --onnx: the model's own, symbolic dimensions "
                             f"taken as 1){infer}")


def load_network(name: Optional[str], onnx_path: Optional[str], batch_size: Optional[int]):
    """A :class:`~ansor.networks.Network` from ``--network`` or ``--onnx`` (exactly one of them)."""
    from .networks import NetworkError, get_network, load_onnx, network_names
    if name and onnx_path:
        raise NetworkError("give either --network or --onnx, not both")
    check_positive("--batch-size", batch_size, "1")
    if onnx_path:
        net = load_onnx(onnx_path)
        if batch_size is not None and net.inputs and net.inputs[0].shape and net.batch_size != batch_size:
            shapes = {s.name: (batch_size, *s.shape[1:]) for s in net.inputs if s.shape}
            net = load_onnx(onnx_path, shapes=shapes)
        return net
    if not name:
        raise NetworkError(f"give --network NAME (one of {', '.join(network_names())}) or --onnx FILE")
    return get_network(name, batch_size if batch_size is not None else 1)


def network_for_log(args: argparse.Namespace, log: os.PathLike):
    """The network a log was tuned for: from ``--network``/``--onnx``/``--batch-size``, else its file name."""
    from .networks import NetworkError
    inferred = network_from_log_name(log)
    if args.network or args.onnx:
        batch = args.batch_size
        if batch is None and inferred is not None and (args.onnx or inferred[0] == args.network):
            batch = inferred[1]
        return load_network(args.network, args.onnx, batch)
    if inferred is None:
        raise NetworkError(f"cannot tell the network of {log} from its name (expected <network>-b<batch>.json); "
                           "give --network NAME --batch-size B, or --onnx FILE")
    name, batch = inferred
    if args.batch_size is not None:
        batch = args.batch_size
    from .networks import network_names
    if name not in network_names():
        raise NetworkError(f"{log}: {name!r} (from the file name) is not a built-in network "
                           f"({', '.join(network_names())}); give --network NAME, or --onnx FILE")
    return load_network(name, None, batch)


# ---------------------------------------------------------------------------------------- evaluation
@dataclass
class NetworkEvaluation:
    """A network's default build vs its build with the best schedules of a log, on the same inputs."""

    default: "object"  # Timing
    tuned: "object"  # Timing
    comparison: "object"  # OutputComparison
    tuned_tasks: int
    n_tasks: int
    tuned_executable: "object" = None  # the tuned build, for --export

    @property
    def speedup(self) -> float:
        return self.default.mean_ms / self.tuned.mean_ms


def tuned_task_count(tasks, log: "os.PathLike | Sequence[os.PathLike]", target) -> int:
    """How many of ``tasks`` have a valid record in the log or logs (for ``target``)."""
    from .records import best_records, load_records
    best = best_records(load_records(log, target=target))
    return sum(1 for t in tasks if t.workload_key in best)


def evaluate_network(extraction, log: "os.PathLike | Sequence[os.PathLike]", target, repeat: int = 10,
                     min_repeat_ms: int = 200) -> NetworkEvaluation:
    """Build the default and the tuned network, compare their outputs, and time both.

    The default build gives every task the parallel + vectorized default schedule; the tuned build
    replaces each task that has a valid record in ``log`` (a log or a list of logs) by its best schedule.
    Timing runs in this process (``TVM_NUM_THREADS`` must already be set).
    """
    from .networks import apply_best, apply_history_best, build, compare_outputs, time_network
    tuned_mod = apply_history_best(extraction.mod, extraction.tasks, log, target=target)
    default_mod = apply_best(extraction.mod, extraction.tasks, {}, target=target)
    tuned_exe, default_exe = build(tuned_mod, target), build(default_mod, target)
    net = extraction.network
    comparison = compare_outputs(net, tuned_exe, default_exe, target)
    default = time_network(default_exe, net, target=target, repeat=repeat, min_repeat_ms=min_repeat_ms)
    tuned = time_network(tuned_exe, net, target=target, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return NetworkEvaluation(default, tuned, comparison, tuned_task_count(extraction.tasks, log, target),
                             len(extraction.tasks), tuned_exe)


def timing_table(rows: Sequence[tuple[str, object]]) -> str:
    """Mean/Median/Max/Min/Std (ms) of named timings, one row each."""
    head = f"{'':<14}{'Mean':>11}{'Median':>11}{'Max':>11}{'Min':>11}{'Std':>11}   (ms)"
    lines = [head, "-" * len(head)]
    for name, t in rows:
        lines.append(f"{name:<14}{t.mean_ms:>11.3f}{t.median_ms:>11.3f}{t.max_ms:>11.3f}{t.min_ms:>11.3f}"
                     f"{t.std_ms:>11.3f}")
    return "\n".join(lines)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """A plain-text table with ``|`` separators; ``align`` has one ``<`` or ``>`` per column."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(f"{str(c):{a}{w}}" for c, a, w in zip(cells, align, widths)).rstrip()

    return [line(header), "-+-".join("-" * w for w in widths)] + [line(r) for r in rows]
