"""From a loop state to a program: schedule, build, and run in this process.

This is the simple, in-process path used by tests, by the final evaluation in ``tune_test.py`` and by
the Ray builders (which ship the exported library to a runner). Timing under load, timeouts and crash
isolation live in :mod:`ansor.measure`.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import numpy as np
import tvm

from .. import codegen
from ..state.layout_rewrite import PackedLayout, pack_arguments, packed_layouts
from ..state.loop_state import State
from ..state.tensor_intrin import BF16_BITS, round_to_bf16
from ..target import device_kind
from .search_task import SearchTask
from .timing import REPORT

logger = logging.getLogger("ansor")


def schedule(task: SearchTask, state: Optional[State]) -> tvm.IRModule:
    """The scheduled module of ``state`` (``None``: the unscheduled program); it takes the original arguments
    (constant weights it packs are packed by layout-rewrite blocks inside it, which a network build folds)."""
    if state is None:
        return task.compute_dag.mod
    return task.compute_dag.replay(state).mod


def reference(task: SearchTask) -> tvm.IRModule:
    """The correctness reference: the unscheduled program, each block's leading spatial loops fused into one
    parallel loop (CPU targets; ResNet3D-18's references took 9.4 s on one core of a 2-core Zen 3, 5.0 s on
    both). Every output element is still computed by the naive loop nest in the same order, so its bits are
    the unscheduled program's. A block is left serial unless each loop made parallel binds a spatial iterator
    and each spatial iterator is a whole index of its store (no two iterations write one element), or where
    TVM refuses.
    """
    mod = task.compute_dag.mod
    if not device_kind(task.target).thread_pool:
        return mod
    sch = tvm.s_tir.Schedule(mod)
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        lead = _parallel_loops(sch, block_rv)
        if not lead:
            continue
        trial = sch.copy()
        try:
            trial.parallel(trial.fuse(*lead) if len(lead) > 1 else lead[0])
        except tvm.s_tir.ScheduleError as err:
            logger.debug("%s: reference block %s stays serial: %s", task.desc, sch.get(block_rv).name_hint, err)
            continue
        sch = trial
    return sch.mod


def _parallel_loops(sch: tvm.s_tir.Schedule, block_rv) -> list:
    """The leading loops of a block that may run in parallel (see :func:`reference`)."""
    block, loops = sch.get(block_rv), sch.get_loops(block_rv)
    realize = sch.get(loops[-1]).body
    kinds = {iv.iter_type for iv in block.iter_vars}  # others, e.g. opaque, stay serial
    if not kinds <= {tvm.tirx.IterVar.DataPar, tvm.tirx.IterVar.CommReduce} \
            or not isinstance(block.body, tvm.tirx.BufferStore):
        return []
    store_vars = [index for index in block.body.indices if isinstance(index, tvm.tirx.Var)]
    spatial, reducing = [], []
    for iv, value in zip(block.iter_vars, realize.iter_values):
        data_par = iv.iter_type == tvm.tirx.IterVar.DataPar
        if data_par and not any(iv.var.same_as(v) for v in store_vars):
            return []
        (spatial if data_par else reducing).extend(tvm.tirx.analysis.undefined_vars(value))
    lead = []
    for loop_rv in loops:
        var = sch.get(loop_rv).loop_var
        if any(var.same_as(v) for v in reducing) or not any(var.same_as(v) for v in spatial):
            break
        lead.append(loop_rv)
    return lead


def kernel(task: SearchTask, state: Optional[State],
           scheduled: Optional[tvm.IRModule] = None) -> tuple[tvm.IRModule, list[PackedLayout]]:
    """What measurement times: the scheduled module (``scheduled``, if the caller has it) without its
    weight-packing blocks, and the layouts its pre-packed arguments take
    (:func:`~ansor.state.layout_rewrite.pack_arguments` makes them)."""
    mod = scheduled if scheduled is not None else schedule(task, state)
    layouts = packed_layouts(state) if state is not None else []
    if layouts:
        func = tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)["main"]
        # TVM's pass leaves the function's type with the unpacked argument shapes: rebuild it from its params.
        mod = tvm.IRModule({"main": tvm.tirx.PrimFunc(func.params, func.body, func.ret_type, func.attrs)})
    return mod, layouts


def build_program(task: SearchTask, state: Optional[State]) -> tvm.runtime.Module:
    """Compile ``state`` for the task's target; returns a runnable module (``mod["main"]``) that takes the
    original arguments."""
    return codegen.compile(schedule(task, state), task.target).jit()


def build_kernel(task: SearchTask, state: Optional[State]) -> tuple[tvm.runtime.Module, list[PackedLayout]]:
    """Compile :func:`kernel`: the program as measured (constant weights pre-packed)."""
    mod, layouts = kernel(task, state)
    return codegen.compile(mod, task.target).jit(), layouts


def arg_specs(task: SearchTask) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every PrimFunc argument, in order."""
    dag = task.compute_dag
    return [(dag.buffer_shapes[p.name], dag.buffer_dtypes[p.name]) for p in task.func.params]


def random_inputs(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    """Random non-zero arrays for every argument (outputs included, as TVM wants every buffer): floats in
    [0.1, 1), bf16 bits (``uint16``: a bf16 network's packed weights and stored activations) of such floats,
    small integers (indices)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in arg_specs(task):
        if dtype.startswith("float"):
            arrays.append(rng.uniform(0.1, 1.0, size=shape).astype(dtype))
        elif dtype == BF16_BITS:  # small integers here would be denormal bf16, which the bf16 units read as zero
            arrays.append(round_to_bf16(rng.uniform(0.1, 1.0, size=shape).astype("float32")))
        else:
            arrays.append(rng.integers(1, 8, size=shape).astype(dtype))
    return arrays


def run_program(module: tvm.runtime.Module, arrays: Sequence[np.ndarray],
        device: Optional[tvm.runtime.Device] = None) -> list[np.ndarray]:
    """Run ``module`` on copies of ``arrays``; returns every argument after the call."""
    dev = device or tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    module["main"](*tensors)
    return [t.numpy() for t in tensors]


CACHE_FLUSH = "cache_flush_cpu_non_first_arg"  # TVM's f_preproc: flush every argument but the first
MAX_COLD_RUNS = 200  # single runs per repeat when each is flushed: a 10 us kernel's flushes would double its time


def time_runs(module: tvm.runtime.Module, device: tvm.runtime.Device, args: list, number: int, repeat: int,
              flush: str) -> tuple[float, ...]:
    """``repeat`` mean seconds of ``number`` runs; with ``flush``, each run is timed alone after its flush
    (at most ``MAX_COLD_RUNS`` of them), because TVM's ``f_preproc`` runs once per repeat, not per run."""
    if not flush:
        timer = module.time_evaluator("main", device, number=number, repeat=repeat)
        return tuple(float(c) for c in timer(*args).results)
    number = min(number, MAX_COLD_RUNS)
    timer = module.time_evaluator("main", device, number=1, repeat=number * repeat, f_preproc=flush)
    runs = np.asarray(timer(*args).results, dtype=float).reshape(repeat, number)
    return tuple(float(c) for c in runs.mean(axis=1))


def runs_per_repeat(probe_s: float, min_repeat_ms: float, least: int = 1) -> int:
    """How many runs make a repeat of about ``min_repeat_ms``, from one run's ``probe_s`` seconds. Computed
    up front: TVM's own min_repeat_ms loop re-runs a whole repeat whenever it falls just short."""
    return max(least, math.ceil(min_repeat_ms / 1000 / max(probe_s, 1e-9)))


def time_module(module: tvm.runtime.Module, arrays: Sequence[np.ndarray],
                repeat: int = REPORT.repeat, min_repeat_ms: int = REPORT.min_repeat_ms, device: Optional[tvm.runtime.Device] = None,
                layouts: Sequence[PackedLayout] = (), cold: bool = True) -> float:
    """Median seconds per run over ``repeat`` repeats of about ``min_repeat_ms`` each.

    ``cold`` (CPU only): every argument but the first is flushed from the caches before each run, as in a
    network where weights come from memory (the tuner's own timing, :func:`time_runs`); otherwise the runs
    follow each other hot, as a library benchmark's loop times them (numpy's ``a @ b`` in ``peak.py``).
    ``layouts``: the module is a :func:`build_kernel` taking pre-packed weights; ``arrays`` are packed first.
    Threads come from ``TVM_NUM_THREADS``, read once when the runtime starts: set it before calling.
    """
    dev = device or tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in pack_arguments(layouts, arrays)]
    on_cpu = dev.dlpack_device_type() == tvm.cpu().dlpack_device_type()
    flush = CACHE_FLUSH if cold and on_cpu else ""
    probe = min(time_runs(module, dev, tensors, 1, 3, flush))
    number = runs_per_repeat(probe, min_repeat_ms)
    return float(np.median(time_runs(module, dev, tensors, number, repeat, flush)))
