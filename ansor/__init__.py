"""ansor: an Ansor-style auto-scheduler for TensorIR programs on Apache TVM 0.27.

The names below are imported on first use: importing the package (what every script does first, for its
error handling) must not load TVM, so a Ctrl-C or a bad flag during start-up is handled like any other.
"""

from importlib import import_module
from typing import Any

from .errors import AnsorError, RecordError, StepError, TargetError, WorkloadError

_LAZY = {
    "ComputeDAG": ".compute_dag",
    "Iterator": ".loop_state",
    "Stage": ".loop_state",
    "State": ".loop_state",
    "RecordWriter": ".records",
    "best_records": ".records",
    "load_records": ".records",
    "save_records": ".records",
    "SearchTask": ".search_task",
}

__all__ = ["AnsorError", "ComputeDAG", "Iterator", "RecordError", "RecordWriter", "SearchTask", "Stage", "State",
           "StepError", "TargetError", "WorkloadError", "best_records", "load_records", "save_records"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
