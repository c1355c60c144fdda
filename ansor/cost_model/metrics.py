"""How well scores rank programs: what the search needs from a cost model.

All functions take per-program ``scores`` (higher = predicted faster), measured ``costs`` (seconds; failed
programs carry a huge cost) and ``groups`` (a task label per program) and only ever compare programs of the
same task, since throughputs of different tasks are not comparable. Failed programs cost ``MAX_COST``.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
from scipy.stats import spearmanr

from ..log.measurement import MAX_COST

#: Pairs compared per block when counting ordered pairs (bounds memory at ~2 M booleans per block).
_BLOCK = 2048


def _by_group(groups: Sequence[Hashable]) -> dict[Hashable, np.ndarray]:
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    return {g: np.asarray(ix) for g, ix in index.items()}


#: Bands of "how many times faster" for :func:`pairwise_accuracy_by_gap`: within timing noise, near, far.
GAP_BANDS = ((1.0, 1.05), (1.05, 1.2), (1.2, 2.0), (2.0, float("inf")))


def pairwise_accuracy(scores: np.ndarray, costs: np.ndarray, groups: Sequence[Hashable],
                      gap: tuple[float, float] = (1.0, float("inf"))) -> float:
    """Fraction of same-task pairs with different costs that the scores put in the right order.

    ``gap``: only pairs whose slower program takes more than ``gap[0]`` and at most ``gap[1]`` times the
    faster's time. A tie in score counts as half right. Returns NaN when there is no such pair.
    """
    right, total = _ordered_pairs(scores, costs, groups, gap)
    return right / total if total else float("nan")


def pairwise_accuracy_by_gap(scores: np.ndarray, costs: np.ndarray, groups: Sequence[Hashable]
                             ) -> dict[tuple[float, float], tuple[float, int]]:
    """The pairwise accuracy and the number of pairs in each band of :data:`GAP_BANDS`: pairs within a few
    per cent are within timing noise, so a model's overall accuracy depends on how many such pairs a log
    holds (an evolved population is mostly close pairs)."""
    out = {}
    for band in GAP_BANDS:
        right, total = _ordered_pairs(scores, costs, groups, band)
        out[band] = (right / total if total else float("nan"), int(total))
    return out


def _ordered_pairs(scores: np.ndarray, costs: np.ndarray, groups: Sequence[Hashable],
                   gap: tuple[float, float]) -> tuple[float, float]:
    """(pairs put in the right order, ties counting half; pairs) among same-task pairs within ``gap``."""
    scores, costs = np.asarray(scores, dtype=float), np.asarray(costs, dtype=float)
    right = total = 0.0
    for ix in _by_group(groups).values():
        s, c = scores[ix], costs[ix]
        for start in range(0, len(ix), _BLOCK):
            cs, ss = c[start:start + _BLOCK, None], s[start:start + _BLOCK, None]
            ratio = c[None, :] / cs
            faster = (ratio > gap[0]) & (ratio <= gap[1])  # pairs (row faster than column)
            total += faster.sum()
            right += (faster & (ss > s[None, :])).sum() + 0.5 * (faster & (ss == s[None, :])).sum()
    return right, total


def top_k_recall(scores: np.ndarray, costs: np.ndarray, groups: Sequence[Hashable], k: int) -> float:
    """Fraction of tasks where one of the ``k`` best-scored programs is a fastest program of that task.

    Ties in score are broken by position (a stable sort). Tasks with no valid program are left out;
    NaN if none is left.
    """
    scores, costs = np.asarray(scores, dtype=float), np.asarray(costs, dtype=float)
    hits = []
    for ix in _by_group(groups).values():
        s, c = scores[ix], costs[ix]
        if c.min() >= MAX_COST:
            continue
        top = np.argsort(-s, kind="stable")[:k]
        hits.append(c[top].min() <= c.min())
    return float(np.mean(hits)) if hits else float("nan")


def spearman_by_group(scores: np.ndarray, costs: np.ndarray, groups: Sequence[Hashable]) -> dict[Hashable, float]:
    """Spearman rank correlation between score and speed (1 / cost) for each task (NaN if undefined)."""
    scores, costs = np.asarray(scores, dtype=float), np.asarray(costs, dtype=float)
    out: dict[Hashable, float] = {}
    for g, ix in _by_group(groups).items():
        s, c = scores[ix], costs[ix]
        if len(ix) < 2 or np.all(s == s[0]) or np.all(c == c[0]):
            out[g] = float("nan")
            continue
        # -inf scores (unreplayable programs) rank last; spearmanr needs finite numbers.
        s = np.where(np.isfinite(s), s, np.min(s[np.isfinite(s)], initial=0.0) - 1.0)
        out[g] = float(spearmanr(s, -c).statistic)
    return out
