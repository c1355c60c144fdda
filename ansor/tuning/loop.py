"""The tuning loop: rounds of proposing programs, measuring them and retraining the cost model.

Each round: the policy proposes programs, the measurer builds and times them (its callbacks append every
result to the log the moment it arrives), and the cost model retrains. A task's history (its own log when
resuming, a :class:`~ansor.log.database.Database`'s logs) is fed to the policy and the model first and counts
towards the trial budget, so nothing measured is measured again. :func:`run_rounds` is the one loop:
:func:`auto_schedule` runs it for one task, the task scheduler (:mod:`ansor.task_scheduler`) for a network's.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence, Union

from ..errors import StepError, short_message
from ..log.measurement import ErrorNo, MeasureInput, MeasureResult, program_results
from ..log.records import Record, best_records, distinct_records
from ..log.seeds import seed_states
from ..sketch.policy import SketchPolicy
from ..state.loop_state import State
from ..task.search_task import SearchTask
from .logs import default_log_path, log_history, log_path, measuring_into
from .options import Measurer, TuningOptions, make_cost_model, make_measurer

if TYPE_CHECKING:
    from ..cost_model.cost_model import CostModel
    from ..log.database import Database

logger = logging.getLogger("ansor")


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
    """The outcome of tuning one task.

    ``trials`` counts the history too; ``resumed`` is how many of them came from the history (a resumed
    log or a database), so ``trials - resumed`` were measured by this call.
    """

    best_state: Optional[State]
    best_cost: float
    trials: int
    resumed: int
    rounds: list[RoundReport] = field(default_factory=list)
    task: Optional[SearchTask] = None
    log_file: Optional[Path] = None

    @property
    def measured(self) -> int:
        """Measurements made by this call."""
        return self.trials - self.resumed

    @property
    def best_gflops(self) -> float:
        """Throughput of the best program (0 when none is valid or the task has no floating-point work)."""
        if self.task is None or self.best_state is None or not self.task.flop_ct:
            return 0.0
        return self.task.flop_ct / self.best_cost / 1e9

    def __str__(self) -> str:
        name = self.task.workload_key if self.task is not None else "task"
        if self.best_state is None:
            best = "no valid program"
        else:
            best = f"best {self.best_cost * 1e3:.4f} ms"
            best += f" ({self.best_gflops:.1f} GFLOPS)" if self.best_gflops else ""
        log = f"; log {self.log_file}" if self.log_file is not None else ""
        return f"{name}: {best} after {self.trials} trials ({self.resumed} from history){log}"


@dataclass
class History:
    """What :func:`feed_history` taught a search: how many distinct states, and the best of them."""

    count: int
    best_cost: float
    best_state: Optional[State]


def feed_history(task: SearchTask, records: Sequence[Record], policy: SketchPolicy, model: CostModel) -> History:
    """Teach the policy and the model what a log already measured, each distinct state once.

    A state measured twice (two tuners on one log) counts once toward the budget. A record whose steps do
    not fit the task's program (a damaged log) is left out with a warning instead of stopping the resume.
    """
    inputs, results, unfit = [], [], []
    for rec in distinct_records(records):
        try:
            inputs.append(MeasureInput(task, task.compute_dag.state_from_steps(rec.steps)))
        except StepError as err:
            unfit.append(str(err))
            continue
        results.append(rec.result)
    if unfit:
        logger.warning("%d records of %s do not fit its program and were not resumed (first: %s)", len(unfit),
                       task.workload_key, unfit[0])
    inputs, results = program_results(inputs, results)  # infrastructure failures are no one's program
    policy.record(inputs, results)
    model.update(inputs, results)
    best_cost, best_state = float("inf"), None
    for inp, res in zip(inputs, results):
        if res.ok and res.mean_cost < best_cost:
            best_cost, best_state = res.mean_cost, inp.state
    return History(len(inputs), best_cost, best_state)


@dataclass
class Round:
    """One round of one task: what was proposed and measured, and the seconds each part took."""

    inputs: list[MeasureInput]
    results: list[MeasureResult]
    search_s: float
    measure_s: float
    train_s: float

    @property
    def seconds(self) -> float:
        return self.search_s + self.measure_s + self.train_s


def measure_round(task: SearchTask, policy: SketchPolicy, model: CostModel,
                  measure: Callable[[list[MeasureInput]], list[MeasureResult]], n: int) -> Optional[Round]:
    """Propose up to ``n`` programs of ``task``, measure them, and teach the policy and the model the results;
    ``None`` when the search space is exhausted (nothing measured)."""
    t0 = time.perf_counter()
    states = policy.next_batch(n)
    t1 = time.perf_counter()
    if not states:
        return None
    inputs = [MeasureInput(task, s) for s in states]
    results = measure(inputs)
    t2 = time.perf_counter()
    learned = program_results(inputs, results)  # an infrastructure failure may be proposed again
    policy.record(*learned)
    model.update(*learned)
    return Round(inputs, results, t1 - t0, t2 - t1, time.perf_counter() - t2)


class RoundSchedule(Protocol):
    """The decisions :func:`run_rounds` leaves to its caller: which task each round tunes, and when to stop
    before the budget is spent. ``trials`` always counts every trial so far, the history's included."""

    def next_task(self, trials: int) -> Optional[int]:
        """The index of the task the next round tunes; ``None`` ends the loop."""

    def round_done(self, index: int, rnd: Round, trials: int) -> None:
        """Task ``index`` measured ``rnd``."""

    def exhausted(self, index: int, trials: int) -> None:
        """Task ``index`` has nothing left to propose."""


def run_rounds(tasks: Sequence[SearchTask], policies: Sequence[SketchPolicy], model: CostModel,
               measure: Callable[[list[MeasureInput]], list[MeasureResult]], budget: int, trials: int,
               per_round: int, schedule: RoundSchedule) -> int:
    """The tuning loop of one task and of a network's tasks alike: rounds (:func:`measure_round`) of the task
    ``schedule`` picks until ``budget`` trials are spent or ``schedule`` stops. ``trials``: those the history
    already spent. Returns the trials spent, the history's included."""
    failures_seen: set[int] = set()
    while trials < budget:
        index = schedule.next_task(trials)
        if index is None:
            break
        rnd = measure_round(tasks[index], policies[index], model, measure, min(per_round, budget - trials))
        if rnd is None:
            schedule.exhausted(index, trials)
            continue
        trials += len(rnd.inputs)
        report_new_failures(tasks[index], rnd.results, failures_seen)
        schedule.round_done(index, rnd, trials)
    return trials


def report_new_failures(task: SearchTask, results: Sequence[MeasureResult], seen: set[int]) -> None:
    """Log the first failure of each kind with its message: a log keeps only the error code, and a run whose
    every candidate fails (a compiler missing on a node, say) must say why while it runs."""
    for result in results:
        if result.error_no and result.error_no not in seen:
            seen.add(result.error_no)
            logger.warning("first %s failure (task %s): %s", ErrorNo(result.error_no).name, task.desc,
                           short_message(result.error_msg, 600, pick="joined") or "no message")


class _OneTask:
    """The schedule of a lone task: every round is its own, until ``early_stopping`` trials without a better
    program (failures included) or an exhausted search space; keeps the best program and the round reports."""

    def __init__(self, early_stopping: Optional[int], best_cost: float, best_state: Optional[State],
                 on_round: Optional[Callable[[RoundReport], None]]):
        self.early_stopping = early_stopping
        self.best_cost, self.best_state = best_cost, best_state
        self.on_round = on_round
        self.since_best = 0
        self.done = False
        self.reports: list[RoundReport] = []

    def next_task(self, trials: int) -> Optional[int]:
        if self.done:
            return None
        if self.early_stopping is not None and self.since_best >= self.early_stopping:
            logger.info("early stop: no improvement in %d trials", self.since_best)
            return None
        return 0

    def round_done(self, index: int, rnd: Round, trials: int) -> None:
        errors = 0
        for inp, res in zip(rnd.inputs, rnd.results):
            if not res.ok:
                errors += 1
                self.since_best += 1
            elif res.mean_cost < self.best_cost:
                self.best_cost, self.best_state, self.since_best = res.mean_cost, inp.state, 0
            else:
                self.since_best += 1
        report = RoundReport(trials, self.best_cost, errors, rnd.search_s, rnd.measure_s, rnd.train_s)
        self.reports.append(report)
        if self.on_round:
            self.on_round(report)

    def exhausted(self, index: int, trials: int) -> None:
        logger.info("search space exhausted after %d trials", trials)
        self.done = True


def auto_schedule(task: SearchTask, options: Optional[TuningOptions] = None, measurer: Optional[Measurer] = None,
                  model: Optional[CostModel] = None, resume_from: Optional[str] = None,
                  on_round: Optional[Callable[[RoundReport], None]] = None,
                  on_resume: Optional[Callable[[int], None]] = None,
                  history: Sequence[Record] = ()) -> TuneResult:
    """Tune ``task`` for ``options.num_measure_trials`` trials, its history included.

    ``history`` (records of this task) and the records of ``task`` in the log ``resume_from`` are fed to
    the policy and the model first and count towards the budget. Without a ``measurer`` one is made from
    ``options`` (:func:`make_measurer`) when the first round needs it, and closed at the end; without a
    ``model``, :func:`make_cost_model`. The caller's measurer carries the log writer; use :func:`tune_task`
    for the whole workflow (log, resume, database).
    """
    options = options or TuningOptions()
    if resume_from:
        history = [*history, *log_history(resume_from, [task])]
    history = distinct_records(history)
    resumed = len(history)
    if resumed >= options.num_measure_trials:  # budget spent: no search, no model, no measurer
        best = best_records(history).get(task.workload_key)
        if on_resume:
            on_resume(resumed)
        state = task.compute_dag.state_from_steps(best.steps) if best else None
        return TuneResult(state, best.result.mean_cost if best else float("inf"), resumed, resumed, [], task)
    model = model if model is not None else make_cost_model(options, task.target)
    policy = SketchPolicy(task, model, seed=options.seed, params=options.search,
                          first=seed_states(task) if options.pretrained else ())
    best_cost, best_state = float("inf"), None
    if history:
        fed = feed_history(task, history, policy, model)
        best_cost, best_state, resumed = fed.best_cost, fed.best_state, fed.count
        logger.info("%s: %d records from its history", task.workload_key, resumed)
        if on_resume:
            on_resume(resumed)
    own = None

    def measure(inputs: list[MeasureInput]) -> list[MeasureResult]:
        nonlocal measurer, own
        if measurer is None:  # made when a round first needs it: a spent budget never starts Ray
            measurer = own = make_measurer(options)
        return measurer.measure(inputs)

    schedule = _OneTask(options.early_stopping, best_cost, best_state, on_round)
    try:
        trials = run_rounds([task], [policy], model, measure, options.num_measure_trials, resumed,
                            options.num_measures_per_round, schedule)
    finally:
        if own is not None:
            own.close()
    return TuneResult(schedule.best_state, schedule.best_cost, trials, resumed, schedule.reports, task)


def tune_task(task: SearchTask, options: Optional[TuningOptions] = None,
              log_file: Union[str, os.PathLike, None] = None, *,
              database: Union["Database", str, os.PathLike, None] = None,
              resume: bool = True, measurer: Optional[Measurer] = None,
              on_round: Optional[Callable[[RoundReport], None]] = None,
              on_resume: Optional[Callable[[int], None]] = None) -> TuneResult:
    """Tune ``task`` into ``log_file``: the whole workflow behind :func:`tune`.

    Parameters
    ----------
    log_file
        Where every measurement is appended; default ``<database>/<workload key>.json`` with a database,
        else ``logs/<workload key>.json``.
    database
        A :class:`~ansor.log.database.Database` (or its directory): its records of this task and target are
        the task's history. A task whose history already reaches the budget is not measured at all.
    resume
        Also take the task's records in ``log_file`` as history (default): rerunning a call continues it.
    measurer
        A measurer to use instead of a new one (it must already write to the log: the caller owns it).
    """
    from ..log.database import as_database
    options = options or TuningOptions()
    db = as_database(database)
    path = log_path(log_file if log_file is not None else default_log_path(task.workload_key, db))
    history: list[Record] = []
    if resume and path.exists():
        history = log_history(path, [task])
    if db is not None:
        history = distinct_records([*history, *db.records(task.workload_key, task.target)])
    if measurer is not None or len(history) >= options.num_measure_trials:  # the log needs no writer here
        result = auto_schedule(task, options, measurer, on_round=on_round, on_resume=on_resume, history=history)
    else:
        with measuring_into(path, options, on_round) as (logged, round_done):
            result = auto_schedule(task, options, logged, on_round=round_done, on_resume=on_resume,
                                   history=history)
    result.log_file = path
    return result
