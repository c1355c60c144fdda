"""Benchmark: how well a cost model ranks the programs of tuning logs it was not trained on, e.g. logs of a
CPU kind the shipped data lacks or of models outside the training data (docs/pretrained.md, "Measured").

  python scripts/bench/bench_ranking.py bench-work/mobilenet-v2-cold.json bench-work/resnet3d-18-cold.json
  python scripts/bench/bench_ranking.py HELD_OUT.json ... --train data/training/znver3/*.json --features tvm

The model ranked is the shipped pretrained one; with ``--train``, also a model trained here on those logs
alone (``--features``, ``--objective``: which features and objective), so features, objective and data can be
told apart as the cause of a low figure. For each held-out log (and for all of them together): the pairwise
accuracy (the fraction of same-task program pairs the model orders like the measurements), top-1 and top-5
recall (the share of tasks whose fastest program is among the model's 1 or 5 best-scored), over every valid
and failed record of the log's target; the repeats' agreement, how often a record's first timing run orders
same-task pairs like the mean of its other runs (the labels' own noise, a bound no model beats); then the
pairwise accuracy in bands of how far apart the pair's times are (an evolved population is mostly pairs
within timing noise of each other). Nothing is timed: it runs anywhere, and names the CPU the logs were
measured on by their target.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def repeat_agreement(results) -> float:
    """Pairwise accuracy of each valid record's first timing run against the mean of its other runs."""
    import numpy as np

    from ansor.cost_model.metrics import pairwise_accuracy

    timed = [(key, res.costs) for key, res in results if res.ok and len(res.costs) > 1]
    if not timed:
        return float("nan")
    first = np.asarray([-costs[0] for _, costs in timed])  # a score: higher is faster
    rest = np.asarray([float(np.mean(costs[1:])) for _, costs in timed])
    return pairwise_accuracy(first, rest, [key for key, _ in timed])


def main(argv: list[str] | None = None) -> int:
    from ansor.cost_model.objective import OBJECTIVES
    from ansor.cost_model.xgb_model import FEATURE_SETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="tuning logs of models outside the training data")
    parser.add_argument("--target", default=None,
                        help="the target whose records to rank (default: the one most records were measured on)")
    parser.add_argument("--train", nargs="+", type=Path, default=[], metavar="LOG",
                        help="also train a model on these logs alone (none of the held-out logs) and rank with it")
    parser.add_argument("--features", choices=sorted(FEATURE_SETS), default="state",
                        help="the trained model's features: ours, from the loop state ('state', the default), or "
                             "TVM's C++ PerStoreFeature, Ansor's own ('tvm', ~10x slower)")
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="pack-sum-rank",
                        help="the trained model's training objective (default pack-sum-rank)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in [*args.logs, *args.train] if not p.is_file()]
    if missing:
        parser.error(f"no such log: {', '.join(missing)}")
    both = sorted({p.resolve() for p in args.logs} & {p.resolve() for p in args.train})
    if both:
        parser.error(f"a held-out log is also a training log: {', '.join(map(str, both))}")

    from ansor.cost_model.pretrained import pretrained_model
    from ansor.cost_model.training import evaluate, load_training_records, to_measure_pairs, train_from_logs
    from ansor.cost_model.xgb_model import XGBParams
    from ansor.errors import AnsorError

    held = []
    try:
        for name, paths in [*((p.name, [p]) for p in args.logs), *([("all", args.logs)] if len(args.logs) > 1 else [])]:
            held.append((name, to_measure_pairs(load_training_records(paths, args.target))))
        target = held[0][1][0][0].task.target
        models = [("shipped", pretrained_model(target))]
        if models[0][1] is None:
            print(f"error: no pretrained model is shipped for {target.kind.name} targets", file=sys.stderr)
            return 2
        if args.train:
            trained = train_from_logs(args.train, target=target, test_fraction=0,
                                      params=XGBParams(objective=args.objective), features=args.features)
            models.append((f"trained on {trained.n_train} programs ({args.features}, {args.objective})",
                           trained.model))
    except AnsorError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    rows = []
    for label, model in models:
        for name, (inputs, results) in held:
            cpu = str(inputs[0].task.target.attrs.get("mcpu", inputs[0].task.target.kind.name))
            agree = repeat_agreement([(inp.task.workload_key, res) for inp, res in zip(inputs, results)])
            rows.append((label, name, cpu, evaluate(model, inputs, results), agree))
    print("| model | log | target CPU | programs | tasks | pairwise accuracy | top-1 recall | top-5 recall "
          "| repeats' agreement |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, name, cpu, r, agree in rows:
        print(f"| {label} | {name} | {cpu} | {r.n_programs} | {r.n_tasks} | {r.pairwise_accuracy:.3f} | "
              f"{r.top1_recall:.2f} | {r.top5_recall:.2f} | {agree:.3f} |")
    print()
    print("Pairwise accuracy by how far apart the two programs of a pair are (pairs within ~5 % are within "
          "timing noise):")
    print()
    bands = list(rows[0][3].by_gap)
    print("| model | log | " + " | ".join(f"{lo:g}-{hi:g}x" if hi != float("inf") else f">{lo:g}x"
                                         for lo, hi in bands) + " |")
    print("| --- | --- |" + " ---: |" * len(bands))
    for label, name, _, r, _ in rows:
        print(f"| {label} | {name} | " + " | ".join(f"{acc:.3f} ({n})" for acc, n in r.by_gap.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
