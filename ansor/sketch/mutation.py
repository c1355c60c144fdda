"""Mutation rules of the evolutionary search: each edits one step of a complete program.

A mutation replays the edited steps in pure Python and returns None when they no longer fit. Which rules a
target uses, with which arguments and probabilities, is its :class:`~ansor.sketch.search_space.SearchSpace`'s
business; a rule here only knows how to edit a program.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..errors import StepError
from ..state.layout_rewrite import packable_arguments
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..state.transform_steps import (
    AnnotationStep, ComputeAtStep, FuseStep, LayoutRewriteStep, PragmaStep, SplitStep, Step,
)
from ..state.transform_steps.split import divisors
from ..task.search_task import SearchTask
from .annotation import MAX_INNERMOST_FACTOR, compute_location_candidates, may_run_serial, outer_parallel_loops
from .rules import needs_multi_level_tiling

Mutation = Callable[[SearchTask, State, random.Random], Optional[State]]


@dataclass(frozen=True)
class Mutator:
    """A mutation rule as a target's search uses it.

    ``probabilities`` name the :class:`~ansor.sketch.evolution.EvolutionParams` fields whose sum is the
    rule's weight, so the numbers stay tunable in one place while each target picks its rules.
    """

    name: str
    mutate: Mutation
    probabilities: tuple[str, ...]


def mutate_tile_size(task: SearchTask, state: State, rng: random.Random, thread_splits: bool = False
                     ) -> Optional[State]:
    """Move a factor of one tile level to another level of the same split (the product stays the same; for
    a padded tiling, the padded extent).

    With ``thread_splits`` (CUDA sketches), a split of one length sets a thread count: the block limits
    (:func:`~ansor.sketch.gpu_annotation.fits_gpu`) bound it, not ``MAX_INNERMOST_FACTOR``.
    """
    candidates = [i for i, s in enumerate(state.steps)
                  if isinstance(s, SplitStep) and s.extent and s.extent > 1 and None not in s.lengths]
    if not candidates:
        return None
    idx = rng.choice(candidates)
    step: SplitStep = state.steps[idx]  # type: ignore[assignment]
    inner = 1
    for length in step.lengths:
        inner *= length  # type: ignore[operator]
    outer = -(-step.extent // inner)  # a padded tiling (split.padded_extents) keeps its padded product
    levels = [outer, *step.lengths] if step.inner_to_outer else [*step.lengths, outer]
    src_choices = [k for k, v in enumerate(levels) if v > 1]
    if not src_choices or len(levels) < 2:
        return None
    src = rng.choice(src_choices)
    dst = rng.choice([k for k in range(len(levels)) if k != src])
    factor = rng.choice([d for d in divisors(levels[src]) if d > 1])
    levels[src] //= factor
    levels[dst] *= factor
    lengths = tuple(levels[1:]) if step.inner_to_outer else tuple(levels[:-1])
    thread_count = thread_splits and len(lengths) == 1
    if lengths[-1] > MAX_INNERMOST_FACTOR and not thread_count:  # type: ignore[operator]
        return None
    return _replace_step(state, idx, SplitStep(step.stage_id, step.iter_id, step.extent, lengths,
                                               step.inner_to_outer))


def mutate_unroll(task: SearchTask, state: State, rng: random.Random, *, choices: tuple[int, ...]
                  ) -> Optional[State]:
    """Pick another auto-unroll limit for one stage, among ``choices`` (the target's, as annotation drew)."""
    idx = [i for i, s in enumerate(state.steps) if isinstance(s, PragmaStep)]
    if not idx:
        return None
    i = rng.choice(idx)
    step: PragmaStep = state.steps[i]  # type: ignore[assignment]
    value = rng.choice([v for v in choices if f"auto_unroll_max_step${v}" != step.pragma])
    return _replace_step(state, i, PragmaStep(step.stage_id, step.iter_id, f"auto_unroll_max_step${value}"))


def mutate_compute_location(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Move a producer that random annotation placed under a consumer loop to another candidate loop."""
    idx = [i for i, s in enumerate(state.steps)
           if isinstance(s, ComputeAtStep) and s.stage_id < s.target_stage_id]
    if not idx:
        return None
    i = rng.choice(idx)
    step: ComputeAtStep = state.steps[i]  # type: ignore[assignment]
    before = state.with_steps(state.steps[:i])
    options = [c for c in compute_location_candidates(before, step.stage_id)
               if c != (step.target_stage_id, step.target_iter_id)]
    if not options:
        return None
    target, iter_id = rng.choice(options)
    return _replace_step(state, i, ComputeAtStep(step.stage_id, target, iter_id))


def mutate_parallel(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Fuse more or fewer outer loops into a stage's parallel loop (Ansor's parallel mutation).

    Tile sizes set how long the outer loops are; this sets how many of them share the threads, e.g. only
    the rows of blocks, or rows and columns; a small program (``may_run_serial``) may also lose its
    threads. Later steps of the stage are renumbered to the new loops.
    """
    steps = state.steps
    idx = [i for i, s in enumerate(steps)
           if isinstance(s, AnnotationStep) and s.annotation == "parallel" and s.iter_id == 0]
    if not idx:
        return None
    i = rng.choice(idx)
    sid = steps[i].stage_id
    prev = steps[i - 1] if i else None
    fused = isinstance(prev, FuseStep) and prev.stage_id == sid and prev.fused_ids == tuple(range(len(prev.fused_ids)))
    k, start = (len(prev.fused_ids), i - 1) if fused else (1, i)  # type: ignore[union-attr]
    before = state.with_steps(steps[:start])
    degrees = [1]  # degrees[m]: parallelism with the first m loops fused
    for it in before.stages[sid].iters[:outer_parallel_loops(before, sid)]:
        if it.extent is None:
            break
        degrees.append(degrees[-1] * it.extent)
    options = [m for m in range(1, len(degrees)) if degrees[m] != degrees[k]] if k < len(degrees) else []
    if may_run_serial(state):
        options.append(0)
    if not options:
        return None
    new_k = rng.choice(options)
    fuse = [FuseStep(sid, tuple(range(new_k)))] if new_k > 1 else []
    head = [*steps[:start], *fuse, *([AnnotationStep(sid, 0, "parallel")] if new_k else [])]
    tail = [_shift_iters(s, sid, k - max(new_k, 1)) for s in steps[i + 1:]]
    if any(s is None for s in tail):
        return None
    try:
        return state.with_steps(head + tail)  # type: ignore[operator]
    except StepError:
        return None


def mutate_layout_rewrite(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Stop packing a runtime input, or start packing one (whether the in-kernel copy pays is measured)."""
    packed = [i for i, s in enumerate(state.steps)
              if isinstance(s, LayoutRewriteStep) and s.buffer not in state.dag.layout_free]
    unpacked = [(sid, buffer) for sid, stage in enumerate(state.stages)
                if stage.compute_at == AttachKind.ROOT and needs_multi_level_tiling(state, sid)
                for buffer in packable_arguments(state, sid) if buffer not in state.dag.layout_free]
    choices = [("drop", i) for i in packed] + [("add", c) for c in unpacked]
    if not choices:
        return None
    what, which = rng.choice(choices)
    steps = list(state.steps)
    if what == "drop":
        del steps[which]
    else:
        steps.append(LayoutRewriteStep(*which))
    try:
        return state.with_steps(steps)
    except StepError:
        return None


def _shift_iters(step: Step, stage_id: int, delta: int) -> Optional[Step]:
    """``step`` with the loops of ``stage_id`` after its first moved by ``delta`` (None: cannot renumber)."""
    def shift(k: int) -> int:
        return k + delta if k >= 1 else k

    if isinstance(step, ComputeAtStep):
        return replace(step, target_iter_id=shift(step.target_iter_id)) if step.target_stage_id == stage_id else step
    if step.stage_id != stage_id:
        return step
    if isinstance(step, (AnnotationStep, PragmaStep, SplitStep)):
        return replace(step, iter_id=shift(step.iter_id))
    if isinstance(step, FuseStep):
        return replace(step, fused_ids=tuple(shift(k) for k in step.fused_ids))
    if isinstance(step, LayoutRewriteStep):
        return step
    return None


def _replace_step(state: State, index: int, step: Step) -> Optional[State]:
    steps = list(state.steps)
    steps[index] = step
    try:
        return state.with_steps(steps)
    except StepError:
        return None
