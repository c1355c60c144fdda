"""Benchmark: how well a run's cost model ranks the programs it is about to measure, with and without the
shipped prior, replayed from a tuning log (docs/pretrained.md, "Online adaptation").

  python scripts/bench/bench_adaptation.py bench-work/mobilenet-v2-cold.json bench-work/resnet3d-18-cold.json

At every --step seconds of each log (its records in measurement order), three models are trained on what
was measured before that moment and rank what the next --horizon seconds measured (same-task pairs, tasks
that already had a measurement): the shipped prior alone, the prior with the run's own correction trees
(what tuning uses), and a cold model of the run's measurements alone. Printed: each model's pairwise
accuracy, averaged over the moments weighted by their pairs' programs. Nothing is timed: it runs anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path, help="tuning logs, in the order their records were measured")
    parser.add_argument("--step", type=float, default=30.0, help="seconds between two training moments (default 30)")
    parser.add_argument("--horizon", type=float, default=30.0,
                        help="seconds of measurements after a moment that its models rank (default 30)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.logs if not p.is_file()]
    if missing:
        parser.error(f"no such log: {', '.join(missing)}")
    if args.step <= 0 or args.horizon <= 0:
        parser.error("--step and --horizon must be positive seconds")

    import numpy as np

    from ansor.cost_model.pretrained import pretrained_model
    from ansor.cost_model.training import evaluate, load_training_records, to_measure_pairs
    from ansor.cost_model.xgb_model import XGBModel
    from ansor.errors import AnsorError

    print("| log | moments | prior alone | prior + run's trees | cold |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for path in args.logs:
        try:
            records = sorted(load_training_records(path), key=lambda r: r.result.timestamp)
        except AnsorError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        inputs, results = to_measure_pairs(records)
        times = np.asarray([r.timestamp for r in results])
        prior = pretrained_model(inputs[0].task.target)
        if prior is None:
            print(f"error: no pretrained model is shipped for {inputs[0].task.target.kind.name} targets",
                  file=sys.stderr)
            return 2
        accuracy: dict[str, list[float]] = {"prior": [], "adapted": [], "cold": []}
        weights = []
        moment = times[0] + args.step
        while moment < times[-1]:
            before = times < moment
            seen = {inp.task.workload_key for inp, b in zip(inputs, before) if b}
            ahead = [i for i, t in enumerate(times)
                     if moment <= t < moment + args.horizon and inputs[i].task.workload_key in seen]
            moment += args.step
            if len(ahead) < 20:
                continue
            train = [i for i, b in enumerate(before) if b]
            test_in, test_res = [inputs[i] for i in ahead], [results[i] for i in ahead]
            adapted, cold = pretrained_model(inputs[0].task.target), XGBModel()
            for model in (adapted, cold):
                model.update([inputs[i] for i in train], [results[i] for i in train])
            weights.append(len(ahead))
            for name, model in (("prior", prior), ("adapted", adapted), ("cold", cold)):
                acc = evaluate(model, test_in, test_res).pairwise_accuracy
                accuracy[name].append(acc if acc == acc else 0.5)  # NaN: no pair with different times
        if not weights:
            print(f"| {path.name} | 0 | - | - | - |")
            continue
        mean = {k: float(np.average(v, weights=weights)) for k, v in accuracy.items()}
        print(f"| {path.name} | {len(weights)} | {mean['prior']:.3f} | {mean['adapted']:.3f} | {mean['cold']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
