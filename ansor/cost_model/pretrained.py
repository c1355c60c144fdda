"""The cost model shipped with the package: a booster trained on the logs of the model zoo.

A search normally starts cold: until 16 programs are measured the XGBoost model scores at random, and
then it knows only this task. The shipped booster (``ansor/data/cpu.model.npz``, trained by
``scripts/train_pretrained.py`` on tuning logs of several networks and ISAs; docs/pretrained.md) ranks
from the first round, and the run's own trees learn its errors on top of it (the ``prior`` of
:class:`~.xgb_model.XGBModel`). The file holds the booster alone, no training data, and is read as data
(NumPy without pickle, XGBoost's UBJSON).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import tvm

from ..errors import RecordError
from ..log.records import PathLike, distill_records, load_records
from ..log.seeds import SCHEDULES_SUFFIX, ScheduleDatabase
from ..target import device_kind, shipped_file
from .cost_model import CostModelError, read_model_file
from .training import EvalReport, evaluate_by_kind, to_measure_pairs
from .xgb_model import XGBModel

logger = logging.getLogger("ansor")

#: The suffix of the shipped model file after the device kind's name.
MODEL_SUFFIX = "model.npz"


def pretrained_model(target: tvm.target.Target, seed: int = 0) -> XGBModel | None:
    """A fresh :class:`~.xgb_model.XGBModel` that starts from the shipped booster for ``target``'s kind,
    or ``None`` when none is shipped (or it cannot be read: the search then starts cold, with a warning)."""
    path = shipped_file(target, MODEL_SUFFIX)
    if path is None:
        return None
    try:
        prior = _shipped_booster(path)
    except CostModelError as err:
        logger.warning("pretrained cost model not used: %s", err)
        return None
    return XGBModel(seed=seed, prior=prior)


@lru_cache(maxsize=None)
def _shipped_booster(path: Path):
    """The booster of a shipped model file, read once per process (every task of a run shares it)."""
    header, arrays = read_model_file(path, kind=XGBModel.kind)
    model = XGBModel.from_file(header, arrays, path)
    if model.booster is None:
        raise CostModelError(f"{path}: holds no trained booster")
    return model.booster


@dataclass
class PretrainReport:
    """What :func:`pretrain` trained on and how the model ranks the held-out logs."""

    programs: int
    tasks: int
    targets: dict[str, int]
    schedules: int
    seconds: float
    held_out: dict[str, EvalReport] = field(default_factory=dict)  # "<log> on <CPU kind>" -> its ranking


def add_to_database(logs: Sequence[PathLike], out_dir: PathLike, *, kind: str = "cpu", top_k: int = 3) -> int:
    """Add the ``top_k`` best records of each workload, target and machine of ``logs`` to the schedule database in
    ``out_dir``, keeping its records and the model beside it; returns the records it now holds.

    The way to bring a new CPU kind's logs into the shipped files without the logs the model was trained
    on: its records become that kind's seeds (:func:`~ansor.log.seeds.hardware_distance` puts them first
    there), while the model, which new trees fitted to one machine alone could only tilt, stays.
    """
    schedules = Path(out_dir) / f"{kind}.{SCHEDULES_SUFFIX}"
    if not schedules.is_file():
        raise RecordError(f"{schedules}: no schedule database to add to; train one with ansor pretrain first")
    new = [r for r in load_records(logs) if device_kind(r.task.target).pretrained == kind]
    if not any(r.result.ok for r in new):
        raise RecordError(f"no valid record of a {kind} target in {', '.join(str(p) for p in logs)}")
    kept = distill_records([*load_records(schedules), *new], schedules, top_k=top_k)
    ScheduleDatabase.write_index(kept, schedules)
    return len(kept)


def pretrain(logs: Sequence[PathLike], out_dir: PathLike, *, held_out: Sequence[PathLike] = (),
             kind: str = "cpu", top_k: int = 3, seed: int = 0) -> PretrainReport:
    """Train the shipped model and write the shipped schedule database from ``logs``.

    Writes ``<out_dir>/<kind>.model.npz`` (the booster, trained on every record of ``logs`` measured for a
    target of that kind, all ISAs together; the features carry each target's vector lanes and cores) and
    ``<out_dir>/<kind>.schedules.json`` (the ``top_k`` best distinct records of each workload, target and machine of
    that kind) with its index.
    ``held_out``: logs of models left out of training, on which the trained model's ranking is reported.
    """
    t0 = time.perf_counter()
    records = [r for r in load_records(logs) if device_kind(r.task.target).pretrained == kind]
    if not any(r.result.ok for r in records):
        raise RecordError(f"no valid record of a {kind} target in {', '.join(str(p) for p in logs)}")
    inputs, results = to_measure_pairs(records)
    trained = XGBModel(min_train_programs=1, seed=seed)
    trained.update(inputs, results)
    shipped = XGBModel(seed=seed)
    shipped.booster = trained.booster
    out = Path(out_dir)
    shipped.save(out / f"{kind}.{MODEL_SUFFIX}")
    schedules = out / f"{kind}.{SCHEDULES_SUFFIX}"
    kept = distill_records(records, schedules, top_k=top_k)
    ScheduleDatabase.write_index(kept, schedules)
    report = PretrainReport(trained.last_train.programs, len({(r.workload_key, r.task.target_str) for r in records}),
                            dict(Counter(r.task.target_str for r in records)), len(kept), time.perf_counter() - t0)
    for path in held_out:
        for cpu, ev in evaluate_by_kind(shipped, load_records(path)).items():
            report.held_out[f"{path} on {cpu}"] = ev
    return report
