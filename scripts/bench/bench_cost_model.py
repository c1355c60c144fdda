"""Benchmark: cost-model overhead in the search (issue goals: >= 1,000 states/s of feature extraction for
matmul on 2 cores; bounded retraining time per round as logs grow), and the two feature sets compared.

Run: python scripts/bench/bench_cost_model.py [--states N] [--repeat N] [--records 1000,5000] [--logs LOG ...]

1. Feature extraction for random complete matmul-512 programs (what the search scores), from a cold
   cache: our features computed from the State (the default), then TVM's C++ PerStoreFeature end to end
   (replay onto s_tir + extraction, pipelined over two threads or serial), each of its parts alone, and a
   warm cache.
2. Retraining: one ``XGBModel.update`` with a round of 16 new records when the model already holds N
   records, for each N in ``--records``, with the default per-task cap and without a cap ("update s"),
   then the median of ``--repeat`` more retrainings on the same data ("retrain s"). Costs are synthetic
   (a smooth function of the tile sizes plus noise); features are extracted before timing, as in tuning,
   where ``predict`` has already extracted the features of every measured program.
3. With ``--logs``: held-out ranking of real measurements by a model on each feature set (pairwise
   accuracy, top-1/top-5 recall; mean over 5 random 70/30 splits by program).

XGB-guided vs random-guided tuning is ``bench_model_guidance.py``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from typing import Callable, Optional

import numpy as np
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

from ansor.cost_model import FeatureExtractor, XGBModel
from ansor.cost_model.features import make_tune_context
from ansor.cost_model.state_features import StateFeatureExtractor
from ansor.cost_model.training import train_from_logs
from ansor.cost_model.xgb_model import MAX_PROGRAMS_PER_TASK
from ansor.state.loop_state import State
from ansor.log.measurement import ErrorNo, MeasureInput, MeasureResult
from ansor.task.search_task import SearchTask
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.state.transform_steps import SplitStep


def cpu_pressure() -> str:
    """Share of the last 10 s in which runnable work waited for a CPU (Linux PSI), or "n/a".

    The figures below are only comparable between runs on an otherwise idle machine; this says whether it was.
    """
    try:
        with open("/proc/pressure/cpu") as f:
            return f.readline().split()[1].split("=")[1] + " %"
    except (OSError, IndexError):
        return "n/a"


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_states(task: SearchTask, n: int, seed: int) -> list[State]:
    return sample_initial_population(task, generate_sketches(task), n, random.Random(seed))


def bench_extraction(task: SearchTask, n: int, repeat: int) -> None:
    states = random_states(task, n, seed=0)
    n = len(states)
    dag = task.compute_dag
    args = ArgInfo.from_prim_func(dag.func)
    FeatureExtractor().extract(task, states[:4])  # warm TVM up once (first calls build lazy state)

    def cold(pipeline: bool) -> Callable[[], object]:
        return lambda: FeatureExtractor(pipeline=pipeline).extract(task, states)

    rows: list[tuple[str, float]] = [
        ("State features (default), 1 thread", median_time(lambda: StateFeatureExtractor().extract(task, states),
                                                           repeat)),
        ("TVM features end to end, pipelined", median_time(cold(True), repeat)),
        ("TVM features end to end, serial", median_time(cold(False), repeat)),
        ("replay onto s_tir alone", median_time(lambda: [dag.replay(s) for s in states], repeat)),
    ]
    candidates = [MeasureCandidate(dag.replay(s), args) for s in states]
    extractor = PerStoreFeature()
    for threads in (1, 2):
        ctx = make_tune_context(dag.mod, task.target, threads)
        rows.append((f"C++ PerStoreFeature alone, {threads} thread{'s' if threads > 1 else ''}",
                     median_time(lambda: extractor.extract_from(ctx, candidates), repeat)))
    warm = StateFeatureExtractor()
    warm.extract(task, states)
    rows.append(("cached (state already seen)", median_time(lambda: warm.extract(task, states), repeat)))
    print(f"feature extraction, {task.workload_key}: {n} random programs, median of {repeat}")
    print(f"  {'':<40}{'states/s':>10}{'ms/state':>10}")
    for name, seconds in rows:
        print(f"  {name:<40}{n / seconds:>10.0f}{seconds / n * 1e3:>10.3f}")


def synthetic_cost(state: State, rng: np.random.Generator) -> float:
    """Seconds that favour mid-sized inner tiles, plus 5 % noise (made up, but smooth in the tile sizes)."""
    penalty = 0.0
    for step in state.steps:
        if isinstance(step, SplitStep) and step.lengths and step.lengths[-1]:
            penalty += (math.log2(step.lengths[-1]) - 3.0) ** 2
    return 1e-3 * (1.0 + 0.2 * penalty) * float(rng.lognormal(0.0, 0.05))


def bench_retraining(task: SearchTask, sizes: list[int], cap: Optional[int], extractor: StateFeatureExtractor,
                     states: list[State], repeat: int) -> None:
    rng = np.random.default_rng(0)
    label = f"cap {cap} programs/task" if cap else "no cap"
    for size in sizes:
        model = XGBModel(max_programs_per_task=cap, extractor=extractor, min_train_programs=size + 1)
        inputs = [MeasureInput(task, s) for s in states[:size]]
        results = [MeasureResult((synthetic_cost(s, rng),), ErrorNo.NO_ERROR) for s in states[:size]]
        model.update(inputs[:-16], results[:-16])  # below min_train_programs: stored, not trained
        model.min_train_programs = 1
        update_s = median_time(lambda: model.update(inputs[-16:], results[-16:]), 1)
        train_s = median_time(model.train, repeat)
        stats = model.last_train
        print(f"  {size:>6} records, {label:<22}{stats.programs:>9}{stats.rows:>8}{stats.rounds:>8}"
              f"{update_s:>10.2f}{train_s:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wkl", default="matmul-512", help="workload (default: matmul-512)")
    parser.add_argument("--states", type=int, default=500, help="programs for the extraction benchmark (default 500)")
    parser.add_argument("--repeat", type=int, default=3, help="timing repeats; the median is reported (default 3)")
    parser.add_argument("--records", default="1000,5000",
                        help="comma-separated training-set sizes for the retraining benchmark (default 1000,5000)")
    parser.add_argument("--logs", nargs="+", default=None, metavar="LOG",
                        help="tuning logs to compare the held-out ranking of the two feature sets on")
    args = parser.parse_args()

    task = SearchTask.from_workload(args.wkl)
    print(f"CPU pressure before: {cpu_pressure()}")
    bench_extraction(task, args.states, args.repeat)

    sizes = [int(v) for v in args.records.split(",")]
    states = random_states(task, max(sizes), seed=1)
    if len(states) < max(sizes):
        raise SystemExit(f"only {len(states)} distinct programs of {args.wkl}; lower --records")
    extractor = StateFeatureExtractor()
    t0 = time.perf_counter()
    extractor.extract(task, states)
    print(f"\nretraining per round (16 new records; features of {len(states)} programs extracted beforehand "
          f"in {time.perf_counter() - t0:.1f} s)")
    print(f"  {'':<38}{'programs':>9}{'rows':>8}{'rounds':>8}{'update s':>10}{'retrain s':>10}")
    for cap in (MAX_PROGRAMS_PER_TASK, None):
        bench_retraining(task, sizes, cap, extractor, states, args.repeat)
    if args.logs:
        compare_feature_sets(args.logs)
    print(f"CPU pressure after: {cpu_pressure()}")


def compare_feature_sets(logs: list[str], splits: int = 5) -> None:
    print(f"\nheld-out ranking of {', '.join(logs)} (mean of {splits} random 70/30 splits by program)")
    print(f"  {'features':<10}{'pairwise':>10}{'top-1':>8}{'top-5':>8}{'train+eval s':>14}")
    for features in ("state", "tvm"):
        t0 = time.perf_counter()
        reports = [train_from_logs(logs, test_fraction=0.3, seed=seed, features=features).report
                   for seed in range(splits)]
        print(f"  {features:<10}{statistics.mean(r.pairwise_accuracy for r in reports):>10.3f}"
              f"{statistics.mean(r.top1_recall for r in reports):>8.2f}"
              f"{statistics.mean(r.top5_recall for r in reports):>8.2f}{time.perf_counter() - t0:>14.1f}")


if __name__ == "__main__":
    main()
