"""What ``ansor bench`` measured for each model, printed as a report and written as markdown."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..task.precision import Precision
from .docs import Provenance, markdown_table, section_key, write_section
from .peak import Peak
from .peers import PeerResult

OURS = "ansor, tuned"  # the tuned build's row among the in-turn timings
DEFAULT = "ansor, default build"  # the untuned build's row among them (not a runtime to compare with)


def peers_label(precision: str) -> str:
    """What ansor's ratio is taken against in a run in ``precision``, for a line of text."""
    return "fastest float32 runtime" if precision == "fp32" else "fastest runtime (its default precision)"


@dataclass
class ModelReport:
    """Everything measured for one model."""

    name: str
    precision: str = "fp32"  # what ansor computed in (--precision): which runtimes its ratio is taken against
    tuning_s: float = float("nan")
    trials: int = 0
    selection: str = ""  # ansor tune's network-level selection line
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
    vs_ort: Any = None  # every output against ONNX Runtime's: an ansor.networks.OutputComparison, or None

    def in_turn_ratios(self) -> list[float]:
        """Each round's ansor / fastest runtime (of that round), from the in-turn timings; [] without peers."""
        peers = [ms for name, ms in self.rounds.items() if name not in (OURS, DEFAULT)]
        if OURS not in self.rounds or not peers:
            return []
        return [a / min(round_ms) for a, round_ms in zip(self.rounds[OURS], zip(*peers))]

    def tuned_vs_default(self) -> float:
        """How many times faster the tuned build is than the default build: the median of the rounds' ratios
        where both were timed in turn (the host may change speed between two one-after-another timings:
        DenseNet-121 read 0.91x so, 1.2x in turn), else the one-after-another ratio."""
        if OURS in self.rounds and DEFAULT in self.rounds:
            return float(np.median([d / t for t, d in zip(self.rounds[OURS], self.rounds[DEFAULT])]))
        return self.default_ms / self.tuned_ms

    def fastest_peer(self) -> Optional[PeerResult]:
        """The fastest runtime of the one-after-another timings that ansor is compared with, if any ran: in
        fp32 the float32 ones; in bf16 every one in its default precision (what a user gets), so not the f32
        row of a runtime timed at another default too (OpenVINO's f32 beat its bf16 default on a Xeon without
        AMX, whose bf16 unit runs at half the FMA's rate)."""
        ran = [p for p in self.peers if not p.missing]
        if self.precision == "fp32":
            peers = [p for p in ran if p.precision == "f32"]
        else:
            other_default = {p.runtime for p in ran if p.precision != "f32"}
            peers = [p for p in ran if p.precision != "f32" or p.runtime not in other_default]
        return min(peers, key=lambda p: p.median_ms) if peers else None

    @property
    def peers_label(self) -> str:
        """What :meth:`fastest_peer` is, for a line of text."""
        return peers_label(self.precision)

    def in_network_over_alone(self) -> float:
        """The tuned tasks' time in the network over their time alone during tuning (the tasks whose state
        the build runs was timed in full alone)."""
        rows = [r for r in self.breakdown if math.isfinite(r.alone_ms)]
        alone = sum(r.alone_ms for r in rows)
        return sum(r.network_ms for r in rows) / alone if alone else float("nan")


@dataclass(frozen=True)
class TaskRow:
    """One tuned task in the tuned build: its calls per inference, the milliseconds they take in the
    network (timed in place), the same calls timed alone during tuning (weight x the state's full timing;
    NaN when it was only probed), the GFLOPS they reach in the network, and whether its products run on
    the bf16 unit (its "of peak" is then against the bf16 peak)."""

    name: str
    weight: int
    network_ms: float
    alone_ms: float
    gflops: float
    bf16: bool = False

    def of_peak(self, peak: Peak) -> float:
        """Its GFLOPS over the peak of the unit it computes on."""
        return self.gflops / (peak.bf16_gflops if self.bf16 and peak.bf16_gflops else peak.gflops)


def _finite_sum(values) -> float:
    return sum(v for v in values if math.isfinite(v))


def _ms(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "-"


def print_report(report: ModelReport, peak: Peak, threads: int) -> None:
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
    fastest = report.fastest_peer()
    print(f"ansor / {report.peers_label}: {report.tuned_ms / (fastest.median_ms if fastest else np.nan):.2f}; "
          f"ansor's output vs ONNX Runtime's: max "
          f"|difference| {report.error_vs_ort:.2e} of the output's scale")
    for peer, error in report.reduced:
        where = "not in that ratio: " if report.precision == "fp32" else ""
        print(f"{where}{peer.name} computes in {peer.precision}, its output vs ONNX Runtime's: max "
              f"|difference| {error:.2e} of the output's scale")
    if report.rounds:
        print(f"timed in turn, {len(report.rounds[OURS])} rounds (ms per round; median):")
        for name, ms in report.rounds.items():
            print(f"  {name:<42}{' '.join(f'{m:7.2f}' for m in ms)}   median {np.median(ms):.2f}")
        ratios = report.in_turn_ratios()
        if ratios:
            print(f"ansor / {report.peers_label}, in turn: median of the rounds' ratios {np.median(ratios):.2f} "
                  f"({' '.join(f'{r:.2f}' for r in ratios)}); faster than every runtime in "
                  f"{sum(r < 1 for r in ratios)} of {len(ratios)} rounds")
        if DEFAULT in report.rounds:
            print(f"tuned vs default build, in turn: {report.tuned_vs_default():.2f}x (median of the rounds' ratios)")
    if report.selection:
        last = f" (the build of every task's fastest measured state: {report.curve[-1][1]:.2f} ms, last point of " \
               "the curve)" if len(report.curve) > 1 else ""
        print(f"{report.selection}{last}")
    profile = report.profile
    print(f"where the tuned build's time goes, each call timed in place ({profile.latency_ms:.2f} ms per "
          f"inference unprobed):")
    print(f"{'task':<58}{'x':>4}{'ms':>8}{'share':>7}{'GFLOPS':>8}{'of peak':>8}{'alone ms':>9}")
    for row in report.breakdown[:15]:
        print(f"{row.name[:57]:<58}{row.weight:>4}{row.network_ms:>8.2f}{row.network_ms / profile.latency_ms:>7.1%}"
              f"{row.gflops:>8.1f}{row.of_peak(peak):>8.2f}{_ms(row.alone_ms):>9}")
    rest = report.breakdown[15:]
    if rest:
        print(f"{f'{len(rest)} more tasks':<58}{'':>4}{sum(r.network_ms for r in rest):>8.2f}"
              f"{'':>23}{_ms(_finite_sum(r.alone_ms for r in rest)):>9}")
    in_tasks = sum(r.network_ms for r in report.breakdown)
    alone = _finite_sum(r.alone_ms for r in report.breakdown)
    unknown = sum(not math.isfinite(r.alone_ms) for r in report.breakdown)
    kernels = [(n, ms) for n, ms in report.outside if not n.startswith("vm.builtin")]
    builtins = sum(ms for n, ms in report.outside if n.startswith("vm.builtin"))
    top = ", ".join(f"{n} {ms:.2f}" for n, ms in kernels[:4])
    probed = f"; {unknown} tasks' states only probed, not timed in full" if unknown else ""
    print(f"tuned tasks {in_tasks:.2f} ms in the network ({alone:.2f} ms timed alone during tuning{probed}); outside "
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


#: The columns every table of tuned models shares (``ansor bench`` and its zoo), after the model's own.
RESULT_HEADER = ("ansor ms", "fastest f32 runtime", "ansor / fastest, in turn", "rounds won", "default build ms",
                 "tuned vs default", "trials", "in network / alone")
RESULT_ALIGN = ">>>>>>>>"
#: What the tables' columns mean, said once under each.
RESULT_NOTE = ("Each model: batch 1, float32, every contender with this machine's physical cores as threads; "
               "\"in turn\" is the median of the per-round ratios of the tuned build, ONNX Runtime and OpenVINO "
               "timed one after another; \"tuned vs default\" likewise where it says \"in turn\" (the default "
               "build in the same rounds), else the two builds timed one after the other; "
               "\"in network / alone\" is the tuned tasks' time inside the network over their time alone during "
               "tuning, over the tasks whose state was timed in full alone (not only probed by one run).")


#: The note under a bf16 table, instead of :data:`RESULT_NOTE`'s first sentence.
_BF16_NOTE = ("Each model: batch 1, ansor in {precision} (convolutions' and dense layers' inputs rounded to bf16, "
              "sums fp32{stored}), every runtime in its default precision on this CPU (OpenVINO's is bf16 where "
              "the CPU has native bf16), all with this machine's physical cores as threads; \"output vs ONNX "
              "Runtime\" is ansor's error against ONNX Runtime's float32 output (OpenVINO's bf16 error: beside "
              "it in the zoo's table, and printed by every run). "
              + RESULT_NOTE.split("; ", 1)[1])


def bf16_note(precision: str) -> str:
    """The note under a table of bf16 runs: what ansor computes in ``precision``, against what."""
    stored = ("; every activation those layers read stored in bf16, as OpenVINO stores them"
              if precision == "bf16-stored" else "")
    return _BF16_NOTE.format(precision=precision, stored=stored)


def result_header(precision: str) -> tuple[str, ...]:
    """:data:`RESULT_HEADER` for a run in ``precision`` (bf16 runs are compared with every runtime)."""
    if precision == "fp32":
        return RESULT_HEADER
    return tuple("fastest runtime" if h == "fastest f32 runtime" else h for h in RESULT_HEADER)


def result_cells(r: ModelReport) -> tuple[tuple[str, ...], float]:
    """One model's cells under :data:`RESULT_HEADER`, and its ratio to :meth:`ModelReport.fastest_peer` (the in-turn
    median, else the one-after-another ratio; NaN without a runtime)."""
    turn = r.in_turn_ratios()
    fastest = r.fastest_peer()
    ratio = float(np.median(turn)) if turn else (r.tuned_ms / fastest.median_ms if fastest else float("nan"))
    cells = (f"{r.tuned_ms:.2f}", f"{fastest.name} {fastest.median_ms:.2f}" if fastest else "none",
             f"**{ratio:.2f}**", f"{sum(x < 1 for x in turn)} of {len(turn)}" if turn else "-",
             f"{r.default_ms:.2f}", f"{r.tuned_vs_default():.2f}x" + (" in turn" if DEFAULT in r.rounds else ""),
             str(r.trials),
             _ms(r.in_network_over_alone()))
    return cells, ratio


def geometric_mean(ratios: list[float]) -> tuple[float, int]:
    """The geometric mean of the finite ratios (models that ran), and how many there were."""
    finite = [x for x in ratios if np.isfinite(x)]
    return (float(np.exp(np.mean(np.log(finite)))) if finite else float("nan")), len(finite)


def summary_row(model: str, cells: tuple[str, ...]) -> tuple[str, str, str]:
    """A model's row of the README's summary, from its cells under :data:`RESULT_HEADER`."""
    return model, cells[RESULT_HEADER.index("ansor / fastest, in turn")], cells[RESULT_HEADER.index("tuned vs default")]


def write_summary(root: Path, what: str, rows: list[tuple[str, str, str]], geomean: float,
                  provenance: Provenance, source: str = "") -> None:
    """The short table of ``root/README.md`` between its ``generated: network-summary`` markers, when it has
    them: the latest run of either benchmark (``what`` names it), one :func:`summary_row` per model.
    ``source``: how the table was made, when not by the one command of ``provenance``."""
    readme = root / "README.md"
    if readme.exists() and "<!-- generated: network-summary -->" in readme.read_text():
        short = markdown_table(("model", "ansor / fastest f32 runtime", "tuned vs default"), rows, "<>>")
        source = source or f"{provenance.date}, `{provenance.command}`"
        write_section(readme, "network-summary",
                      f"{what}; {provenance.cpu}; {source}:\n\n{short}\n\n"
                      f"Geometric mean **{geomean:.2f}**. All figures: [docs/benchmarks.md](docs/benchmarks.md).")


def write_docs(root: Path, reports: list[ModelReport], provenance: Provenance, args: argparse.Namespace) -> None:
    """This run's table as this CPU kind's section of ``root/docs/benchmarks.md``, and as the summary of
    ``root/README.md`` (between its ``generated: network-summary`` markers, when it has them)."""
    precision = Precision(args.precision)  # the run's: every report's
    bf16 = precision is not Precision.FP32
    header = ("model", *result_header(precision.value), "output vs ONNX Runtime")
    rows, ratios, summary = [], [], []
    for r in reports:
        cells, ratio = result_cells(r)
        ratios.append(ratio)
        rows.append((r.name, *cells, f"{r.error_vs_ort:.1e}"))
        summary.append(summary_row(r.name, cells))
    geomean, count = geometric_mean(ratios)
    table = markdown_table(header, rows, f"<{RESULT_ALIGN}>")
    what = f"Networks{' in ' + precision.value if bf16 else ''} after {args.minutes:g} minutes of tuning each"
    body = (f"## {what}\n\n{provenance.markdown()}\n{table}\n\n"
            f"Geometric mean of ansor / {peers_label(precision.value)}: **{geomean:.2f}** over {count} models. "
            f"{bf16_note(precision.value) if bf16 else RESULT_NOTE}\n")
    write_section(root / "docs" / "benchmarks.md", section_key("network" + precision.suffix, provenance.cpu), body)
    if not bf16:  # the README's summary is the fp32 comparison
        write_summary(root, what, summary, geomean, provenance)
    print(f"wrote {root / 'docs' / 'benchmarks.md'}")
