"""Benchmark: how well the shipped pretrained cost model ranks the programs of tuning logs it was not
trained on, e.g. logs of a CPU kind the shipped data lacks (docs/pretrained.md, "Measured").

  python scripts/bench/bench_ranking.py bench-work/mobilenet-v2-cold.json bench-work/resnet3d-18-cold.json

For each log (and for all of them together): the pairwise accuracy (the fraction of same-task program pairs
the model orders like the measurements), top-1 and top-5 recall (the share of tasks whose fastest program is
among the model's 1 or 5 best-scored), over every valid and failed record of the log's target; then the
pairwise accuracy in bands of how far apart the pair's times are (an evolved population is mostly pairs
within timing noise of each other, which no model orders). Nothing is timed: it runs anywhere, and names
the CPU the logs were measured on by their target.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="tuning logs of models outside the training data")
    parser.add_argument("--target", default=None,
                        help="the target whose records to rank (default: the one most records were measured on)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.logs if not p.is_file()]
    if missing:
        parser.error(f"no such log: {', '.join(missing)}")

    from ansor.cost_model.pretrained import pretrained_model
    from ansor.cost_model.training import evaluate, load_training_records, to_measure_pairs
    from ansor.errors import AnsorError

    rows = []
    for name, paths in [*((p.name, [p]) for p in args.logs), *([("all", args.logs)] if len(args.logs) > 1 else [])]:
        try:
            records = load_training_records(paths, args.target)
        except AnsorError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        inputs, results = to_measure_pairs(records)
        target = inputs[0].task.target
        model = pretrained_model(target)
        if model is None:
            print(f"error: no pretrained model is shipped for {target.kind.name} targets", file=sys.stderr)
            return 2
        report = evaluate(model, inputs, results)
        rows.append((name, str(target.attrs.get("mcpu", target.kind.name)), report))
    print("| log | target CPU | programs | tasks | pairwise accuracy | top-1 recall | top-5 recall |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, cpu, r in rows:
        print(f"| {name} | {cpu} | {r.n_programs} | {r.n_tasks} | {r.pairwise_accuracy:.3f} | "
              f"{r.top1_recall:.2f} | {r.top5_recall:.2f} |")
    print()
    print("Pairwise accuracy by how far apart the two programs of a pair are (pairs within ~5 % are within "
          "timing noise):")
    print()
    bands = list(rows[0][2].by_gap)
    print("| log | " + " | ".join(f"{lo:g}-{hi:g}x" if hi != float("inf") else f">{lo:g}x" for lo, hi in bands) + " |")
    print("| --- |" + " ---: |" * len(bands))
    for name, _, r in rows:
        print(f"| {name} | " + " | ".join(f"{acc:.3f} ({n})" for acc, n in r.by_gap.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
