"""Benchmark: a network tuned by ansor against the CPU inference runtimes, on the same ONNX file, in one run.

  python scripts/bench/bench_network.py                                # resnet-50, mobilenet-v2, bert; 10 min each
  python scripts/bench/bench_network.py --models resnet-50 --minutes 5 --plot curves.png
  python scripts/bench/bench_network.py --onnx model.onnx --minutes 10          # your own ONNX file
  python scripts/bench/bench_network.py --models resnet-50 --log logs/resnet-50.json   # no tuning: use a log
  python scripts/bench/bench_network.py --models resnet-50 --metaschedule      # also MetaSchedule, same trials

For each model:

1. The ONNX file: a built-in network's PyTorch definition (``ansor/networks/torch_baseline.py``) exported as
   a user exports theirs (NCHW, opset 17; needs the ``torch`` extra), or a file given with ``--onnx``.
2. ansor tunes it as a user would: ``scripts/tune_network.py --onnx FILE --minutes M`` in a subprocess.
3. Then, one after another in this process with pauses between (nothing else runs; TVM_NUM_THREADS, ONNX
   Runtime's and OpenVINO's threads and PyTorch's threads all equal this machine's physical cores): the
   build with the best schedules found after each checkpoint minute (the curve), the final tuned build, the
   default build (parallel + vectorized default schedules), ONNX Runtime, OpenVINO and PyTorch eager
   (the runtimes come with the ``bench`` extra; a missing one is reported, not faked). Every one computes in
   float32 as ansor does; where OpenVINO's default on this CPU is another precision (bfloat16 on CPUs with
   native bf16 arithmetic), it is timed that way too, as a row of its own that the ratios leave out.
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
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from peak import cpu_description, measure_peak
from peers import (PeerResult, max_difference, onnxruntime_peer, openvino_default_precision, openvino_peer,
                   torch_peer)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("resnet-50", "mobilenet-v2", "bert")
CHECKPOINTS = (1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60)
OURS = "ansor, tuned"  # the tuned build's row among the in-turn timings


@dataclass
class ModelReport:
    """Everything measured for one model."""

    name: str
    tuning_s: float = float("nan")
    trials: int = 0
    curve: list[tuple[float, float]] = field(default_factory=list)  # (minutes, ms)
    tuned_ms: float = float("nan")
    default_ms: float = float("nan")
    peers: list[PeerResult] = field(default_factory=list)
    breakdown: list[TaskRow] = field(default_factory=list)
    outside: list[tuple[str, float]] = field(default_factory=list)  # other functions the VM calls: name, ms
    profile: Any = None  # ansor.networks.CallProfile of the tuned build
    error_vs_ort: float = float("nan")
    rounds: dict[str, list[float]] = field(default_factory=dict)  # alternating timings: name -> ms per round
    reduced: list[tuple[PeerResult, float]] = field(default_factory=list)  # runtimes not in f32, their error


@dataclass(frozen=True)
class TaskRow:
    """One tuned task in the tuned build: its calls per inference, the milliseconds they take in the
    network (timed in place), the same calls timed alone during tuning (weight x best measurement), and
    the GFLOPS they reach in the network."""

    name: str
    weight: int
    network_ms: float
    alone_ms: float
    gflops: float


def tune(onnx: Path, log: Path, minutes: float, n_trials: int) -> tuple[float, int]:
    """``tune_network.py --onnx`` as a user runs it; returns (tuning seconds, trials) as it reports them."""
    cmd = [sys.executable, str(ROOT / "scripts" / "tune_network.py"), "--onnx", str(onnx), "--minutes", str(minutes),
           "--n-trials", str(n_trials), "--log-file", str(log), "--repeat", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tune_network.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found = re.search(r"^tuning: (\d+) new trials .* in (\d+\.\d+) s", proc.stderr, re.M)
    if found is None:
        raise SystemExit(f"tune_network.py did not print its 'tuning: N new trials ... in S s' line:\n"
                         f"{proc.stderr[-3000:]}")
    return float(found.group(2)), int(found.group(1))


def tune_metaschedule(extraction, target, trials: int, work_dir: str):
    """MetaSchedule's ``tune_relax`` on the module ansor tuned (same PrimFuncs, weights bound as constants,
    which its layout rewrite packs), best schedules applied with ``MetaScheduleApplyDatabase`` and built as
    ours are; returns (executable, wall seconds)."""
    from tvm import relax
    from tvm.s_tir.meta_schedule import relax_integration

    from ansor.networks import build

    t0 = time.time()
    database = relax_integration.tune_relax(extraction.mod, {}, target, work_dir, max_trials_global=trials,
                                            num_trials_per_iter=64)
    wall = time.time() - t0
    with target, database:
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(extraction.mod)
    return build(tuned, target), wall


def records_until(log: Path, deadline: float, out: Path) -> int:
    """Copy the records of ``log`` measured before ``deadline`` (unix time) to ``out``; returns how many."""
    from ansor.records import RecordWriter, load_records
    kept = [r for r in load_records(log) if r.result.timestamp <= deadline]
    out.unlink(missing_ok=True)
    with RecordWriter(out) as writer:
        for r in kept:
            writer.write_record(r.task, r.steps, r.result)
    return len(kept)


def evaluate(report: ModelReport, extraction, log: Path, start: float, target, repeat: int, pause: float,
             work: Path) -> tuple[Any, list]:
    """Time the builds along the tuning curve (minutes since the tuning command started, up to its last
    measurement), the final tuned build and the default build; returns the tuned build and its outputs."""
    from ansor.networks import apply_best, apply_history_best, build, profile_calls, run, time_network
    from ansor.records import load_records
    net = extraction.network
    minutes = (max((r.result.timestamp for r in load_records(log)), default=start) - start) / 60
    for m in [c for c in CHECKPOINTS if c < minutes] + [minutes]:
        partial = work / f"{report.name}-{m}min.json"
        if records_until(log, start + m * 60, partial) == 0:
            continue
        time.sleep(pause)
        exe = build(apply_history_best(extraction.mod, extraction.tasks, partial, target=target), target)
        report.curve.append((m, time_network(exe, net, target=target, repeat=max(3, repeat // 2)).median_ms))
        print(f"  {report.name}: after {m:g} min {report.curve[-1][1]:.2f} ms", flush=True)
    tuned = build(apply_history_best(extraction.mod, extraction.tasks, log, target=target), target)
    time.sleep(pause)
    report.tuned_ms = time_network(tuned, net, target=target, repeat=repeat).median_ms
    time.sleep(pause)
    report.profile = profile_calls(tuned, net, target=target, repeat=repeat)
    default = build(apply_best(extraction.mod, extraction.tasks, {}, target=target), target)
    time.sleep(pause)
    report.default_ms = time_network(default, net, target=target, repeat=repeat).median_ms
    report.curve.insert(0, (0.0, report.default_ms))  # before any tuning: every task's default schedule
    return tuned, run(tuned, net, net.random_inputs(0), target)


def alternate(report: ModelReport, tuned, extraction, onnx: Path, feed: dict, threads: int, rounds: int,
              repeat: int, pause: float, target) -> None:
    """Time the tuned build, ONNX Runtime and OpenVINO in turn, ``rounds`` times. On a shared machine a burst
    of load can land on one timing of one contender; taken in turn, every contender meets the same bursts,
    and the per-round medians and wins are the comparison to trust."""
    from ansor.networks import time_network
    for _ in range(rounds):
        time.sleep(pause)
        ms = time_network(tuned, extraction.network, target=target, repeat=repeat).median_ms
        report.rounds.setdefault(OURS, []).append(ms)
        for peer in (onnxruntime_peer, openvino_peer):
            time.sleep(pause)
            result = peer(str(onnx), feed, threads, repeat)
            if not result.missing:
                report.rounds.setdefault(result.name, []).append(result.median_ms)


def breakdown(report: ModelReport, extraction, log: Path, target) -> None:
    """Per task: its time in the tuned build (from the call profile), alone (the log's best records) and
    GFLOPS in the network; and the other functions the VM calls, by time."""
    from ansor.records import best_records, load_records
    best = best_records(load_records(log, target=target))
    profile = report.profile
    in_tasks = set()
    for t in extraction.tasks:
        rec = best.get(t.workload_key)
        if rec is None:
            continue
        in_tasks.update(t.global_vars)
        ms = sum(profile.ms.get(name, 0.0) for name in t.global_vars)
        report.breakdown.append(TaskRow(t.name, t.weight, ms, t.weight * rec.result.mean_cost * 1e3,
                                        t.weight * t.task.flop_ct / max(ms, 1e-9) / 1e6))
    report.breakdown.sort(key=lambda row: -row.network_ms)
    report.outside = sorted(((name, ms) for name, ms in profile.ms.items() if name not in in_tasks),
                            key=lambda kv: -kv[1])


def print_report(report: ModelReport, peak_gflops: float, threads: int) -> None:
    print(f"\n== {report.name} (batch 1, {threads} threads) ==")
    rows = [(f"ansor, tuned {report.tuning_s / 60:.1f} min / {report.trials} trials", report.tuned_ms),
            ("ansor, default build (untuned)", report.default_ms)]
    rows += [(p.name, p.median_ms) for p in report.peers if not p.missing]
    print(f"{'':<44}{'median ms':>10}{'ansor / this':>14}")
    for name, ms in rows:
        print(f"{name:<44}{ms:>10.2f}{report.tuned_ms / ms:>14.2f}")
    for p in report.peers:
        if p.missing:
            print(f"{p.name:<44}{'missing':>10}  ({p.missing})")
    fastest = min((p.median_ms for p in report.peers if not p.missing and p.precision == "f32"),
                  default=float("nan"))
    print(f"ansor / fastest float32 runtime: {report.tuned_ms / fastest:.2f}; ansor's output vs ONNX Runtime's: max "
          f"|difference| {report.error_vs_ort:.2e} of the output's scale")
    for peer, error in report.reduced:
        print(f"not in that ratio: {peer.name} computes in {peer.precision}, its output vs ONNX Runtime's: max "
              f"|difference| {error:.2e} of the output's scale")
    if report.rounds:
        ours = report.rounds[OURS]
        print(f"timed in turn, {len(ours)} rounds (ms per round; median):")
        for name, ms in report.rounds.items():
            print(f"  {name:<42}{' '.join(f'{m:7.2f}' for m in ms)}   median {np.median(ms):.2f}")
        peers = [ms for name, ms in report.rounds.items() if name != OURS]
        if peers:
            best = [min(round_ms) for round_ms in zip(*peers)]
            ratios = [a / b for a, b in zip(ours, best)]
            print(f"ansor / fastest float32 runtime, in turn: median of the rounds' ratios {np.median(ratios):.2f} "
                  f"({' '.join(f'{r:.2f}' for r in ratios)}); faster than every runtime in "
                  f"{sum(r < 1 for r in ratios)} of {len(ratios)} rounds")
    profile = report.profile
    print(f"where the tuned build's time goes, each call timed in place ({profile.latency_ms:.2f} ms per "
          f"inference unprobed):")
    print(f"{'task':<58}{'x':>4}{'ms':>8}{'share':>7}{'GFLOPS':>8}{'of peak':>8}{'alone ms':>9}")
    for row in report.breakdown[:15]:
        print(f"{row.name[:57]:<58}{row.weight:>4}{row.network_ms:>8.2f}{row.network_ms / profile.latency_ms:>7.1%}"
              f"{row.gflops:>8.1f}{row.gflops / peak_gflops:>8.2f}{row.alone_ms:>9.2f}")
    rest = report.breakdown[15:]
    if rest:
        print(f"{f'{len(rest)} more tasks':<58}{'':>4}{sum(r.network_ms for r in rest):>8.2f}"
              f"{'':>23}{sum(r.alone_ms for r in rest):>9.2f}")
    in_tasks = sum(r.network_ms for r in report.breakdown)
    alone = sum(r.alone_ms for r in report.breakdown)
    kernels = [(n, ms) for n, ms in report.outside if not n.startswith("vm.builtin")]
    builtins = sum(ms for n, ms in report.outside if n.startswith("vm.builtin"))
    top = ", ".join(f"{n} {ms:.2f}" for n, ms in kernels[:4])
    print(f"tuned tasks {in_tasks:.2f} ms in the network ({alone:.2f} ms timed alone during tuning); outside "
          f"them: {sum(ms for _, ms in kernels):.2f} ms in {len(kernels)} untuned functions ({top}), "
          f"{builtins:.2f} ms in VM builtins (allocation, shape checks), "
          f"{profile.latency_ms - in_tasks - sum(ms for _, ms in report.outside):.2f} ms between calls "
          f"(negative: the probe's own clock reads)")


def plot(reports: list[ModelReport], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(reports), figsize=(5 * len(reports), 4), squeeze=False)
    for ax, report in zip(axes[0], reports):
        if report.curve:
            ax.plot(*zip(*report.curve), "o-", label="ansor")
        for p, style in zip([p for p in report.peers if not p.missing], ("--", ":", "-.")):
            ax.axhline(p.median_ms, linestyle=style, color="gray", label=p.name)
        ax.set_title(report.name)
        ax.set_xlabel("tuning minutes")
        ax.set_ylabel("latency (ms)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"curve: {path}")


def bench_model(name: str, onnx: Path, args: argparse.Namespace, target, threads: int, work: Path,
                torch_name: str | None) -> ModelReport:
    from ansor.networks import extract, load_onnx
    report = ModelReport(name)
    log = Path(args.log) if args.log else work / f"{name}.json"
    start = time.time()
    if not args.log:
        print(f"{name}: tuning for up to {args.minutes:g} minutes ...", flush=True)
        report.tuning_s, report.trials = tune(onnx, log, args.minutes, args.n_trials)
    else:
        from ansor.records import load_records
        records = load_records(log)
        report.trials = len(records)
        start = min((r.result.timestamp for r in records), default=start)
        report.tuning_s = max((r.result.timestamp for r in records), default=start) - start
    net = load_onnx(onnx)
    extraction = extract(net, target)
    tuned, outputs = evaluate(report, extraction, log, start, target, args.repeat, args.pause, work)
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
        from ansor.networks import time_network
        exe, wall = tune_metaschedule(extraction, target, report.trials, str(work / f"{name}-metaschedule"))
        time.sleep(args.pause)
        ms = time_network(exe, extraction.network, target=target, repeat=args.repeat)
        report.peers.append(PeerResult(f"MetaSchedule, {report.trials} trials ({wall / 60:.0f} min)", ms.mean_ms,
                                       ms.median_ms))
    if args.rounds:
        alternate(report, tuned, extraction, onnx, feed, threads, args.rounds, args.repeat, args.pause, target)
    ort = next((p for p in report.peers if p.outputs is not None and p.name.startswith("ONNX")), None)
    if ort is not None:
        report.error_vs_ort = max_difference(outputs, ort.outputs)
        report.reduced = [(p, max_difference(p.outputs, ort.outputs)) for p in report.peers
                          if p.precision != "f32" and p.outputs is not None]
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME",
                        help="built-in networks, exported from their PyTorch definitions (default: "
                             f"{' '.join(MODELS)})")
    parser.add_argument("--onnx", nargs="+", default=None, metavar="FILE", help="ONNX files instead of --models")
    parser.add_argument("--minutes", type=float, default=10.0, help="ansor's tuning time per model (default 10)")
    parser.add_argument("--n-trials", type=int, default=100_000,
                        help="ansor's trial budget per model (default: large, so --minutes decides)")
    parser.add_argument("--log", default=None, help="evaluate this tuning log instead of tuning (one model)")
    parser.add_argument("--metaschedule", action="store_true",
                        help="also tune with MetaSchedule at ansor's trial count (slow: minutes per 100 trials)")
    parser.add_argument("--plot", default=None, metavar="PNG", help="draw latency against tuning minutes")
    parser.add_argument("--work-dir", default=None, help="ONNX files and logs (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=10, help="timing repeats of each build (default 10)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between timings (default 3)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="at the end, time the tuned build, ONNX Runtime and OpenVINO in turn this many "
                             "times (a shared machine's bursts of load then hit all alike; default 5, 0: skip)")
    args = parser.parse_args()
    if args.minutes <= 0 or args.repeat < 1 or args.n_trials < 1 or args.rounds < 0:
        print("error: --minutes, --repeat and --n-trials must be positive, --rounds at least 0", file=sys.stderr)
        return 2
    if args.log and len(args.onnx or args.models) != 1:
        print("error: --log evaluates one model: give one --models name or one --onnx file", file=sys.stderr)
        return 2

    if not args.onnx:
        from ansor.networks.torch_baseline import TORCH_NETWORKS
        unknown = [m for m in args.models if m not in TORCH_NETWORKS]
        if unknown:
            print(f"error: no PyTorch definition of {', '.join(unknown)} (choose from {', '.join(TORCH_NETWORKS)}), "
                  "or give ONNX files with --onnx", file=sys.stderr)
            return 2

    from ansor.target import host_target
    target = host_target()
    threads = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ansor-bench-network-"))
    work.mkdir(parents=True, exist_ok=True)
    peak = measure_peak(threads)
    print(f"{cpu_description()}\n{peak.summary()}\nwork dir {work}", flush=True)

    models: list[tuple[str, Path, str | None]] = []  # name, ONNX file, the PyTorch definition it came from
    if args.onnx:
        models = [(Path(f).stem, Path(f), None) for f in args.onnx]
    else:
        from ansor.networks.torch_baseline import export_onnx
        for name in args.models:
            path = work / f"{name}.onnx"
            if not path.exists():
                export_onnx(name, 1, path)
            models.append((name, path, name))
    reports = [bench_model(name, path, args, target, threads, work, torch_name) for name, path, torch_name in models]
    for report in reports:
        print_report(report, peak.gflops, threads)
    if args.plot:
        plot(reports, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
