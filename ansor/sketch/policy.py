"""SketchPolicy: what to measure next, one round at a time.

A round samples random programs from the sketches, seeds evolution with them and with the best measured
programs, and returns the top of the evolved population plus a few (eps-greedy) random programs. A
program already measured (this run or in a resumed log) is never returned again.
"""

from __future__ import annotations

import heapq
import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from ..state.loop_state import State
from ..log.measurement import MeasureInput, MeasureResult
from ..task.search_task import SearchTask
from .evolution import EvolutionParams, evolutionary_search
from .rules import SketchRule
from .search_space import generate_sketches, sample_initial_population, space_of

if TYPE_CHECKING:
    from ..cost_model.cost_model import CostModel

logger = logging.getLogger("ansor")


@dataclass
class SearchParams:
    """Knobs of one search round (defaults sized for a 2-core machine; Ansor's were larger)."""

    init_population: int = 128
    eps_greedy: float = 0.05
    use_measured_ratio: float = 0.2
    evolution: EvolutionParams = field(default_factory=EvolutionParams)


class SketchPolicy:
    """Generates candidates for one task; learns nothing itself (the cost model does)."""

    def __init__(self, task: SearchTask, model: CostModel, seed: int = 0, params: Optional[SearchParams] = None,
                 extra_rules: Sequence[SketchRule] = (), first: Sequence[State] = ()):
        self.task = task
        self.model = model
        self.rng = random.Random(seed)
        self.params = params or SearchParams()
        self.space = space_of(task.target)
        self.sketches = generate_sketches(task, extra_rules=tuple(extra_rules))
        self.measured: set = set()
        self._best: list[tuple[float, int, State]] = []  # the 64 fastest: a min-heap on -cost pops the slowest
        self._counter = 0
        self._first = list(first)  # a network task's default schedule, the database's seeds: see next_batch
        logger.info("%s: %d sketches", task.desc, len(self.sketches))

    def record(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Remember what was measured so it is never proposed again and good programs seed evolution."""
        for inp, res in zip(inputs, results):
            self.measured.add(inp.state.key())
            if res.ok:
                self._counter += 1
                heapq.heappush(self._best, (-res.mean_cost, self._counter, inp.state))
                if len(self._best) > 64:
                    heapq.heappop(self._best)

    def next_batch(self, n: int) -> list[State]:
        """Up to ``n`` new programs to measure (fewer when the search space is exhausted).

        The ``first`` programs come first, in batches of their own: a network's scheduler learns what each
        task costs from its default schedule and seeds (1-4 trials) before it spends a searched round on
        any. DenseNet-121 has 142 tasks: warm-up rounds of 16 took all of a 10-minute run (1,837 trials; 21
        tasks never measured, no second round, 2 % over the default build). First rounds of their own: all
        142 measured, 2,321 trials, 1.23x over the default build.
        """
        batch: list[State] = []
        keys: set = set()
        while self._first and len(batch) < n:
            state = self._first.pop(0)
            if state.key() not in self.measured:
                self._add_if_valid(state, batch, keys)
        if batch:
            return batch
        p = self.params
        population = sample_initial_population(self.task, self.sketches, p.init_population, self.rng,
                                               exclude=self.measured)
        seeds = [s for _, _, s in sorted(self._best, reverse=True)]
        n_seed = int(p.init_population * p.use_measured_ratio)
        population += seeds[:n_seed]
        n_random = max(0, int(round(n * p.eps_greedy))) if self.measured else 0
        evolved = evolutionary_search(self.task, self.model, population, 2 * n, self.measured | keys, self.rng,
                                      p.evolution)
        for _, state in evolved:
            if len(batch) >= n - n_random:
                break
            self._add_if_valid(state, batch, keys)
        for state in sample_initial_population(self.task, self.sketches, n - len(batch), self.rng,
                                               exclude=self.measured | keys):
            self._add_if_valid(state, batch, keys)
        return batch

    def _add_if_valid(self, state: State, batch: list[State], keys: set) -> None:
        """Add ``state`` unless the search space's check refuses it (CPU: TVM cannot replay it; GPU: it
        fails TVM's GPU verifier).

        The cost model describes States without TVM, so a program TensorIR would refuse can rank high; a
        check costs ~2 ms, a failed build a trial. A refused program is never proposed again.
        """
        if state.key() in keys:
            return
        keys.add(state.key())
        reason = self.space.check(self.task, state)
        if reason is None:
            batch.append(state)
        else:
            self.measured.add(state.key())
            logger.debug("%s: dropped a program before measurement: %s", self.task.desc, reason)
