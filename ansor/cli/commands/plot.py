"""``ansor plot``: best latency against trials from a network's tuning log, the estimated total and each
task (also ``scripts/plot_tuning_curve.py``).

Examples
--------
  ansor plot logs/resnet-50-b1.json --out resnet50.png
  ansor plot my-log.json --network bert --batch-size 16 --out bert.png
  ansor plot logs/tiny-cnn-b1.json --csv curve.csv        # data only, no matplotlib

Trials are the log's measurements of the network's tasks in the order they were made (file order; a
resumed run appends). Per task: the best valid latency measured so far. Total: the estimated network
latency, the sum over tasks of weight x best latency (weight = how often the subgraph occurs); it starts at
the first trial where every task the log measures has a valid result. Tasks the log never measured are not
in the total (the plot says how many). Weights and task names come from extracting the network, so the
script needs to know which network and batch size the log is for: from --network/--onnx and --batch-size,
else from the log's file name <network>-b<batch>.json.

The PNG needs matplotlib (pip install matplotlib); --csv alone does not.
Exit status: 0, 2 bad input (or matplotlib missing), 130 interrupted.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

#: Tasks named in the legend; the others are drawn in grey.
LEGEND_TASKS = 10


NAME = "plot"
SUMMARY = "plot (or write as CSV) a network's tuning curve from its log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import ExistingFile, OutputFile, Text, add_precision_arg
    from ..networks import add_network_args

    parser.add_argument("log", metavar="LOG", type=ExistingFile("a tuning log", "logs/net-b1.json"),
                        help="a tuning log of one network")
    parser.add_argument("--out", default=None, metavar="FILE.png", type=OutputFile("a PNG file path", "curve.png"),
                        help="the picture to write (default: LOG with the suffix .png, unless only --csv is given)")
    parser.add_argument("--csv", default=None, metavar="FILE.csv", type=OutputFile("a CSV file path", "curve.csv"),
                        help="also (or only) write the curves as CSV: trial, total_ms, one column per task")
    add_network_args(parser, for_logs=True)
    add_precision_arg(parser, for_logs=True)
    parser.add_argument("--target", default=None, type=Text("a target", "host"),
                        help="use the records of this target (default: the target most of the log's records "
                             "were measured for)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_main
    return run_main(run, args)


@dataclass
class Curves:
    """Best latency (ms) after each trial, per task and in total; ``None`` where not yet defined."""

    names: list[str]
    weights: list[int]
    trials: list[int]
    per_task: list[list]  # per_task[i][t]: task i's best after trial t
    total: list  # total[t]
    covered: int  # tasks in the total (measured with a valid result somewhere in the log)


def curves(log: Path, extraction, target) -> Curves:
    """Replay the log's records of the extraction's tasks in file order."""
    from ...log.records import load_records

    index = {t.workload_key: i for i, t in enumerate(extraction.tasks)}
    records = [r for r in load_records(log, target=target) if r.workload_key in index]
    n = len(extraction.tasks)
    weights = [t.weight for t in extraction.tasks]
    covered = {index[r.workload_key] for r in records if r.result.ok}
    best: list = [None] * n
    per_task: list[list] = [[] for _ in range(n)]
    total: list = []
    for rec in records:
        i = index[rec.workload_key]
        if rec.result.ok:
            ms = rec.result.mean_cost * 1e3
            best[i] = ms if best[i] is None else min(best[i], ms)
        for j in range(n):
            per_task[j].append(best[j])
        if covered and all(best[j] is not None for j in covered):
            total.append(sum(weights[j] * best[j] for j in covered))
        else:
            total.append(None)
    return Curves([t.name for t in extraction.tasks], weights, list(range(1, len(records) + 1)), per_task, total,
                  len(covered))


def run(args: argparse.Namespace) -> int:
    from ..networks import network_for_log
    from ..options import network_precision
    from ..targets import log_target, parse_target_and_threads
    from ...errors import AnsorError

    log = Path(args.log)
    out = Path(args.out) if args.out else (None if args.csv else log.with_suffix(".png"))
    plt = _pyplot() if out is not None else None  # fail fast, before the slow part
    net = network_for_log(args, log)
    target = parse_target_and_threads(args.target or log_target([log]) or "host")
    from ...networks import extract

    extraction = extract(net, target, precision=network_precision(args, target, log))
    data = curves(log, extraction, target)
    if not data.trials:
        raise AnsorError(f"{log} has no measurement of {net.name} (batch {net.batch_size}) tasks for this target; "
                         "check --network/--batch-size/--target")
    if args.csv:
        write_csv(Path(args.csv), data)
        print(f"wrote {args.csv}")
    if out is not None:
        plot(plt, data, out, f"{net.name}, batch {net.batch_size}: {log.name}")
        print(f"wrote {out}")
    final = next((t for t in reversed(data.total) if t is not None), None)
    n = len(data.names)
    print(f"{len(data.trials)} trials; {data.covered} of {n} tasks measured; estimated total "
          f"{'-' if final is None else f'{final:.3f} ms'}"
          f"{'' if data.covered == n else f' (over the {data.covered} measured tasks)'}")
    return 0


def _pyplot():
    from ...errors import AnsorError
    try:
        import matplotlib
    except ImportError:
        raise AnsorError("plotting needs matplotlib: pip install matplotlib (or write only the data with "
                         "--csv FILE.csv)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_csv(path: Path, data: Curves) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "total_ms", *data.names])
        for t, trial in enumerate(data.trials):
            row = [trial, data.total[t], *(c[t] for c in data.per_task)]
            writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in row])


def plot(plt, data: Curves, out: Path, title: str) -> None:
    n = len(data.names)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 8), gridspec_kw={"height_ratios": [1, 1.4]})
    xs = [x for x, y in zip(data.trials, data.total) if y is not None]
    ys = [y for y in data.total if y is not None]
    label = "sum of weight x best latency" + ("" if data.covered == n else f" ({data.covered} of {n} tasks)")
    if xs:
        top.step(xs, ys, where="post", color="black", marker="." if len(xs) <= 50 else None, label=label)
        top.legend(loc="best")
    else:
        top.text(0.5, 0.5, "no trial where every measured task has a valid result", ha="center",
                 transform=top.transAxes)
    top.set_ylabel("estimated total (ms)")
    top.set_title(title)
    top.grid(True, alpha=0.3)

    # Name the tasks that matter most at the end (weight x final best); the rest stay grey.
    final = [(c[-1] or 0.0) * w for c, w in zip(data.per_task, data.weights)]
    named = set(sorted(range(n), key=lambda i: -final[i])[:LEGEND_TASKS])
    grey = 0
    for i, c in enumerate(data.per_task):
        pts = [(x, y) for x, y in zip(data.trials, c) if y is not None]
        if not pts:
            continue
        xs_, ys_ = zip(*pts)
        if i in named:
            bottom.step(xs_, ys_, where="post", label=f"{i}: {data.names[i]} (x{data.weights[i]})")
        else:
            grey += 1
            bottom.step(xs_, ys_, where="post", color="0.75", linewidth=0.8)
    if grey:
        bottom.plot([], [], color="0.75", label=f"{grey} other tasks")
    bottom.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.6, 1, 2 rather than 6x10^-1, 10^0, 2x10^0
    bottom.yaxis.set_major_formatter(plain)
    bottom.yaxis.set_minor_formatter(plain)
    bottom.set_xlabel("trials")
    bottom.set_ylabel("best latency per task (ms)")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)

