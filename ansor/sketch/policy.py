"""SketchPolicy: what to measure next, one round at a time.

A round samples random programs from the sketches, seeds evolution with them and with the best measured
programs, and returns the top of the evolved population plus a few (eps-greedy) random programs. A
program already measured (this run or in a resumed log) is never returned again.
"""

from __future__ import annotations

import heapq
import logging
import os
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from ..state.loop_state import State
from ..state.transform_steps import TensorizeStep
from ..log.measurement import MeasureInput, MeasureResult
from ..task.search_task import SearchTask
from .evolution import EvolutionParams, evolutionary_search
from .rules import SketchRule
from .search_space import generate_sketches, sample_initial_population, space_of

if TYPE_CHECKING:
    from ..cost_model.cost_model import CostModel

logger = logging.getLogger("ansor")


@lru_cache(maxsize=None)
def _checkers() -> Optional[ThreadPoolExecutor]:
    """Threads for the search space's checks, one per CPU this process may use (None: one CPU).

    A check is a TVM replay, and for CUDA a lowering: 15-60 ms in C++, which releases the GIL. On a 2-core
    Zen 3, 32 CUDA programs of a ResNet-50 convolution were checked in 0.75 s by 2 threads, 1.88 s by one.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return ThreadPoolExecutor(cpus, thread_name_prefix="ansor-check") if cpus > 1 else None


def family(state: State) -> tuple[str, ...]:
    """The tensor intrinsics a program is built around (none for most): which kind of sketch it comes from."""
    return tuple(sorted({step.intrin for step in state.steps if isinstance(step, TensorizeStep)}))


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
        self._families: dict[tuple[str, ...], list[State]] = {}  # each family's sketches
        for sketch in self.sketches:
            self._families.setdefault(family(sketch), []).append(sketch)
        self._tried: set = set()  # the families of measured programs
        self._best: list[tuple[float, int, State]] = []  # the 64 fastest: a min-heap on -cost pops the slowest
        self._counter = 0
        self._first = list(first)  # a network task's default schedule, the database's seeds: see next_batch
        logger.info("%s: %d sketches", task.desc, len(self.sketches))

    def record(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Remember what was measured so it is never proposed again and good programs seed evolution."""
        for inp, res in zip(inputs, results):
            self.measured.add(inp.state.key())
            self._tried.add(family(inp.state))
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
        if self._first:
            first = iter(self._first)
            self._add_valid((s for s in first if s.key() not in self.measured), batch, keys, n)
            self._first = list(first)  # what the batch had no room for
        if batch:
            return batch
        self._one_of_each_family(batch, keys)
        p = self.params
        population = sample_initial_population(self.task, self.sketches, p.init_population, self.rng,
                                               exclude=self.measured)
        seeds = [s for _, _, s in sorted(self._best, reverse=True)]
        n_seed = int(p.init_population * p.use_measured_ratio)
        population += seeds[:n_seed]
        n_random = max(0, int(round(n * p.eps_greedy))) if self.measured else 0
        evolved = evolutionary_search(self.task, self.model, population, 2 * n, self.measured | keys, self.rng,
                                      p.evolution)
        self._add_valid((state for _, state in evolved), batch, keys, n - n_random)
        self._add_valid(sample_initial_population(self.task, self.sketches, n - len(batch), self.rng,
                                                  exclude=self.measured | keys), batch, keys, n)
        return batch

    def _one_of_each_family(self, batch: list[State], keys: set) -> None:
        """Where a task's sketches are built around different intrinsics (a bf16 product on AMX: tile
        products and vdpbf16ps), one random program of each family not measured yet, whatever the model
        predicts: the pretrained model was trained where no AMX existed. Without this, 64 trials of
        bf16-matmul-512 on a Xeon with AMX measured vdpbf16ps only (94 GFLOPS); any random tile program ran
        5-10x faster, and a cold start found 720 GFLOPS."""
        if len(self._families) < 2:
            return
        for fam in sorted(self._families.keys() - self._tried):
            sample = sample_initial_population(self.task, self._families[fam], 1, self.rng,
                                               exclude=self.measured | keys)
            self._add_valid(sample, batch, keys, len(batch) + 1)

    def _add_valid(self, states: Iterable[State], batch: list[State], keys: set, limit: int) -> None:
        """Add ``states``, in order, to ``batch`` until it holds ``limit``, each unless the search space's
        check refuses it (CPU: TVM cannot replay it; GPU: it fails TVM's GPU verifier); ``states`` is read
        no further than that.

        The cost model describes States without TVM, so a program TensorIR would refuse can rank high; a
        check costs a few ms (a CUDA one ~50), a failed build a trial. A refused program is never proposed
        again. As many states as the batch still needs are checked at once (:func:`_checkers`), so the
        batch is the one checking them one by one would give.
        """
        todo = iter(states)
        pool, check = _checkers(), partial(self.space.check, self.task)
        while len(batch) < limit:
            chunk: list[State] = []
            for state in todo:
                if state.key() not in keys:
                    keys.add(state.key())
                    chunk.append(state)
                    if len(chunk) == limit - len(batch):
                        break
            if not chunk:
                break
            reasons = pool.map(check, chunk) if pool and len(chunk) > 1 else map(check, chunk)
            for state, reason in zip(chunk, reasons):
                if reason is None:
                    batch.append(state)
                else:
                    self.measured.add(state.key())
                    logger.debug("%s: dropped a program before measurement: %s", self.task.desc, reason)
