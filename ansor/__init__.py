"""ansor: an Ansor-style auto-scheduler for TensorIR programs on Apache TVM 0.27.

The workflow in one call each (see docs/tutorial.md)::

    result = ansor.tune(func, "llvm", trials=64, log_file="mm.json")   # a PrimFunc or [A, B, C] TE tensors
    mod = ansor.apply_best(result.task, "mm.json")                     # the scheduled IRModule
    ansor.relax.tune_relax(mod, params, target, "net.json", 1000)      # any Relax model
    exe = ansor.relax.compile_relax(mod, params, "net.json", target)   # -> a Relax VM executable

The names below are imported on first use: importing the package (what every script does first, for its
error handling) must not load TVM, so a Ctrl-C or a bad flag during start-up is handled like any other.
"""

from importlib import import_module
from typing import Any

from .errors import AnsorError, RecordError, StepError, TargetError, WorkloadError
from .torchless import keep_torch_out_of_workers
from .version import __version__

keep_torch_out_of_workers()  # before anything imports TVM in this process

_LAZY = {
    "ComputeDAG": ".state.compute_dag",
    "Database": ".log.database",
    "Iterator": ".state.loop_nest",
    "Stage": ".state.loop_nest",
    "State": ".state.loop_state",
    "RecordWriter": ".log.records",
    "best_records": ".log.records",
    "distill": ".log.records",
    "load_records": ".log.records",
    "save_records": ".log.records",
    "SearchTask": ".task.search_task",
    "apply_best": ".log.best",
    "best_record": ".log.best",
    "print_best": ".log.best",
    "BuilderOptions": ".tuning",
    "RunnerOptions": ".tuning",
    "TuneResult": ".tuning",
    "TuningOptions": ".tuning",
    "auto_schedule": ".tuning",
    "ray_session": ".tuning",
    "tune": ".tuning",
    "tune_task": ".tuning",
}
_SUBMODULES = ("relax", "networks")

__all__ = ["AnsorError", "BuilderOptions", "ComputeDAG", "Database", "Iterator", "RecordError", "RecordWriter",
           "RunnerOptions", "SearchTask", "Stage", "State", "StepError", "TargetError", "TuneResult",
           "TuningOptions", "WorkloadError", "apply_best", "auto_schedule", "best_record", "best_records", "distill",
           "load_records", "networks", "print_best", "ray_session", "relax", "save_records", "tune", "tune_task"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
