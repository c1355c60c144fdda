"""End-to-end table from existing tuning logs: Network | Batch | Baseline | ansor | Speedup.

Examples
--------
  python scripts/evaluate_networks.py logs/resnet-50-b1.json logs/mobilenet-v2-b1.json
  python scripts/evaluate_networks.py logs/*.json --stat median
  python scripts/evaluate_networks.py my-log.json --network bert --batch-size 16
  python scripts/evaluate_networks.py logs/model-b1.json --onnx model.onnx

Each log's network and batch size come from its file name, <network>-b<batch>.json (what
scripts/tune_network.py writes), unless --network/--onnx and --batch-size say otherwise. Nothing is
measured on Ray and nothing is tuned: both builds are compiled and timed in this process, with
TVM_NUM_THREADS set to the target's core count.

Baseline: the default build, where every kernel gets our parallel + vectorized default schedule (the
schedule an untuned task keeps). "ansor" is the same network with the best schedule of every task the log
tuned. The two builds must give the same outputs, or the row is marked WRONG and the exit status is 1.
PyTorch is not used as a baseline even when it is installed: this project defines its networks in Relax
only, and a second definition in PyTorch would be a different program with different weights.
Exit status: 0, 1 a tuned build gives wrong outputs, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

BASELINE = "default build"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ansor.cli import add_network_args

    parser = argparse.ArgumentParser(
        prog="evaluate_networks.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", metavar="LOG", help="tuning logs, one network each")
    add_network_args(parser, for_logs=True)
    parser.add_argument("--target", default=None,
                        help="target to build for and whose records to use (default: the target most records "
                             "of the log were measured for, else 'host')")
    parser.add_argument("--stat", choices=("mean", "median"), default="mean",
                        help="which statistic of the repeats the table shows (default mean)")
    parser.add_argument("--repeat", type=int, default=10,
                        help="timing repeats, each at least 200 ms (default 10)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ansor.cli import run_main, setup_logging

    setup_logging(args.verbose)
    return run_main(run, args)


def run(args: argparse.Namespace) -> int:
    from ansor.cli import (
        check_log_file, check_positive, evaluate_network, format_table, log_target, network_for_log,
        parse_target_and_threads,
    )
    from ansor.networks import extract

    check_positive("--repeat", args.repeat, "10")
    logs = [Path(p) for p in args.logs]
    for log in logs:
        check_log_file(log, must_exist=True)
    networks = [network_for_log(args, log) for log in logs]  # all bad input is reported before any timing

    rows, wrong, threads = [], 0, None
    for log, net in zip(logs, networks):
        # The first target decides the thread count: TVM's pool is sized once per process.
        target = parse_target_and_threads(args.target if args.target else (log_target([log]) or "host"))
        print(f"{log}: {net.name} batch {net.batch_size} ...", file=sys.stderr, flush=True)
        extraction = extract(net, target)
        ev = evaluate_network(net, extraction, log, target, repeat=args.repeat)
        threads = ev.tuned.num_threads
        if ev.tuned_tasks == 0:
            print(f"warning: {log} has no valid record of any task of {net.name} batch {net.batch_size} for "
                  f"this target: its row compares the default build with itself (check --network, "
                  f"--batch-size, --target)", file=sys.stderr)
        base, tuned = (getattr(ev.default, f"{args.stat}_ms"), getattr(ev.tuned, f"{args.stat}_ms"))
        ok = ev.comparison.ok
        wrong += not ok
        rows.append((net.name, str(net.batch_size), f"{base:.3f} ms", f"{tuned:.3f} ms",
                     f"{base / tuned:.2f}x" if ok else "WRONG", f"{ev.tuned_tasks}/{ev.n_tasks}"))
    header = ("Network", "Batch", f"Baseline ({BASELINE})", "ansor", "Speedup", "Tuned tasks")
    print("\n".join(format_table(header, rows, "<>>>><")))
    print(f"Baseline: {BASELINE} (parallel + vectorized default schedules, no tuning); ansor: best schedules "
          f"of each log, default schedules for the tasks it lacks. {args.stat.capitalize()} of {args.repeat} "
          f"repeats, {threads} TVM threads (TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}).")
    if _torch_importable():
        print("note: PyTorch is installed but not used as the baseline: the networks exist here only as "
              "Relax definitions.", file=sys.stderr)
    if wrong:
        print(f"error: {wrong} tuned build(s) give outputs that differ from the default build's (marked "
              "WRONG)", file=sys.stderr)
        return 1
    return 0


def _torch_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


if __name__ == "__main__":
    sys.exit(main())
