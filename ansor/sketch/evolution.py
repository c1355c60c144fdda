"""Evolutionary search over complete programs, ranked by the cost model.

Each generation scores the population, keeps the best unmeasured programs seen so far, and breeds the next
generation by mutating parents picked with probability proportional to their score. Mutations
(:mod:`.mutation`) edit one step of a program and replay the rest in pure Python; a program whose steps no
longer fit is dropped. The target's :class:`~ansor.sketch.search_space.SearchSpace` says which mutations
run, with which probabilities, and which children fit the hardware.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

from ..state.loop_state import State
from ..task.search_task import SearchTask
from .search_space import space_of

if TYPE_CHECKING:
    from ..cost_model.cost_model import CostModel  # the search only calls predict

logger = logging.getLogger("ansor")


@dataclass(frozen=True)
class EvolutionParams:
    """Population size and generations trade search time for quality; Ansor used 2048 x 4.

    The ``p_*`` fields weigh the mutation rules; each target's search space names the fields its rules use.
    On GPU, Ansor mutates only tile sizes (0.90) and the unroll limit (0.10): the CUDA space weighs its
    unroll rule by ``p_unroll + p_compute_location`` and never moves compute locations (the sketch fixed them).
    """

    population: int = 256
    generations: int = 3
    mutation_prob: float = 0.85
    #: probabilities of Ansor's CPU mutation rules
    p_tile_size: float = 0.90
    p_unroll: float = 0.04
    p_compute_location: float = 0.05
    p_parallel: float = 0.01
    #: ours: pack or unpack a runtime input of a tiled stage (constant weights are always packed)
    p_layout_rewrite: float = 0.02


def evolutionary_search(task: SearchTask, model: CostModel, population: list[State], out_size: int,
                        exclude: set, rng: random.Random, params: EvolutionParams = EvolutionParams()
                        ) -> list[tuple[float, State]]:
    """The ``out_size`` best-scored programs found, none of them in ``exclude`` (best first)."""
    space = space_of(task.target)
    mutators = space.mutators
    weights = [sum(getattr(params, name) for name in m.probabilities) for m in mutators]
    best: dict = {}
    for generation in range(params.generations + 1):
        if not population:
            break
        scores = np.asarray(model.predict(task, population), dtype=float)
        for state, score in zip(population, scores):
            key = state.key()
            if key not in exclude and (key not in best or best[key][0] < score):
                best[key] = (float(score), state)
        if generation == params.generations:
            break
        finite = np.where(np.isfinite(scores), scores, np.nan)
        floor = np.nanmin(finite) if np.isfinite(finite).any() else 0.0
        fitness = np.nan_to_num(finite - floor, nan=0.0) + 1e-6
        probs = fitness / fitness.sum()
        nxt: list[State] = []
        seen: set = set()
        for _ in range(params.population * 3):
            if len(nxt) >= params.population:
                break
            parent = population[int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum()).clip(
                0, len(population) - 1))]
            child: Optional[State] = parent
            if rng.random() < params.mutation_prob:
                child = rng.choices(mutators, weights=weights)[0].mutate(task, parent, rng)
                if child is not None and not space.fits(task, child):
                    child = None  # over a hardware limit: it would be dropped before measurement anyway
            if child is None or child.key() in seen:
                continue
            seen.add(child.key())
            nxt.append(child)
        population = nxt
    ranked = sorted(best.values(), key=lambda item: -item[0])
    return ranked[:out_size]
