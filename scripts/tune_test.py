"""Tune one operator and report the best program.

Examples
--------
  python scripts/tune_test.py --wkl matmul-512 --n-trials 64
  python scripts/tune_test.py --wkl nhwc-resnet-50.C2 --n-trials 256 --log-file logs/c2.json
  python scripts/tune_test.py --wkl matmul-512 --n-trials 512 --log-file logs/c2.json --resume
  python scripts/tune_test.py --wkl matmul-512 --n-trials 64 --database tuning-db   # reuse earlier runs

Every measurement is appended to the log as soon as it finishes; after a crash or Ctrl-C, rerun with
--resume and nothing measured is measured again. Exit status 2 means bad input (the message says which).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tune_test.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wkl", default="matmul-512",
                        help="workload name, e.g. matmul-512, matmul-64x128x256, nhwc-resnet-50.C2, C2D-b1, "
                             "softmax-4x1024, conv2d-bn-relu (an unknown name lists all); default matmul-512")
    parser.add_argument("--n-trials", type=int, default=64,
                        help="total measurement budget, resumed measurements included (default 64)")
    parser.add_argument("--target", default="host",
                        help="'host' (this CPU, physical cores; default), 'llvm', 'llvm -mcpu=znver5 "
                             "-num-cores=2', 'cuda -arch=sm_80', or a JSON dict")
    parser.add_argument("--log-file", default=None,
                        help="JSON-lines log to append to (default logs/<workload>.json, with --database "
                             "DIR/<workload>.json)")
    parser.add_argument("--resume", action="store_true",
                        help="read --log-file first and never re-measure what it holds")
    parser.add_argument("--database", default=None, metavar="DIR",
                        help="a directory of logs: the task's records there (any log, same target) are its "
                             "history and count towards --n-trials; the log defaults to DIR/<workload>.json")
    parser.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"),
                        help="join this Ray cluster instead of starting a local one (default: $RAY_ADDRESS, "
                             "else local)")
    parser.add_argument("--cost-model", choices=("xgb", "random"), default="xgb",
                        help="cost model that ranks candidates (default xgb)")
    parser.add_argument("--load-model", default=None,
                        help="start from a cost model saved by scripts/train_cost_model.py")
    parser.add_argument("--per-round", type=int, default=16,
                        help="candidates measured per search round (default 16)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log search details")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    from ansor.errors import AnsorError

    try:
        return run(args)
    except AnsorError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from ansor.cli import check_log_file, open_database, parse_target_and_threads, tuning_options
    from ansor.errors import AnsorError

    if args.n_trials <= 0:
        raise AnsorError(f"--n-trials must be a positive number of trials, got {args.n_trials} "
                         "(example: --n-trials 64)")
    if args.per_round <= 0:
        raise AnsorError(f"--per-round must be positive, got {args.per_round} (example: --per-round 16)")
    # TVM sizes its thread pool once, from TVM_NUM_THREADS: set it before any kernel runs in this process.
    target = parse_target_and_threads(args.target, args.ray_address)

    from ansor.search_task import SearchTask
    from ansor.tuning import default_log_path, tune_task
    task = SearchTask.from_workload(args.wkl, target)
    database = open_database(args.database)
    log_file = Path(args.log_file) if args.log_file else default_log_path(task.workload_key, database)
    check_log_file(log_file, resume=args.resume)
    if args.resume and not log_file.exists():
        print(f"note: {log_file} does not exist yet; starting a fresh log", file=sys.stderr)

    from ansor.measure.types import MeasureInput, MeasureResult
    from tqdm import tqdm

    bar = tqdm(total=args.n_trials, unit="trial", desc=task.workload_key, dynamic_ncols=True)
    stats = {"best": float("inf"), "errors": 0}

    def progress(inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        for res in results:
            if res.ok:
                stats["best"] = min(stats["best"], res.mean_cost)
            else:
                stats["errors"] += 1
        best = task.flop_ct / stats["best"] / 1e9 if stats["best"] < float("inf") else 0.0
        bar.set_postfix_str(f"best {best:.1f} GFLOPS, errors {stats['errors']}")
        bar.update(len(results))

    t0 = time.time()
    # The library's log writer, then the progress bar, see each candidate the moment it finishes.
    try:
        result = tune_task(task, tuning_options(args, [progress]), log_file, database=database,
                           resume=args.resume, on_resume=lambda n: bar.update(min(n, args.n_trials)))
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: finished measurements are in {log_file}; rerun with --resume", file=sys.stderr)
        return 130
    bar.close()
    wall = time.time() - t0
    if result.best_state is None:
        print(f"no valid program found in {result.trials} trials (see {log_file})", file=sys.stderr)
        return 1
    report_best(task, result.best_state)
    print(f"Tuning: {result.trials} trials ({result.resumed} resumed) in {wall:.1f} s; log: {log_file}")
    return 0


def report_best(task, state) -> None:
    """Print the best program's TIR, then time it afresh with the target's threads and check it."""
    import numpy as np

    from ansor import apply
    from ansor.workloads import get_workload

    print("=" * 20, "Lowered TIR", "=" * 20)
    print(apply.schedule(task, state)["main"].script())
    print("=" * 20, "Evaluate", "=" * 20)
    module = apply.build(task, state)
    args = apply.random_inputs(task, seed=1)
    got = apply.run(task, module, args)
    expected = get_workload(task.workload_key).reference(args[: len(args) - 1])
    np.testing.assert_allclose(got[-1], expected[-1], rtol=1e-3, atol=1e-3)
    cost = apply.time_module(task, module, args)
    print(f"Best program: {task.flop_ct / cost / 1e9:.2f} GFLOPS  cost: {cost * 1e3:.3f} ms  "
          f"(checked against numpy; TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')})")


if __name__ == "__main__":
    sys.exit(main())
