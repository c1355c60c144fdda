"""``ansor train-model``: train the XGBoost cost model from tuning logs and report how well it ranks
held-out programs (also ``scripts/train_cost_model.py``).

Examples
--------
  ansor train-model logs/*.json --out model.npz
  ansor train-model logs/a.json logs/b.json --out model.npz --workload matmul-512
  ansor train-model logs/*.json --out model.npz --test-fraction 0   # train on everything

The distinct programs of each task are split (seeded) into a training part and a held-out part; the model
is trained on the training part only and then scored on the held-out part:

  pairwise accuracy  fraction of same-task program pairs the model orders like the measurements
  top-k recall       fraction of tasks whose fastest held-out program is among the model's k best-scored
  Spearman           rank correlation of score and measured speed, per task

The saved model is the one evaluated. Load it in other scripts with ``--load-model FILE``
(``ansor.cost_model.load_model``). Exit status 2 means bad input: a missing log, or logs that hold no
valid record to learn from.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter


class _RepeatLimiter(logging.Filter):
    """Shows the first few warnings of each kind (a corrupt log warns once per line), then counts the rest."""

    def __init__(self, shown: int = 5):
        super().__init__()
        self.shown = shown
        self.seen: Counter = Counter()
        self.example: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        self.seen[record.msg] += 1
        if self.seen[record.msg] <= self.shown:
            return True
        self.example.setdefault(record.msg, record.getMessage())
        return False

    def summary(self) -> list[str]:
        return [f"WARNING ... and {n - self.shown} more like: {self.example[msg]} (-v shows all)"
                for msg, n in self.seen.items() if n > self.shown]


NAME = "train-model"
SUMMARY = "train a cost model offline from tuning logs (for --load-model)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import SEED, ExistingFile, Number, OutputFile, Text, count

    parser.add_argument("logs", nargs="+", metavar="LOG", type=ExistingFile("a tuning log", "logs/mm.json"),
                        help="tuning logs (JSON lines) to learn from")
    parser.add_argument("--out", required=True, metavar="FILE", type=OutputFile("a model file path", "model.npz"),
                        help="where to save the trained model (an .npz archive; replaced if it exists)")
    parser.add_argument("--test-fraction", type=Number(0.0, 0.99, False, "0.2"), default=0.2,
                        help="fraction of each task's distinct programs held out for evaluation, in [0, 0.99]; "
                             "0 trains on everything and reports nothing (default 0.2)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the split and of training (default 0)")
    parser.add_argument("--target", default=None, type=Text("a target", "host"),
                        help="learn only from records of this target ('host', 'llvm -mcpu=znver4 -num-cores=2', "
                             "a JSON dict...); default: the target most records were measured on. Records of "
                             "other targets are skipped with a warning")
    parser.add_argument("--workload", action="append", default=None, metavar="KEY",
                        type=Text("a workload key", "matmul-512"),
                        help="learn only from this workload key (repeat for several); default: all")
    parser.add_argument("--objective", choices=("pack-sum-rank", "pack-sum-mse"), default="pack-sum-rank",
                        help="training loss on per-program sums: pack-sum-rank (pairwise, rank-aware; "
                             "default) or pack-sum-mse (Ansor's throughput-weighted squared error)")
    parser.add_argument("--features", choices=("state", "tvm"), default="state",
                        help="per-store features: state (computed from the loop State; default) or tvm "
                             "(TVM's C++ PerStoreFeature on the replayed program, ~10x slower); a model "
                             "keeps its choice when saved")
    parser.add_argument("--max-rounds", type=count(100_000, "100"), default=100,
                        help="most boosting rounds (trees); training stops earlier when the training loss "
                             "stops improving (default 100)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every skipped record and training details")


def execute(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    limiter = _RepeatLimiter()
    ansor_logger = logging.getLogger("ansor")
    if not args.verbose:
        ansor_logger.addFilter(limiter)
    from ..running import run_main

    try:
        return run_main(run, args)
    finally:
        ansor_logger.removeFilter(limiter)
        for line in limiter.summary():
            print(line, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from ...cost_model.training import train_from_logs
    from ...cost_model.xgb_model import XGBParams

    t0 = time.perf_counter()
    result = train_from_logs(args.logs, target=args.target, workloads=args.workload,
                             test_fraction=args.test_fraction, seed=args.seed, features=args.features,
                             params=XGBParams(objective=args.objective, num_boost_round=args.max_rounds))
    stats, features = result.model.last_train, result.model.extractor.stats
    print(f"trained on {result.n_train} records ({stats.rows} store rows, {stats.rounds} rounds) in "
          f"{time.perf_counter() - t0:.1f} s: features {features.wall_s:.1f} s, boosting {stats.seconds:.1f} s")
    report = result.report
    if report is not None:
        print(f"held out: {report.n_programs} records of {report.n_tasks} task(s)")
        print(f"pairwise accuracy: {report.pairwise_accuracy:.3f}")
        print(f"top-1 recall: {report.top1_recall:.3f}")
        print(f"top-5 recall: {report.top5_recall:.3f}")
        print("Spearman per task:")
        width = max(len(k) for k in report.spearman)
        for key, rho in sorted(report.spearman.items()):
            print(f"  {key:<{width}}  {rho:6.3f}  ({report.programs_per_task[key]} held-out records)")
    result.model.save(args.out)
    print(f"saved model to {args.out}")
    return 0

