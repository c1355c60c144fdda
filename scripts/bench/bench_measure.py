#!/usr/bin/env python
"""Benchmark of the measurement layer (not a test). Prints one table.

1. Ray overhead per candidate, excluding compile and run: a batch's wall time minus the build makespan and
   the run (and reference) time the workers themselves recorded, divided by the batch size. Goal: <= 50 ms.
   The first batch (runner start-up, cold build workers) is reported apart from later (warm) batches.
2. Timing fidelity: one fixed matmul-512 schedule timed by the Ray runner and, with the same library and the
   same ``time_evaluator`` settings, in a plain Python process without Ray. Goal: within 5 %.
3. Builds per second on the cluster's CPUs (2 workers here) against one process building in a loop.

TVM_NUM_THREADS is set to the target's core count for every timing, in the plain process as in the runners.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ansor.task.search_task import SearchTask

WORKLOAD_TIMED = "matmul-512"
WORKLOAD_SMALL = "matmul-128"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"),
                        help="join this Ray cluster instead of starting a local one (default: $RAY_ADDRESS)")
    parser.add_argument("--rounds", type=int, default=5, help="timings of the matmul-512 schedule per side")
    parser.add_argument("--batch", type=int, default=32, help="candidates per batch for overhead and builds/s")
    args = parser.parse_args()

    big = SearchTask.from_workload(WORKLOAD_TIMED)
    small = SearchTask.from_workload(WORKLOAD_SMALL)
    # Before TVM's thread pool starts (the first parallel kernel); runners get the same through their env.
    os.environ["TVM_NUM_THREADS"] = str(big.hardware_params.num_cores)

    import ray

    from ansor.measure import MeasureInput, ProgramMeasurer
    from ansor.measure.builder import RayBuilder, build_program
    from ansor.measure.runner import RunConfig

    config = RunConfig()  # what the measurer times with: tuning's defaults
    rows: list[tuple[str, str, str]] = []
    (busy_start, ours_start), wall_start = cpu_seconds(), time.time()
    with ProgramMeasurer(args.ray_address) as measurer:
        # 1. overhead per candidate: the first batch (fresh runner and build workers), then warm batches
        inputs = [MeasureInput(small, s) for s in small_states(small, args.batch)]
        overheads = []
        for _ in range(3):
            start = time.time()
            results = measurer.measure(inputs)
            wall = time.time() - start
            assert all(r.ok for r in results), [r.error_msg for r in results if not r.ok]
            builds = [s for s in measurer.spans if s.kind == "build"]
            makespan = max(s.end for s in builds) - min(s.start for s in builds)
            runs = sum(s.end - s.start for s in measurer.spans if s.kind in ("run", "reference"))
            overheads.append((wall - makespan - runs) / len(inputs))
        rows += [(f"Ray overhead per candidate, first batch of {args.batch}", f"{overheads[0] * 1e3:.1f} ms",
                  "(runner start-up, cold workers)"),
                 (f"Ray overhead per candidate, warm batches of {args.batch}",
                  f"{statistics.mean(overheads[1:]) * 1e3:.1f} ms", "<= 50 ms")]

        # 2. the same schedule timed through Ray and in a plain process, interleaved so drift hits both alike
        fixed = MeasureInput(big, tiled_matmul(big))
        lib = build_program(big, fixed.state.steps).lib
        via_ray, here = [], []
        for _ in range(args.rounds):
            [result] = measurer.measure([fixed])
            assert result.ok, result.error_msg
            via_ray.append(result.mean_cost)
            here.append(time_in_process(WORKLOAD_TIMED, lib, config))
        ray_ms, here_ms = statistics.median(via_ray) * 1e3, statistics.median(here) * 1e3
        gflops = big.flop_ct / (here_ms / 1e3) / 1e9
        rows += [(f"{WORKLOAD_TIMED} via Ray runner, median (min) of {args.rounds}",
                  f"{ray_ms:.3f} ({min(via_ray) * 1e3:.3f}) ms", ""),
                 (f"{WORKLOAD_TIMED} in-process, median (min) of {args.rounds}",
                  f"{here_ms:.3f} ({min(here) * 1e3:.3f}) ms", f"{gflops:.0f} GFLOPS"),
                 ("ratio Ray / in-process, of medians (of mins)",
                  f"{ray_ms / here_ms:.3f} ({min(via_ray) / min(here):.3f})", "within 5 %")]

        # 3. builds per second
        jobs = [(small, s) for s in small_states(small, args.batch)]
        start = time.time()
        built = RayBuilder().build(jobs)
        ray_rate = len(jobs) / (time.time() - start)
        assert all(b.lib for b in built)
        start = time.time()
        for task, state in jobs:
            build_program(task, state.steps)
        local_rate = len(jobs) / (time.time() - start)
        workers = int(ray.cluster_resources().get("CPU", 0))
        rows += [(f"builds/s on Ray, {workers} workers ({WORKLOAD_SMALL})", f"{ray_rate:.1f}", ""),
                 (f"builds/s in one process ({WORKLOAD_SMALL})", f"{local_rate:.1f}", "")]
        busy_end, ours_end = cpu_seconds()  # while Ray's processes are alive to be counted

    others = (busy_end - busy_start - (ours_end - ours_start)) / ((time.time() - wall_start) * (os.cpu_count() or 1))
    rows.append(("CPU taken by other processes and VMs meanwhile", f"{max(others, 0) * 100:.0f} %",
                 "~0 for trustworthy figures"))
    width = max(len(r[0]) for r in rows)
    print(f"\nmeasurement benchmark (TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}, number={config.number}, "
          f"repeat={config.repeat}, min_repeat_ms={config.min_repeat_ms}, cache flush on)")
    print(f"{'metric':<{width}}  {'value':<18}  goal")
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:<18}  {goal}")


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine was busy, incl. hypervisor steal; those of this process tree).

    The tree includes exited descendants once reaped (Ray's workers by the raylet, the in-process timings by
    this process). On a shared machine someone else's job shifts every figure here; the difference of the
    two says how much of that there was.
    """
    import psutil

    t = psutil.cpu_times()
    busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
    me = psutil.Process()
    ours = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            c = proc.cpu_times()
            ours += c.user + c.system + c.children_user + c.children_system
        except psutil.Error:
            pass
    return busy, ours


def tiled_matmul(task: SearchTask):
    """A fixed, reasonable CPU schedule: 32x64x4 tiles, outer loop parallel, inner j vectorized."""
    s = task.compute_dag.init_state()
    s.split(0, 0, [32])
    s.split(0, 2, [64])
    s.split(0, 4, [4])
    s.reorder(0, [0, 2, 4, 1, 5, 3])  # i0 j0 k0 i1 k1 j1
    s.annotate(0, 0, "parallel")
    s.annotate(0, 5, "vectorize")
    return s


def small_states(task: SearchTask, n: int) -> list:
    """``n`` distinct tilings of a small matmul (cheap to build and run)."""
    states = []
    factors = [2, 4, 8, 16, 32, 64]
    for f in factors:
        for g in factors:
            for annotate in (False, True):
                s = task.compute_dag.init_state()
                s.split(0, 0, [f])
                s.split(0, 2, [g])
                if annotate:
                    s.annotate(0, 0, "parallel")
                states.append(s)
    return states[:n]


IN_PROCESS = """
import statistics, sys
import tvm
from ansor.task import program
from ansor.measure.runner import load_library
from ansor.task.search_task import SearchTask
number, repeat, min_repeat_ms = map(int, sys.argv[2:5])
task = SearchTask.from_workload(sys.argv[5])
module = load_library(open(sys.argv[1], "rb").read())
dev = tvm.cpu(0)
args = [tvm.runtime.tensor(a, dev) for a in program.random_inputs(task)]
timer = module.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                              f_preproc="cache_flush_cpu_non_first_arg")
timer(*args)  # the first timing in a fresh process runs slow; the runner's process is warm
print(statistics.mean(timer(*args).results))
"""


def time_in_process(workload: str, lib: bytes, config) -> float:
    """Mean seconds per run of ``lib``, timed exactly as the runner times it, in a plain Python process.

    A fresh process without Ray: timing in this (driver) process would share its TVM thread pool and
    heap with the Ray client, and running kernels here disturbs the runner's next timings.
    """
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(lib)
        f.flush()
        out = subprocess.run([sys.executable, "-c", IN_PROCESS, f.name, str(config.number), str(config.repeat),
                              str(config.min_repeat_ms), workload], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
