"""ansor: an Ansor-style auto-scheduler for TensorIR programs on Apache TVM 0.27."""

from .compute_dag import ComputeDAG
from .errors import AnsorError, RecordError, StepError, TargetError, WorkloadError
from .loop_state import Iterator, Stage, State

__all__ = ["AnsorError", "ComputeDAG", "Iterator", "RecordError", "Stage", "State", "StepError",
           "TargetError", "WorkloadError"]
