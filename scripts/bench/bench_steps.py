"""Benchmark: cost of the two step interpreters (issue goals: <= 0.1 ms per pure-Python step, <= 2 ms
per matmul replay onto s_tir).

Run: python scripts/bench/bench_steps.py [--repeat N]
Uses random complete programs for matmul-512 (the search's real input), so the figures include the steps
the search actually produces (splits, reorder, cache write, compute_at, fuse, annotations, pragmas).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from ansor.task.search_task import SearchTask
from ansor.sketch.search_space import generate_sketches, sample_initial_population


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wkl", default="matmul-512", help="workload (default: matmul-512)")
    parser.add_argument("--states", type=int, default=200, help="random programs to time (default: 200)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats; the median is reported")
    args = parser.parse_args()

    task = SearchTask.from_workload(args.wkl)
    states = sample_initial_population(task, generate_sketches(task), args.states, random.Random(0))
    n_steps = sum(len(s.steps) for s in states)
    dag = task.compute_dag

    apply_times, replay_times, copy_times = [], [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for s in states:
            s.with_steps(s.steps)
        apply_times.append((time.perf_counter() - t0) / n_steps)
        t0 = time.perf_counter()
        for s in states:
            dag.replay(s)
        replay_times.append((time.perf_counter() - t0) / len(states))
        t0 = time.perf_counter()
        for s in states:
            s.copy()
        copy_times.append((time.perf_counter() - t0) / len(states))

    apply_us = statistics.median(apply_times) * 1e6
    replay_ms = statistics.median(replay_times) * 1e3
    print(f"workload {args.wkl}: {len(states)} random programs, {n_steps / len(states):.1f} steps each")
    print(f"{'measure':<36}{'value':>12}{'goal':>12}")
    print(f"{'pure-Python apply, per step':<36}{apply_us:>9.1f} us{'<= 100 us':>12}")
    print(f"{'replay onto s_tir, per program':<36}{replay_ms:>9.2f} ms{'<= 2 ms':>12}")
    print(f"{'State.copy()':<36}{statistics.median(copy_times) * 1e6:>9.2f} us")


if __name__ == "__main__":
    main()
