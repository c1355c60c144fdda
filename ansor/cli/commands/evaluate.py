"""``ansor evaluate``: end-to-end table from existing tuning logs, Network | Batch | Baseline | ansor |
Speedup (also ``scripts/evaluate_networks.py``).

Examples
--------
  ansor evaluate logs/resnet-50-b1.json logs/mobilenet-v2-b1.json
  ansor evaluate logs/*.json --stat median
  ansor evaluate my-log.json --network bert --batch-size 16
  ansor evaluate logs/model-b1.json --onnx model.onnx

Each log's network and batch size come from its file name, <network>-b<batch>.json (what
ansor tune writes), unless --network/--onnx and --batch-size say otherwise. Nothing is
measured on Ray and nothing is tuned: both builds (and PyTorch) are compiled and timed in this process,
with TVM_NUM_THREADS set to the target's core count.

Baseline (--baseline): "auto" (default) is PyTorch eager when torch imports and the network has a PyTorch
definition (the five built-in benchmark networks: ansor/networks/torch_baseline.py, NCHW, eval mode,
torch.inference_mode, torch.set_num_threads = the target's core count), else the default build; "torch"
insists on PyTorch (an error if it is not installed); "default" always uses the default build, where every
kernel gets our parallel + vectorized default schedule (the schedule an untuned task keeps). tiny-cnn and
ONNX models have no PyTorch definition: their baseline is the default build, with a note. The last column
says which baseline each row used. "ansor" is the network with the best schedule of every task the log
tuned. The tuned build's outputs must equal the default build's, or the row is marked WRONG and the exit
status is 1.
Exit status: 0, 1 a tuned build gives wrong outputs, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT = "default build"
TORCH = "PyTorch eager"


NAME = "evaluate"
SUMMARY = "time networks tuned by earlier runs (their logs) against a baseline"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import REPEATS, ExistingFile, add_precision_arg
    from ..targets import add_log_target_arg
    from ..networks import add_network_args

    parser.add_argument("logs", nargs="+", metavar="LOG", type=ExistingFile("a tuning log", "logs/net-b1.json"),
                        help="tuning logs, one network each")
    add_network_args(parser, for_logs=True)
    add_precision_arg(parser, for_logs=True)
    add_log_target_arg(parser)
    parser.add_argument("--baseline", choices=("auto", "torch", "default"), default="auto",
                        help="what the speedup is over: PyTorch eager where torch is installed and the network "
                             "has a PyTorch definition, else the default build (auto, the default); PyTorch "
                             "eager, an error without torch (torch); always the default build (default)")
    parser.add_argument("--stat", choices=("mean", "median"), default="mean",
                        help="which statistic of the repeats the table shows (default mean)")
    parser.add_argument("--repeat", type=REPEATS, default=10,
                        help="timing repeats, each at least 200 ms (default 10)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_main
    return run_main(run, args)


def run(args: argparse.Namespace) -> int:
    from ..evaluation import evaluate_network
    from ..networks import network_for_log
    from ..options import network_precision
    from ..targets import log_target, parse_target_and_threads
    from ..tables import format_table
    from ...networks import extract

    logs = [Path(p) for p in args.logs]  # each an existing, readable file: checked by the flag's type
    networks = [network_for_log(args, log) for log in logs]  # all bad input is reported before any timing
    torch_version = torch_for_baseline(args.baseline, networks)

    rows, wrong, threads, kinds = [], 0, None, set()
    for log, net in zip(logs, networks):
        # The first target decides the thread count: TVM's pool is sized once per process.
        target = parse_target_and_threads(args.target if args.target else (log_target([log]) or "host"),
                                          runs_here=True)
        print(f"{log}: {net.name} batch {net.batch_size} ...", file=sys.stderr, flush=True)
        extraction = extract(net, target, precision=network_precision(args, target, log))
        ev = evaluate_network(net, extraction, log, target, repeat=args.repeat)
        threads = ev.tuned.num_threads
        if ev.tuned_tasks == 0:
            print(f"warning: {log} has no valid record of any task of {net.name} batch {net.batch_size} for "
                  f"this target: its ansor column is the default build (check --network, --batch-size, "
                  f"--target)", file=sys.stderr)
        kind, baseline = DEFAULT, ev.default
        if torch_version is not None and torch_applies(net, target):
            from ...networks.torch_baseline import time_torch

            cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else threads
            print(f"{net.name}: timing PyTorch eager with {cores} threads ...", file=sys.stderr, flush=True)
            baseline = time_torch(net.name, net.batch_size, threads=cores, repeat=args.repeat)
            kind = TORCH
        kinds.add(kind)
        base, tuned = (getattr(baseline, f"{args.stat}_ms"), getattr(ev.tuned, f"{args.stat}_ms"))
        ok = ev.check.ok
        wrong += not ok
        used = f"{TORCH}, {baseline.num_threads} threads" if kind == TORCH else DEFAULT
        rows.append((net.name, str(net.batch_size), f"{base:.3f} ms", f"{tuned:.3f} ms",
                     f"{base / tuned:.2f}x" if ok else "WRONG", f"{ev.tuned_tasks}/{ev.n_tasks}", used))
    common = f"Baseline ({next(iter(kinds))})" if len(kinds) == 1 else "Baseline"
    header = ("Network", "Batch", common, "ansor", "Speedup", "Tuned tasks", "Baseline used")
    print("\n".join(format_table(header, rows, "<>>>><<")))
    described = []
    if DEFAULT in kinds:
        described.append(f"{DEFAULT} (parallel + vectorized default schedules, no tuning)")
    if TORCH in kinds:
        described.append(f"{TORCH} (PyTorch {torch_version}, NCHW, inference mode, torch threads = target cores)")
    print(f"Baseline: {' or '.join(described)}; ansor: best schedules of each log, default schedules for the tasks "
          f"it lacks. {args.stat.capitalize()} of {args.repeat} repeats, {threads} TVM threads "
          f"(TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}); outputs checked against the default build.")
    if wrong:
        print(f"error: {wrong} tuned build(s) give outputs that differ from the default build's (marked "
              "WRONG)", file=sys.stderr)
        return 1
    return 0


def torch_for_baseline(choice: str, networks: list) -> str | None:
    """PyTorch's version if the baseline may be PyTorch eager, else ``None``.

    ``torch`` without PyTorch raises a one-line error (exit 2) before anything is built; ``auto`` falls back
    to the default build with a note, and does not import torch (seconds) when no network has a PyTorch
    definition.
    """
    from ...networks.torch_baseline import TorchUnavailableError, has_torch_definition, import_torch

    if choice == "default":
        return None
    if choice == "auto" and not any(has_torch_definition(net) for net in networks):
        print("note: none of these networks has a PyTorch definition: the baseline is the default build",
              file=sys.stderr)
        return None
    try:
        return import_torch().__version__
    except TorchUnavailableError:
        if choice == "torch":
            raise
        print('note: PyTorch is not installed: the baseline is the default build (pip install -e ".[torch]" '
              "for the PyTorch eager baseline)", file=sys.stderr)
        return None


def torch_applies(net, target) -> bool:
    """Whether ``net`` has a PyTorch definition for ``target``; prints why not when it has none."""
    from ...networks.torch_baseline import has_torch_definition
    from ...target import device_kind

    if not device_kind(target).torch_baseline:
        print(f"note: {net.name}: the PyTorch baseline runs on the CPU only; the baseline for this GPU target "
              "is the default build", file=sys.stderr)
        return False
    if not has_torch_definition(net):
        print(f"note: {net.name} has no PyTorch definition (only the built-in benchmark networks have one): its "
              "baseline is the default build", file=sys.stderr)
        return False
    return True

