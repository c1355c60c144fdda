"""``ansor export``: a deployable build of a tuned network, from its log, without tuning.

Examples
--------
  ansor export logs/model-b1.json --onnx model.onnx --out deploy/model
  ansor export logs/resnet-50-b1.json --out deploy/r50        # network and batch from the log's name

The network is built with the best schedule of every task the log tuned (default schedules for the rest),
its outputs are checked against the default build's on random inputs, and it is written to DIR as
``model.so`` + ``model.json`` + ``README.md`` (+ ``params.bin`` when weights are run-time arguments, as on
a GPU target; on a CPU they are constants inside ``model.so``). On a CPU the tuned build is first timed
under each TVM thread-pool setting and the fastest is named in ``model.json`` (``--no-pool-probe`` skips
that). It loads and runs with ``tvm`` alone; the README in DIR says how. ``ansor tune ... --export DIR``
does the same at the end of a tuning run.
Exit status: 0, 1 the tuned build gives wrong outputs (nothing is written), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

NAME = "export"
SUMMARY = "write a tuned network as a deployable model.so, from its tuning log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import ExistingFile, OutputDir, add_precision_arg
    from ..networks import add_network_args
    from ..options import add_pool_probe_arg
    from ..targets import add_log_target_arg

    parser.add_argument("log", metavar="LOG", type=ExistingFile("a tuning log", "logs/model-b1.json"),
                        help="the network's tuning log (ansor tune's)")
    parser.add_argument("--out", required=True, metavar="DIR", type=OutputDir("an export directory", "deploy/model"),
                        help="where to write model.so, model.json and README.md (created if missing)")
    add_network_args(parser, for_logs=True)
    add_precision_arg(parser, for_logs=True)
    add_log_target_arg(parser)
    add_pool_probe_arg(parser, "")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_main
    return run_main(run, args)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ...networks import apply_schedules, apply_history_best, build, extract
    from ...relax import export_network
    from ..evaluation import check_tuned, pool_setting, tuned_task_count
    from ..options import network_precision
    from ..networks import network_for_log
    from ..running import EXIT_FAILED
    from ..targets import log_target, parse_target_and_threads

    log = Path(args.log)
    net = network_for_log(args, log)
    target = parse_target_and_threads(args.target or log_target([log]) or "host")
    extraction = extract(net, target, precision=network_precision(args, target, log))
    tuned = tuned_task_count(extraction.tasks, log, target)
    if tuned == 0:
        print(f"warning: {log} has no valid record of any task of {net.name} batch {net.batch_size} for this "
              "target: the export is the default build (check --network, --batch-size, --target)", file=sys.stderr)
    print(f"building {net.name} (batch {net.batch_size}) with {tuned} of {len(extraction.tasks)} tasks tuned ...",
          file=sys.stderr, flush=True)
    tuned_exe = build(apply_history_best(extraction.mod, extraction.tasks, log, target=target), target)
    default_exe = build(apply_schedules(extraction.mod, extraction.tasks, {}, target=target), target)
    check = check_tuned(net, extraction, tuned_exe, default_exe, target)
    if not check.ok:
        print(f"error: the tuned build's output differs from the default build's: {check.summary()}; a schedule "
              f"in {log} is wrong, nothing was written", file=sys.stderr)
        return EXIT_FAILED
    env = (pool_setting(tuned_exe, extraction.network, target, args.pool_probe_processes)
           if args.pool_probe else {})
    library = export_network(tuned_exe, extraction.network, args.out, target, env)
    print(f"Exported the tuned build to {library.parent} (model.so, model.json, README.md"
          f"{', params.bin' if extraction.network.weights else ''}); output check: {check.summary()}")
    return 0
