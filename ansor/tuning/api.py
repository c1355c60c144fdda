"""Tuning one program in one call: a task from a PrimFunc or TE tensors, tuned into its log."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import AnsorError
from ..task.precision import Precision, in_precision, precision_named
from ..task.search_task import SearchTask, TargetLike
from .loop import TuneResult, tune_task
from .options import TuningOptions, with_trials

if TYPE_CHECKING:
    from ..log.database import Database


def as_task(func: Any, target: TargetLike = None, workload_key: Optional[str] = None,
            precision: Precision = Precision.FP32) -> SearchTask:
    """A :class:`SearchTask` from a PrimFunc, a list of TE tensors, a one-PrimFunc IRModule, or a task; in
    ``precision`` (:func:`~ansor.task.precision.in_precision`: bf16 takes a matmul)."""
    import tvm
    if isinstance(func, SearchTask):
        if precision is not Precision.FP32:
            raise AnsorError("a SearchTask is tuned as it is: give its PrimFunc to tune it in bf16")
        return func
    if isinstance(func, tvm.IRModule):
        funcs = [f for _, f in func.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise AnsorError(f"an IRModule to tune must hold exactly one PrimFunc, this one has {len(funcs)}; "
                             "for a Relax model use ansor.relax.tune_relax")
        func = funcs[0]
    elif isinstance(func, (list, tuple)):
        if not func or not all(isinstance(t, tvm.te.Tensor) for t in func):
            raise AnsorError("give a PrimFunc or a list of TE tensors (placeholders and outputs), "
                             f"not a {type(func).__name__} of {sorted({type(t).__name__ for t in func})}")
        func = tvm.te.create_prim_func(list(func))
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise AnsorError(f"cannot tune a {type(func).__name__}: give a PrimFunc, a list of TE tensors, "
                         "a one-PrimFunc IRModule or a SearchTask")
    return SearchTask(in_precision(func, precision), target, workload_key=workload_key)


def tune(func: Any, target: TargetLike = None, trials: Optional[int] = None,
         log_file: Union[str, os.PathLike, None] = None, *, options: Optional[TuningOptions] = None,
         database: Union["Database", str, os.PathLike, None] = None, resume: bool = True,
         workload_key: Optional[str] = None, precision: Union[Precision, str] = Precision.FP32) -> TuneResult:
    """Tune one program in one call: ``ansor.tune(func, "llvm", trials=64, log_file="mm.json")``.

    ``func`` is a PrimFunc, a list of TE tensors (``[A, B, C]``), a one-PrimFunc IRModule or a
    :class:`SearchTask`; ``trials`` (default 64) overrides ``options.num_measure_trials``. Measurement,
    timing and cost model are the scripts' (:class:`TuningOptions` defaults). Returns a
    :class:`TuneResult`: ``best_state``, ``best_cost`` (seconds), ``log_file``; apply it with
    ``ansor.apply_best(result.task, result.log_file)``. See :func:`tune_task` for ``database`` and ``resume``.
    ``precision="bf16"`` tunes a matmul with bf16 inputs and fp32 sums (the task's PrimFunc is its bf16 form).
    """
    task = as_task(func, target, workload_key, precision_named(precision))
    return tune_task(task, with_trials(options, trials), log_file, database=database, resume=resume)
