"""Tuning, in the auto_scheduler vocabulary: :mod:`.options` (how a run measures), :mod:`.loop` (the rounds
of search, measurement and training), :mod:`.logs` (the one way a run writes its log: every measurement the
moment it is known) and :mod:`.api` (one program in one call). The names are re-exported here.
"""

from .api import as_task, tune
from .logs import default_log_path, log_history, log_path, measuring_into
from .loop import (
    History, Round, RoundReport, RoundSchedule, TuneResult, auto_schedule, feed_history, measure_round, run_rounds,
    tune_task,
)
from .options import (
    BuilderOptions, Measurer, RunnerOptions, TuningOptions, make_cost_model, make_measurer, ray_session, with_trials,
)

__all__ = [
    "BuilderOptions", "History", "Measurer", "Round", "RoundReport", "RoundSchedule", "RunnerOptions", "TuneResult",
    "TuningOptions", "as_task", "auto_schedule", "default_log_path", "feed_history", "log_history", "log_path",
    "make_cost_model", "make_measurer", "measure_round", "measuring_into", "ray_session", "run_rounds", "tune",
    "tune_task", "with_trials",
]
