"""Evolutionary search over complete programs, ranked by the cost model.

Each generation scores the population, keeps the best unmeasured programs seen so far, and breeds the next
generation by mutating parents picked with probability proportional to their score. Mutations edit one
step of a program and replay the rest in pure Python; a program whose steps no longer fit is dropped.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from ..errors import StepError
from ..state.layout_rewrite import packable_arguments
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..task.search_task import SearchTask
from ..target import is_gpu
from ..state.transform_steps import (
    AnnotationStep, ComputeAtStep, FuseStep, LayoutRewriteStep, PragmaStep, SplitStep, Step,
)
from .annotation import (
    CPU_UNROLL_STEPS, GPU_UNROLL_STEPS, MAX_INNERMOST_FACTOR, divisors, compute_location_candidates,
    outer_parallel_loops,
)
from .gpu_annotation import fits_gpu
from .rules import needs_multi_level_tiling

if TYPE_CHECKING:
    from ..cost_model.cost_model import CostModel  # the search only calls predict

logger = logging.getLogger("ansor")


@dataclass(frozen=True)
class EvolutionParams:
    """Population size and generations trade search time for quality; Ansor used 2048 x 4.

    On GPU, Ansor mutates only tile sizes (0.90) and the unroll limit (0.10): the unroll share there is
    ``p_unroll + p_compute_location`` and compute locations are never mutated (the sketch fixed them).
    """

    population: int = 256
    generations: int = 3
    mutation_prob: float = 0.85
    #: probabilities of Ansor's CPU mutation rules
    p_tile_size: float = 0.90
    p_unroll: float = 0.04
    p_compute_location: float = 0.05
    p_parallel: float = 0.01
    #: ours: pack or unpack a runtime input of a tiled stage (constant weights are always packed)
    p_layout_rewrite: float = 0.02


def mutate_tile_size(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Move a factor of one tile level to another level of the same split (the product stays the same)."""
    candidates = [i for i, s in enumerate(state.steps)
                  if isinstance(s, SplitStep) and s.extent and s.extent > 1 and None not in s.lengths]
    if not candidates:
        return None
    idx = rng.choice(candidates)
    step: SplitStep = state.steps[idx]  # type: ignore[assignment]
    inner = 1
    for length in step.lengths:
        inner *= length  # type: ignore[operator]
    levels = [step.extent // inner, *step.lengths] if step.inner_to_outer else [*step.lengths, step.extent // inner]
    src_choices = [k for k, v in enumerate(levels) if v > 1]
    if not src_choices or len(levels) < 2:
        return None
    src = rng.choice(src_choices)
    dst = rng.choice([k for k in range(len(levels)) if k != src])
    factor = rng.choice([d for d in divisors(levels[src]) if d > 1])
    levels[src] //= factor
    levels[dst] *= factor
    lengths = tuple(levels[1:]) if step.inner_to_outer else tuple(levels[:-1])
    thread_count = is_gpu(task.target) and len(lengths) == 1  # a GPU thread split: limited by fits_gpu
    if lengths[-1] > MAX_INNERMOST_FACTOR and not thread_count:  # type: ignore[operator]
        return None
    return _replace_step(state, idx, SplitStep(step.stage_id, step.iter_id, step.extent, lengths,
                                               step.inner_to_outer))


def mutate_unroll(task: SearchTask, state: State, rng: random.Random) -> Optional[State]:
    """Pick another auto-unroll limit for one stage."""
    idx = [i for i, s in enumerate(state.steps) if isinstance(s, PragmaStep)]
    if not idx:
        return None
    i = rng.choice(idx)
    step: PragmaStep = state.steps[i]  # type: ignore[assignment]
    values = GPU_UNROLL_STEPS if is_gpu(task.target) else CPU_UNROLL_STEPS
    value = rng.choice([v for v in values if f"auto_unroll_max_step${v}" != step.pragma])
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
    the rows of blocks, or rows and columns. Later steps of the stage are renumbered to the new loops.
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
    if not options:
        return None
    new_k = rng.choice(options)
    fuse = [FuseStep(sid, tuple(range(new_k)))] if new_k > 1 else []
    head = [*steps[:start], *fuse, AnnotationStep(sid, 0, "parallel")]
    tail = [_shift_iters(s, sid, k - new_k) for s in steps[i + 1:]]
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


Mutation = Callable[[SearchTask, State, random.Random], Optional[State]]


def evolutionary_search(task: SearchTask, model: CostModel, population: list[State], out_size: int,
                        exclude: set, rng: random.Random, params: EvolutionParams = EvolutionParams()
                        ) -> list[tuple[float, State]]:
    """The ``out_size`` best-scored programs found, none of them in ``exclude`` (best first)."""
    gpu = is_gpu(task.target)
    rules: list[tuple[float, Mutation]] = [
        (params.p_tile_size, mutate_tile_size),
        (params.p_unroll, mutate_unroll),
        (params.p_compute_location, mutate_compute_location),
        (params.p_parallel, mutate_parallel),
        (params.p_layout_rewrite, mutate_layout_rewrite),
    ] if not gpu else [
        (params.p_tile_size, mutate_tile_size),
        (params.p_unroll + params.p_compute_location, mutate_unroll),
    ]
    weights = [w for w, _ in rules]
    best: dict = {}
    for generation in range(params.generations + 1):
        if not population:
            break
        scores = np.asarray(model.predict(task, population), dtype=float)
        for state, score in zip(population, scores):
            key = state.key()
            if key not in exclude and (key not in best or best[key][0] < score):
                best[key] = (float(score), state)
        if generation == params.generations:
            break
        finite = np.where(np.isfinite(scores), scores, np.nan)
        floor = np.nanmin(finite) if np.isfinite(finite).any() else 0.0
        fitness = np.nan_to_num(finite - floor, nan=0.0) + 1e-6
        probs = fitness / fitness.sum()
        nxt: list[State] = []
        seen: set = set()
        for _ in range(params.population * 3):
            if len(nxt) >= params.population:
                break
            parent = population[int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum()).clip(
                0, len(population) - 1))]
            child: Optional[State] = parent
            if rng.random() < params.mutation_prob:
                mutate = rng.choices(rules, weights=weights)[0][1]
                child = mutate(task, parent, rng)
                if child is not None and gpu and not fits_gpu(task, child):
                    child = None  # over a block limit: it would be dropped before measurement anyway
            if child is None or child.key() in seen:
                continue
            seen.add(child.key())
            nxt.append(child)
        population = nxt
    ranked = sorted(best.values(), key=lambda item: -item[0])
    return ranked[:out_size]
