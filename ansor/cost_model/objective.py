"""Pack-sum training objectives: per-store predictions, summed per program, judged per program.

A program has one feature row per buffer store; the model predicts a number per row and a program's score
is the sum of its rows (Ansor's "pack-sum"). Labels belong to programs, so the loss is computed on the
sums, and the gradient XGBoost needs for each row is the gradient of that loss with respect to the row's
prediction. Since ``d sum / d row = 1``, every row of a program gets its program's gradient (and, as in
Ansor, its program's diagonal Hessian).

Plain numpy, no XGBoost: :mod:`ansor.cost_model.xgb_model` wraps these as custom objectives and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.special import expit


@dataclass(frozen=True)
class Packs:
    """How store rows form programs and programs form tasks, with the programs' labels.

    ``labels`` are normalised throughputs: 1 for the fastest program of its task, ``best / cost`` for the
    others, 0 for programs that failed.
    """

    row_program: np.ndarray  # (n_rows,) program index of each row
    program_task: np.ndarray  # (n_programs,) task index of each program
    labels: np.ndarray  # (n_programs,)

    @property
    def n_programs(self) -> int:
        return len(self.labels)

    def sums(self, row_preds: np.ndarray) -> np.ndarray:
        """Program scores: the sum of each program's row predictions."""
        return np.bincount(self.row_program, weights=row_preds, minlength=self.n_programs)

    def to_rows(self, grad: np.ndarray, hess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-program gradient and Hessian, broadcast to each program's rows."""
        return grad[self.row_program], hess[self.row_program]


class PackSumObjective(Protocol):
    """A loss on program sums: its name, value (for early stopping) and per-program derivatives."""

    name: str

    def loss(self, sums: np.ndarray) -> float: ...

    def gradient(self, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class PackSumSquaredError:
    """Ansor's ``pack_sum_square_error``: ``sum_p w_p (s_p - y_p)^2 / 2`` with ``w_p = y_p``.

    Weighting by the label (the throughput) spends the model's capacity on the fast programs, which are
    the ones the search must rank correctly; failed programs (label 0) do not pull on the fit at all.
    """

    name = "pack-sum-rmse"

    def __init__(self, packs: Packs):
        self.packs = packs
        self.weights = packs.labels

    def loss(self, sums: np.ndarray) -> float:
        """Weighted RMSE of the program sums (the metric Ansor reported as ``p-rmse``)."""
        total = self.weights.sum()
        if total <= 0:
            return 0.0
        return float(np.sqrt(np.sum(self.weights * (sums - self.packs.labels) ** 2) / total))

    def gradient(self, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (sums - self.packs.labels) * self.weights, self.weights.copy()


class PackSumPairwise:
    """Rank-aware: logistic loss on ordered pairs of programs of the same task, ``log(1 + e^-(s_a - s_b))``.

    The search only needs the order of programs within a task, not their throughput. Each boosting round
    draws ``pairs_per_program`` partners per program (same task, different label), so a round costs
    O(programs), not O(programs^2); pairs are weighted by the label gap, so misordering the best programs
    costs more than misordering two slow ones. ``loss`` uses one fixed draw so early stopping sees a
    steady number.
    """

    name = "pack-sum-pairwise-logloss"

    def __init__(self, packs: Packs, pairs_per_program: int = 8, seed: int = 0):
        self.packs = packs
        self.pairs_per_program = pairs_per_program
        self._rng = np.random.default_rng(seed)
        self._fixed = self._draw_pairs(np.random.default_rng(seed + 1))

    def loss(self, sums: np.ndarray) -> float:
        hi, lo, w = self._fixed
        if len(hi) == 0:
            return 0.0
        return float(np.sum(w * np.logaddexp(0.0, -(sums[hi] - sums[lo]))) / np.sum(w))

    def gradient(self, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hi, lo, w = self._draw_pairs(self._rng)
        n = self.packs.n_programs
        if len(hi) == 0:
            return np.zeros(n), np.zeros(n)
        sig = expit(sums[lo] - sums[hi])  # probability the pair is misordered
        p = w * sig  # -d loss / d s_hi
        h = p * (1.0 - sig)
        grad = np.bincount(lo, weights=p, minlength=n) - np.bincount(hi, weights=p, minlength=n)
        hess = np.bincount(lo, weights=h, minlength=n) + np.bincount(hi, weights=h, minlength=n)
        return grad, hess

    def _draw_pairs(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(better, worse, weight) program indices of random same-task pairs with different labels."""
        tasks = self.packs.program_task
        labels = self.packs.labels
        order = np.argsort(tasks, kind="stable")
        counts = np.bincount(tasks)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        a = np.repeat(order, self.pairs_per_program)
        t = tasks[a]
        b = order[starts[t] + (rng.random(len(a)) * counts[t]).astype(np.int64)]
        keep = labels[a] != labels[b]
        a, b = a[keep], b[keep]
        better = labels[a] > labels[b]
        hi, lo = np.where(better, a, b), np.where(better, b, a)
        return hi, lo, np.abs(labels[a] - labels[b])


#: Names of the objectives :func:`make_objective` knows, the default (rank-aware) first.
OBJECTIVES = ("pack-sum-rank", "pack-sum-mse")


def make_objective(name: str, packs: Packs, seed: int = 0) -> PackSumObjective:
    """The objective called ``name`` (one of :data:`OBJECTIVES`) over ``packs``."""
    if name == "pack-sum-rank":
        return PackSumPairwise(packs, seed=seed)
    if name == "pack-sum-mse":
        return PackSumSquaredError(packs)
    raise ValueError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
