"""SearchTask: one program to tune, for one target.

A task is a ComputeDAG plus a target and its hardware parameters, named by a workload key: the
registered workload name for named workloads (``matmul-512``), else a structural hash of the PrimFunc.
Logs store the PrimFunc text next to the key, so any log can be replayed without the code that made it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Sequence, Union

import tvm
import tvm_ffi

from ..state.compute_dag import ComputeDAG
from ..target import HardwareParams, hardware_params, parse_target, target_to_str

if TYPE_CHECKING:
    from ..log.database import Database

#: Anything :func:`ansor.target.parse_target` accepts.
TargetLike = Union[str, dict, tvm.target.Target, None]
#: Where records are read from: a log file, several, or a :class:`~ansor.log.database.Database`.
LogSource = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]], "Database"]


def prim_func_key(func: tvm.tirx.PrimFunc) -> str:
    """Workload key of an unnamed PrimFunc: equal programs get equal keys."""
    return f"prim_func-{tvm_ffi.structural_hash(func) & (2 ** 64 - 1):016x}"


class SearchTask:
    """A program, a target and the hardware facts the search needs.

    Parameters
    ----------
    func
        The PrimFunc to tune (use :meth:`from_workload` for named workloads).
    target
        A ``tvm.target.Target`` or anything :func:`ansor.target.parse_target` accepts; default: this host.
    workload_key
        Name of the workload; default: a structural hash of ``func``.
    hardware
        Override the detected hardware parameters.
    desc
        A human-readable name (shown in progress tables).
    """

    def __init__(self, func: tvm.tirx.PrimFunc, target: TargetLike = None,
                 workload_key: Optional[str] = None, hardware: Optional[HardwareParams] = None,
                 desc: str = ""):
        self.func = func
        self.target = parse_target(target)
        self.workload_key = workload_key or prim_func_key(func)
        self.hardware_params = hardware or hardware_params(self.target)
        self.desc = desc or self.workload_key
        self._dag: Optional[ComputeDAG] = None

    @staticmethod
    def from_workload(name: str, target: TargetLike = None) -> "SearchTask":
        """A task for a registered workload (``matmul-512``, ``nhwc-resnet-50.C2``, ...)."""
        from .workloads import get_workload
        wl = get_workload(name)
        return SearchTask(wl.prim_func(), target, workload_key=wl.name, desc=wl.description or wl.name)

    @property
    def compute_dag(self) -> ComputeDAG:
        if self._dag is None:
            self._dag = ComputeDAG(self.func)
        return self._dag

    @property
    def flop_ct(self) -> float:
        return self.compute_dag.flop_ct

    @property
    def target_str(self) -> str:
        return target_to_str(self.target)

    # Ansor's spelling of the workflow as methods (``task.tune``, ``task.best_record``, ``task.apply_best``,
    # ``task.print_best``) is added by ansor.tuning, the layer that offers it: the task is core data that the
    # record reader builds, and imports nothing above it.

    def __getstate__(self) -> dict:
        # TVM objects travel as text so a task can be shipped to Ray workers and stored in logs.
        return {"func": tvm.ir.save_json(self.func), "target": self.target_str, "key": self.workload_key,
                "hw": self.hardware_params.to_json(), "desc": self.desc}

    def __setstate__(self, data: dict) -> None:
        self.func = tvm.ir.load_json(data["func"])
        self.target = parse_target(data["target"])
        self.workload_key = data["key"]
        self.hardware_params = HardwareParams.from_json(data["hw"])
        self.desc = data["desc"]
        self._dag = None

    def __repr__(self) -> str:
        return f"SearchTask({self.workload_key!r}, target={self.target_str})"
