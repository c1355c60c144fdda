"""``ansor tune-op``: tune one operator and report the best program (also ``scripts/tune_test.py``).

Examples
--------
  ansor tune-op --wkl matmul-512 --n-trials 64
  ansor tune-op --wkl nhwc-resnet-50.C2 --n-trials 256 --log-file logs/c2.json
  ansor tune-op --wkl matmul-512 --n-trials 512 --log-file logs/c2.json --resume
  ansor tune-op --wkl matmul-512 --n-trials 64 --database tuning-db   # reuse earlier runs

Every measurement is appended to the log as soon as it finishes; after a crash or Ctrl-C, rerun with
--resume and nothing measured is measured again. Exit status 2 means bad input (the message says which).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


NAME = "tune-op"
SUMMARY = "tune one operator (a built-in workload) and report its best program"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import PER_ROUND, SEED, TRIALS, ExistingFile, OutputDir, OutputFile, Text
    from ..options import add_build_memory_arg, add_ray_address_arg

    parser.add_argument("--wkl", default="matmul-512", type=Text("a workload name", "matmul-512"),
                        help="workload name, e.g. matmul-512, matmul-64x128x256, nhwc-resnet-50.C2, C2D-b1, "
                             "softmax-4x1024, conv2d-bn-relu (an unknown name lists all); default matmul-512")
    parser.add_argument("--n-trials", type=TRIALS, default=64,
                        help="total measurement budget, resumed measurements included (default 64)")
    parser.add_argument("--target", default="host", type=Text("a target", "host"),
                        help="'host' (this CPU, physical cores; default), 'llvm', 'llvm -mcpu=znver5 "
                             "-num-cores=2', 'cuda -arch=sm_80', or a JSON dict")
    parser.add_argument("--log-file", default=None, type=OutputFile("a log file path", "logs/mm.json"),
                        help="JSON-lines log to append to (default logs/<workload>.json, with --database "
                             "DIR/<workload>.json)")
    parser.add_argument("--resume", action="store_true",
                        help="read --log-file first and never re-measure what it holds")
    parser.add_argument("--database", default=None, metavar="DIR", type=OutputDir("a directory of logs", "tuning-db"),
                        help="a directory of logs: the task's records there (any log, same target) are its "
                             "history and count towards --n-trials; the log defaults to DIR/<workload>.json")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="fp32 (default), or bf16: the product's inputs rounded to bf16, products and sums "
                             "in fp32, computed by the CPU's bf16 dot product (AVX512_BF16); matmul workloads")
    parser.add_argument("--seed", type=SEED, default=0, help="search seed (default 0)")
    add_ray_address_arg(parser)
    parser.add_argument("--cost-model", choices=("xgb", "random"), default="xgb",
                        help="cost model that ranks candidates (default xgb)")
    parser.add_argument("--load-model", default=None, type=ExistingFile("a saved cost model", "model.npz"),
                        help="start from a cost model saved by ansor train-model")
    parser.add_argument("--no-pretrained", action="store_true",
                        help="start cold: no shipped pretrained cost model and no first candidates from the "
                             "shipped schedule database (docs/pretrained.md; the default uses both on CPU "
                             "targets)")
    parser.add_argument("--per-round", type=PER_ROUND, default=16,
                        help="candidates measured per search round (default 16; the shipped database's seeds, "
                             "when there are any, are a first round of their own)")
    add_build_memory_arg(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log search details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_tuning_main
    return run_tuning_main(run, args)


def run(args: argparse.Namespace, log) -> int:
    from ..logs import check_log_file
    from ..options import open_database, tuning_options
    from ..running import EXIT_FAILED
    from ..targets import announce_target, parse_target_and_threads

    # TVM sizes its thread pool once, from TVM_NUM_THREADS: set it before any kernel runs in this process.
    target = parse_target_and_threads(args.target, args.ray_address, runs_here=True)

    from ...task.precision import Precision, workload_in
    from ...task.search_task import SearchTask
    from ...tuning import default_log_path, tune_task
    precision = Precision(args.precision)
    if precision is Precision.BF16:
        from ...sketch.tensor_rules import require_bf16_unit
        require_bf16_unit(target)
    task = SearchTask.from_workload(workload_in(args.wkl, precision), target)
    database = open_database(args.database)
    log_file = Path(args.log_file) if args.log_file else default_log_path(task.workload_key, database)
    check_log_file(log_file, resume=args.resume)
    announce_target(target)
    if args.resume and not log_file.exists():
        print(f"note: {log_file} does not exist yet; starting a fresh log", file=sys.stderr)

    from ..progress import TrialBar

    t0 = time.time()
    log.path = log_file
    # The library's log writer, then the progress bar, see each candidate the moment it finishes.
    with TrialBar(task, args.n_trials) as bar:
        result = tune_task(task, tuning_options(args, [bar.measured]), log_file, database=database,
                           resume=args.resume, on_resume=bar.resumed_from)
    log.path = None
    wall = time.time() - t0
    for note in bar.notes():
        print(note, file=sys.stderr)
    if result.best_state is None:
        print(f"no valid program found in {result.trials} trials (see {log_file})", file=sys.stderr)
        return EXIT_FAILED
    status = report_best(task, result.best_state, result.best_cost)
    print(f"Tuning: {result.trials} trials ({result.resumed} resumed) in {wall:.1f} s; log: {log_file}")
    return status


def report_best(task, state, tuned_cost: float) -> int:
    """Print the best program's TIR, then time it afresh with the target's threads and check it.

    A GPU program is re-timed on this machine's GPU; without one, the cost measured while tuning (on the
    cluster's GPU) is reported instead. Returns the exit status: 1 if the program is wrong.
    """
    from ...task import program
    from ...measure.check import output_mismatch
    from ...target import device_kind
    from ...task.workloads import get_workload
    from ..running import EXIT_FAILED

    print("=" * 20, "Lowered TIR", "=" * 20)
    print(program.schedule(task, state)["main"].script())
    print("=" * 20, "Evaluate", "=" * 20)
    kind = device_kind(task.target)
    device = kind.device(task.target)
    if not device.exist:
        print(f"Best program: {task.flop_ct / tuned_cost / 1e9:.2f} GFLOPS  cost: {tuned_cost * 1e3:.3f} ms  "
              f"(as measured while tuning; not re-timed: this machine has no {task.target.kind.name.upper()} "
              "device)")
        return 0
    module = program.build_program(task, state)
    args = program.random_inputs(task, seed=1)
    got = program.run_program(module, args, device=device)
    expected = get_workload(task.workload_key).reference(args[: len(args) - 1])
    mismatch = output_mismatch(got[-1:], expected[-1:])
    if mismatch:
        print(f"error: the best program's output differs from numpy's: {mismatch}", file=sys.stderr)
        return EXIT_FAILED
    cost = program.time_module(module, args, device=device)
    how = (f"; each run after a cache flush of every argument but the first, "
           f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}") if kind.flush_caches else ""
    print(f"Best program: {task.flop_ct / cost / 1e9:.2f} GFLOPS  cost: {cost * 1e3:.3f} ms  "
          f"(checked against numpy{how})")
    return 0

