"""CUDA sketch rules: Ansor's GPU sketch policy on our TensorIR-semantics State.

Rules run from the output stage towards the inputs, as on CPU. The GPU list is AlwaysInline (every
non-output, non-reducing stage), CrossThreadReduction, AddCacheWrite, MultiLevelTilingWithFusion (with the
shared-memory cache reads) and SkipStage.

Where TensorIR forces a different construction from Ansor's:

* **Shared-memory cache reads are added by the tiling rule of the consumer**, not by a rule on the
  producer. Our DAG has no placeholder stages, and ``cache_read`` needs the reader alone at the root, so the
  reads must be taken before the consumer's epilogue is fused under it. The copies are computed at the last
  loop of the consumer's outermost reduction tile, as in Ansor.
* **The accumulator always lives in a ``local`` cache.** TensorIR gives an intermediate buffer global scope
  wherever it is allocated, and CUDA cannot allocate global memory inside a kernel. So a tiled stage with an
  element-wise consumer gets ``CHW local`` and its write-back stage is inlined into the consumer, which then
  reads the per-thread cache; the consumer is fused under the thread tile (Ansor computed the tiled stage
  inside its consumer and let TE's scope inference make the intermediate local).
* **A cross-thread reduction computed under its consumer is placed first and split afterwards**: ``CA``
  regenerates the moved stage's loops, so a split made before it would be lost.

Thread counts of cross-thread reductions and element-wise stages are left unfilled (``None``) in the sketch;
:mod:`ansor.sketch.gpu_annotation` samples them (Ansor fixed them to the warp size and let mutation vary
them).
"""

from __future__ import annotations

from typing import Optional

from ..state.access import IterKind
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..task.search_task import SearchTask
from ..state.transform_steps import SplitStep
from .rules import (
    AlwaysInline, Cond, SketchRule, SkipStage, dag_stage, fuse_reduction, has_cache_write_stage, has_reduce_iter,
    is_output, multi_level_tiling, needs_multi_level_tiling, single_elementwise_consumer, space_and_reduce_length,
    spatial_level_end,
)

#: Ansor's GPU tiling structure: block, vthread, thread spatial tiles, two reduction tiles, inner tiles.
GPU_STRUCTURE = "SSSRRSRS"
#: Tile level (1-based, spatial) under which an element-wise consumer is fused: the thread tile.
THREAD_LEVEL = 3


def has_cross_thread_reduction(state: State, stage_id: int) -> bool:
    """True if the stage, or a stage computed at its loops, binds a reduction loop to ``threadIdx.x``."""
    return any(state.stages[sid].reduces_across_threads for sid in (stage_id, *state.attached_to(stage_id)))


def common_outer_loops(state: State, stage_id: int, target_id: int) -> int:
    """How many outer loops of ``target_id`` walk exactly the leading dimensions of ``stage_id``'s output.

    Under the last of them the stage can be computed for one slice of its output (Ansor's
    ``GetNumCommonOuterIterator``).
    """
    out = state.stages[stage_id].block.writes[0]
    own = [None if i is None else i.single_var() for i in out.indices]
    spatial = {v.name for v in state.stages[stage_id].block.vars if v.kind == IterKind.SPATIAL}
    target = state.stages[target_id]
    uses = target.block.reads_of(out.buffer)
    n = 0
    for k, it in enumerate(target.iters):
        if k >= len(own) or own[k] not in spatial or it.kind != IterKind.SPATIAL or len(it.parts) != 1:
            break
        var = it.parts[0].var
        if not uses or any(len(u.indices) <= k or u.indices[k] is None or u.indices[k].single_var() != var
                           for u in uses):
            break
        n += 1
    return n


class CrossThreadReduction(SketchRule):
    """Reduce across the threads of a block when the spatial part is too small to fill the GPU.

    ``APPLY``: the stage is also kept without it (Ansor's "1 cross-thread reduction sketch + 1 default").
    The reduction loops are fused and split; the inner part is bound to ``threadIdx.x``. If the single
    consumer is not tiled and shares outer loops with the stage, the stage is computed under the last of
    them and follows the consumer's thread split, so both run in one kernel.
    """

    name = "cross_thread_reduction"

    def condition(self, task: SearchTask, state: State, stage_id: int) -> Cond:
        if not has_reduce_iter(state, stage_id) or has_cross_thread_reduction(state, stage_id) \
                or dag_stage(state, stage_id) is None:
            return Cond.PASS
        space, reduce = space_and_reduce_length(state, stage_id)
        hw = task.hardware_params
        if needs_multi_level_tiling(state, stage_id):
            return Cond.APPLY if space <= hw.max_threads_per_block and space < reduce else Cond.PASS
        return Cond.APPLY if reduce > hw.warp_size else Cond.PASS

    def apply(self, task: SearchTask, state: State, stage_id: int) -> list[tuple[State, int]]:
        s = state.copy()
        target = _fusible_consumer(s, stage_id)
        if target is None:
            fused = fuse_reduction(s, stage_id)
            s.split(stage_id, fused, [None])
            s.annotate(stage_id, fused + 1, "threadIdx.x")
            return [(s, stage_id - 1)]
        # The result is read by every thread of the consumer's block: keep it in shared memory (an
        # intermediate buffer allocated inside a kernel cannot stay global in TensorIR).
        write_back = s.cache_write(stage_id, "shared")
        s.compute_inline(write_back)
        target += 1  # the write-back stage was added before it
        split_id = _thread_split_of(s, target)
        s.compute_at(stage_id, target, common_outer_loops(s, stage_id, target) - 1)
        fused = fuse_reduction(s, stage_id)
        s.follow_split(stage_id, fused, split_id, 1)
        s.annotate(stage_id, fused + 1, "threadIdx.x")
        return [(s, stage_id - 1)]


def _fusible_consumer(state: State, stage_id: int) -> Optional[int]:
    consumers = state.consumers(stage_id)
    if len(consumers) != 1:
        return None
    target = consumers[0]
    tstage = state.stages[target]
    if (needs_multi_level_tiling(state, target) or tstage.compute_at != AttachKind.ROOT
            or has_reduce_iter(state, target)):
        return None
    return target if common_outer_loops(state, stage_id, target) > 0 else None


def _thread_split_of(state: State, target: int) -> int:
    """Step id of the consumer's thread split, adding it (innermost loop, length to be sampled) if missing."""
    for i, step in enumerate(state.steps):
        if isinstance(step, SplitStep) and step.stage_id == target:
            return i
    last = len(state.stages[target].iters) - 1
    state.split(target, last, [None])
    state.annotate(target, last + 1, "threadIdx.x")
    return len(state.steps) - 2


class GPUAddCacheWrite(SketchRule):
    """Accumulate a tiled stage in a ``local`` cache (always on GPU; see the module notes).

    With a single element-wise consumer and an intermediate output, the write-back stage is inlined so the
    consumer reads the per-thread cache once it is fused under the thread tile.
    """

    name = "add_cache_write"

    def condition(self, task: SearchTask, state: State, stage_id: int) -> Cond:
        if needs_multi_level_tiling(state, stage_id) and state.stages[stage_id].compute_at == AttachKind.ROOT \
                and not has_cache_write_stage(state, stage_id) and not has_cross_thread_reduction(state, stage_id):
            return Cond.APPLY_AND_SKIP_REST
        return Cond.PASS

    def apply(self, task: SearchTask, state: State, stage_id: int) -> list[tuple[State, int]]:
        s = state.copy()
        fuse_epilogue = single_elementwise_consumer(s, stage_id) is not None and not is_output(s, stage_id)
        write_back = s.cache_write(stage_id, "local")
        if fuse_epilogue:
            s.compute_inline(write_back)
        return [(s, stage_id)]


class GPUMultiLevelTilingWithFusion(SketchRule):
    """Read the inputs through shared memory, tile "SSSRRSRS", fuse the consumer under the thread tile."""

    name = "multi_level_tiling_with_fusion"

    def condition(self, task: SearchTask, state: State, stage_id: int) -> Cond:
        if needs_multi_level_tiling(state, stage_id) and has_cache_write_stage(state, stage_id) \
                and state.stages[stage_id].compute_at == AttachKind.ROOT:
            return Cond.APPLY_AND_SKIP_REST
        return Cond.PASS

    def apply(self, task: SearchTask, state: State, stage_id: int) -> list[tuple[State, int]]:
        s = state.copy()
        first = stage_id
        block = state.stages[first].block
        for buffer in block.read_buffers():  # each copy goes before the reader
            if any(i is None for acc in block.reads_of(buffer) for i in acc.indices):
                continue  # a non-affine read (grouped conv): no region to bound a shared copy by
            s.cache_read(stage_id, buffer, "shared")
            stage_id += 1
        consumer = single_elementwise_consumer(s, stage_id)
        s, _, level_ends = multi_level_tiling(s, stage_id, GPU_STRUCTURE)
        if consumer is not None:
            s.compute_at(consumer, stage_id, spatial_level_end(GPU_STRUCTURE, level_ends, THREAD_LEVEL))
        read_at = _bind_tile_levels(s, stage_id, level_ends)
        for shared in range(first, stage_id):
            s.compute_at(shared, stage_id, read_at)
        return [(s, first - 1)]


def _bind_tile_levels(state: State, stage_id: int, level_ends: list[int]) -> int:
    """Fuse the block, vthread and thread tiles and bind them; returns the id of the outer reduction tile's
    last loop, where the shared copies go.

    Binding comes before the copies are placed because TensorIR sizes a shared copy for every thread and
    vthread only when their loops are already bound (Ansor bound them in random annotation; TE's bound
    inference relaxed thread loops whenever it ran).
    """
    start, pos = 0, 0
    for level, axis in enumerate(("blockIdx.x", "vthread", "threadIdx.x")):
        size = level_ends[level] + 1 - start
        if size > 1:
            state.fuse(stage_id, list(range(pos, pos + size)))
        if size:
            state.annotate(stage_id, pos, axis)
            pos += 1
        start = level_ends[level] + 1
    return level_ends[GPU_STRUCTURE.index("R")] - start + pos


GPU_RULES: tuple[SketchRule, ...] = (
    AlwaysInline(strict=False), CrossThreadReduction(), GPUAddCacheWrite(), GPUMultiLevelTilingWithFusion(),
    SkipStage(),
)
