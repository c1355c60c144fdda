"""How much a perfect search could still gain over the default build: a tuned network's ceiling.

A network's tuned vs default ratio cannot pass a bound set by the machine: its tiled kernels (the tasks with
a stage Ansor tiles in several levels: convolutions, matmuls) cannot run faster than the measured peak, and
the search cannot touch the VM's own work. This benchmark profiles the default and the tuned build of each
(ONNX model, log) in place, in turn (``ansor.networks.CallProfiler``), and reports the ratio now, the tiled
kernels' fraction of the peak in each build, and the ratio the network would reach if every tiled kernel
ran at 100 % or 90 % of the peak (a kernel already faster keeps its time), everything else as tuned.

  python scripts/bench/bench_headroom.py --pair densenet121.onnx densenet121.json --write-docs .

TVM_NUM_THREADS = this machine's physical cores; the peak is measured first (``ansor.bench.peak``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: Fractions of the peak the ceiling is reported at: 100 % no kernel reaches; the largest products and
#: 1x1 convolutions of DenseNet-121 and GoogLeNet run at 90-93 % of it in the network once tuned.
CEILING_FRACTIONS = (1.0, 0.9)


@dataclass(frozen=True)
class KernelTime:
    """One task's calls in one inference: the work and the milliseconds in each build."""

    name: str
    tiled: bool
    gflop: float
    default_ms: float
    tuned_ms: float


@dataclass(frozen=True)
class Headroom:
    """Where one network's default and tuned builds spend an inference, and the ceiling of their ratio."""

    name: str
    kernels: tuple[KernelTime, ...]
    default_ms: float  # every function the VM calls, summed (medians over the rounds)
    tuned_ms: float
    ratio: float  # median over the rounds of default / tuned, each round's two profiles in turn

    def tiled(self, build: str) -> float:
        """Milliseconds of the tiled kernels in ``build`` ("default" or "tuned")."""
        return sum(getattr(k, f"{build}_ms") for k in self.kernels if k.tiled)

    def fraction_of_peak(self, build: str, peak_gflops: float) -> float:
        """The tiled kernels' GFLOPS in ``build`` over the peak."""
        gflop = sum(k.gflop for k in self.kernels if k.tiled)
        return gflop / (self.tiled(build) / 1e3) / peak_gflops if self.tiled(build) else float("nan")

    def ceiling(self, peak_gflops: float, fraction: float = 1.0) -> float:
        """default / tuned if every tiled kernel ran at ``fraction`` of the peak (or kept its tuned time, when
        that is faster) and everything else took its tuned time."""
        bound = sum(min(k.tuned_ms, k.gflop / (peak_gflops * fraction) * 1e3) for k in self.kernels if k.tiled)
        return self.default_ms / (self.tuned_ms - self.tiled("tuned") + bound)


def profile_in_turn(executables: Sequence[Any], network, target, rounds: int, repeat: int) -> list[list[dict]]:
    """Each build's per-function milliseconds, one profile of ``repeat`` inferences per build per round, the
    builds in turn; ``[build][round] -> {function: ms}``."""
    from ..networks.evaluate import CallProfiler
    profilers = [CallProfiler(exe, network, target=target) for exe in executables]
    profiles: list[list[dict]] = [[] for _ in executables]
    for _ in range(rounds):
        for k, profiler in enumerate(profilers):
            profiles[k].append(profiler.profile(repeat).ms)
    return profiles


def headroom(name: str, extraction, default: list[dict], tuned: list[dict]) -> Headroom:
    """The :class:`Headroom` of ``extraction`` from in-turn profiles of its default and tuned builds."""
    def median(profiles: list[dict], function: str) -> float:
        return statistics.median(p.get(function, 0.0) for p in profiles)

    kernels = tuple(
        KernelTime(t.name, any(s.needs_multi_level_tiling for s in t.task.compute_dag.stages),
                   t.weight * t.task.flop_ct / 1e9, sum(median(default, g) for g in t.global_vars),
                   sum(median(tuned, g) for g in t.global_vars))
        for t in extraction.tasks)
    functions = set().union(*default, *tuned)
    ratio = statistics.median(sum(d.values()) / sum(t.values()) for d, t in zip(default, tuned))
    return Headroom(name, kernels, sum(median(default, f) for f in functions),
                    sum(median(tuned, f) for f in functions), ratio)


def measure(name: str, extraction, log: Path, target, rounds: int, repeat: int) -> Headroom:
    """Build ``extraction`` with default schedules and with ``log``'s best, profile both in turn."""
    from ..networks import apply_history_best, apply_schedules, build
    builds = [build(apply_schedules(extraction.mod, extraction.tasks, {}, target=target), target),
              build(apply_history_best(extraction.mod, extraction.tasks, log, target=target), target)]
    default, tuned = profile_in_turn(builds, extraction.network, target, rounds, repeat)
    return headroom(name, extraction, default, tuned)


def table(results: Sequence[Headroom], peak_gflops: float) -> str:
    from .docs import markdown_table
    rows = [[h.name, f"{h.default_ms:.2f}", f"{h.tuned_ms:.2f}", f"**{h.ratio:.2f}x**",
             f"{h.tiled('tuned') / h.tuned_ms:.0%}",
             f"{h.fraction_of_peak('default', peak_gflops):.0%} / {h.fraction_of_peak('tuned', peak_gflops):.0%}",
             *(f"{h.ceiling(peak_gflops, f):.2f}x" for f in CEILING_FRACTIONS)] for h in results]
    return markdown_table(["model", "default ms", "tuned ms", "tuned vs default, in turn",
                           "tiled kernels' share of tuned", "tiled kernels of peak: default / tuned",
                           *(f"ceiling at {f:.0%} of peak" for f in CEILING_FRACTIONS)], rows, "<>>>>>>>")


def markdown(results: Sequence[Headroom], peak_summary: str, peak_gflops: float, cpu: str, rounds: int,
             repeat: int) -> str:
    from .docs import Provenance
    prov = Provenance.here(cpu, script="scripts/bench/bench_headroom.py")
    return (f"## Headroom: how far the search could still take the tuned build\n\n{prov.markdown()}- {peak_summary}\n\n"
            f"{table(results, peak_gflops)}\n\nMilliseconds are the in-place profiles' sums of every function the "
            f"VM calls, the median over {rounds} rounds of {repeat} inferences, the two builds profiled in turn; "
            "the ratio is the median of the rounds' ratios. Tiled kernels: the tasks with a stage Ansor tiles "
            "in several levels (convolutions, matmuls). A ceiling: the ratio if every tiled kernel ran at that "
            "fraction of the measured peak (or kept its tuned time when faster), everything else as tuned.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, action="append", required=True, type=Path, metavar=("ONNX", "LOG"),
                        help="an ONNX model and its tuning log (repeat for more models)")
    parser.add_argument("--rounds", type=int, default=5, help="profiles of each build, in turn (default 5)")
    parser.add_argument("--repeat", type=int, default=10, help="inferences per profile (default 10)")
    parser.add_argument("--write-docs", type=Path, default=None, metavar="ROOT",
                        help="write the table into ROOT/docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        parser.error(f"--rounds and --repeat must be at least 1 (got {args.rounds} and {args.repeat})")
    missing = [str(p) for pair in args.pair for p in pair if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")

    from ..errors import AnsorError, short_message
    from ..networks import extract, load_onnx
    from ..target import host_target
    from .docs import section_key, write_section
    from .peak import cpu_description, measure_peak
    target = host_target()
    threads = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)
    extractions = []
    for onnx, _ in args.pair:  # every model imports before anything is timed
        try:
            extractions.append(extract(load_onnx(onnx), target))
        except AnsorError as error:
            print(f"error: {onnx}: {short_message(error, pick='joined')}", file=sys.stderr)
            return 2
    cpu = cpu_description()
    peak = measure_peak(threads)
    print(f"{cpu}\n{peak.summary()}", flush=True)
    results = []
    for (onnx, log), extraction in zip(args.pair, extractions):
        results.append(measure(onnx.stem, extraction, log, target, args.rounds, args.repeat))
        h = results[-1]
        print(f"{h.name}: default {h.default_ms:.2f} ms, tuned {h.tuned_ms:.2f} ms, {h.ratio:.2f}x in turn; "
              + ", ".join(f"ceiling at {f:.0%} of peak {h.ceiling(peak.gflops, f):.2f}x" for f in CEILING_FRACTIONS),
              flush=True)
    print(table(results, peak.gflops))
    if args.write_docs:
        write_section(args.write_docs / "docs" / "benchmarks.md", section_key("headroom", cpu),
                      markdown(results, peak.summary(), peak.gflops, cpu, args.rounds, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
