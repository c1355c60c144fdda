"""Random annotation of CUDA sketches: tile sizes, thread binding, cooperative fetching, unroll.

Ansor's GPU initial-population rules are InitFillTileSize, InitThreadBind and InitUnroll; there is no
parallel, vectorize or compute-location rule on GPU. Two changes from Ansor, both to waste fewer samples:

* tile sizes of a multi-level-tiled stage are drawn so the thread tile has between a warp and
  ``max_threads_per_block`` threads and the vthread tile at most ``max_vthread_extent`` (Ansor drew them
  freely and threw the out-of-range ones away);
* thread counts that a sketch leaves open (cross-thread reductions, element-wise stages) are drawn from the
  powers of two and divisors of the extent between the warp size and the block limit (Ansor started from
  the warp size and left the rest to mutation).

:func:`fits_gpu` is the cheap, pure-Python check of the limits TVM's GPU verifier enforces (threads,
vthreads, shared memory, vector width); :mod:`ansor.sketch.gpu_verify` runs the real verifier.
"""

from __future__ import annotations

import math
import random
from typing import Optional

from ..errors import StepError
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..task.search_task import SearchTask
from ..state.transform_steps import SplitStep, Step
from ..state.transform_steps.split import divisors
from .annotation import annotate_unroll, factorizations, outer_parallel_loops
from .gpu_rules import has_cross_thread_reduction

#: Ansor's GPU auto-unroll limits.
GPU_UNROLL_STEPS = (0, 16, 64, 512, 1024)
#: Vector widths tried for a cooperative fetch (a CUDA vector load is at most 16 bytes).
FETCH_VECTOR_LANES = (1, 2, 4)
_TRIES = 32


def sample_gpu_program(task: SearchTask, sketch: State, rng: random.Random) -> Optional[State]:
    """One complete CUDA program from ``sketch``, or None if no draw fitted the hardware limits."""
    for _ in range(_TRIES):
        try:
            state = fill_gpu_tile_sizes(task, sketch, rng)
            if state is None:
                continue
            bind_threads(state, task, rng)
            annotate_unroll(state, rng, GPU_UNROLL_STEPS)
        except StepError:
            continue
        if fits_gpu(task, state):
            return state
    return None


# ---------------------------------------------------------------------------------------------- tile sizes
def thread_counts(extent: int, warp: int, max_threads: int) -> list[int]:
    """Thread counts worth trying for a loop of ``extent``: powers of two and divisors in [warp, limit]."""
    if extent <= warp:
        return [extent]
    top = min(extent, max_threads)
    pow2 = [1 << k for k in range(warp.bit_length() - 1, top.bit_length()) if warp <= 1 << k <= top]
    return sorted(set(pow2) | {d for d in divisors(extent) if warp <= d <= top})


def fill_gpu_tile_sizes(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Fill every open split: multi-level tiles per stage under the thread/vthread limits, thread counts."""
    hw = task.hardware_params
    steps: list[Step] = list(state.steps)
    groups: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        if isinstance(step, SplitStep) and any(v is None for v in step.lengths):
            if len(step.lengths) == 1:
                lengths = (rng.choice(thread_counts(step.extent or 1, hw.warp_size, hw.max_threads_per_block)),)
                steps[i] = SplitStep(step.stage_id, step.iter_id, step.extent, lengths, step.inner_to_outer)
            else:
                groups.setdefault(step.stage_id, []).append(i)
    for ids in groups.values():
        spatial = [i for i in ids if len(steps[i].lengths) == 4]  # type: ignore[union-attr]
        space = math.prod(steps[i].extent or 1 for i in spatial)  # type: ignore[union-attr]
        if not _fill_spatial(steps, spatial, hw, space > hw.warp_size, rng):
            return None
        for i in ids:
            step = steps[i]
            if i not in spatial:
                choice = rng.choice(factorizations(step.extent or 1, len(step.lengths)))  # type: ignore[union-attr]
                steps[i] = SplitStep(step.stage_id, step.iter_id, step.extent, choice, True)  # type: ignore
    return state.with_steps(steps)


def _fill_spatial(steps: list[Step], ids: list[int], hw, need_warp: bool, rng: random.Random) -> bool:
    """Lengths (vthread, thread, inner, innermost) for each spatial split, drawn under the block limits."""
    vthreads = threads = 1
    order = list(ids)
    rng.shuffle(order)
    for n, i in enumerate(order):
        step: SplitStep = steps[i]  # type: ignore[assignment]
        last = n == len(order) - 1
        options = [f for f in factorizations(step.extent or 1, 4)
                   if vthreads * f[0] <= hw.max_vthread_extent and threads * f[1] <= hw.max_threads_per_block
                   and (not last or not need_warp or threads * f[1] >= hw.warp_size)]
        if not options:
            return False
        choice = rng.choice(options)
        vthreads, threads = vthreads * choice[0], threads * choice[1]
        steps[i] = SplitStep(step.stage_id, step.iter_id, step.extent, choice, True)
    return True


# ---------------------------------------------------------------------------------------------- binding
def bind_threads(state: State, task: SearchTask, rng: random.Random) -> None:
    """Ansor's InitThreadBind: every kernel gets its block and thread loops; shared copies fetch together.

    Multi-level-tiled stages were bound in their sketch (see :mod:`ansor.sketch.gpu_rules`).
    """
    hw = task.hardware_params
    for sid in range(len(state.stages)):
        stage = state.stages[sid]
        if stage.compute_at == AttachKind.INLINED:
            continue
        if has_cross_thread_reduction(state, sid):
            if stage.compute_at == AttachKind.ROOT:
                n = _fuse_outer_space(state, sid)
                if n:
                    state.annotate(sid, 0, "blockIdx.x")
            continue
        if any(it.annotation == "threadIdx.x" for it in stage.iters):
            continue
        if stage.compute_at == AttachKind.ROOT:
            _bind_simple(state, sid, hw, rng)
        elif stage.name.endswith("_shared"):
            _cooperative_fetch(state, sid, rng)


def _fuse_outer_space(state: State, sid: int) -> int:
    """Fuse the leading spatial loops up to the first attach point; returns how many were fused (0: none)."""
    n = outer_parallel_loops(state, sid)
    if n > 1:
        state.fuse(sid, list(range(n)))
    return n


def _bind_simple(state: State, sid: int, hw, rng: random.Random) -> None:
    if not _fuse_outer_space(state, sid):
        raise StepError(f"stage {state.stages[sid].name} has no spatial loop to bind to GPU threads")
    extent = state.stages[sid].iters[0].extent or 1
    if extent <= hw.warp_size:
        state.annotate(sid, 0, "threadIdx.x")
        return
    state.split(sid, 0, [rng.choice(thread_counts(extent, hw.warp_size, hw.max_threads_per_block))])
    state.annotate(sid, 0, "blockIdx.x")
    state.annotate(sid, 1, "threadIdx.x")


def _cooperative_fetch(state: State, sid: int, rng: random.Random) -> None:
    """Fuse a shared copy's loops and split them over the consumer's threads (and a short vector)."""
    target = state.stages[sid].attach[0]
    follow = [i for i in _steps_of(state, target) if isinstance(state.steps[i], SplitStep)
              and len(state.steps[i].lengths) == 4]  # type: ignore[union-attr]
    n = len(state.stages[sid].iters)
    if n > 1:
        state.fuse(sid, list(range(n)))
    extent = state.stages[sid].iters[0].extent or 1
    threads = math.prod(state.steps[i].lengths[1] or 1 for i in follow)  # type: ignore[union-attr]
    lanes = rng.choice([v for v in FETCH_VECTOR_LANES if extent % (v * threads) == 0] or [1])
    state.split(sid, 0, [lanes])
    state.follow_fused_split(sid, 0, follow, 1, True)
    state.annotate(sid, 1, "threadIdx.x")
    state.annotate(sid, 2, "vectorize")


def _steps_of(state: State, stage_id: int) -> list[int]:
    """Ids of the steps applied to the stage now at ``stage_id`` (stage ids shift when steps add stages)."""
    ids = list(range(len(state.dag.stages)))
    owner: list[int] = []
    fresh = len(ids)
    for step in state.steps:
        owner.append(ids[step.stage_id])
        if step.NEW_STAGE is not None:
            ids.insert(step.stage_id + step.NEW_STAGE, fresh)
            fresh += 1
    return [i for i, o in enumerate(owner) if o == ids[stage_id]]


# ---------------------------------------------------------------------------------------------- limits
def fits_gpu(task: SearchTask, state: State) -> bool:
    """True if no kernel of ``state`` exceeds the block's threads, vthreads, shared memory or vector width."""
    hw = task.hardware_params
    for sid, stage in enumerate(state.stages):
        if stage.compute_at != AttachKind.ROOT:
            continue
        kernel = _kernel_stages(state, sid)
        threads = vthreads = 1
        shared = 0
        bound = False
        for k in kernel:
            s = state.stages[k]
            for it in s.iters:
                extent = it.extent or 1
                if it.annotation == "threadIdx.x":
                    threads = max(threads, extent)
                elif it.annotation == "vthread":
                    vthreads *= extent
                elif it.annotation == "vectorize" and extent * _dtype_bytes(state, k) > hw.vector_unit_bytes:
                    return False
                bound = bound or it.annotation in ("threadIdx.x", "blockIdx.x")
            if s.name.endswith("_shared"):
                shared += math.prod(it.extent or 1 for it in s.iters) * _dtype_bytes(state, k)
        if not bound or threads > hw.max_threads_per_block or vthreads > hw.max_vthread_extent \
                or shared > hw.max_shared_memory_per_block:
            return False
    return True


def _kernel_stages(state: State, root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        sid = todo.pop()
        out.append(sid)
        todo.extend(state.attached_to(sid))
    return out


def _dtype_bytes(state: State, sid: int) -> int:
    return max(1, state.dag.element_bits(state.stages[sid].block.writes[0].buffer) // 8)
