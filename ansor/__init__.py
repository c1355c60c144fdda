"""ansor: an Ansor-style auto-scheduler for TensorIR programs on Apache TVM 0.27.

The workflow in one call each (see docs/tutorial.md)::

    result = ansor.tune(func, "llvm", trials=64, log_file="mm.json")   # a PrimFunc or [A, B, C] TE tensors
    mod = result.task.apply_best("mm.json")                            # the scheduled IRModule
    ansor.relax.tune_relax(mod, params, target, "net.json", 1000)      # any Relax model
    exe = ansor.relax.compile_relax(mod, params, "net.json", target)   # -> a Relax VM executable

``ansor.relax`` and ``ansor.networks`` are imported on first use (they load TVM's Relax frontends).
"""

from importlib import import_module
from typing import Any

from .compute_dag import ComputeDAG
from .database import Database
from .errors import AnsorError, RecordError, StepError, TargetError, WorkloadError
from .loop_state import Iterator, Stage, State
from .records import RecordWriter, best_records, distill, load_records, save_records
from .search_task import SearchTask
from .tuning import (
    BuilderOptions, RunnerOptions, TuneResult, TuningOptions, auto_schedule, ray_session, tune, tune_task,
)

_SUBMODULES = ("relax", "networks")

__all__ = ["AnsorError", "BuilderOptions", "ComputeDAG", "Database", "Iterator", "RecordError", "RecordWriter",
           "RunnerOptions", "SearchTask", "Stage", "State", "StepError", "TargetError", "TuneResult",
           "TuningOptions", "WorkloadError", "auto_schedule", "best_records", "distill", "load_records",
           "networks", "ray_session", "relax", "save_records", "tune", "tune_task"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
