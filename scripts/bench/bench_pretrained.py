"""Benchmark: a few minutes with the shipped pretrained model and schedule database against ten minutes
cold, on models the shipped files were not trained on (issue goal: 2 minutes >= as fast as 10 cold).

  python scripts/bench/bench_pretrained.py --onnx vit.onnx convnext.onnx --work-dir bench-pretrained
  python scripts/bench/bench_pretrained.py --onnx vit.onnx --cold-log vit=logs/vit-10min.json
  python scripts/bench/bench_pretrained.py --network mobilenet-v2 resnet3d-18 --minutes 1 --work-dir bp

For each model, in a work dir that keeps the logs (a rerun reuses a log that exists):

1. ``ansor tune --onnx FILE --minutes 2`` (the default: pretrained) into ``<name>-pretrained.json``;
2. ``ansor tune --onnx FILE --minutes 10 --no-pretrained`` into ``<name>-cold.json``, or ``--cold-log``;
   a built-in network (``--network``, batch 1; no ``torch`` needed) is tuned with ``--network NAME``;
3. the build of each log after each checkpoint minute (the two curves), timed one after another;
4. the two final builds in turn, ``--rounds`` times in each of ``--processes`` fresh processes
   (``ansor.bench.in_turn``): the ratio pretrained / cold of each round, the median of them all.

TVM_NUM_THREADS = this machine's physical cores. ``--write-docs ROOT`` writes the table into
ROOT/docs/benchmarks.md. Say which models the shipped files were trained on (docs/pretrained.md): a model
in their training data measures the database, not transfer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def model_name(model: str | Path) -> str:
    """A model's name in logs and tables: the ONNX file's stem, or the built-in network's name."""
    return Path(model).stem if str(model).endswith(".onnx") else str(model)


def tuned_log(onnx: str | Path, log: Path, minutes: float, cold: bool,
              startup: float = 0.0) -> tuple[float, float, int]:
    """Tune into ``log`` unless it exists; returns (start time, time of its first measurement, trials). The
    start is kept beside the log; a log given with --cold-log has none, and starts ``startup`` seconds before
    its first measurement."""
    from ansor.bench.network import tune
    from ansor.log.records import load_records
    start_file = log.with_suffix(".start")
    if not log.exists():
        start = time.time()
        print(f"{model_name(onnx)}: tuning {'cold ' if cold else ''}for {minutes:g} minutes ...", flush=True)
        tune(onnx, log, minutes, 100_000, ["--no-pretrained"] if cold else [])
        start_file.write_text(json.dumps(start))
    records = load_records(log)
    first = min(r.result.timestamp for r in records)
    start = float(json.loads(start_file.read_text())) if start_file.exists() else first - startup
    return start, first, len(records)


def bench(onnx: str | Path, cold_log: Path | None, args: argparse.Namespace, target, work: Path) -> dict:
    from ansor.bench.network import CHECKPOINTS, tuning_curve
    from ansor.bench.in_turn import load_model, time_in_processes
    from ansor.networks import extract
    name = model_name(onnx)
    warm_log = work / f"{name}-pretrained.json"
    warm_start, warm_first, warm_trials = tuned_log(onnx, warm_log, args.minutes, cold=False)
    cold_log = cold_log or work / f"{name}-cold.json"
    startup = warm_first - warm_start  # import, extraction, Ray
    cold_start, _, cold_trials = tuned_log(onnx, cold_log, args.cold_minutes, cold=True, startup=startup)
    extraction = extract(load_model(onnx), target)
    warm_curve = list(tuning_curve(extraction, warm_log, warm_start, args.minutes, CHECKPOINTS, target,
                                   args.repeat, 1.0, work, f"{name}-pretrained-part"))
    cold_curve = list(tuning_curve(extraction, cold_log, cold_start, args.cold_minutes, CHECKPOINTS, target,
                                   args.repeat, 1.0, work, f"{name}-cold-part"))
    per_process = time_in_processes(onnx, [warm_log, cold_log], args.processes, args.rounds, args.repeat)
    rounds = [r for process in per_process for r in process]
    ratios = [w / c for w, c in rounds]
    result = {"name": name, "warm_trials": warm_trials, "cold_trials": cold_trials,
              "warm_ms": statistics.median(r[0] for r in rounds), "cold_ms": statistics.median(r[1] for r in rounds),
              "ratio": statistics.median(ratios), "won": sum(r <= 1.0 for r in ratios), "rounds": len(ratios),
              "per_process": [statistics.median(w / c for w, c in process) for process in per_process],
              "warm_curve": warm_curve, "cold_curve": cold_curve}
    print(f"{name}: pretrained {args.minutes:g} min ({warm_trials} trials) {result['warm_ms']:.2f} ms, cold "
          f"{args.cold_minutes:g} min ({cold_trials} trials) {result['cold_ms']:.2f} ms; in turn "
          f"{result['ratio']:.3f} (pretrained as fast or faster in {result['won']} of {len(ratios)} rounds; per "
          f"process {', '.join(f'{x:.3f}' for x in result['per_process'])})")
    for label, points in (("pretrained", warm_curve), ("cold", cold_curve)):
        print(f"  curve {label}: " + ", ".join(f"{m:g} min {ms:.2f} ms" for m, ms in points), flush=True)
    return result


def markdown(results: list[dict], args: argparse.Namespace, cpu: str) -> str:
    from ansor.bench.docs import Provenance, markdown_table
    prov = Provenance.here(cpu, script="scripts/bench/bench_pretrained.py")
    rows = []
    for r in results:
        def fmt(points):
            return ", ".join(f"{m:g}: {ms:.2f}" for m, ms in points)
        rows.append([r["name"], f"{r['warm_ms']:.2f} ({r['warm_trials']})", f"{r['cold_ms']:.2f} ({r['cold_trials']})",
                     f"**{r['ratio']:.3f}**", f"{r['won']} of {r['rounds']}",
                     ", ".join(f"{x:.3f}" for x in r["per_process"]), fmt(r["warm_curve"]),
                     fmt(r["cold_curve"])])
    table = markdown_table(["model", f"pretrained {args.minutes:g} min: ms (trials)",
                            f"cold {args.cold_minutes:g} min: ms (trials)", "pretrained / cold, in turn",
                            "rounds pretrained won", "per process", "curve pretrained (min: ms)",
                            "curve cold (min: ms)"], rows, "<>>>>><<")
    return (f"## Pretrained start: {args.minutes:g} minutes against {args.cold_minutes:g} cold\n\n{prov.markdown()}\n"
            f"{table}\n\nModels outside the shipped files' training data (docs/pretrained.md). Each build is "
            f"timed alone for the curves, then the two final builds in turn, in {args.processes} fresh processes "
            f"of {args.rounds} rounds each (a network's time differs by a few percent from one process to the "
            "next, and rounds in one process share its offset); the ratio is the median of all rounds' ratios, "
            "and each process's median is listed.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", nargs="+", default=[], type=Path, help="ONNX models (not in the training data)")
    parser.add_argument("--network", nargs="+", default=[], metavar="NAME",
                        help="built-in networks at batch 1 (not in the training data: mobilenet-v2, resnet3d-18, "
                             "dcgan)")
    parser.add_argument("--minutes", type=float, default=2.0, help="tuning minutes with the pretrained start (default 2)")
    parser.add_argument("--cold-minutes", type=float, default=10.0, help="tuning minutes cold (default 10)")
    parser.add_argument("--cold-log", nargs="*", default=[], metavar="NAME=LOG",
                        help="use this log as the cold run of model NAME (the ONNX file's stem or the "
                             "network's name) instead of "
                             "tuning; its curve starts as long before its first measurement as the "
                             "pretrained run's did (the startup)")
    parser.add_argument("--work-dir", type=Path, required=True, help="logs (kept: a rerun reuses them)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="in-turn rounds of the final builds in each timing process (default 5)")
    parser.add_argument("--processes", type=int, default=3,
                        help="fresh processes that time the final builds in turn, one after another (default 3)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats of each build (default 5)")
    parser.add_argument("--write-docs", type=Path, default=None, metavar="ROOT",
                        help="write the table into ROOT/docs/benchmarks.md")
    args = parser.parse_args(argv)
    cold = {}
    for item in args.cold_log:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"--cold-log {item!r}: give NAME=LOG with an existing log")
        cold[name] = Path(path)
    if args.rounds < 1 or args.processes < 1:
        parser.error(f"--rounds and --processes must be at least 1 (got {args.rounds} and {args.processes})")
    missing = [str(p) for p in args.onnx if not p.is_file()]
    if missing:
        parser.error(f"no such ONNX file: {', '.join(missing)}")
    from ansor.networks import network_names
    unknown = [n for n in args.network if n not in network_names()]
    if unknown:
        parser.error(f"unknown network {', '.join(unknown)}; built-in networks: {', '.join(network_names())}")
    if not args.onnx and not args.network:
        parser.error("give models: --onnx FILE ... and/or --network NAME ...")

    from ansor.bench.docs import section_key, write_section
    from ansor.bench.peak import cpu_description
    from ansor.target import host_target
    target = host_target()
    os.environ["TVM_NUM_THREADS"] = str(int(target.attrs["num-cores"]))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    cpu = cpu_description()
    print(cpu, flush=True)
    results = [bench(m, cold.get(model_name(m)), args, target, args.work_dir) for m in [*args.onnx, *args.network]]
    ratios = [r["ratio"] for r in results]
    print(f"geometric mean pretrained / cold: {statistics.geometric_mean(ratios):.3f}")
    if args.write_docs:
        write_section(args.write_docs / "docs" / "benchmarks.md", section_key("pretrained", cpu),
                      markdown(results, args, cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
