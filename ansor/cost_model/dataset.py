"""What the cost model learns from: measured programs per task, their features, and their labels.

Labels are computed when the model trains, not when a measurement arrives: a label is the program's
throughput normalised by the best program of its task *so far* (``best_cost / cost``; 1 = best, failed
programs 0), so every label moves when a faster program turns up.

Retraining on everything every round gets slower as logs grow, so each task keeps at most
``max_programs_per_task`` programs: the fastest half of that budget and, for the rest, the most recent.
The best programs are what the search must keep ranking right; recent ones describe the region it is
exploring now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..log.measurement import MAX_COST
from .objective import Packs


@dataclass
class _TaskData:
    """The programs of one task (same workload and target), in arrival order."""

    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TrainingArrays:
    """The training set in the shape XGBoost wants: one row per store, plus how rows group."""

    rows: np.ndarray  # (n_rows, n_features) float32
    packs: Packs
    costs: np.ndarray  # (n_programs,)
    task_keys: list[str]


class TrainingSet:
    """Measured programs grouped by task, capped per task.

    Parameters
    ----------
    max_programs_per_task
        Cap on each task's programs (``None``: keep everything). See the module docstring.
    """

    def __init__(self, max_programs_per_task: Optional[int] = None):
        if max_programs_per_task is not None and max_programs_per_task < 2:
            raise ValueError(f"max_programs_per_task must be at least 2, got {max_programs_per_task}")
        self.max_programs_per_task = max_programs_per_task
        self._tasks: dict[str, _TaskData] = {}
        self._seq = 0

    def __len__(self) -> int:
        return sum(len(t.costs) for t in self._tasks.values())

    @property
    def task_keys(self) -> list[str]:
        return list(self._tasks)

    def add(self, task_key: str, features: np.ndarray, cost: float) -> None:
        """Add one measured program (``cost``: mean seconds, ``MAX_COST`` if it failed)."""
        data = self._tasks.setdefault(task_key, _TaskData())
        data.features.append(features)
        data.costs.append(min(float(cost), MAX_COST))
        data.seqs.append(self._seq)
        self._seq += 1
        cap = self.max_programs_per_task
        if cap is not None and len(data.costs) > cap:
            self._trim(data, cap)

    @staticmethod
    def _trim(data: _TaskData, cap: int) -> None:
        costs = np.asarray(data.costs)
        best = np.argsort(costs, kind="stable")[: cap // 2]
        rest = np.setdiff1d(np.arange(len(costs)), best)
        recent = rest[np.argsort(np.asarray(data.seqs)[rest], kind="stable")[len(rest) - (cap - len(best)):]]
        keep = np.sort(np.concatenate((best, recent)))
        data.features = [data.features[i] for i in keep]
        data.costs = [data.costs[i] for i in keep]
        data.seqs = [data.seqs[i] for i in keep]

    def arrays(self) -> TrainingArrays:
        """Rows, grouping and normalised-throughput labels of everything kept."""
        feats: list[np.ndarray] = []
        costs: list[float] = []
        tasks: list[int] = []
        labels: list[np.ndarray] = []
        for t, data in enumerate(self._tasks.values()):
            c = np.asarray(data.costs)
            ok = c < MAX_COST
            best = c[ok].min() if ok.any() else 1.0
            labels.append(np.where(ok, best / np.where(ok, c, 1.0), 0.0))
            feats.extend(data.features)
            costs.extend(data.costs)
            tasks.extend([t] * len(data.costs))
        counts = np.asarray([len(f) for f in feats], dtype=np.int64)
        n_features = feats[0].shape[1] if feats else 0
        rows = np.concatenate(feats).astype(np.float32, copy=False) if feats else np.zeros((0, n_features),
                                                                                            np.float32)
        packs = Packs(np.repeat(np.arange(len(feats)), counts), np.asarray(tasks, dtype=np.int64),
                      np.concatenate(labels) if labels else np.zeros(0))
        return TrainingArrays(rows, packs, np.asarray(costs, dtype=float), self.task_keys)

    # ------------------------------------------------------------------ persistence
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat arrays for a model file (see :meth:`from_arrays`)."""
        feats, counts, costs, seqs, tasks = [], [], [], [], []
        for t, data in enumerate(self._tasks.values()):
            feats.extend(data.features)
            counts.extend(len(f) for f in data.features)
            costs.extend(data.costs)
            seqs.extend(data.seqs)
            tasks.extend([t] * len(data.costs))
        width = feats[0].shape[1] if feats else 0
        return {"rows": np.concatenate(feats) if feats else np.zeros((0, width), np.float32),
                "row_counts": np.asarray(counts, dtype=np.int64), "costs": np.asarray(costs, dtype=float),
                "seqs": np.asarray(seqs, dtype=np.int64), "program_task": np.asarray(tasks, dtype=np.int64)}

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray], task_keys: list[str],
                    max_programs_per_task: Optional[int]) -> "TrainingSet":
        out = TrainingSet(max_programs_per_task)
        bounds = np.concatenate(([0], np.cumsum(arrays["row_counts"])))
        rows = arrays["rows"]
        for i, (t, cost, seq) in enumerate(zip(arrays["program_task"], arrays["costs"], arrays["seqs"])):
            data = out._tasks.setdefault(task_keys[int(t)], _TaskData())
            data.features.append(rows[bounds[i]:bounds[i + 1]])
            data.costs.append(float(cost))
            data.seqs.append(int(seq))
        out._seq = int(arrays["seqs"].max()) + 1 if len(arrays["seqs"]) else 0
        return out
