"""Benchmark: a whole network tuned by ansor vs MetaSchedule at the same total trial budget, in one run.

  python scripts/bench/bench_network.py --network resnet-50 --trials-per-task 64
  python scripts/bench/bench_network.py --network tiny-cnn --trials-per-task 8     # a quick check
  python scripts/bench/bench_network.py --network resnet-50 --ansor-log logs/resnet-50-b1.json --skip-metaschedule

Budget: trials-per-task x the number of ansor tasks, given to both tuners as one global budget.
1. ansor: ``scripts/tune_network.py`` in a subprocess (as a user runs it; its log is kept in --work-dir),
   or an existing log given with --ansor-log.
2. MetaSchedule: ``relax_integration.tune_relax`` on the same fused module (its own tasks from its
   PrimFuncs, 64 trials per task round), best schedules applied with ``MetaScheduleApplyDatabase``.
3. Timed at the end, one after another with a pause in between, in this process (TVM_NUM_THREADS = the
   target's cores): the default build (our parallel + vectorized default schedules), ansor's tuned
   build, MetaSchedule's build, and PyTorch eager with as many threads when torch is installed.
Reported: mean latency of each and the ratios, and the tuning wall times.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tune_ansor(network: str, trials: int, log: Path) -> float:
    """Run tune_network.py; returns its tuning wall time (seconds, as it reports it)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "tune_network.py"), "--network", network, "--n-trials",
           str(trials), "--log-file", str(log), "--repeat", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tune_network.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found = re.search(r"^tuning: .* in (\d+\.\d+) s", proc.stderr, re.M)
    return float(found.group(1)) if found else float("nan")


def tune_metaschedule(extraction, target, trials: int, work_dir: str):
    """MetaSchedule on the same fused module ansor tunes; returns (executable, wall seconds).

    ``tune_relax`` takes its tasks from the module's PrimFuncs, so it gets the legalized and fused module
    (the raw one has none); its best schedules are applied with ``MetaScheduleApplyDatabase`` and the
    module is lowered like ours (PrimFuncs without a record stay unscheduled, as in MetaSchedule's flow).
    """
    from tvm import relax
    from tvm.s_tir.meta_schedule import relax_integration

    from ansor.networks import build

    t0 = time.time()
    database = relax_integration.tune_relax(extraction.mod, {}, target, work_dir, max_trials_global=trials,
                                            num_trials_per_iter=64)
    wall = time.time() - t0
    with target, database:
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(extraction.mod)
    return build(tuned, target), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet-50", help="built-in network (default resnet-50)")
    parser.add_argument("--trials-per-task", type=int, default=64, help="budget per ansor task (default 64)")
    parser.add_argument("--ansor-log", default=None, help="use this tuning log instead of tuning with ansor")
    parser.add_argument("--skip-metaschedule", action="store_true", help="no MetaSchedule run")
    parser.add_argument("--work-dir", default=None, help="where logs and MetaSchedule's database go "
                                                         "(default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=10, help="timing repeats of each build (default 10)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between timings (default 3)")
    args = parser.parse_args()

    from ansor.target import host_target
    target = host_target()
    cores = int(target.attrs["num-cores"])
    os.environ["TVM_NUM_THREADS"] = str(cores)

    from ansor.cli import evaluate_network
    from ansor.networks import extract, get_network, time_network

    net = get_network(args.network, batch_size=1)
    extraction = extract(net, target)
    trials = args.trials_per_task * len(extraction.tasks)
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="ansor-bench-network-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"{args.network} b1: {len(extraction.tasks)} ansor tasks, budget {trials} trials for each tuner, "
          f"TVM_NUM_THREADS={cores}; work dir {work_dir}", flush=True)

    walls: dict[str, float] = {}
    log = Path(args.ansor_log) if args.ansor_log else work_dir / f"{args.network}-b1.json"
    if not args.ansor_log:
        walls["ansor"] = tune_ansor(args.network, trials, log)
        print(f"ansor tuned in {walls['ansor']:.0f} s", flush=True)
    ms_exe = None
    if not args.skip_metaschedule:
        ms_exe, walls["metaschedule"] = tune_metaschedule(extraction, target, trials,
                                                          str(work_dir / "metaschedule"))
        print(f"MetaSchedule tuned in {walls['metaschedule']:.0f} s", flush=True)

    time.sleep(args.pause)
    ev = evaluate_network(extraction, log, target, repeat=args.repeat)
    if not ev.comparison.ok:
        print("error: ansor's tuned build gives outputs that differ from the default build's", file=sys.stderr)
        return 1
    rows = [("default build", ev.default.mean_ms), ("ansor", ev.tuned.mean_ms)]
    if ms_exe is not None:
        time.sleep(args.pause)
        rows.append(("metaschedule", time_network(ms_exe, extraction.network, target=target, repeat=args.repeat).mean_ms))
    torch_ms = _torch_mean_ms(args.network, cores, args.repeat, args.pause)
    if torch_ms is not None:
        rows.append((f"pytorch eager ({cores} threads)", torch_ms))

    ansor_ms = ev.tuned.mean_ms
    print(f"\n{'build':<28}{'mean ms':>10}{'ansor / this':>14}")
    for name, ms in rows:
        print(f"{name:<28}{ms:>10.3f}{ansor_ms / ms:>14.2f}")
    print(f"tasks tuned by ansor: {ev.tuned_tasks}/{ev.n_tasks}; tuning wall time: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()))
    return 0


def _torch_mean_ms(network: str, threads: int, repeat: int, pause: float):
    """PyTorch eager latency of the same network, or None without torch or a torch definition."""
    try:
        from ansor.networks.torch_baseline import time_torch
    except ImportError:
        return None
    time.sleep(pause)
    try:
        return time_torch(network, 1, threads, repeat).mean_ms
    except Exception as err:  # torch missing or no definition for this network
        print(f"note: no PyTorch baseline ({err})", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())
