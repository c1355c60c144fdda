"""TVM's GPU code verification, run on a replayed state before it can reach a GPU.

A CUDA kernel that asks for more threads, shared memory or vector width than the device has fails at
launch, after a build and a trip to the GPU node. We lower the replayed schedule just far enough for TVM's
verifier (``tvm.s_tir.analysis.verify_gpu_code``) to see the real allocations and thread extents, and
check them against the task's :class:`~ansor.target.HardwareParams`. It costs a few milliseconds, so the
search runs the pure-Python :func:`~ansor.sketch.gpu_annotation.fits_gpu` first and this only on what is
about to be measured.

The lowering passes are the front of TVM's default pipeline (``tvm.s_tir.pipeline``), up to storage
rewriting: the point where allocations have their final sizes and vthreads have been injected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Optional

import tvm
from tvm import s_tir, tirx

from ..errors import StepError, short_message
from ..state.loop_nest import AttachKind, Iterator
from ..state.loop_state import State
from ..task.search_task import SearchTask

logger = logging.getLogger("ansor")


def _lowering() -> tvm.transform.Pass:
    return tvm.transform.Sequential([
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        tirx.transform.StorageRewrite(),
    ])


def gpu_constraints(task: SearchTask) -> dict[str, int]:
    """The limits ``verify_gpu_code`` checks, from the task's hardware parameters."""
    hw = task.hardware_params
    return {
        "max_threads_per_block": hw.max_threads_per_block,
        "max_thread_x": hw.max_threads_per_block,
        "max_thread_y": hw.max_threads_per_block,
        "max_thread_z": 64,
        "max_shared_memory_per_block": hw.max_shared_memory_per_block,
        "max_local_memory_per_block": hw.max_local_memory_per_block,
        "max_vthread": hw.max_vthread_extent,
        "max_vector_bytes": hw.vector_unit_bytes,
    }


#: Loop annotations that put a loop on the GPU's grid (a vthread alone launches nothing).
_THREAD_TAGS = ("blockIdx.", "threadIdx.")


def host_code(state: State) -> Optional[str]:
    """Why ``state`` is not a GPU program, or None: a CPU annotation (parallel loop, packed weight), or a
    root stage none of whose loops is bound to a GPU thread.

    TVM's verifier passes such programs (they ask for no threads at all) and the CUDA build keeps their
    loops on the host, which then reads device memory: a ResNet-50 run on an H200 lost a Ray worker to each
    of them (the CPU default schedules of its warm-up rounds, steps ``parallel``, ``vectorize``, ``LR``).
    """
    for stage in state.stages:
        if stage.packed:
            return f"stage {stage.name} reads a weight pre-packed for the CPU ({', '.join(stage.packed)})"
        for it in stage.iters:
            if it.annotation == "parallel":
                return f"loop {it.name} of stage {stage.name} is a CPU parallel loop"
    for sid, stage in enumerate(state.stages):
        if stage.compute_at == AttachKind.ROOT and not any(it.annotation.startswith(_THREAD_TAGS)
                                                           for it in _kernel_iters(state, sid)):
            return f"stage {stage.name} binds no loop to a GPU block or thread: it would run on the host"
    return None


def _kernel_iters(state: State, sid: int) -> Iterable[Iterator]:
    """The loops of root stage ``sid`` and of every stage computed under it: one kernel's loops."""
    todo = [sid]
    while todo:
        k = todo.pop()
        todo.extend(state.attached_to(k))
        yield from state.stages[k].iters


def verify_gpu(task: SearchTask, state: State) -> Optional[str]:
    """None if ``state`` is a GPU program (:func:`host_code`), replays and passes TVM's GPU verification,
    else the reason it does not."""
    reason = host_code(state)
    if reason is not None:
        return reason
    try:
        mod = task.compute_dag.replay(state).mod
    except StepError as err:
        return str(err)
    try:
        with task.target:
            lowered = _lowering()(mod)
    except Exception as err:  # TVM reports lowering failures as several error types
        return f"lowering failed: {short_message(err, None, pick='last')}"
    constraints = gpu_constraints(task)
    for gvar, func in lowered.functions.items():
        if isinstance(func, tirx.PrimFunc) and not s_tir.analysis.verify_gpu_code(func, constraints):
            return f"{gvar.name_hint} exceeds the GPU limits {constraints}"
    return _cross_thread_reduction_error(task, state, mod, lowered)


def _cross_thread_reduction_error(task: SearchTask, state: State, mod: tvm.IRModule,
                                  lowered: tvm.IRModule) -> Optional[str]:
    """Why a reduction loop bound to GPU threads would compute wrong results or fail to build, or None.

    Each such stage must become a cross-thread reduction (``tvm_thread_allreduce``), else every thread adds
    into one accumulator; and TVM's whole lowering must take it: unrolled, an allreduce can be duplicated
    and ``LowerThreadAllreduce`` fails (6 of 48 candidates of ResNet-50's global pooling on an H200; the
    full lowering, 3-8 ms, refused exactly those). The verifier checks neither.
    """
    stages = [stage.name for stage in state.stages if stage.reduces_across_threads]
    if not stages:
        return None
    text = "".join(func.script() for func in lowered.functions.values() if isinstance(func, tirx.PrimFunc))
    if text.count("tvm_thread_allreduce(") < len(stages):
        return (f"the reduction of {', '.join(stages)} is bound to GPU threads but not lowered to a "
                "cross-thread reduction: its threads would race on one accumulator")
    target = task.target if task.target.host is not None else task.target.with_host(tvm.target.Target("llvm"))
    try:
        with target:
            tirx.get_default_tir_pipeline(target)[0](tirx.transform.BindTarget(target)(mod))
    except Exception as err:  # TVM reports lowering failures as several error types
        why = short_message(err, None, pick="last")
        return f"lowering the cross-thread reduction of {', '.join(stages)} failed: {why}"
    return None


def launch_dims(state: State) -> list[dict]:
    """Grid and block size of each kernel of a CUDA state, from its thread bindings (outer to inner).

    One entry per root stage that is not inlined, in program order: ``{"stage", "grid", "block",
    "vthread"}`` with ``grid`` and ``block`` as ``[x, y, z]``.
    """
    out = []
    for sid, stage in enumerate(state.stages):
        if stage.compute_at != AttachKind.ROOT:
            continue
        grid, block = [1, 1, 1], [1, 1, 1]
        vthread = 1
        for it in _kernel_iters(state, sid):
            tag, extent = it.annotation, it.extent or 1
            if tag.startswith(_THREAD_TAGS):
                dims = grid if tag.startswith("blockIdx.") else block
                axis = "xyz".index(tag[-1])
                dims[axis] = max(dims[axis], extent)
            elif tag == "vthread":
                vthread *= extent
        out.append({"stage": stage.name, "grid": grid, "block": block, "vthread": vthread})
    return out
