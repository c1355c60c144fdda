"""``ansor tune``: tune a whole network (built-in or an ONNX file) and report end-to-end latency (also
``scripts/tune_network.py``): extract its tasks, share the trial budget among them.

Examples
--------
  ansor tune --onnx model.onnx --minutes 10
  ansor tune --network resnet-50 --n-trials 2000
  ansor tune --network resnet-50 --n-trials 4000 --resume     # continue the same log
  ansor tune --network mobilenet-v2 --batch-size 16 --n-trials 1000
  ansor tune --network resnet-50 --eval-only                  # apply the log, no tuning
  ansor tune --network resnet-50 --n-trials 2000 --database db --export deploy/r50

The gradient task scheduler gives each round of --per-round measurements to the task whose improvement
would lower the estimated total latency most (the sum over tasks of weight x best latency; weight = how
often the subgraph occurs). A table of the tasks is redrawn after every round on stderr. Then (--select,
CPU targets) the network-level selection re-times the few best states of the heaviest tasks inside the
built network and keeps the combination that runs fastest there, if it beats the best measured states end
to end (docs/networks.md; its time counts in --minutes). At the end the
network is built twice, with the default schedules (parallel + vectorized) and with the best schedule of
each tuned task; the two builds must give the same outputs, then both are timed in turn.

Every measurement is appended to the log as soon as it finishes; after a crash, kill or Ctrl-C, rerun with
--resume and nothing measured is measured again. Exit status: 0 done, 1 the tuned build gives wrong
outputs, 2 bad input (the message says which), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


NAME = "tune"

#: Share of --minutes left for the network-level selection: it took 20 s for ResNet-50 on 2 cores (3 best
#: states of 22 tasks: 4 builds, 5 rounds of profiles), 3 % of 10 minutes.
SELECTION_SHARE = 0.05
SUMMARY = "tune a network (an ONNX file or a built-in one) and time it end to end"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import (
        MINUTES, PER_ROUND, REPEATS, SEED, SELECT, TRIALS, ExistingFile, OutputDir, OutputFile, Text, add_precision_arg,
    )
    from ..networks import add_network_args
    from ..options import add_build_memory_arg, add_pool_probe_arg, add_ray_address_arg

    add_network_args(parser)
    add_precision_arg(parser)
    parser.add_argument("--n-trials", type=TRIALS, default=1000,
                        help="total measurement budget over all tasks, resumed measurements included "
                             "(default 1000)")
    parser.add_argument("--minutes", type=MINUTES, default=None, metavar="M",
                        help="also stop tuning after M minutes of wall time (no new round starts; default: "
                             "only --n-trials limits it)")
    parser.add_argument("--target", default="host", type=Text("a target", "host"),
                        help="'host' (this CPU, physical cores; default), 'llvm', 'llvm -mcpu=znver5 "
                             "-num-cores=2', or a JSON dict")
    parser.add_argument("--log-file", default=None, type=OutputFile("a log file path", "logs/net.json"),
                        help="JSON-lines log to append to (default logs/<network>-b<batch>.json, with "
                             "--database DIR/<network>-b<batch>.json)")
    parser.add_argument("--resume", action="store_true",
                        help="read --log-file first: its measurements count towards --n-trials, train the "
                             "cost model, and are never measured again")
    parser.add_argument("--database", default=None, metavar="DIR", type=OutputDir("a directory of logs", "tuning-db"),
                        help="a directory of logs: a task some log there tuned for this target is done (its "
                             "best record is used, it gets no trials; with --resume the run's own log is "
                             "continued instead); the log defaults to DIR/<network>-b<batch>.json, so the "
                             "database grows with every run")
    parser.add_argument("--export", default=None, metavar="DIR", type=OutputDir("an export directory", "deploy/model"),
                        help="write the tuned build to DIR: model.so, model.json, README.md (and params.bin "
                             "when weights are run-time arguments); it loads and runs with tvm alone")
    add_pool_probe_arg(parser, "with --export: ")
    parser.add_argument("--eval-only", action="store_true",
                        help="no tuning: apply the best schedules of --log-file and report the timing table")
    parser.add_argument("--no-eval", action="store_true",
                        help="tune only: no final build, output check or timing of the default and tuned networks "
                             "(a CUDA network's two builds take minutes; --eval-only or ansor bench --log do them "
                             "later)")
    parser.add_argument("--per-round", type=PER_ROUND, default=16,
                        help="measurements per scheduler round, all of one task (default 16; a task's warm-up "
                             "round measures only its default schedule and seeds)")
    parser.add_argument("--strategy", choices=("gradient", "round-robin"), default="gradient",
                        help="how rounds are given to tasks: Ansor's gradient scheduler (default; a task's "
                             "gradient halves every 128 of its trials without gain) or in turn")
    parser.add_argument("--early-stopping", type=TRIALS, default=None, metavar="N",
                        help="a task whose best latency has not improved in its last N trials gets no more "
                             "rounds (default: never stop a task)")
    parser.add_argument("--cost-model", choices=("xgb", "random"), default="xgb",
                        help="cost model that ranks candidates, shared by all tasks (default xgb)")
    parser.add_argument("--load-model", default=None, metavar="FILE",
                        type=ExistingFile("a saved cost model", "model.npz"),
                        help="start from a cost model saved by ansor train-model")
    parser.add_argument("--no-pretrained", action="store_true",
                        help="start cold: no shipped pretrained cost model and no first candidates from the "
                             "shipped schedule database (docs/pretrained.md; the default uses both on CPU "
                             "targets)")
    parser.add_argument("--select", type=SELECT, default=3, metavar="K",
                        help="after tuning, re-time the K best states of the heaviest tasks inside the built "
                             "network and keep the combination that is fastest there if it beats the best "
                             "measured states end to end (CPU targets; its time counts in --minutes; default "
                             "3, 0: off)")
    parser.add_argument("--seed", type=SEED, default=0, help="search and scheduler seed (default 0)")
    add_ray_address_arg(parser)
    add_build_memory_arg(parser)
    parser.add_argument("--repeat", type=REPEATS, default=10,
                        help="timing repeats (each at least 200 ms) of the final end-to-end measurement "
                             "(default 10)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log search and measurement details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_tuning_main
    return run_tuning_main(run, args)


def run(args: argparse.Namespace, log) -> int:
    from ..logs import check_log_file, log_name
    from ..networks import load_network
    from ..options import network_precision, open_database
    from ..targets import announce_target, parse_target_and_threads

    from ...errors import AnsorError
    if args.select == 1:
        raise AnsorError("--select 1 compares nothing: give 0 (no selection) or 2 or more states per task")
    if args.no_eval and (args.eval_only or args.export):
        raise AnsorError(f"--no-eval skips the final build, which {'--eval-only' if args.eval_only else '--export'} "
                         "needs: give one or the other")
    target = parse_target_and_threads(args.target, args.ray_address, runs_here=True)  # sets TVM_NUM_THREADS first
    precision = network_precision(args, target)
    net = load_network(args.network, args.onnx, args.batch_size)
    database = open_database(args.database)
    name = log_name(net.name, net.batch_size, precision.value)
    log_file = Path(args.log_file) if args.log_file else (database.path / name if database else Path("logs") / name)
    check_log_file(log_file, must_exist=args.eval_only and database is None, resume=args.resume)
    announce_target(target)

    from ...networks import extract

    t0 = time.time()
    extraction = extract(net, target, precision=precision)
    in_bf16 = f", {precision.value}" if precision.bf16 else ""
    print(f"{net.name} (batch {net.batch_size}{in_bf16}): {len(extraction.tasks)} tasks, {extraction.total_weight} "
          f"weighted occurrences, {len(extraction.skipped)} PrimFuncs not tuned (extracted in "
          f"{time.time() - t0:.1f} s); log: {log_file}", file=sys.stderr)
    if not extraction.tasks:
        raise_no_tasks(net)

    from ..progress import TaskTable

    table = TaskTable(extraction.tasks, args.n_trials)
    logs = [log_file, *(database.logs(exclude=[log_file]) if database else [])]
    if not args.eval_only:
        log.path = log_file
        tune(args, extraction, log_file, logs, database, table, target)
        log.path = None
    else:
        from ...log.records import distinct_records, load_records
        existing = [p for p in logs if p.exists()]
        table.load(distinct_records(load_records(existing, target=target)) if existing else [])
    print("\n".join(table.render(final=True)))
    if args.no_eval:
        return 0
    return report(args, net, extraction, target, [p for p in logs if p.exists()], table)


def raise_no_tasks(net) -> None:
    from ...networks import NetworkError
    raise NetworkError(f"{net.name} has no task to tune (every PrimFunc is a reshape, a copy, or one "
                       "ComputeDAG cannot analyse)")


def tune(args: argparse.Namespace, extraction, log_file: Path, logs: list[Path], database, table, target) -> None:
    from ..options import tuning_options
    from ...relax import tune_tasks
    from ...target import device_kind

    start = time.time()
    select = args.select if device_kind(target).profile_calls else 0
    budget = None if args.minutes is None else args.minutes * 60

    if args.resume and not log_file.exists():
        print(f"note: {log_file} does not exist yet; starting a fresh log", file=sys.stderr)
    elif not args.resume and database is None and log_file.exists() and log_file.stat().st_size > 0:
        print(f"note: appending to the existing {log_file} without reading it (use --resume to continue it)",
              file=sys.stderr)

    def history(resumed, reused) -> None:
        table.add_history(resumed, reused)
        if resumed:
            print(f"resumed {table.resumed} measurements of {len(resumed)} tasks from {log_file}", file=sys.stderr)
        if reused:
            print(f"database {database.path}: {len(reused)} of {len(table.tasks)} tasks already tuned there "
                  f"({sum(map(len, reused.values()))} records); they get no trials", file=sys.stderr)
        if table.resumed >= args.n_trials:
            print(f"note: the log already holds {table.resumed} >= --n-trials {args.n_trials} measurements; "
                  "nothing to tune", file=sys.stderr)
        table.start()

    result = tune_tasks(extraction.tasks, log_file, args.n_trials, options=tuning_options(args, [table.measured]),
                        database=database, strategy=args.strategy, resume=args.resume, on_round=table.round_done,
                        on_history=history,
                        time_limit=None if budget is None else budget * (1 - SELECTION_SHARE if select else 1))
    table.stop()
    print(f"tuning: {result.total_measured} new trials ({table.resumed} resumed, {table.errors} failed, "
          f"{len(result.reused)} tasks from the database) in {time.time() - table.t0:.1f} s; log: {log_file}",
          file=sys.stderr)
    if result.spent is not None and result.spent.trials:
        print(f"time: {result.spent}", file=sys.stderr)
    for note in table.notes():
        print(note, file=sys.stderr)
    if select and result.total_measured:
        from ...networks.selection import select_in_network
        print(select_in_network(extraction, [p for p in logs if p.exists()], log_file, target, candidates=select,
                                deadline=None if budget is None else start + budget), file=sys.stderr)


def report(args: argparse.Namespace, net, extraction, target, logs: list[Path], table) -> int:
    from ..evaluation import evaluate_network, pool_setting
    from ..running import EXIT_FAILED
    from ..tables import timing_table

    where = ", ".join(map(str, logs)) or "the log"
    if not any(table.trials):
        print(f"note: {where} has no measurement of this network's tasks: the tuned build is the default "
              "build", file=sys.stderr)
    print("building the default and the tuned network ...", file=sys.stderr)
    ev = evaluate_network(net, extraction, logs, target, repeat=args.repeat)
    check = ev.check
    if not check.ok:
        print(f"error: the tuned build's output differs from the default build's: {check.summary()}; a schedule "
              f"in {where} is wrong, or the network amplifies float rounding differences that much (then its "
              "output also moves under a 1e-6 change of the input)", file=sys.stderr)
        return EXIT_FAILED
    if args.export:
        from ...relax import export_network
        env = (pool_setting(ev.tuned_executable, extraction.network, target, args.pool_probe_processes)
               if args.pool_probe else {})
        library = export_network(ev.tuned_executable, extraction.network, args.export, target, env)
        print(f"Exported the tuned build to {library.parent} (model.so, model.json, README.md"
              f"{', params.bin' if extraction.network.weights else ''})")
    print(f"Output check: {check.summary()}")
    if extraction.precision.value != "fp32":
        from ..evaluation import error_against_fp32, fp32_reference
        err = check.tuned_vs_fp32 or error_against_fp32(extraction, ev.tuned_executable, fp32_reference(net, target),
                                                        target)
        print(f"{extraction.precision.value} error: max |tuned - fp32 default build| {err.max_abs_error:.3g} "
              f"({err.max_abs_error / max(err.scale, 1e-30):.2%} of the output's scale {err.scale:.3g})")
    print(f"Mean inference time (std dev): {ev.tuned.mean_ms:.3f} ms ({ev.tuned.std_ms:.3f} ms)")
    torch_timing = pytorch_eager(net, target, args.repeat, ev.tuned.num_threads)
    rows = [("default build", ev.default), ("tuned", ev.tuned)]
    print(timing_table(rows + ([("pytorch eager", torch_timing)] if torch_timing else [])))
    print(f"Speedup (mean): {ev.speedup:.2f}x; {ev.tuned_tasks} of {ev.n_tasks} tasks use tuned schedules, "
          f"the rest default schedules; {ev.tuned.repeats} repeats, {ev.tuned.num_threads} TVM threads")
    if torch_timing:
        print(f"Speedup over PyTorch eager (mean): {torch_timing.mean_ms / ev.tuned.mean_ms:.2f}x "
              f"({torch_timing.num_threads} PyTorch threads)")
    return 0


def pytorch_eager(net, target, repeat: int, tvm_threads: int):
    """PyTorch eager timing of ``net`` (a :class:`~ansor.networks.Timing`), the baseline of Ansor's tables.

    ``None`` when torch is not installed (it is optional), the network has no PyTorch definition
    (``tiny-cnn``, ONNX models), or the target is a GPU (PyTorch here runs on the CPU). PyTorch gets the
    target's core count as its thread count (TVM's thread count if the target names none).
    """
    from ...networks.torch_baseline import has_torch_definition, time_torch, torch_available
    from ...target import device_kind

    if not device_kind(target).torch_baseline or not has_torch_definition(net) or not torch_available():
        return None
    cores = int(target.attrs["num-cores"]) if "num-cores" in target.attrs else tvm_threads
    print(f"timing PyTorch eager with {cores} threads ...", file=sys.stderr, flush=True)
    return time_torch(net.name, net.batch_size, threads=cores, repeat=repeat)

