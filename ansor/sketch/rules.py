"""Sketch generation: the few loop-nest skeletons worth searching, derived rule by rule.

Rules run from the output stage towards the inputs, as in Ansor. Each rule says whether it applies to a
stage (``PASS``, ``APPLY``, ``APPLY_AND_SKIP_REST``) and, if so, returns new (state, next stage id) pairs.
A sketch is a state whose split lengths are still ``None``; random annotation fills them in.

Our TensorIR adaptation of fusion: Ansor tiled the consumer and computed the producer inside it. Here the
producer is tiled and the consumer is placed under its tile loop with ``CA`` (``reverse_compute_at``),
which builds the same loop nest.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from ..state.access import IterKind
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..task.search_task import SearchTask


class Cond(Enum):
    PASS = 0
    APPLY = 1
    APPLY_AND_SKIP_REST = 2


class SketchRule:
    """A sketch rule. Subclass and pass instances to ``SketchPolicy(extra_rules=...)`` to add your own."""

    name = "rule"

    def condition(self, task: SearchTask, state: State, stage_id: int) -> Cond:
        raise NotImplementedError

    def apply(self, task: SearchTask, state: State, stage_id: int) -> list[tuple[State, int]]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------- predicates
def dag_stage(state: State, stage_id: int):
    """The ComputeDAG analysis of the block a stage came from (None for stages a step added)."""
    origin = state.stages[stage_id].origin
    return state.dag.stages[origin] if origin >= 0 else None


def needs_multi_level_tiling(state: State, stage_id: int) -> bool:
    ds = dag_stage(state, stage_id)
    return ds is not None and ds.needs_multi_level_tiling


def has_reduce_iter(state: State, stage_id: int) -> bool:
    return any(it.kind == IterKind.REDUCE for it in state.stages[stage_id].iters)


def is_rfactor_stage(state: State, stage_id: int) -> bool:
    """True for the ``_rf`` stage an rfactor made: its only consumer is the reduction it was factored from."""
    consumers = state.consumers(stage_id)
    return (state.stages[stage_id].origin < 0 and len(consumers) == 1
            and state.stages[stage_id].name == f"{state.stages[consumers[0]].name}_rf")


def is_output(state: State, stage_id: int) -> bool:
    return bool(set(state.stages[stage_id].block.write_buffers()) & state.dag.param_buffers)


def has_cache_write_stage(state: State, stage_id: int) -> bool:
    """True once CHW redirected this stage's output into a cache."""
    ds = dag_stage(state, stage_id)
    return ds is not None and state.stages[stage_id].block.writes[0].buffer != ds.block.writes[0].buffer


def should_always_inline(state: State, stage_id: int, strict: bool = True) -> bool:
    """Whether to inline a stage in every sketch: one that reduces or writes an output never is; else, with
    ``strict``, only a strictly inlineable one (nothing recomputed), without it any (Ansor's GPU rule)."""
    stage = state.stages[stage_id]
    if stage.compute_at == AttachKind.INLINED or is_output(state, stage_id) or has_reduce_iter(state, stage_id):
        return False
    ds = dag_stage(state, stage_id)
    if ds is None:
        return False
    return ds.strictly_inlineable or not strict


def single_elementwise_consumer(state: State, stage_id: int, prefix: bool = False) -> Optional[int]:
    """The only live consumer, if it reads this stage's output element for element (Ansor's fusion test);
    ``prefix``: or only its first elements, as the cut back of a product padded to whole tiles does."""
    consumers = state.consumers(stage_id)
    if len(consumers) != 1:
        return None
    target = consumers[0]
    if state.producers(target) != [stage_id]:  # another live producer could not follow it under the tile
        return None
    stage, consumer = state.stages[stage_id], state.stages[target]
    if has_reduce_iter(state, stage_id) and has_reduce_iter(state, target):
        return None
    if consumer.name.endswith("_shared") or any(v.kind == IterKind.REDUCE for v in consumer.block.vars):
        return None
    out = stage.block.writes[0]
    spatial = [v for v in consumer.block.vars if v.kind == IterKind.SPATIAL]
    shape, extents = state.shapes[out.buffer], tuple(v.extent for v in spatial)
    if shape != extents and not (prefix and len(shape) == len(extents)
                                 and all(e is not None and e <= n for e, n in zip(extents, shape))):
        return None
    for acc in consumer.block.reads_of(out.buffer):
        if [None if i is None or i.const else i.single_var() for i in acc.indices] != [v.name for v in spatial]:
            return None
    return target


def space_and_reduce_length(state: State, stage_id: int) -> tuple[int, int]:
    space = reduce = 1
    for it in state.stages[stage_id].iters:
        if it.kind == IterKind.SPATIAL:
            space *= it.extent or 1
        elif it.kind == IterKind.REDUCE:
            reduce *= it.extent or 1
    return space, reduce


def needs_rfactor(task: SearchTask, state: State, stage_id: int) -> bool:
    """Ansor's test: factor a reduction when its spatial part cannot keep the cores busy."""
    if not has_reduce_iter(state, stage_id) or dag_stage(state, stage_id) is None:
        return False
    space, reduce = space_and_reduce_length(state, stage_id)
    cores = task.hardware_params.num_cores
    if needs_multi_level_tiling(state, stage_id):
        return not (space > reduce or space > cores * 16)
    return reduce > 1 and reduce > cores


def fuse_reduction(state: State, stage_id: int) -> int:
    """Move the reduction loops innermost and fuse them into one; returns that loop's id."""
    iters = state.stages[stage_id].iters
    spatial = [k for k, it in enumerate(iters) if it.kind == IterKind.SPATIAL]
    reduce = [k for k, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    if spatial + reduce != list(range(len(iters))):
        state.reorder(stage_id, spatial + reduce)
    if len(reduce) > 1:
        state.fuse(stage_id, list(range(len(spatial), len(iters))))
    return len(spatial)


# ---------------------------------------------------------------------------------------------- tiling
def multi_level_tiling(state: State, stage_id: int, structure: str) -> tuple[State, list[int], list[int]]:
    """Split every spatial iterator into the 'S' levels and every reduce iterator into the 'R' levels.

    Returns the new state, the step ids of the spatial splits (for FSP/FFSP followers), and for each
    character of ``structure`` the iterator id of that level's last loop. Unit-extent iterators are not
    split; they stay in the outermost level of their kind.
    """
    n_space, n_reduce = structure.count("S"), structure.count("R")
    s = state.copy()
    space_levels: list[list[int]] = [[] for _ in range(n_space)]
    reduce_levels: list[list[int]] = [[] for _ in range(n_reduce)]
    split_ids: list[int] = []
    pos = 0  # position of the current original iterator; splits add iterators before the next one
    for it in state.stages[stage_id].iters:
        levels, n = (space_levels, n_space) if it.kind == IterKind.SPATIAL else (reduce_levels, n_reduce)
        if it.kind not in (IterKind.SPATIAL, IterKind.REDUCE) or n == 1 or (it.extent or 1) == 1:
            levels[0].append(pos)
            pos += 1
            continue
        s.split(stage_id, pos, [None] * (n - 1))
        if it.kind == IterKind.SPATIAL:
            split_ids.append(len(s.steps) - 1)
        for level in range(n):
            levels[level].append(pos + level)
        pos += n
    order: list[int] = []
    level_ends: list[int] = []
    counters = {"S": 0, "R": 0}
    for ch in structure:
        levels = space_levels if ch == "S" else reduce_levels
        order += levels[counters[ch]]
        counters[ch] += 1
        level_ends.append(len(order) - 1)
    if order != list(range(len(order))):
        s.reorder(stage_id, order)
    return s, split_ids, level_ends


def spatial_level_end(structure: str, level_ends: list[int], level: int) -> int:
    """Iterator id of the last loop of the ``level``-th (1-based) spatial tile level."""
    positions = [k for k, ch in enumerate(structure) if ch == "S"]
    return level_ends[positions[level - 1]]


# ---------------------------------------------------------------------------------------------- rules
class AlwaysInline(SketchRule):
    """Inline what :func:`should_always_inline` picks; ``strict=False`` on GPU, where an intermediate not
    inlined is a global-memory round trip between kernels."""

    name = "always_inline"

    def __init__(self, strict: bool = True) -> None:
        self.strict = strict

    def condition(self, task, state, stage_id):
        return Cond.APPLY_AND_SKIP_REST if should_always_inline(state, stage_id, self.strict) else Cond.PASS

    def apply(self, task, state, stage_id):
        s = state.copy()
        s.compute_inline(stage_id)
        return [(s, stage_id - 1)]


class AddRfactor(SketchRule):
    """Fuse the reduction loops, split them in two, and factor out either half (two sketches)."""

    name = "add_rfactor"

    def condition(self, task, state, stage_id):
        ok = needs_rfactor(task, state, stage_id) and not has_cache_write_stage(state, stage_id)
        return Cond.APPLY if ok else Cond.PASS

    def apply(self, task, state, stage_id):
        base = state.copy()
        r = fuse_reduction(base, stage_id)
        base.split(stage_id, r, [None])
        out = []
        for which in (r, r + 1):
            s = base.copy()
            s.rfactor(stage_id, which, r)
            out.append((s, stage_id - 1))
        return out


class AddCacheWrite(SketchRule):
    name = "add_cache_write"

    def condition(self, task, state, stage_id):
        if needs_multi_level_tiling(state, stage_id) and single_elementwise_consumer(state, stage_id) is None \
                and state.stages[stage_id].compute_at == AttachKind.ROOT and not has_cache_write_stage(state, stage_id):
            return Cond.APPLY
        return Cond.PASS

    def apply(self, task, state, stage_id):
        s = state.copy()
        s.cache_write(stage_id, "local")
        return [(s, stage_id)]


class MultiLevelTilingWithFusion(SketchRule):
    """Tile the stage and fuse its element-wise consumer under tile level 1 or 2."""

    name = "multi_level_tiling_with_fusion"

    def condition(self, task, state, stage_id):
        if needs_multi_level_tiling(state, stage_id) and single_elementwise_consumer(state, stage_id) is not None:
            if has_cache_write_stage(state, stage_id):
                return Cond.APPLY_AND_SKIP_REST
            return Cond.APPLY
        return Cond.PASS

    def apply(self, task, state, stage_id):
        consumer = single_elementwise_consumer(state, stage_id)
        base, _, level_ends = multi_level_tiling(state, stage_id, CPU_STRUCTURE)
        out = []
        for level in (1, 2):
            s = base.copy()
            s.compute_at(consumer, stage_id, spatial_level_end(CPU_STRUCTURE, level_ends, level))
            out.append((s, stage_id - 1))
        return out


class MultiLevelTiling(SketchRule):
    name = "multi_level_tiling"

    def condition(self, task, state, stage_id):
        return Cond.APPLY_AND_SKIP_REST if needs_multi_level_tiling(state, stage_id) else Cond.PASS

    def apply(self, task, state, stage_id):
        s, _, _ = multi_level_tiling(state, stage_id, CPU_STRUCTURE)
        return [(s, stage_id - 1)]


class SkipStage(SketchRule):
    name = "skip_stage"

    def condition(self, task, state, stage_id):
        return Cond.APPLY

    def apply(self, task, state, stage_id):
        return [(state, stage_id - 1)]


#: Ansor's CPU tiling structure (the GPU one is in :mod:`ansor.sketch.gpu_rules`).
CPU_STRUCTURE = "SSRSRS"

CPU_RULES: tuple[SketchRule, ...] = (
    AlwaysInline(), AddRfactor(), AddCacheWrite(), MultiLevelTilingWithFusion(), MultiLevelTiling(), SkipStage(),
)


def derive_sketches(task: SearchTask, rules: tuple[SketchRule, ...]) -> list[State]:
    """All sketches ``rules`` derive for ``task``: each rule list walk from the last stage to the first."""
    init = task.compute_dag.init_state()
    frontier: list[tuple[State, int]] = [(init, len(init.stages) - 1)]
    sketches: list[State] = []
    seen: set = set()
    while frontier:
        nxt: list[tuple[State, int]] = []
        for state, stage_id in frontier:
            if stage_id < 0:
                if state.key() not in seen:
                    seen.add(state.key())
                    sketches.append(state)
                continue
            stage = state.stages[stage_id]
            if stage.compute_at == AttachKind.INLINED or stage.origin < 0:
                nxt.append((state, stage_id - 1))
                continue
            for rule in rules:
                cond = rule.condition(task, state, stage_id)
                if cond == Cond.PASS:
                    continue
                nxt.extend(rule.apply(task, state, stage_id))
                if cond == Cond.APPLY_AND_SKIP_REST:
                    break
        frontier = nxt
    return sketches
