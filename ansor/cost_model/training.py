"""Train a cost model from tuning logs, and measure how well it ranks programs it has not seen.

This is what ``scripts/train_cost_model.py`` runs: load the logs, keep one target (and optionally some
workloads), split the distinct programs of each task into a training and a held-out part, train, and
report the ranking metrics of :mod:`.metrics` on the held-out part.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import tvm

from ..errors import RecordError, StepError
from ..log.measurement import MAX_COST, MeasureInput, MeasureResult
from ..log.records import PathLike, Record, load_records
from ..target import parse_target, target_to_str
from .cost_model import CostModel
from .metrics import pairwise_accuracy, pairwise_accuracy_by_gap, spearman_by_group, top_k_recall
from .xgb_model import MAX_PROGRAMS_PER_TASK, XGBModel, XGBParams

logger = logging.getLogger("ansor")

TargetLike = Union[str, dict, tvm.target.Target, None]


@dataclass
class EvalReport:
    """Ranking quality on a set of programs (held out from training)."""

    n_programs: int
    n_tasks: int
    pairwise_accuracy: float
    top1_recall: float
    top5_recall: float
    spearman: dict[str, float] = field(default_factory=dict)  # per workload key (and target, if several)
    programs_per_task: dict[str, int] = field(default_factory=dict)
    #: (faster, slower] band of the slower program's time over the faster's -> (accuracy, pairs) in it
    by_gap: dict[tuple[float, float], tuple[float, int]] = field(default_factory=dict)

    def gap_summary(self) -> str:
        """The pairwise accuracy per band of :data:`~.metrics.GAP_BANDS`, on one line."""
        return ", ".join(f"{acc:.2f} of {n} pairs {lo:g}-{hi:g}x apart" if hi != float("inf") else
                         f"{acc:.2f} of {n} pairs over {lo:g}x apart" for (lo, hi), (acc, n) in self.by_gap.items())


@dataclass
class TrainResult:
    model: XGBModel
    n_train: int
    n_test: int
    report: Optional[EvalReport]  # None when nothing was held out


def load_training_records(paths: Union[PathLike, Sequence[PathLike]], target: TargetLike = None,
                          workloads: Optional[Iterable[str]] = None) -> list[Record]:
    """The records of ``paths`` for one target (and the given workloads), saying what was left out.

    ``target``: any form :func:`~ansor.target.parse_target` takes; default: the target most records of the
    logs were measured on. Records of other targets and workloads are skipped with a warning each kind.

    Raises
    ------
    RecordError
        If a log is missing or unreadable, or nothing usable is left.
    """
    path_list = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not path_list:
        raise RecordError("no log given")
    records = load_records(path_list)
    names = ", ".join(str(p) for p in path_list)
    if not records:
        raise RecordError(f"no records in {names} (empty, or every line is corrupt)")
    targets = Counter(r.task.target_str for r in records)
    want = target_to_str(parse_target(target)) if target is not None else targets.most_common(1)[0][0]
    for other, n in targets.items():
        if other != want:
            logger.warning("skipped %d records measured for another target (%s); training for %s", n, other, want)
    records = [r for r in records if r.task.target_str == want]
    if workloads is not None:
        wanted = set(workloads)
        skipped = Counter(r.workload_key for r in records if r.workload_key not in wanted)
        if skipped:
            logger.warning("skipped %d records of other workloads (%s)", sum(skipped.values()),
                           ", ".join(f"{k}: {n}" for k, n in sorted(skipped.items())))
        records = [r for r in records if r.workload_key in wanted]
    if not records:
        raise RecordError(f"no records in {names} for target {want}"
                          + (f" and workloads {', '.join(sorted(set(workloads)))}" if workloads is not None else ""))
    return records


def to_measure_pairs(records: Sequence[Record]) -> tuple[list[MeasureInput], list[MeasureResult]]:
    """Records as (input, result) pairs for :meth:`CostModel.update`, dropping those whose steps do not fit."""
    inputs, results, bad = [], [], 0
    for rec in records:
        try:
            inputs.append(MeasureInput(rec.task, rec.state))
        except StepError:
            bad += 1
            continue
        results.append(rec.result)
    if bad:
        logger.warning("skipped %d records whose steps no longer fit their workload", bad)
    return inputs, results


def split_by_program(records: Sequence[Record], test_fraction: float, seed: int = 0
                     ) -> tuple[list[Record], list[Record]]:
    """Split each task's distinct programs into training and held-out parts (repeats of a program stay together).

    Every task with at least two programs gets at least one held-out program when ``test_fraction > 0``.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    rng = random.Random(seed)
    programs: dict[tuple, dict[tuple, list[Record]]] = {}
    for rec in records:
        programs.setdefault((rec.workload_key, rec.task.target_str), {}).setdefault(rec.steps, []).append(rec)
    train: list[Record] = []
    test: list[Record] = []
    for group in programs.values():
        keys = list(group)
        rng.shuffle(keys)
        n_test = round(len(keys) * test_fraction)
        if test_fraction > 0 and len(keys) >= 2:
            n_test = min(max(n_test, 1), len(keys) - 1)
        for k, key in enumerate(keys):
            (test if k < n_test else train).extend(group[key])
    return train, test


def evaluate(model: CostModel, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> EvalReport:
    """Ranking metrics of ``model``'s scores against the measured costs, per task."""
    by_task: dict[int, list[int]] = {}
    for i, inp in enumerate(inputs):
        by_task.setdefault(id(inp.task), []).append(i)
    scores = np.empty(len(inputs))
    for idx in by_task.values():
        scores[idx] = model.predict(inputs[idx[0]].task, [inputs[i].state for i in idx])
    costs = np.asarray([r.mean_cost if r.ok else MAX_COST for r in results])
    multi_target = len({inp.task.target_str for inp in inputs}) > 1
    groups = [f"{inp.task.workload_key} @ {inp.task.target_str}" if multi_target else inp.task.workload_key
              for inp in inputs]
    return EvalReport(len(inputs), len(set(groups)), pairwise_accuracy(scores, costs, groups),
                      top_k_recall(scores, costs, groups, 1), top_k_recall(scores, costs, groups, 5),
                      {str(k): v for k, v in spearman_by_group(scores, costs, groups).items()},
                      dict(Counter(groups)), pairwise_accuracy_by_gap(scores, costs, groups))


def cpu_kind(record: Record) -> str:
    """The kind of CPU ``record`` was measured on, for reporting a model's ranking per kind: its log's
    machine facts where it has them (model name and vector width), else its target's ``mcpu``."""
    mcpu = str(record.task.target.attrs.get("mcpu", "")) or record.task.target.kind.name
    if record.machine is None:
        return f"{mcpu} (machine not logged)"
    return f"{record.machine.cpu}, {mcpu}, {8 * record.machine.vector_bytes}-bit vectors"


def evaluate_by_kind(model: CostModel, records: Sequence[Record]) -> dict[str, EvalReport]:
    """:func:`evaluate` on the records of each CPU kind (:func:`cpu_kind`) apart."""
    kinds: dict[str, list[Record]] = {}
    for rec in records:
        kinds.setdefault(cpu_kind(rec), []).append(rec)
    out = {}
    for kind, recs in sorted(kinds.items()):
        inputs, results = to_measure_pairs(recs)
        if inputs:
            out[kind] = evaluate(model, inputs, results)
    return out


def train_from_logs(paths: Union[PathLike, Sequence[PathLike]], *, target: TargetLike = None,
                    workloads: Optional[Iterable[str]] = None, test_fraction: float = 0.2, seed: int = 0,
                    params: Optional[XGBParams] = None, features: str = "state",
                    max_programs_per_task: Optional[int] = MAX_PROGRAMS_PER_TASK) -> TrainResult:
    """Train an :class:`XGBModel` on the logs and report its ranking of a held-out split.

    The model is trained once, on the training split only, so the report describes the model returned.
    ``max_programs_per_task`` defaults to the tuning cap, so a model loaded with ``--load-model`` still
    retrains in bounded time (``None``: keep everything).

    Raises
    ------
    RecordError
        If a log is missing, unreadable or has no usable record, or the training split has no successful
        measurement.
    """
    records = load_training_records(paths, target, workloads)
    train, test = split_by_program(records, test_fraction, seed)
    train_in, train_res = to_measure_pairs(train)
    if not train_in:
        raise RecordError("no usable records to train on")
    if not any(res.ok for res in train_res):
        raise RecordError(f"no valid record to train on: all {len(train_in)} records are failed measurements "
                          "(a model learns from measured times; tune first, or give other logs)")
    model = XGBModel(params, min_train_programs=1, max_programs_per_task=max_programs_per_task, seed=seed,
                     features=features)
    model.update(train_in, train_res)
    report = None
    if test:
        test_in, test_res = to_measure_pairs(test)
        if test_in:
            report = evaluate(model, test_in, test_res)
    return TrainResult(model, len(train_in), len(test) if report else 0, report)
