"""From a loop state to a program: schedule, build, and run in this process.

This is the simple, in-process path used by tests, by the final evaluation in ``tune_test.py`` and by
the Ray builders (which ship the exported library to a runner). Timing under load, timeouts and crash
isolation live in :mod:`ansor.measure`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tvm

from .loop_state import State
from .search_task import SearchTask


def schedule(task: SearchTask, state: Optional[State]) -> tvm.IRModule:
    """The scheduled module of ``state`` (``None``: the unscheduled program)."""
    if state is None:
        return task.compute_dag.mod
    return task.compute_dag.replay(state).mod


def build(task: SearchTask, state: Optional[State]) -> tvm.runtime.Module:
    """Compile ``state`` for the task's target; returns a runnable module (``mod["main"]``)."""
    return tvm.compile(schedule(task, state), target=task.target).jit()


def arg_specs(task: SearchTask) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every PrimFunc argument, in order."""
    dag = task.compute_dag
    return [(dag.buffer_shapes[p.name], dag.buffer_dtypes[p.name]) for p in task.func.params]


def random_inputs(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    """Random non-zero arrays for every argument (outputs included, as TVM wants every buffer)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in arg_specs(task):
        if dtype.startswith("float"):
            arrays.append(rng.uniform(0.1, 1.0, size=shape).astype(dtype))
        else:
            arrays.append(rng.integers(1, 8, size=shape).astype(dtype))
    return arrays


def run(task: SearchTask, module: tvm.runtime.Module, arrays: Sequence[np.ndarray],
        device: Optional[tvm.runtime.Device] = None) -> list[np.ndarray]:
    """Run ``module`` on copies of ``arrays``; returns every argument after the call."""
    dev = device or tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    module["main"](*tensors)
    return [t.numpy() for t in tensors]


def time_module(task: SearchTask, module: tvm.runtime.Module, arrays: Sequence[np.ndarray],
                repeat: int = 10, min_repeat_ms: int = 200, device: Optional[tvm.runtime.Device] = None) -> float:
    """Median seconds per run, with the CPU cache flushed before each repeat (inputs cold, as in a network).

    Threads come from ``TVM_NUM_THREADS``, read once when the runtime starts: set it before calling.
    """
    dev = device or tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    flush = "cache_flush_cpu_non_first_arg" if dev.dlpack_device_type() == tvm.cpu().dlpack_device_type() else ""
    timer = module.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms,
                                  f_preproc=flush)
    return float(np.median(timer(*tensors).results))
