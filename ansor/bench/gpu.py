"""``ansor bench --target cuda``: networks tuned for this machine's GPU, timed in turn against TVM's default
GPU build, PyTorch eager and ``torch.compile``.

Per model (a built-in network with a PyTorch definition; resnet-50 unless ``--models`` says otherwise):

1. ``ansor tune --network NAME --target cuda --minutes M`` in a subprocess, as a user runs it (or the log
   given with ``--log``); the log gives the trials, the failed ones and the trials a minute.
2. In this process, the tuned build and the default build (dlight's schedules), both launched as one CUDA
   graph, their outputs compared.
3. The tuned build, the default build, PyTorch eager and ``torch.compile`` (its default mode) timed one
   after another, ``--rounds`` times, each round starting with the next one: float32 everywhere, TF32 off
   in PyTorch (ansor computes in float32). The medians of the rounds and ansor's ratio to each are printed;
   ``--write-docs`` writes them as this GPU's section of docs/benchmarks.md.

PyTorch comes with the torch extra (with CUDA); without it, or where it sees no GPU, its rows are reported
missing, not faked.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import AnsorError, short_message
from ..networks.network import NetworkError
from .docs import Provenance, markdown_table, section_key, write_section
from .in_turn import in_turn
from .network import require_torch_definitions, tune
from .peak import cpu_description

OURS = "ansor, tuned"
DEFAULT = "TVM default (dlight)"
#: The PyTorch rows, by :data:`~ansor.networks.torch_baseline.TORCH_MODES`.
TORCH_ROWS = {"eager": "PyTorch eager", "torch.compile": "torch.compile"}
#: ``ansor bench`` flags this mode does not take: (attribute, its value when not given, what it is for).
CPU_ONLY_FLAGS = (("zoo", False, "--zoo"), ("onnx", None, "--onnx"), ("metaschedule", False, "--metaschedule"),
                  ("plot", None, "--plot"), ("reuse_timings", False, "--reuse-timings"))


@dataclass
class GpuReport:
    """One model's run: its tuning and the contenders' milliseconds, one entry per round."""

    name: str
    tuning_s: float = 0.0
    trials: int = 0
    failed: int = 0
    outputs_agree: str = ""  # the tuned build's outputs against the default build's, as printed
    rounds: dict[str, list[float]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # contender -> why it was not timed

    def median(self, name: str) -> float:
        return statistics.median(self.rounds[name]) if self.rounds.get(name) else math.nan

    @property
    def trials_a_minute(self) -> float:
        return self.trials / (self.tuning_s / 60) if self.tuning_s else math.nan


def check_flags(args: argparse.Namespace) -> list[str]:
    """The models to run; one ``AnsorError`` naming the first flag this mode cannot honour."""
    from ..networks.torch_baseline import TORCH_NETWORKS
    for attr, unset, flag in CPU_ONLY_FLAGS:
        if getattr(args, attr, unset) != unset:
            raise AnsorError(f"{flag} is for CPU benchmarks; --target cuda tunes built-in networks "
                             f"({', '.join(TORCH_NETWORKS)}) and times them against PyTorch on the GPU")
    if args.precision != "fp32":
        raise AnsorError("--target cuda benchmarks float32 only (bf16 is for CPUs with bf16 units)")
    models = args.models or ["resnet-50"]
    if args.log and len(models) != 1:
        raise AnsorError("--log evaluates one model: give one --models name")
    require_torch_definitions(models)
    return models


def local_gpu() -> tuple[str, str]:
    """This machine's first CUDA GPU: (its name, ``sm_XY``); an ``AnsorError`` when TVM finds none."""
    import tvm
    dev = tvm.cuda(0)
    if not dev.exist:
        raise AnsorError("--target cuda times the tuned network on this machine's GPU, and TVM finds no CUDA "
                         "device here; run it on the GPU machine")
    return dev.device_name, "sm_" + dev.compute_version.replace(".", "")


def log_summary(log: Path) -> tuple[int, int, float]:
    """(trials, failed trials, seconds from the first measurement to the last) of a tuning log: every record
    counts, a failure is any error code."""
    from ..log.records import load_records
    records = load_records(log)
    stamps = [r.result.timestamp for r in records]
    return len(records), sum(1 for r in records if not r.result.ok), max(stamps, default=0) - min(stamps, default=0)


def bench_gpu_model(name: str, args: argparse.Namespace, target, work: Path) -> GpuReport:
    """Tune ``name`` for ``target`` (this GPU's), build, check and time it in turn with the others (module
    docstring). PyTorch runs where the target's code runs: on the GPU, or on the CPU for a CPU target."""
    from ..networks import (
        apply_history_best, apply_schedules, build, compare_outputs, extract, get_network, time_network,
    )
    from ..networks.torch_baseline import TORCH_MODES, TorchBaseline, TorchUnavailableError, torch_available
    report = GpuReport(name)
    if args.log:  # evaluate a log: its trials, its failures, its span
        log = Path(args.log)
        report.trials, report.failed, report.tuning_s = log_summary(log)
    else:
        log = work / f"{name}-{target.kind.name}.json"
        print(f"{name}: tuning for up to {args.minutes:g} minutes for {target.kind.name} ...", flush=True)
        flags = ["--target", str(target), "--no-eval"] + (["--no-pretrained"] if args.no_pretrained else [])
        report.tuning_s, _, _ = tune(Path(name), log, args.minutes, args.n_trials, flags)
        report.trials, report.failed, _ = log_summary(log)
    extraction = extract(get_network(name, 1), target)
    net = extraction.network
    tuned = build(apply_history_best(extraction.mod, extraction.tasks, str(log), target=target), target)
    default = build(apply_schedules(extraction.mod, extraction.tasks, {}, target=target), target)
    agree = compare_outputs(net, tuned, default, target, rtol=extraction.output_rtol)
    report.outputs_agree = (f"{'equal' if agree.ok else 'DIFFERENT'} (max |difference| {agree.max_abs_error:.3g}, "
                            f"allowed {agree.allowed:.3g})")
    contenders: dict[str, Callable[[], float]] = {
        OURS: lambda: time_network(tuned, net, target=target, repeat=args.repeat).median_ms,
        DEFAULT: lambda: time_network(default, net, target=target, repeat=args.repeat).median_ms,
    }
    device = "cuda" if target.kind.name == "cuda" else "cpu"
    threads = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    for mode in TORCH_MODES:
        row = TORCH_ROWS[mode]
        if not torch_available():
            report.missing[row] = "PyTorch is not installed (pip install -e '.[torch]')"
            continue
        try:
            baseline = TorchBaseline(name, 1, device=device, mode=mode)
            baseline.time(threads, repeat=1)  # torch.compile compiles here, not in the first round
        except (TorchUnavailableError, NetworkError) as err:  # no GPU for PyTorch; no definition of name
            report.missing[row] = str(err)
            continue
        except Exception as err:  # PyTorch's own failure (torch.compile without Triton, say): the row says so
            report.missing[row] = f"{mode} failed: {short_message(err)}"
            continue
        contenders[row] = lambda b=baseline: b.time(threads, repeat=args.repeat).median_ms
    report.rounds = in_turn(contenders, max(1, args.rounds), args.pause)
    return report


def print_gpu_report(report: GpuReport) -> None:
    ours = report.median(OURS)
    print(f"\n{report.name}: {report.trials} trials in {report.tuning_s / 60:.1f} min "
          f"({report.trials_a_minute:.0f} a minute), {report.failed} failed; tuned vs default build: "
          f"{report.outputs_agree}")
    for name in report.rounds:
        ms = report.median(name)
        ratio = "" if name == OURS else f"ansor / this {ours / ms:5.2f}"
        rounds = ", ".join(f"{x:.3f}" for x in report.rounds[name])
        print(f"  {name:<22} {ms:8.3f} ms  {ratio:<17}  (rounds: {rounds})")
    for name, why in report.missing.items():
        print(f"  {name:<22} not timed: {why}")


def gpu_markdown(reports: list[GpuReport], provenance: Provenance, minutes: float) -> str:
    header = ("model", "trials (a minute)", "failed", *(f"{n} (ms)" for n in (OURS, DEFAULT, *TORCH_ROWS.values())),
              *(f"ansor / {n}" for n in (DEFAULT, *TORCH_ROWS.values())))
    rows = []
    for r in reports:
        ms = [r.median(n) for n in (OURS, DEFAULT, *TORCH_ROWS.values())]
        rows.append((r.name, f"{r.trials} ({r.trials_a_minute:.0f})", str(r.failed),
                     *("-" if math.isnan(x) else f"{x:.3f}" for x in ms),
                     *("-" if math.isnan(x) else f"{ms[0] / x:.2f}" for x in ms[1:])))
    table = markdown_table(header, rows, "<" + ">" * (len(header) - 1))
    return (f"## Networks on the GPU after {minutes:g} minutes of tuning each\n\n{provenance.markdown()}\n{table}\n\n"
            "Medians of the rounds timed in turn; float32 everywhere (TF32 off in PyTorch); the TVM builds launch "
            "as one CUDA graph. Below 1.00, ansor is faster.\n")


def run_gpu(args: argparse.Namespace) -> int:
    """The command with ``--target cuda``."""
    from ..target import physical_cores
    models = check_flags(args)
    gpu, arch = local_gpu()
    # Before any kernel runs here: TVM's CPU runtime pins this process to its first TVM_NUM_THREADS cores
    # (half of them by default), and the next model's tuning subprocess would inherit that.
    os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ansor-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"GPU: {gpu} ({arch}); host {cpu_description()}\nwork dir {work}", flush=True)
    from ..target import parse_target
    target = parse_target({"kind": "cuda", "arch": arch})
    reports = [bench_gpu_model(name, args, target, work) for name in models]
    for report in reports:
        print_gpu_report(report)
    if args.write_docs:
        path = Path(args.write_docs) / "docs" / "benchmarks.md"
        provenance = Provenance.here(f"GPU: {gpu} ({arch}); host {cpu_description()}")
        write_section(path, section_key("gpu", gpu), gpu_markdown(reports, provenance, args.minutes))
        print(f"wrote {path}")
    return 0
