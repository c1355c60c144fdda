"""Tuning a Relax model's tasks into a log: the one network-tuning path of the API and the scripts.

:func:`tune_tasks` shares a trial budget among weighted tasks with Ansor's gradient task scheduler, one
cost model and one Ray measurer, measuring each task's default schedule first (so a tuned task is never
slower than its default build). History comes from two places:

* the run's own log (``resume=True``): its records count towards ``trials`` and the run continues them;
* a :class:`~ansor.log.database.Database`: a task that a log of the database tuned for this target is
  **done**: its records teach the cost model and give its best latency, but it gets no new trials and
  they do not count towards ``trials`` (the budget goes to the new tasks). So tuning ResNet-101 after
  ResNet-50 measures none of the tasks they share. With ``resume``, the run's own log (which may lie in
  the database directory) is continued instead of counted as done.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

from ..log.database import Database, as_database
from ..errors import AnsorError
from ..log.measurement import MeasureInput, MeasureResult
from ..networks import NetworkTask, default_candidates, extract
from ..log.records import Record
from ..log.seeds import seed_states
from ..state.loop_state import State
from ..task.precision import Precision
from ..task.search_task import SearchTask, TargetLike
from ..tuning import TuningOptions, log_history, log_path, make_cost_model, measuring_into, with_trials
from .model import Params, as_network

logger = logging.getLogger("ansor")

#: Records by workload key.
History = Mapping[str, Sequence[Record]]


@dataclass
class TimeSpent:
    """Where a tuning run's wall time went, for its trials a minute on this machine (seconds)."""

    seconds: float  # the whole call: Ray and runners started, first programs, the rounds
    trials: int
    search_s: float = 0.0  # proposing programs (sketches, sampling, evolution) and the cost model's learning
    build_s: float = 0.0  # build phases (the builds run in parallel on every CPU of the cluster)
    build_cpu_s: float = 0.0  # the builds' own seconds, summed over the workers
    builds: int = 0  # programs built: candidates, and each task's unscheduled reference once
    run_s: float = 0.0  # run phases: each candidate checked and timed, each task's reference run once

    @property
    def other_s(self) -> float:
        """Start-up (Ray, runners, the model, each task's first programs) and the rest between rounds."""
        return max(0.0, self.seconds - self.search_s - self.build_s - self.run_s)

    def __str__(self) -> str:
        per_build = f", {self.build_cpu_s / self.builds:.2f} s a build" if self.builds else ""
        return (f"{self.trials * 60 / max(self.seconds, 1e-9):.0f} trials a minute: search and cost model "
                f"{self.search_s:.1f} s, builds {self.build_s:.1f} s ({self.build_cpu_s:.1f} worker-seconds"
                f"{per_build}), runs {self.run_s:.1f} s, start-up and the rest {self.other_s:.1f} s")


@dataclass
class NetworkTuneResult:
    """What :func:`tune_tasks` did.

    Attributes
    ----------
    tasks
        The tasks, in the order given.
    log_file
        Where this run's measurements are.
    best_costs
        Best latency (seconds) of each task over its whole history (``inf``: none valid).
    measured
        New measurements of each task in this run.
    resumed
        Records of the run's own log that counted towards the budget.
    reused
        Workload keys of the tasks the database had already tuned (measured 0 times here).
    spent
        Where the run's time went (``None`` when nothing was measured).
    """

    tasks: list[NetworkTask]
    log_file: Path
    best_costs: list[float]
    measured: list[int]
    resumed: int = 0
    reused: list[str] = field(default_factory=list)
    spent: Optional[TimeSpent] = None

    @property
    def total_measured(self) -> int:
        return sum(self.measured)

    @property
    def estimated_latency(self) -> Optional[float]:
        """Σ weight × best latency (seconds) once every task has a valid measurement, else ``None``."""
        if any(c == float("inf") for c in self.best_costs):
            return None
        return sum(t.weight * c for t, c in zip(self.tasks, self.best_costs))

    def __str__(self) -> str:
        est = self.estimated_latency
        total = f"estimated latency {est * 1e3:.3f} ms" if est is not None else "some tasks without a valid program"
        return (f"{len(self.tasks)} tasks: {self.total_measured} new measurements, {self.resumed} resumed, "
                f"{len(self.reused)} tasks from the database; {total}; log {self.log_file}")


def extract_tasks(mod, params: Params = None, target: TargetLike = None,
                  precision: Precision = Precision.FP32) -> list[NetworkTask]:
    """The weighted tuning tasks of any Relax module (``params`` by name are bound as constants first;
    ``precision`` bf16: convolutions and dense layers in bf16, see :mod:`ansor.networks.bf16`).

    The fused module and the PrimFuncs left out are in ``ansor.networks.extract(as_network(mod, params))``.
    """
    return extract(as_network(mod, params), target, precision=precision).tasks


def tune_tasks(tasks: Sequence[NetworkTask], log_file: Union[str, os.PathLike], trials: Optional[int] = None, *,
               options: Optional[TuningOptions] = None, database: Union[Database, str, os.PathLike, None] = None,
               strategy: str = "gradient", resume: bool = False, time_limit: Optional[float] = None,
               on_round: Optional[Callable] = None,
               on_history: Optional[Callable[[History, History], None]] = None) -> NetworkTuneResult:
    """Tune weighted tasks with one shared budget into ``log_file`` (see the module docstring).

    Parameters
    ----------
    trials
        Total budget over all tasks; overrides ``options.num_measure_trials``.
    options
        Budget per round (``num_measures_per_round``), early stopping per task, seed, cost model, measurer
        (:class:`~ansor.tuning.TuningOptions`; defaults = the scripts').
    strategy
        ``gradient`` (Ansor's task scheduler) or ``round-robin``.
    resume
        Continue the run's own log: its records of these tasks count towards ``trials``.
    time_limit
        Seconds after which no new round starts (``trials`` may end the run first).
    on_round
        Called with a :class:`~ansor.task_scheduler.SchedulerRound` after every round.
    on_history
        Called once with (records resumed from the log, records reused from the database) by workload key.
    """
    from ..task_scheduler import schedule_tasks

    start = time.perf_counter()
    if not tasks:
        raise AnsorError("no task to tune (the model has no PrimFunc worth a search)")
    if strategy not in ("gradient", "round-robin"):
        raise AnsorError(f"unknown strategy {strategy!r}; valid: gradient, round-robin")
    options = with_trials(options, trials)
    db = as_database(database)
    path = log_path(log_file, example="logs/net.json")
    keys = [t.workload_key for t in tasks]
    own: dict[str, list[Record]] = {}
    if resume and path.exists():
        for rec in log_history(path, [t.task for t in tasks]):
            own.setdefault(rec.workload_key, []).append(rec)
    # Without resume the run's own log is one more log of the database (a rerun finds its tasks done).
    exclude = [path] if resume else []
    target = tasks[0].task.target
    reused = {k: v for k, v in (db.history(keys, target, exclude=exclude) if db else {}).items() if k not in own}
    if on_history:
        on_history(own, reused)
    resumed = sum(len(v) for v in own.values())
    best = {k: min([r.result.mean_cost for r in recs if r.result.ok], default=float("inf"))
            for k, recs in {**own, **reused}.items()}
    measured: Counter = Counter()

    def count(inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        for inp, res in zip(inputs, results):
            measured[inp.task.workload_key] += 1
            if res.ok:
                best[inp.task.workload_key] = min(best.get(inp.task.workload_key, float("inf")), res.mean_cost)

    spent = None
    if resumed < options.num_measure_trials and any(k not in reused for k in keys):
        model = make_cost_model(options, tasks[0].task.target)
        with measuring_into(path, options, on_round, [count]) as (measurer, round_done):
            spent = TimeSpent(0.0, 0)

            def spent_on(rnd) -> None:  # the model retrains when next asked: its time is in the search's
                spent.search_s += rnd.search_s + rnd.train_s
                round_done(rnd)

            schedule_tasks([t.task for t in tasks], [t.weight for t in tasks], options.num_measure_trials, measurer,
                           model, per_round=options.num_measures_per_round, strategy=strategy,
                           early_stopping=options.early_stopping, seed=options.seed, search=options.search,
                           on_round=spent_on, first=[first_candidates(t.task, options.pretrained) for t in tasks],
                           time_limit=time_limit, history=own, tuned_elsewhere=reused)
            totals = getattr(measurer, "totals", None)  # a caller's measurer may keep none
            if totals is not None:
                spent.build_s, spent.build_cpu_s, spent.builds = totals.build_s, totals.build_cpu_s, totals.builds
                spent.run_s = totals.run_s
        spent.seconds, spent.trials = time.perf_counter() - start, sum(measured.values())
    else:
        logger.info("nothing to tune: %d resumed records, %d of %d tasks from the database", resumed,
                    len(reused), len(tasks))
    return NetworkTuneResult(list(tasks), path, [best.get(k, float("inf")) for k in keys],
                             [measured[k] for k in keys], resumed, sorted(reused), spent)


def first_candidates(task: SearchTask, pretrained: bool) -> list[State]:
    """What a network task measures before searching: the default schedule the untuned build would run (so
    tuning never ends slower than it), then the shipped database's seeds (``pretrained``)."""
    return [*default_candidates(task), *(seed_states(task) if pretrained else ())]


def tune_relax(mod, params: Params, target: TargetLike, log_file: Union[str, os.PathLike],
               trials: Optional[int] = None, *, precision: Precision = Precision.FP32, **kwargs) -> NetworkTuneResult:
    """Extract the tasks of a Relax module and tune them into ``log_file`` (``kwargs``: :func:`tune_tasks`).

    ``params``: weights by parameter name, bound as constants (``None``: weights stay runtime inputs).
    Compile the result with :func:`~ansor.relax.compile_relax` (same ``mod``, ``params``, target and
    ``precision``).
    """
    return tune_tasks(extract_tasks(mod, params, target, precision), log_file, trials, **kwargs)

