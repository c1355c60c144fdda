"""Benchmark: what the XGBoost cost model buys the search, in one run (issue goals in brackets).

  python scripts/bench/bench_model_guidance.py                   # both parts, 128 trials each
  python scripts/bench/bench_model_guidance.py --trials 64 --skip-transfer

1. Guidance: each workload tuned with the same seed and budget twice, once ranked by ``XGBModel`` and once
   by ``RandomModel`` (same sketches, same evolution, same measurement); the best program of each run is
   re-timed by the same in-process timer. Reported: best GFLOPS of each and their ratio [XGB >= 1.3x random].
2. Transfer: a model trained on every log of part 1 (other workloads) tunes ``--transfer-wkl``; a fresh
   model tunes it too (cold start). Reported: trials each run needed to reach 90 % of the cold run's final
   best [warm <= 1/3 of cold].

Timings use TVM_NUM_THREADS = the target's cores; measurement is the scripts' (3 repeats of ~15 ms). One
run per configuration: on a shared 2-core machine, read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass
class Run:
    workload: str
    model: str
    gflops: float  # best program, re-timed
    curve: list[float]  # best GFLOPS after each trial, in measurement order
    wall_s: float


def tune(wkl: str, trials: int, seed: int, model, model_name: str, log: Path) -> Run:
    from ansor.task import program
    from ansor.task.search_task import SearchTask
    from ansor.tuning import TuningOptions, auto_schedule, measuring_into

    task = SearchTask.from_workload(wkl)
    curve: list[float] = []

    def track(inputs, results) -> None:
        for res in results:
            gflops = task.flop_ct / res.mean_cost / 1e9 if res.ok else 0.0
            curve.append(max(gflops, curve[-1] if curve else 0.0))

    t0 = time.time()
    options = TuningOptions(num_measure_trials=trials, seed=seed)  # the scripts' timing and measurer
    with measuring_into(log, options, callbacks=[track]) as (measurer, round_done):
        result = auto_schedule(task, options, measurer, model, on_round=round_done)
    wall = time.time() - t0
    module = program.build_program(task, result.best_state)
    cost = program.time_module(module, program.random_inputs(task))
    return Run(wkl, model_name, task.flop_ct / cost / 1e9, curve, wall)


def trials_to_reach(curve: list[float], level: float) -> Optional[int]:
    """1-based trial count at which the running best first reaches ``level`` (None: never)."""
    return next((k + 1 for k, g in enumerate(curve) if g >= level), None)


def pretrained_model(logs: list[Path], seed: int):
    from ansor.cost_model import XGBModel
    from ansor.cost_model.training import load_training_records, to_measure_pairs

    model = XGBModel(seed=seed)
    inputs, results = to_measure_pairs(load_training_records(logs))
    model.update(inputs, results)
    return model, len(inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wkl", nargs="+", default=["matmul-512", "nhwc-resnet-50.C2"],
                        help="workloads of part 1 (default: matmul-512 nhwc-resnet-50.C2)")
    parser.add_argument("--trials", type=int, default=128, help="trials per tuning run (default 128)")
    parser.add_argument("--transfer-wkl", default="nhwc-resnet-50.C6",
                        help="workload of part 2, tuned with a model trained on part 1's logs "
                             "(default nhwc-resnet-50.C6)")
    parser.add_argument("--skip-transfer", action="store_true", help="only part 1")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default 0)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between runs (default 3)")
    args = parser.parse_args()

    from ansor.cost_model import RandomModel, XGBModel
    from ansor.target import host_target

    os.environ["TVM_NUM_THREADS"] = str(int(host_target().attrs["num-cores"]))
    print(f"TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}, {args.trials} trials per run, seed {args.seed}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ansor-bench-") as tmp:
        logs: list[Path] = []
        rows: list[tuple[str, Run, Run]] = []
        for wkl in args.wkl:
            runs = []
            for name, model in (("xgb", XGBModel(seed=args.seed)), ("random", RandomModel(seed=args.seed))):
                time.sleep(args.pause)
                log = Path(tmp) / f"{wkl}-{name}.json"
                runs.append(tune(wkl, args.trials, args.seed, model, name, log))
                logs.append(log)
                print(f"{wkl} {name}: {runs[-1].gflops:.1f} GFLOPS in {runs[-1].wall_s:.1f} s", flush=True)
            rows.append((wkl, *runs))

        print(f"\nGuidance, {args.trials} trials")
        print(f"{'workload':<22}{'xgb GFLOPS':>11}{'random GFLOPS':>14}{'xgb/random':>11}"
              f"{'xgb trials to 90%':>18}{'random trials to 90%':>21}")
        for wkl, x, r in rows:
            level = 0.9 * max(x.curve[-1], r.curve[-1])
            print(f"{wkl:<22}{x.gflops:>11.1f}{r.gflops:>14.1f}{x.gflops / r.gflops:>11.2f}"
                  f"{str(trials_to_reach(x.curve, level)):>18}{str(trials_to_reach(r.curve, level)):>21}")

        if args.skip_transfer:
            return 0
        sources = [log for log in logs if not log.name.startswith(args.transfer_wkl + "-")]
        model, n = pretrained_model(sources, args.seed)
        print(f"\nTransfer: model trained on {n} records of {', '.join(w for w in args.wkl)}", flush=True)
        time.sleep(args.pause)
        cold = tune(args.transfer_wkl, args.trials, args.seed, XGBModel(seed=args.seed), "cold",
                    Path(tmp) / "cold.json")
        print(f"{args.transfer_wkl} cold: {cold.gflops:.1f} GFLOPS", flush=True)
        time.sleep(args.pause)
        warm = tune(args.transfer_wkl, args.trials, args.seed, model, "warm", Path(tmp) / "warm.json")
        print(f"{args.transfer_wkl} warm: {warm.gflops:.1f} GFLOPS", flush=True)
        level = 0.9 * cold.curve[-1]
        t_cold, t_warm = trials_to_reach(cold.curve, level), trials_to_reach(warm.curve, level)
        print(f"\n{'workload':<22}{'cold GFLOPS':>12}{'warm GFLOPS':>12}{'cold trials to 90%':>19}"
              f"{'warm trials to 90%':>19}{'warm/cold':>10}")
        ratio = f"{t_warm / t_cold:.2f}" if t_warm and t_cold else "n/a"
        print(f"{args.transfer_wkl:<22}{cold.gflops:>12.1f}{warm.gflops:>12.1f}{str(t_cold):>19}"
              f"{str(t_warm):>19}{ratio:>10}")
        print("(90 % of the cold run's final best as measured during tuning)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
