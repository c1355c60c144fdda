"""The best record of a task in its logs, and the program it schedules (Ansor's ``apply_best``/``print_best``).

Functions, not methods of :class:`~ansor.task.search_task.SearchTask`: the task is core data that the record
reader builds, so it cannot depend on the records itself.
"""

from __future__ import annotations

import tvm

from .database import log_paths
from ..errors import AnsorError, RecordError
from .records import Record, best_records, load_records
from ..task.search_task import LogSource, SearchTask


def best_record(task: SearchTask, log_file: LogSource) -> Record:
    """The fastest valid record of ``task`` (same target) in a log, several logs or a database.

    Raises
    ------
    RecordError
        If a log is missing or unreadable, or holds no valid record of this task for this target.
    """
    paths = log_paths(log_file)
    best = best_records(load_records(paths, workload_key=task.workload_key, target=task.target, selections=True))
    if task.workload_key not in best:
        where = ", ".join(str(p) for p in paths) or "an empty database"
        raise RecordError(f"{where}: no valid record of {task.workload_key} for target {task.target_str}")
    return best[task.workload_key]


def apply_best(task: SearchTask, log_file: LogSource) -> tvm.IRModule:
    """The scheduled IRModule (``mod["main"]``) of the best record of ``task`` in ``log_file``."""
    return task.compute_dag.replay(best_record(task, log_file).steps).mod


def print_best(task: SearchTask, log_file: LogSource, print_mode: str = "schedule") -> str:
    """The best schedule as code: ``schedule``: the ``tvm.s_tir.Schedule`` primitives as Python; ``tir``:
    the scheduled PrimFunc as TVMScript."""
    if print_mode not in ("schedule", "tir"):
        raise AnsorError(f"unknown print_mode {print_mode!r}; valid: 'schedule', 'tir'")
    sch = task.compute_dag.replay(best_record(task, log_file).steps)
    return str(sch.trace) if print_mode == "schedule" else sch.mod["main"].script()
