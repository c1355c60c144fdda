"""``ansor bench``: a network tuned by ansor against the CPU inference runtimes, on the same ONNX file, in one
run (also ``scripts/bench/bench_network.py``).

  ansor bench                                      # resnet-50, mobilenet-v2, bert; 10 min each
  ansor bench --models resnet-50 --minutes 5 --plot curves.png
  ansor bench --onnx model.onnx --minutes 10       # your own ONNX file
  ansor bench --models resnet-50 --log logs/resnet-50.json   # no tuning: use a log
  ansor bench --models resnet-50 --metaschedule    # also MetaSchedule, same trials
  ansor bench --write-docs .                       # also write the figures into ./docs/benchmarks.md
  ansor bench --zoo --work-dir logs/zoo            # the model zoo (22 models, hours; a rerun resumes)
  ansor bench --target cuda --minutes 5            # this machine's GPU against PyTorch (ansor/bench/gpu.py)

For each model:

1. The ONNX file: a built-in network's PyTorch definition (``ansor/networks/torch_baseline.py``) exported as
   a user exports theirs (NCHW, opset 17; needs the ``torch`` extra), or a file given with ``--onnx``.
2. ansor tunes it as a user would: ``ansor tune --onnx FILE --minutes M`` in a subprocess.
3. Then, one after another in this process with pauses between (nothing else runs; TVM_NUM_THREADS, ONNX
   Runtime's and OpenVINO's threads and PyTorch's threads all equal this machine's physical cores): the
   build with the best schedules found after each checkpoint minute (the curve), the final tuned build, the
   default build (parallel + vectorized default schedules), ONNX Runtime, OpenVINO and PyTorch eager
   (the runtimes come with the ``bench`` extra; a missing one is reported, not faked). Every one computes in
   float32 as ansor does; where OpenVINO's default on this CPU is another precision (bfloat16 on CPUs with
   native bf16 arithmetic), it is timed that way too, as a row of its own that the ratios leave out. With
   ``--precision bf16`` ansor computes in bf16 and its ratio is taken against every runtime at its default
   precision (OpenVINO's bf16 row included; in turn, OpenVINO runs at its default).
4. Then the tuned build, ONNX Runtime and OpenVINO in turn, ``--rounds`` times: one timing each can land in a
   burst of load on a shared machine for one and not the others; in turn they all meet the same bursts. The
   ratio is taken within each round (ansor / the fastest runtime of that round), then its median: load that
   shifts between rounds moves the contenders' medians apart, not a round's ratio.

Printed per model: each one's latency and ansor's speed relative to it, ansor's tuning minutes and trials,
the per-task breakdown of the tuned build with every call timed in place (ms, share of the latency, GFLOPS,
fraction of the machine's measured peak, see ``peak.py``, and the same task's time alone during tuning)
and the time spent outside the tuned tasks (untuned functions, VM builtins), then the in-turn timings of
every round, their medians and in how many rounds ansor beat every runtime; ``--plot`` draws latency
against tuning minutes with the runtimes as horizontal lines (needs matplotlib).

``--zoo``: the models of ``ansor/bench/zoo.py`` (torchvision and Hugging Face transformers, exported from
their libraries; the ``zoo`` extra) the same way, without the tuning curve and PyTorch eager, then one table
of them all: does each import, build and match ONNX Runtime's outputs, and how fast does it run. Its work dir
keeps an ONNX file, a log and a status file per model: a rerun tunes only what is not tuned yet
(``ansor/bench/zoo_bench.py``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence


from ..errors import AnsorError, short_message
from ..networks.bf16 import BF16_VS_FP32_RTOL
from .docs import Provenance
from .in_turn import model_flags
from .network_report import DEFAULT, OURS, ModelReport, TaskRow, plot, print_report, write_docs
from .peak import cpu_description, measure_peak
from .peers import (PeerResult, compare_all, max_difference, onnxruntime_peer, openvino_default_precision,
                    openvino_peer, torch_peer)

MODELS = ("resnet-50", "mobilenet-v2", "bert")
CHECKPOINTS = (1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60)


class TuningFailed(AnsorError):
    """The ``ansor tune`` subprocess failed: a failed run (exit status 1), not bad input. The message is one
    line (the end of its stderr); ``detail`` keeps the tail of its stderr for the command to print."""

    exit_code = 1

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def tune(onnx: Path, log: Path, minutes: float, n_trials: int, flags: Sequence[str] = ()) -> tuple[float, int, str]:
    """``ansor tune --onnx`` (``--network`` for a built-in network's name) as a user runs it (with ``flags``
    added); returns (tuning seconds, trials, the network-level selection's line) as it reports them."""
    cmd = [sys.executable, "-m", "ansor", "tune", *model_flags(onnx), "--minutes", str(minutes),
           "--n-trials", str(n_trials), "--log-file", str(log), "--repeat", "3", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TuningFailed(f"ansor tune failed ({proc.returncode}): {short_message(proc.stderr, pick='last')}",
                           proc.stderr[-3000:])
    found = re.search(r"^tuning: (\d+) new trials .* in (\d+\.\d+) s", proc.stderr, re.M)
    if found is None:
        raise TuningFailed("ansor tune did not print its 'tuning: N new trials ... in S s' line",
                           proc.stderr[-3000:])
    selection = re.search(r"^network-level selection: .*$", proc.stderr, re.M)
    return float(found.group(2)), int(found.group(1)), selection.group(0) if selection else ""


def tune_flags(args: argparse.Namespace) -> list[str]:
    """The ``ansor tune`` flags that ``ansor bench``'s own flags ask for."""
    return (["--no-pretrained"] if args.no_pretrained else []) + ["--precision", args.precision]


def tune_metaschedule(extraction, target, trials: int, work_dir: str):
    """MetaSchedule's ``tune_relax`` on the module ansor tuned (same PrimFuncs, weights bound as constants,
    which its layout rewrite packs), best schedules applied with ``MetaScheduleApplyDatabase`` and built as
    ours are; returns (executable, wall seconds)."""
    from tvm import relax
    from tvm.s_tir.meta_schedule import relax_integration

    from ..networks import build

    t0 = time.time()
    database = relax_integration.tune_relax(extraction.mod, {}, target, work_dir, max_trials_global=trials,
                                            num_trials_per_iter=64)
    wall = time.time() - t0
    with target, database:
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(extraction.mod)
    return build(tuned, target), wall


def records_until(log: Path, deadline: float, out: Path) -> int:
    """Copy the records of ``log`` measured before ``deadline`` (unix time) to ``out``; returns how many."""
    from ..log.records import RecordWriter, load_records
    kept = [r for r in load_records(log) if r.result.timestamp <= deadline]
    out.unlink(missing_ok=True)
    with RecordWriter(out) as writer:
        for r in kept:
            writer.write_record(r.task, r.steps, r.result)
    return len(kept)


def tuning_curve(extraction, log: Path, start: float, minutes: float, checkpoints: Sequence[float], target,
                 repeat: int, pause: float, work: Path, name: str) -> Iterator[tuple[float, float]]:
    """(minutes, median ms) of the build of the records of ``log`` measured within each checkpoint minute since
    ``start`` (unix time) below ``minutes``, then within ``minutes`` (no point at all without ``checkpoints``);
    each prefix is kept in ``work`` as ``<name>-<M>min.json``."""
    from ..networks import apply_history_best, build, time_network
    for m in [c for c in checkpoints if c < minutes] + ([minutes] if checkpoints else []):
        partial = work / f"{name}-{m}min.json"
        if records_until(log, start + m * 60, partial) == 0:
            continue
        time.sleep(pause)
        exe = build(apply_history_best(extraction.mod, extraction.tasks, partial, target=target), target)
        yield m, time_network(exe, extraction.network, target=target, repeat=repeat).median_ms


def evaluate(report: ModelReport, extraction, log: Path, start: float, target, repeat: int, pause: float,
             work: Path, checkpoints: tuple[float, ...] = CHECKPOINTS, default: Any = None) -> tuple[Any, Any, list]:
    """Time the builds along the tuning curve (minutes since the tuning command started, up to its last
    measurement; none without ``checkpoints``), the final tuned build and the default build (``default``,
    when already built); returns the tuned build, the default build and the tuned build's outputs."""
    from ..networks import apply_schedules, apply_history_best, build, profile_calls, run, time_network
    from ..log.records import load_records
    net = extraction.network
    minutes = (max((r.result.timestamp for r in load_records(log)), default=start) - start) / 60
    for point in tuning_curve(extraction, log, start, minutes, checkpoints, target, max(3, repeat // 2), pause,
                              work, report.name):
        report.curve.append(point)
        print(f"  {report.name}: after {point[0]:g} min {point[1]:.2f} ms", flush=True)
    tuned = build(apply_history_best(extraction.mod, extraction.tasks, log, target=target), target)
    time.sleep(pause)
    report.tuned_ms = time_network(tuned, net, target=target, repeat=repeat).median_ms
    time.sleep(pause)
    report.profile = profile_calls(tuned, net, target=target, repeat=repeat)
    if default is None:
        default = build(apply_schedules(extraction.mod, extraction.tasks, {}, target=target), target)
    time.sleep(pause)
    report.default_ms = time_network(default, net, target=target, repeat=repeat).median_ms
    report.curve.insert(0, (0.0, report.default_ms))  # before any tuning: every task's default schedule
    return tuned, default, run(tuned, net, net.random_inputs(0), target)


def alternate(report: ModelReport, tuned, default, extraction, onnx: Path, feed: dict, threads: int, rounds: int,
              repeat: int, pause: float, target, openvino_precision: str = "f32") -> None:
    """Time the tuned build, the default build, ONNX Runtime and OpenVINO (in ``openvino_precision``: its
    default for a bf16 run) in turn, ``rounds`` times. On a shared machine a burst of load can land on one
    timing of one contender; taken in turn, every contender meets the same bursts, and the per-round medians
    and wins are the comparison to trust."""
    from ..networks import time_network
    for _ in range(rounds):
        for name, executable in ((OURS, tuned), (DEFAULT, default)):
            time.sleep(pause)
            ms = time_network(executable, extraction.network, target=target, repeat=repeat).median_ms
            report.rounds.setdefault(name, []).append(ms)
        for peer in (onnxruntime_peer, lambda *a: openvino_peer(*a, precision=openvino_precision)):
            time.sleep(pause)
            result = peer(str(onnx), feed, threads, repeat)
            if not result.missing:
                report.rounds.setdefault(result.name, []).append(result.median_ms)


def breakdown(report: ModelReport, extraction, log: Path, target) -> None:
    """Per task: its time in the tuned build (from the call profile), alone (the full timing of the state
    the build runs, the log's fastest or the network-level selection's choice; NaN when it has none) and
    GFLOPS in the network (bf16: the task holds bf16 bits, so its products run on the bf16 unit); and the other
    functions the VM calls, by time."""
    from ..log.records import best_records, distinct_records, load_records
    from ..state.tensor_intrin import BF16_BITS
    records = load_records(log, target=target, selections=True)
    best = best_records(records)
    # Timed in full only: a probe's one run condemns a program the tuner took for slow, and a preempted one
    # read SqueezeNet's 0.02 ms Winograd input transform as 1.83 ms (in the network: 0.013 ms).
    alone = {(r.workload_key, r.steps): r for r in distinct_records(
        r for r in records if not r.result.in_network and len(r.result.costs) > 1)}
    profile = report.profile
    in_tasks = set()
    for t in extraction.tasks:
        rec = best.get(t.workload_key)
        if rec is None:
            continue
        in_tasks.update(t.global_vars)
        ms = sum(profile.ms.get(name, 0.0) for name in t.global_vars)
        measured = alone.get((t.workload_key, rec.steps))
        report.breakdown.append(TaskRow(t.name, t.weight, ms,
                                        t.weight * measured.result.mean_cost * 1e3 if measured else math.nan,
                                        t.weight * t.task.flop_ct / max(ms, 1e-9) / 1e6,
                                        BF16_BITS in t.task.compute_dag.buffer_dtypes.values()))
    report.breakdown.sort(key=lambda row: -row.network_ms)
    report.outside = sorted(((name, ms) for name, ms in profile.ms.items() if name not in in_tasks),
                            key=lambda kv: -kv[1])


def bench_model(name: str, onnx: Path, args: argparse.Namespace, target, threads: int, work: Path,
                torch_name: str | None) -> ModelReport:
    """Tune ``onnx`` (or read ``args.log``), then :func:`measure` it."""
    from ..networks import extract, load_onnx
    from ..task.precision import Precision
    report = ModelReport(name, precision=args.precision)
    log = Path(args.log) if args.log else work / f"{name}{Precision(args.precision).suffix}.json"
    start = time.time()
    if not args.log:
        print(f"{name}: tuning for up to {args.minutes:g} minutes ...", flush=True)
        report.tuning_s, report.trials, report.selection = tune(onnx, log, args.minutes, args.n_trials,
                                                                tune_flags(args))
    else:
        from ..log.records import load_records
        records = load_records(log)
        report.trials = len(records)
        start = min((r.result.timestamp for r in records), default=start)
        report.tuning_s = max((r.result.timestamp for r in records), default=start) - start
    extraction = extract(load_onnx(onnx), target, precision=Precision(args.precision))
    return measure(report, onnx, extraction, log, start, args, target, threads, work, torch_name)


def measure(report: ModelReport, onnx: Path, extraction, log: Path, start: float, args: argparse.Namespace,
            target, threads: int, work: Path, torch_name: str | None, checkpoints: tuple[float, ...] = CHECKPOINTS,
            default: Any = None) -> ModelReport:
    """Everything after tuning: the builds (:func:`evaluate`), the breakdown, the runtimes, MetaSchedule,
    the in-turn rounds and the outputs' agreement with ONNX Runtime's."""
    net = extraction.network
    name = report.name
    tuned, default, outputs = evaluate(report, extraction, log, start, target, args.repeat, args.pause, work,
                                       checkpoints, default)
    breakdown(report, extraction, log, target)
    feed = {spec.name: array for spec, array in zip(net.inputs, net.random_inputs(0))}
    ov_default = openvino_default_precision()
    for peer in (lambda: onnxruntime_peer(str(onnx), feed, threads, args.repeat),
                 lambda: openvino_peer(str(onnx), feed, threads, args.repeat),
                 lambda: (openvino_peer(str(onnx), feed, threads, args.repeat, ov_default)
                          if ov_default not in (None, "f32") else None),
                 lambda: torch_peer(torch_name, 1, threads, args.repeat) if torch_name else None):
        time.sleep(args.pause)
        result = peer()
        if result is not None:
            report.peers.append(result)
    if args.metaschedule:
        from ..networks import time_network
        exe, wall = tune_metaschedule(extraction, target, report.trials, str(work / f"{name}-metaschedule"))
        time.sleep(args.pause)
        ms = time_network(exe, extraction.network, target=target, repeat=args.repeat)
        report.peers.append(PeerResult(f"MetaSchedule, {report.trials} trials ({wall / 60:.0f} min)", ms.mean_ms,
                                       ms.median_ms))
    if args.rounds:
        alternate(report, tuned, default, extraction, onnx, feed, threads, args.rounds, args.repeat, args.pause,
                  target, ov_default if report.precision != "fp32" and ov_default else "f32")
    ort = next((p for p in report.peers if p.outputs is not None and p.name.startswith("ONNX")), None)
    if ort is not None:
        report.error_vs_ort = max_difference(outputs, ort.outputs)
        report.vs_ort = compare_all(outputs, ort.outputs, None if report.precision == "fp32" else BF16_VS_FP32_RTOL)
        report.reduced = [(p, max_difference(p.outputs, ort.outputs)) for p in report.peers
                          if p.precision != "f32" and p.outputs is not None]
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..arguments import (
        MINUTES, REPEATS, TRIALS, ExistingFile, Number, OutputDir, OutputFile, Text, add_precision_arg,
    )
    parser.add_argument("--target", choices=("host", "cuda"), default="host",
                        help="where the networks run: host (this CPU, against ONNX Runtime and OpenVINO; default) "
                             "or cuda (this machine's GPU, against TVM's default GPU build, PyTorch eager and "
                             "torch.compile: ansor/bench/gpu.py)")
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME", type=Text("a model name", "bert"),
                        help="built-in networks, exported from their PyTorch definitions (default: "
                             f"{' '.join(MODELS)}; needs the torch extra); with --zoo, the zoo's models "
                             "(default: all of them)")
    parser.add_argument("--zoo", action="store_true",
                        help="benchmark the model zoo (ansor/bench/zoo.py: 22 models of torchvision and Hugging "
                             "Face transformers; needs the zoo extra); resumable with --work-dir")
    parser.add_argument("--onnx", nargs="+", default=None, metavar="FILE", type=ExistingFile("an ONNX file", "m.onnx"),
                        help="ONNX files instead of --models")
    parser.add_argument("--minutes", type=MINUTES, default=10.0, help="ansor's tuning time per model (default 10)")
    parser.add_argument("--n-trials", type=TRIALS, default=100_000,
                        help="ansor's trial budget per model (default: large, so --minutes decides)")
    parser.add_argument("--no-pretrained", action="store_true",
                        help="tune from a cold start (ansor tune --no-pretrained): without the shipped pretrained "
                             "cost model and schedule database, which hold records of resnet-50, bert and "
                             "some zoo models (docs/pretrained.md)")
    add_precision_arg(parser)
    parser.add_argument("--log", default=None, type=ExistingFile("a tuning log", "logs/net.json"),
                        help="evaluate this tuning log instead of tuning (one model)")
    parser.add_argument("--metaschedule", action="store_true",
                        help="also tune with MetaSchedule at ansor's trial count (slow: minutes per 100 trials)")
    parser.add_argument("--plot", default=None, metavar="PNG", type=OutputFile("a PNG file path", "curves.png"),
                        help="draw latency against tuning minutes (needs matplotlib)")
    parser.add_argument("--work-dir", default=None, type=OutputDir("a work directory", "bench-work"),
                        help="ONNX files and logs (default: a temporary directory); with --zoo, a rerun with "
                             "the same directory tunes only the models not tuned yet")
    parser.add_argument("--reuse-timings", action="store_true",
                        help="with --zoo: a model tuned and timed by an earlier run with the same --minutes is "
                             "not timed again, its stored row goes into the table (each row's ratio is still "
                             "measured in turn within its own run)")
    parser.add_argument("--repeat", type=REPEATS, default=10, help="timing repeats of each build (default 10)")
    parser.add_argument("--pause", type=Number(0, 600, False, "3"), default=3.0,
                        help="seconds between timings (default 3)")
    parser.add_argument("--rounds", type=Number(0, 1000, True, "5"), default=5,
                        help="at the end, time the tuned build, ONNX Runtime and OpenVINO in turn this many "
                             "times (a shared machine's bursts of load then hit all alike; default 5, 0: skip)")
    parser.add_argument("--write-docs", default=None, metavar="ROOT", type=OutputDir("a checkout's root", "."),
                        help="also write the results as markdown into ROOT/docs/benchmarks.md (this CPU kind's "
                             "section is replaced) and the summary table of ROOT/README.md (with --zoo: the "
                             "zoo's section only)")


def run(args: argparse.Namespace) -> int:
    """The command without ``--zoo`` (that is :func:`.zoo_bench.run_zoo`): built-in networks or ONNX files."""
    try:
        return run_networks(args)
    except TuningFailed as err:
        print(err.detail, file=sys.stderr)
        raise


@dataclass(frozen=True)
class Setup:
    """What every model of one run shares: the host target, its threads, the work dir, the measured peak."""

    target: Any
    threads: int
    work: Path
    peak: Any


def setup(args: argparse.Namespace) -> Setup:
    """The host target, ``TVM_NUM_THREADS`` set to its physical cores before any kernel runs (ONNX Runtime,
    OpenVINO and PyTorch get as many), the work dir and the machine's peak; prints them."""
    from ..target import host_target
    target = host_target()
    if args.precision != "fp32":
        from ..sketch.tensor_rules import require_bf16_unit
        require_bf16_unit(target)
    threads = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ansor-bench-network-"))
    work.mkdir(parents=True, exist_ok=True)
    peak = measure_peak(threads)
    print(f"{cpu_description()}\n{peak.summary()}\nwork dir {work}", flush=True)
    return Setup(target, threads, work, peak)


def require_torch_definitions(names: Sequence[str], alternative: str = "") -> None:
    """An ``AnsorError`` naming the built-in networks among ``names`` without a PyTorch definition and those
    with one (``alternative``: what else the user may give, appended to the message)."""
    from ..networks.torch_baseline import TORCH_NETWORKS
    unknown = [m for m in names if m not in TORCH_NETWORKS]
    if unknown:
        raise AnsorError(f"no PyTorch definition of {', '.join(unknown)} (choose from {', '.join(TORCH_NETWORKS)})"
                         f"{alternative}")


def run_networks(args: argparse.Namespace) -> int:
    models_given = args.models or list(MODELS)
    if args.log and len(args.onnx or models_given) != 1:
        raise AnsorError("--log evaluates one model: give one --models name or one --onnx file")
    if args.reuse_timings:
        raise AnsorError("--reuse-timings reuses the model zoo's stored rows: it needs --zoo")
    if not args.onnx:
        require_torch_definitions(models_given, ", or give ONNX files with --onnx")

    at = setup(args)
    target, threads, work = at.target, at.threads, at.work
    models: list[tuple[str, Path, str | None]] = []  # name, ONNX file, the PyTorch definition it came from
    if args.onnx:
        models = [(Path(f).stem, Path(f), None) for f in args.onnx]
    else:
        from ..networks.torch_baseline import export_onnx
        for name in models_given:
            path = work / f"{name}.onnx"
            if not path.exists():
                export_onnx(name, 1, path)
            models.append((name, path, name))
    reports = [bench_model(name, path, args, target, threads, work, torch_name) for name, path, torch_name in models]
    for report in reports:
        print_report(report, at.peak, threads)
    if args.plot:
        plot(reports, args.plot)
    if args.write_docs:
        write_docs(Path(args.write_docs), reports, Provenance.here(cpu_description()), args)
    return 0
