"""Benchmark: ansor vs MetaSchedule vs numpy/OpenBLAS, tuned and timed in one run.

  python scripts/bench/bench_tune.py                                  # matmul-512 and C2 at 64 and 256 trials
  python scripts/bench/bench_tune.py --wkl matmul-512 --trials 64     # one quick comparison
  python scripts/bench/bench_tune.py --skip-metaschedule              # ours only
  python scripts/bench/bench_tune.py --trials 64 --seeds 0 1 2        # mean of three runs per tuner
  python scripts/bench/bench_tune.py --precision bf16                 # bf16 matmul 512 and 2048 vs PyTorch's

Every contender runs in its own block with a pause in between (TVM's and OpenBLAS's pool threads spin
after a call and would steal each other's cores), with TVM_NUM_THREADS = the target's cores. The best
program of each tuner is re-timed by the same in-process timer (median of 10 repeats of >= 200 ms, runs
back to back with hot caches, as numpy's loop is timed), so the ratios compare programs, not measurement
setups; numpy's a @ b is timed the same way (median of 0.2 s repeats, in a process of its own), with the
fastest OpenBLAS kernel family this CPU runs (peak.openblas_kernels; a second row "numpy (env)" when the
environment's OPENBLAS_CORETYPE pins another, as it pinned AVX2 kernels on a Zen 5 machine). Both tuners
also time their candidates hot while tuning (MetaSchedule's runner never flushes the cache); --cold-tuning
times ours as a network runs them, each run after a cache flush of every argument but the first (the
default of the tuning scripts), which picks programs for cold weights. Also reported: wall time of each
tuning run and ansor's search overhead per round (time not spent building or running).

``--precision bf16`` tunes the bf16 form of each matmul (``bf16-matmul-N``: inputs rounded to bf16, sums in
fp32, on the CPU's bf16 unit) against PyTorch's ``torch.matmul`` of bfloat16 tensors (oneDNN: AMX or
AVX512_BF16; in a process of its own, timed as numpy is; a row saying why where PyTorch is not installed),
with numpy's fp32 ``a @ b`` for reference and "of peak" against the bf16 peak. MetaSchedule has no bf16
intrinsic and sits it out. A CPU without a bf16 unit is one error line, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class Row:
    workload: str
    trials: int
    contender: str
    gflops: float
    wall_s: float
    note: str = ""


def time_ours(wkl: str, trials: int, seed: int, cold: bool = False) -> tuple[float, float, str]:
    from ansor.task import program
    from ansor.cost_model import XGBModel
    from ansor.task.search_task import SearchTask
    from ansor.tuning import RunnerOptions, TuningOptions, auto_schedule, make_measurer

    task = SearchTask.from_workload(wkl)
    model = XGBModel(seed=seed)
    options = TuningOptions(num_measure_trials=trials, seed=seed,  # the scripts' measurer, hot unless cold
                            runner=RunnerOptions(enable_cpu_cache_flush=cold))
    t0 = time.time()
    with make_measurer(options) as measurer:
        ray_start = time.time() - t0
        result = auto_schedule(task, options, measurer, model)
    wall = time.time() - t0
    rounds = result.rounds
    search = sum(r.search_s for r in rounds) / max(1, len(rounds))
    train = sum(r.train_s for r in rounds) / max(1, len(rounds))
    measure = sum(r.measure_s for r in rounds) / max(1, len(rounds))
    module = program.build_program(task, result.best_state)
    cost = program.time_module(module, program.random_inputs(task), cold=False)
    stats, n = model.extractor.stats, max(1, len(rounds))
    note = (f"Ray start {ray_start:.1f} s; per round ({len(rounds)}): search {search:.2f} s (features "
            f"{stats.wall_s / n:.2f} s), model update {train:.2f} s, measure {measure:.2f} s")
    return task.flop_ct / cost / 1e9, wall, note


def time_metaschedule(wkl: str, trials: int, seed: int) -> tuple[float, float, str]:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ansor.task import program
    from ansor.task.search_task import SearchTask

    task = SearchTask.from_workload(wkl)
    mod = tvm.IRModule({"main": task.func})
    with tempfile.TemporaryDirectory() as work_dir:
        t0 = time.time()
        database = ms.tune_tir(mod, task.target, work_dir, max_trials_global=trials, num_trials_per_iter=64,
                               seed=seed)
        wall = time.time() - t0
        sch = ms.tir_integration.compile_tir(database, mod, task.target)
    module = tvm.compile(sch.mod, target=task.target).jit()
    cost = program.time_module(module, program.random_inputs(task), cold=False)
    return task.flop_ct / cost / 1e9, wall, "tune_tir, default rules and builder"


def time_numpy(wkl: str, threads: int) -> list[Row]:
    """numpy's a @ b with the fastest OpenBLAS kernels this CPU runs (the "vs numpy" baseline), and as the
    environment configures OpenBLAS when that differs (e.g. ``OPENBLAS_CORETYPE`` pinned to older kernels)."""
    from ansor.bench.peak import numpy_gemm_gflops, openblas_kernels

    if not wkl.startswith("matmul-"):
        return [Row(wkl, 0, "numpy", float("nan"), 0.0, "no numpy equivalent")]
    m, n, k = matmul_shape(wkl)
    how = "in a process of its own, median of 0.2 s repeats"
    fastest = openblas_kernels(threads)
    rows = [Row(wkl, 0, "numpy", numpy_gemm_gflops(m, n, k, threads, seconds=2.0, median=True, kernels=fastest),
                0.0, f"a @ b, OpenBLAS {fastest or 'default'} kernels (the fastest it has here), {how}")]
    configured = os.environ.get("OPENBLAS_CORETYPE", "")
    if configured and configured.lower() != fastest.lower():
        rows.append(Row(wkl, 0, "numpy (env)", numpy_gemm_gflops(m, n, k, threads, seconds=2.0, median=True),
                        0.0, f"a @ b, OpenBLAS as the environment sets it (OPENBLAS_CORETYPE={configured}), {how}"))
    return rows


#: PyTorch's bf16 matmul, in a process of its own (its OpenMP threads spin after a call): GFLOPS, median of 0.2 s
#: repeats, as numpy's loop is timed.
TORCH_BF16 = """
import json, statistics, sys, time
import torch
m, n, k, threads = map(int, sys.argv[1:5])
torch.set_num_threads(threads)
a, b = torch.rand(m, k).to(torch.bfloat16), torch.rand(k, n).to(torch.bfloat16)
torch.matmul(a, b)
def run():
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        torch.matmul(a, b)
        calls += 1
    return (time.perf_counter() - t0) / calls
seconds = statistics.median(run() for _ in range(10))
print(json.dumps({"gflops": 2.0 * m * n * k / seconds / 1e9, "version": torch.__version__}))
"""


def time_torch_bf16(wkl: str, threads: int) -> Row:
    """PyTorch's bf16 ``torch.matmul`` of the workload's shapes; NaN and why where PyTorch cannot run it."""
    import importlib.util
    import json
    import subprocess

    name = "pytorch bf16"
    if importlib.util.find_spec("torch") is None:
        return Row(wkl, 0, name, float("nan"), 0.0, "not timed: PyTorch is not installed (pip install -e '.[torch]')")
    m, n, k = matmul_shape(wkl)
    proc = subprocess.run([sys.executable, "-c", TORCH_BF16, str(m), str(n), str(k), str(threads)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return Row(wkl, 0, name, float("nan"), 0.0, f"not timed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    got = json.loads(proc.stdout.splitlines()[-1])
    return Row(wkl, 0, name, got["gflops"], 0.0, f"torch.matmul of bfloat16 tensors, torch {got['version']}, "
                                                 "in a process of its own, median of 0.2 s repeats")


def matmul_shape(wkl: str) -> tuple[int, int, int]:
    """(m, n, k) of a matmul workload."""
    from ansor.task.search_task import SearchTask

    dag = SearchTask.from_workload(wkl).compute_dag
    (m, k), (_, n) = (dag.buffer_shapes[name] for name in dag.param_names[:2])
    return m, n, k


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wkl", nargs="+", default=None,
                        help="workloads (default: matmul-512 and nhwc-resnet-50.C2; bf16: matmul-512 and matmul-2048)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: tune each matmul's bf16 form against PyTorch's bf16 matmul (default fp32)")
    parser.add_argument("--trials", nargs="+", type=int, default=[64, 256], help="trial budgets")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0],
                        help="seeds; each tuner runs once per seed and the table shows the mean (default 0)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between contenders (default 3)")
    parser.add_argument("--skip-metaschedule", action="store_true", help="only ansor and numpy")
    parser.add_argument("--cold-tuning", action="store_true",
                        help="tune ours with each run after a cache flush, as tune_test.py and networks do "
                             "(default: hot, as MetaSchedule tunes and as the final timings compare)")
    args = parser.parse_args()

    from ansor.errors import AnsorError
    from ansor.target import host_target
    from ansor.bench.peak import cpu_description, measure_peak
    from ansor.sketch.tensor_rules import require_bf16_unit
    target = host_target()
    bf16 = args.precision == "bf16"
    workloads = args.wkl or (["matmul-512", "matmul-2048"] if bf16 else ["matmul-512", "nhwc-resnet-50.C2"])
    if bf16:
        from ansor.task.precision import Precision, workload_in
        from ansor.task.search_task import SearchTask
        try:  # the CPU's bf16 unit, then every workload's bf16 form, before anything is timed
            require_bf16_unit(target)
            for wkl in workloads:
                SearchTask.from_workload(workload_in(wkl, Precision.BF16))
        except AnsorError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    threads = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(threads)
    peak = measure_peak(threads)
    print(f"target {target}, TVM_NUM_THREADS={threads}\n{cpu_description()}\n{peak.summary()}", flush=True)

    rows: list[Row] = []
    for wkl in workloads:
        rows.extend(time_numpy(wkl, threads))
        if bf16:
            time.sleep(args.pause)
            rows.append(time_torch_bf16(wkl, threads))
        for trials in args.trials:
            ours = functools.partial(time_ours, cold=args.cold_tuning)
            tuned = workload_in(wkl, Precision.BF16) if bf16 else wkl
            contenders = [("ansor", ours)] + ([] if args.skip_metaschedule or bf16 else [("metaschedule",
                                                                                              time_metaschedule)])
            runs: dict[str, list[tuple[float, float, str]]] = {name: [] for name, _ in contenders}
            for seed in args.seeds:
                for name, tune in contenders:
                    time.sleep(args.pause)
                    runs[name].append(tune(tuned, trials, seed))
                    print(f"{wkl} {trials} {name} seed {seed}: {runs[name][-1][0]:.1f} GFLOPS in "
                          f"{runs[name][-1][1]:.1f} s", flush=True)
            for name, got in runs.items():
                per_seed = " ".join(f"{g:.0f}" for g, _, _ in got)
                note = got[-1][2] + (f"; seeds {args.seeds}: {per_seed}" if len(got) > 1 else "")
                rows.append(Row(wkl, trials, f"{name} bf16" if bf16 else name, statistics.mean(g for g, _, _ in got),
                                statistics.mean(w for _, w, _ in got), note))

    print()
    other = "vs torch" if bf16 else "vs MS"  # the bf16 rows' peer: PyTorch's bf16 matmul
    print(f"{'workload':<20}{'trials':>7} {'contender':<14}{'GFLOPS':>9}{'of peak':>9}{'vs numpy':>9}"
          f"{other:>9}{'wall s':>8}  note")
    for r in rows:
        numpy = next((x.gflops for x in rows if x.workload == r.workload and x.contender == "numpy"), float("nan"))
        peer = next((x.gflops for x in rows if x.workload == r.workload and x is not r
                     and x.contender in ("metaschedule", "pytorch bf16") and x.trials in (0, r.trials)), float("nan"))
        ceiling = peak.bf16_gflops if "bf16" in r.contender else peak.gflops  # 0: the probe could not run
        print(f"{r.workload:<20}{r.trials:>7} {r.contender:<14}{r.gflops:>9.1f}{ratio(r.gflops, ceiling):>9.2f}"
              f"{ratio(r.gflops, numpy):>9.2f}{ratio(r.gflops, peer):>9.2f}{r.wall_s:>8.1f}  {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
