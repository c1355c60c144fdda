"""Running the model zoo (``ansor bench --zoo``): each model of :mod:`.zoo` through the network benchmark,
one table for all of them, resumable.

The full zoo takes hours (10 minutes of tuning per model, then its builds and timings), longer than a shared
machine stays quiet or a session lasts, so a run keeps everything in its work dir: per model the ONNX file,
the tuning log and a small JSON status file (``<name>.status.json``: when tuning started, its seconds and
trials, or the last failure, and the model's row of the table from its last timing). A rerun with the same
``--work-dir`` tunes only the models whose tuning has not finished (with the same ``--minutes``) and times
every model again from its log; with ``--reuse-timings`` it takes the stored row of a model already timed
instead. Every row's ratio is measured in turn within its own run, against runtimes timed in the same rounds,
so a table assembled from several runs (the whole zoo takes longer than a machine stays free) compares each
model fairly; the rows are not comparable with each other to a few percent. A tuning killed mid-run is
started afresh (its partial log kept aside as ``<name>.interrupted.json``): a log's records before and after
a restart would make no single tuning curve.

A model that cannot be exported, imported, built or tuned gets its row with the one-line error, and the run
goes on to the next model: the table says what works as much as how fast it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import AnsorError, short_message
from ..task.precision import Precision
from .docs import Provenance, markdown_table, read_section, section_key, write_section
from .network_report import (RESULT_ALIGN, RESULT_HEADER, RESULT_NOTE, ModelReport, bf16_note, geometric_mean,
                             peers_label, result_cells, result_header, summary_row, write_summary)
from .zoo import ZooModel

logger = logging.getLogger("ansor")

STAGES = ("export", "import", "build", "tune", "evaluate")  # in the order a model goes through them
HEADER = ("model", "family", "imports", "builds", "matches ONNX Runtime", *RESULT_HEADER)  # the zoo table's


@dataclass
class ZooStatus:
    """What earlier runs left for one model in ``<work>/<name>.status.json``."""

    tuned: bool = False  # its tuning finished: the log is complete and is not tuned again
    start: float = 0.0  # unix time the tuning command started (the origin of the log's timestamps)
    tuning_s: float = math.nan
    trials: int = 0
    error: str = ""  # the last failure, "stage: message"; empty once a run got through
    minutes: float = math.nan  # the --minutes it was tuned with (nan: unknown, from an older run)
    row: list[str] = field(default_factory=list)  # its table row from the last timing, for --reuse-timings
    ratio: float = math.nan  # that timing's ansor / fastest runtime (the row's ratio, for the geometric mean)
    timed: str = ""  # when: YYYY-MM-DD


def status_path(work: Path, name: str) -> Path:
    return Path(work) / f"{name}.status.json"


def log_path(work: Path, name: str) -> Path:
    return Path(work) / f"{name}.json"


def read_status(work: Path, name: str) -> ZooStatus:
    """The model's status, or a fresh one when there is none or it cannot be read (then it is tuned again:
    a damaged status file must not pass an unfinished log off as finished)."""
    path = status_path(work, name)
    try:
        data = json.loads(path.read_text())
        return ZooStatus(**{k: v for k, v in data.items() if k in ZooStatus.__dataclass_fields__})
    except FileNotFoundError:
        return ZooStatus()
    except (OSError, ValueError, TypeError) as err:
        logger.warning("%s: unreadable (%s); the model is tuned again", path, short_message(err))
        return ZooStatus()


def write_status(work: Path, name: str, status: ZooStatus) -> None:
    """Write the status whole or not at all (beside it, then renamed): a kill never leaves half a file."""
    path = status_path(work, name)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(status), indent=1) + "\n")
    os.replace(partial, path)


def needs_tuning(work: Path, name: str, minutes: float = math.nan) -> bool:
    """Whether the model must be tuned in this run: not unless an earlier run finished tuning it, for the
    same ``minutes`` where both are known, and its log is still there."""
    status = read_status(work, name)
    other_budget = not (math.isnan(minutes) or math.isnan(status.minutes) or status.minutes == minutes)
    return not (status.tuned and log_path(work, name).exists()) or other_budget


@dataclass(frozen=True)
class StoredRow:
    """A model's row of the table as an earlier run timed it (``--reuse-timings``)."""

    cells: tuple[str, ...]
    ratio: float  # ansor / fastest runtime in that run's rounds (nan: it did not run)
    timed: str  # YYYY-MM-DD, or "" from a run that did not record it


@dataclass
class ZooResult:
    """One model's outcome: its report, or the stage that failed and the one-line error."""

    model: ZooModel
    report: Optional[ModelReport] = None
    stage: str = ""
    error: str = ""
    resumed: bool = False  # its tuning was done by an earlier run
    notes: list[str] = field(default_factory=list)
    stored: Optional[StoredRow] = None  # its row as an earlier run timed it


def bench_zoo_model(model: ZooModel, args: argparse.Namespace, target: Any, threads: int, work: Path,
                    say: Callable[[str], None] = logger.info) -> ZooResult:
    """Export, import, build, tune (unless done) and measure one model; a failure at any stage is caught as
    an :class:`~ansor.errors.AnsorError` and becomes the result's error (and the status file's)."""
    from .network import measure, tune, tune_flags
    from .zoo import export
    key = run_key(model.name, args.precision)  # a bf16 run's log and status beside the fp32 run's
    status = read_status(work, key)
    result = ZooResult(model)
    log = log_path(work, key)
    tuned = not needs_tuning(work, key, args.minutes)
    if args.reuse_timings and tuned and status.row and status.minutes == args.minutes:
        say(f"{model.name}: timed on {status.timed or 'an earlier day'}; its stored row goes into the table")
        return ZooResult(model, resumed=True, stored=StoredRow(tuple(status.row), status.ratio, status.timed))
    stage = "export"
    try:
        onnx = export(model, work)
        stage = "import"
        from ..networks import apply_schedules, build, extract, load_onnx
        extraction = extract(load_onnx(onnx), target, precision=Precision(args.precision))
        stage = "build"
        default = build(apply_schedules(extraction.mod, extraction.tasks, {}, target=target), target)
        if not tuned:
            stage = "tune"
            if log.exists():
                aside = log.with_name(f"{key}.interrupted.json")
                os.replace(log, aside)
                say(f"{model.name}: an earlier tuning did not finish; its log is kept as {aside}")
            say(f"{model.name}: tuning for up to {args.minutes:g} minutes ...")
            start = time.time()
            tuning_s, trials, _ = tune(onnx, log, args.minutes, args.n_trials, tune_flags(args))
            status = ZooStatus(True, start, tuning_s, trials, minutes=args.minutes)
            write_status(work, key, status)
        else:
            result.resumed = True
            say(f"{model.name}: tuned by an earlier run ({status.trials} trials in {status.tuning_s / 60:.1f} "
                f"min); timing its log {log}")
        stage = "evaluate"
        report = ModelReport(model.name, args.precision, tuning_s=status.tuning_s, trials=status.trials)
        result.report = measure(report, onnx, extraction, log, status.start, args, target, threads, work, None,
                                checkpoints=(), default=default)
        row, status.ratio = zoo_row(result)
        status.error, status.row, status.timed = "", list(row), time.strftime("%Y-%m-%d")
    except AnsorError as err:
        if getattr(err, "detail", ""):  # a failed ansor tune: the tail of its stderr, for whoever looks into it
            log.with_name(f"{key}.tune-stderr.txt").write_text(err.detail)
        result.stage, result.error = stage, short_message(err)
        status.error = f"{stage}: {result.error}"
        say(f"{model.name}: {status.error}")
    write_status(work, key, status)
    return result


def run_key(name: str, precision: str) -> str:
    """The name of a model's log and status file in the work dir: ``<model>``, ``<model>-bf16`` in bf16."""
    return name + Precision(precision).suffix


def zoo_section(cpu: str, precision: str) -> str:
    """The key of the zoo's section of ``docs/benchmarks.md`` for this CPU kind and precision."""
    return section_key("zoo" + Precision(precision).suffix, cpu)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def matches_ort(report: ModelReport) -> str:
    """Whether ansor's outputs match ONNX Runtime's within the scaled tolerance, and the error over the scale;
    in bf16 also the error of each runtime that computes in a reduced precision (OpenVINO's bf16), the same way."""
    c = report.vs_ort
    if c is None:
        return "no ONNX Runtime" if report.fastest_peer() is None else "outputs differ in shape"
    theirs = "".join(f"; {peer.runtime} in {peer.precision}: {error:.1e}" for peer, error in report.reduced
                     if report.precision != "fp32")
    return f"{'yes' if c.ok else '**no**'} ({c.max_abs_error / max(c.scale, 1e-30):.1e}{theirs})"


def zoo_row(r: ZooResult) -> tuple[tuple[str, ...], float]:
    """One model's row (a failed one with its error where its first missing figure would be) and its ratio
    of ansor / fastest runtime (nan when it did not run)."""
    if r.stored is not None:
        return r.stored.cells, r.stored.ratio
    m, error = r.model, _escape(f"{r.stage} failed: {r.error}")
    blank = ("-",) * len(RESULT_HEADER)
    if r.report is not None:
        cells, ratio = result_cells(r.report)
        return (m.name, m.family, "yes", "yes", matches_ort(r.report), *cells), ratio
    if r.stage in ("export", "import"):
        return (m.name, m.family, f"no: {error}", "-", "-", *blank), math.nan
    if r.stage == "build":
        return (m.name, m.family, "yes", f"no: {error}", "-", *blank), math.nan
    return (m.name, m.family, "yes", "yes", "-", error, *blank[1:]), math.nan


def zoo_rows(results: list[ZooResult], precision: str = "fp32"
             ) -> tuple[tuple[str, ...], list[tuple[str, ...]], float, int]:
    """The zoo's table: header, one row per model, and the geometric mean of ansor / fastest runtime over
    the models that ran."""
    pairs = [zoo_row(r) for r in results]
    geomean, count = geometric_mean([ratio for _, ratio in pairs])
    return zoo_header(precision), [row for row, _ in pairs], geomean, count


def zoo_header(precision: str) -> tuple[str, ...]:
    """The columns of the zoo's table for a run in ``precision``."""
    return HEADER[:len(HEADER) - len(RESULT_HEADER)] + result_header(precision)


def zoo_heading(minutes: float, precision: str) -> str:
    """The title of the zoo's section for a run in ``precision`` of ``minutes`` of tuning a model."""
    return f"## Model zoo{' in ' + precision if precision != 'fp32' else ''} after {minutes:g} minutes of tuning each"


def zoo_markdown(results: list[ZooResult], provenance: Provenance, minutes: float, precision: str = "fp32") -> str:
    """The zoo's section of ``docs/benchmarks.md``: provenance, the table, the geometric mean, the sources."""
    header, rows, geomean, count = zoo_rows(results, precision)
    table = markdown_table(header, rows, f"<<<<<{RESULT_ALIGN}")
    sources = "; ".join(f"{r.model.name}: `{r.model.source}`" for r in results)
    earlier = ", ".join(f"{r.model.name} ({r.stored.timed or 'undated'})" for r in results if r.stored)
    if earlier:
        sources += (f". Rows timed by earlier runs (`--reuse-timings`; each ratio measured in turn within its "
                    f"own run, the date above is the table's): {earlier}")
    bf16 = precision != "fp32"
    tolerance = ("within 5 % of the output's scale of ONNX Runtime's float32 outputs (bf16's tolerance, "
                 "`ansor.networks.bf16.BF16_VS_FP32_RTOL`)" if bf16 else
                 "within the tolerance tuned builds are checked with (`ansor.networks.compare_outputs`)")
    theirs = " (after the semicolon: OpenVINO's bf16 output's, the same way)" if bf16 else ""
    return (f"{zoo_heading(minutes, precision)}\n\n"
            f"{provenance.markdown()}\n{table}\n\n"
            f"Geometric mean of ansor / {peers_label(precision)}: **{geomean:.2f}** over the {count} "
            f"of {len(results)} models that ran. {bf16_note(precision) if bf16 else RESULT_NOTE} \"matches ONNX "
            f"Runtime\": every output {tolerance}, in brackets the largest difference over the output's scale"
            f"{theirs}. Random "
            f"weights, batch 1, opset 17; sources: {sources}.\n")


def _cells(line: str) -> list[str]:
    """A markdown table line's cells (a ``\\|`` inside a cell, as :func:`_escape` writes it, stays in it)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def earlier_rows(path: Path, key: str, minutes: float, precision: str = "fp32") -> dict[str, StoredRow]:
    """The rows of the zoo section ``key`` of the markdown file ``path``, by model, each with its ratio and
    the date it was timed; none when the section is missing, has other columns, another ``minutes`` or
    another ``precision``."""
    body = read_section(path, key)
    if zoo_heading(minutes, precision) not in body:
        return {}
    lines = [line for line in body.splitlines() if line.startswith("| ")]
    header = zoo_header(precision)
    if not lines or tuple(_cells(lines[0])) != header:
        return {}
    date = re.search(r"^- date: (\S+)", body, re.M)
    listed = re.search(r"Rows timed by earlier runs [^:]*: ([^\n]*)\.$", body, re.M)
    dates = dict(re.findall(r"([\w.-]+) \(([\w-]+)\)", listed.group(1))) if listed else {}
    column = header.index(RESULT_HEADER[2])  # ansor / fastest, in turn
    rows = {}
    for line in lines[2:]:
        cells = _cells(line)
        if len(cells) != len(header):
            continue
        try:
            ratio = float(cells[column].strip("*"))
        except ValueError:
            ratio = math.nan
        rows[cells[0]] = StoredRow(tuple(cells), ratio, dates.get(cells[0], date.group(1) if date else ""))
    return rows


def with_earlier_rows(results: list[ZooResult], earlier: dict[str, StoredRow]) -> list[ZooResult]:
    """``results`` and, for the zoo's models not among them, their rows in ``earlier``, in the zoo's order:
    a run over a few models (``--models``) updates their rows of a table the whole zoo made."""
    from .zoo import ZOO
    ran = {r.model.name: r for r in results}
    kept = [ran.pop(m.name) if m.name in ran else ZooResult(m, resumed=True, stored=earlier[m.name])
            for m in ZOO if m.name in ran or m.name in earlier]
    return kept + list(ran.values())


def write_zoo_docs(root: Path, results: list[ZooResult], provenance: Provenance, minutes: float,
                   precision: str = "fp32") -> Path:
    """Write the zoo's table as this CPU kind's ``zoo:`` (``zoo-bf16:``) section of ``root/docs/benchmarks.md``
    (a rerun replaces it), and the README's summary for fp32; returns the file."""
    path = Path(root) / "docs" / "benchmarks.md"
    write_section(path, zoo_section(provenance.cpu, precision), zoo_markdown(results, provenance, minutes, precision))
    if precision != "fp32":
        return path
    _, rows, geomean, _ = zoo_rows(results)
    width = len(RESULT_HEADER)
    write_summary(Path(root), f"Model zoo after {minutes:g} minutes of tuning each",
                  [summary_row(row[0], row[-width:]) for row in rows], geomean, provenance,
                  assembled_from(results, provenance, minutes))
    return path


def assembled_from(results: list[ZooResult], provenance: Provenance, minutes: float) -> str:
    """Which runs a zoo table comes from (``--models`` reruns keep the other rows, dated) and the command
    that measures the whole zoo again."""
    dates = sorted({r.stored.timed for r in results if r.stored is not None and r.stored.timed}
                   | {provenance.date})
    when = f"assembled from runs of {dates[0]} to {dates[-1]} (each row's date: docs/benchmarks.md)" \
        if len(dates) > 1 else f"one run of {dates[0]}"
    return f"{when}; the whole zoo: `ansor bench --zoo --minutes {minutes:g} --work-dir bench-work --write-docs .`"


def run_zoo(args: argparse.Namespace) -> int:
    """``ansor bench --zoo``: the command, which prints (a rerun with the same ``--work-dir`` resumes)."""
    from .network import setup
    from .network_report import plot, print_report
    from .peak import cpu_description
    from .zoo import ZOO, zoo_model
    if args.onnx or args.log:
        raise AnsorError("--zoo benchmarks the zoo's models: give them with --models, not --onnx or --log")
    models = [zoo_model(name) for name in args.models] if args.models else list(ZOO)
    at = setup(args)
    if not args.work_dir:
        print(f"note: no --work-dir; a rerun resumes only with --work-dir {at.work}", flush=True)
    results = []
    for i, model in enumerate(models, 1):
        print(f"[{i}/{len(models)}] {model.name} ({model.family}, {model.source})", flush=True)
        results.append(bench_zoo_model(model, args, at.target, at.threads, at.work, say=lambda s: print(s, flush=True)))
        if results[-1].report is not None:
            print_report(results[-1].report, at.peak, at.threads)
    provenance = Provenance.here(cpu_description())
    if args.reuse_timings and args.write_docs:
        docs = Path(args.write_docs) / "docs" / "benchmarks.md"
        earlier = earlier_rows(docs, zoo_section(provenance.cpu, args.precision), args.minutes, args.precision)
        results = with_earlier_rows(results, earlier)
        print(f"{sum(r.model not in models for r in results)} rows of models not in this run kept from {docs}")
    header, rows, geomean, count = zoo_rows(results, args.precision)
    print(f"\n== model zoo, {args.precision}, {args.minutes:g} minutes of tuning each ==\n"
          f"{markdown_table(header, rows)}\n"
          f"geometric mean of ansor / {peers_label(args.precision)}: {geomean:.2f} over {count} of "
          f"{len(results)} models")
    if args.plot:
        plot([r.report for r in results if r.report is not None], args.plot)
    if args.write_docs:
        path = write_zoo_docs(Path(args.write_docs), results, provenance, args.minutes, args.precision)
        print(f"wrote {path}")
    return 0
