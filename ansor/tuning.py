"""auto_schedule: the tuning loop for one task, in the auto_scheduler vocabulary.

Each round: the policy proposes programs, the measurer builds and times them (its callbacks append every
result to the log the moment it arrives), and the cost model retrains. A resumed run first replays the
log into the policy and the model, so nothing measured is measured again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from .errors import AnsorError
from .loop_state import State
from .measure.types import MeasureInput, MeasureResult, program_results
from .records import Record, load_records
from .search_task import SearchTask
from .sketch.policy import SearchParams, SketchPolicy

logger = logging.getLogger("ansor")

class Measurer(Protocol):
    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]: ...


class CostModel(Protocol):
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None: ...

    def predict(self, task: SearchTask, states: Sequence[State]): ...


@dataclass
class TuningOptions:
    """How much to measure and how."""

    num_measure_trials: int = 64
    num_measures_per_round: int = 16
    early_stopping: Optional[int] = None  # stop after this many trials without improvement
    seed: int = 0
    search: SearchParams = field(default_factory=SearchParams)

    def __post_init__(self) -> None:
        if self.num_measure_trials <= 0:
            raise AnsorError(f"num_measure_trials must be positive, got {self.num_measure_trials}")
        if self.num_measures_per_round <= 0:
            raise AnsorError(f"num_measures_per_round must be positive, got {self.num_measures_per_round}")


@dataclass
class RoundReport:
    """What one round did, for progress displays and the overhead benchmark."""

    trials: int
    best_cost: float
    errors: int
    search_s: float
    measure_s: float
    train_s: float


@dataclass
class TuneResult:
    best_state: Optional[State]
    best_cost: float
    trials: int
    resumed: int
    rounds: list[RoundReport] = field(default_factory=list)


def feed_history(task: SearchTask, records: Sequence[Record], policy: SketchPolicy,
                 model: CostModel) -> tuple[float, Optional[State]]:
    """Teach the policy and the model what a log already measured; returns the best (cost, state) in it."""
    inputs, results = program_results([MeasureInput(task, task.compute_dag.state_from_steps(r.steps))
                                       for r in records], [r.result for r in records])
    policy.record(inputs, results)
    model.update(inputs, results)
    best_cost, best_state = float("inf"), None
    for inp, res in zip(inputs, results):
        if res.ok and res.mean_cost < best_cost:
            best_cost, best_state = res.mean_cost, inp.state
    return best_cost, best_state


def auto_schedule(task: SearchTask, options: TuningOptions, measurer: Measurer, model: CostModel,
                  resume_from: Optional[str] = None,
                  on_round: Optional[Callable[[RoundReport], None]] = None,
                  on_resume: Optional[Callable[[int], None]] = None) -> TuneResult:
    """Tune ``task`` for ``options.num_measure_trials`` trials (resumed ones included)."""
    policy = SketchPolicy(task, model, seed=options.seed, params=options.search)
    best_cost, best_state = float("inf"), None
    resumed = 0
    if resume_from:
        records = load_records(resume_from, workload_key=task.workload_key, target=task.target)
        if records:
            best_cost, best_state = feed_history(task, records, policy, model)
            resumed = len(records)
            logger.info("resumed %d records of %s from %s", resumed, task.workload_key, resume_from)
            if on_resume:
                on_resume(resumed)
    trials, since_best = resumed, 0
    reports: list[RoundReport] = []
    while trials < options.num_measure_trials:
        if options.early_stopping is not None and since_best >= options.early_stopping:
            logger.info("early stop: no improvement in %d trials", since_best)
            break
        n = min(options.num_measures_per_round, options.num_measure_trials - trials)
        t0 = time.perf_counter()
        states = policy.next_batch(n)
        t1 = time.perf_counter()
        if not states:
            logger.info("search space exhausted after %d trials", trials)
            break
        inputs = [MeasureInput(task, s) for s in states]
        results = measurer.measure(inputs)
        t2 = time.perf_counter()
        policy.record(*program_results(inputs, results))  # an infrastructure failure may be proposed again
        model.update(*program_results(inputs, results))
        t3 = time.perf_counter()
        errors = 0
        for inp, res in zip(inputs, results):
            trials += 1
            if not res.ok:
                errors += 1
                since_best += 1
            elif res.mean_cost < best_cost:
                best_cost, best_state, since_best = res.mean_cost, inp.state, 0
            else:
                since_best += 1
        report = RoundReport(trials, best_cost, errors, t1 - t0, t2 - t1, t3 - t2)
        reports.append(report)
        if on_round:
            on_round(report)
    return TuneResult(best_state, best_cost, trials, resumed, reports)
