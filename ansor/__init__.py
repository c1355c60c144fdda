"""ansor: an Ansor-style auto-scheduler for TensorIR programs on Apache TVM 0.27."""

from .compute_dag import ComputeDAG
from .errors import AnsorError, RecordError, StepError, TargetError, WorkloadError
from .loop_state import Iterator, Stage, State
from .records import RecordWriter, best_records, load_records, save_records
from .search_task import SearchTask

__all__ = ["AnsorError", "ComputeDAG", "Iterator", "RecordError", "RecordWriter", "SearchTask", "Stage", "State",
           "StepError", "TargetError", "WorkloadError", "best_records", "load_records", "save_records"]
