"""``ansor pretrain``: train the pretrained cost model and write the schedule database that the package
ships (``ansor/data/``), from tuning logs (also ``scripts/train_pretrained.py``).

Examples
--------
  ansor pretrain logs/zoo/*.json --held-out logs/vit.json logs/convnext.json
  ansor pretrain logs/*.json --out-dir my-data --top-k 5
  ansor pretrain train/resnet-50.json train/bert.json --add     # a new CPU kind's logs, into the shipped files

Writes two files into --out-dir (default: the package's own ``ansor/data``, which tuning reads unless
``--no-pretrained`` is given; docs/pretrained.md):

  cpu.model.npz        an XGBoost booster trained on every record of a CPU target in the logs, all ISAs
                       together (its features include each target's vector lanes and cores)
  cpu.schedules.json   the --top-k best distinct records of each workload, target and machine: a log

--add adds the logs' best records to the schedule database already in --out-dir and keeps its model:
the way to bring a new CPU kind's logs in without the logs the model was trained on.

--held-out LOG reports how well the new model ranks the programs of logs it was not trained on, for
each kind of CPU they were measured on (the machine each log names, else its target's CPU):
pairwise accuracy (the fraction of same-task program pairs it orders like the measurements), top-1
recall and Spearman per task. Exit status 2 means bad input: a missing log, or no valid record.
"""

from __future__ import annotations

import argparse
import logging

NAME = "pretrain"
SUMMARY = "train the shipped pretrained cost model and schedule database from logs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import SEED, ExistingFile, OutputDir, count

    parser.add_argument("logs", nargs="+", metavar="LOG", type=ExistingFile("a tuning log", "logs/zoo/resnet50.json"),
                        help="tuning logs (JSON lines) to learn from, of any CPU targets")
    parser.add_argument("--held-out", nargs="+", default=(), metavar="LOG",
                        type=ExistingFile("a tuning log", "logs/zoo/vit_b_16.json"),
                        help="logs of models left out of training: the model's ranking of them is reported")
    parser.add_argument("--out-dir", default=None, type=OutputDir("a directory", "ansor/data"),
                        help="where to write cpu.model.npz and cpu.schedules.json (default: the installed "
                             "package's ansor/data, replacing what it ships)")
    parser.add_argument("--top-k", type=count(100, "3"), default=3,
                        help="records kept per workload, target and machine in the schedule database (default 3)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of training (default 0)")
    parser.add_argument("--add", action="store_true",
                        help="add the logs' best records to the schedule database in --out-dir instead, keeping "
                             "its records and its model (a new CPU kind's logs, without the logs the model was "
                             "trained on)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log skipped records and training details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_main
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return run_main(run, args)


def run(args: argparse.Namespace) -> int:
    from ...cost_model.pretrained import add_to_database, pretrain
    from ...errors import AnsorError
    from ...target import DATA_DIR

    out = args.out_dir or DATA_DIR
    if args.add:
        if args.held_out:
            raise AnsorError("--held-out reports a newly trained model's ranking; --add trains none")
        count = add_to_database(args.logs, out, top_k=args.top_k)
        print(f"schedule database: {count} records; wrote {out}/cpu.schedules.json (the model is unchanged)")
        return 0
    report = pretrain(args.logs, out, held_out=args.held_out, top_k=args.top_k, seed=args.seed)
    targets = ", ".join(f"{n} on {t}" for t, n in sorted(report.targets.items()))
    print(f"trained on {report.programs} programs of {report.tasks} tasks ({targets}) in {report.seconds:.1f} s")
    print(f"schedule database: {report.schedules} records")
    for path, ev in report.held_out.items():
        print(f"held out {path}: {ev.n_programs} programs of {ev.n_tasks} tasks, pairwise accuracy "
              f"{ev.pairwise_accuracy:.3f}, top-1 recall {ev.top1_recall:.3f}; by gap: {ev.gap_summary()}")
    print(f"wrote {out}/cpu.model.npz and {out}/cpu.schedules.json")
    return 0
