"""State / Stage / Iterator: the cheap, copyable loop structure the search mutates.

A :class:`State` is a list of transform steps plus the loop structure those steps produce. Stages and
iterators are frozen, so copying a state copies two lists of references. The structure mirrors what
TensorIR builds when :mod:`ansor.replay` applies the same steps (same loops, same order, same extents), so
the search can reason about programs without calling TVM; ``tests/test_loop_state.py`` checks the two
interpreters agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from .access import Access, Affine, BlockInfo, BlockVar, LoopPart, region_extents, split_parts, var_ranges
from .errors import StepError
from .transform_steps import (
    ANNOTATIONS, PRAGMAS, AnnotationStep, CacheReadStep, CacheWriteStep, ComputeAtStep, ComputeInlineStep,
    ComputeRootStep, FollowFusedSplitStep, FollowSplitStep, FuseStep, LayoutRewriteStep, PragmaStep, ReorderStep,
    RfactorStep, SplitStep, Step, StorageAlignStep, split_lengths,
)

if TYPE_CHECKING:
    from .compute_dag import ComputeDAG

ROOT, INLINED, ATTACHED = "root", "inline", "iter"


@dataclass(frozen=True, slots=True)
class Iterator:
    """One loop of a stage. ``kind``: "S" spatial, "R" reduce, "M" a fusion of both."""

    name: str
    extent: Optional[int]
    kind: str
    annotation: str = "none"
    pragma: str = ""
    parts: tuple[LoopPart, ...] = ()


@dataclass(frozen=True, slots=True)
class Stage:
    """One block: its loops, how it touches memory, and where it is computed."""

    name: str
    iters: tuple[Iterator, ...]
    block: BlockInfo
    compute_at: str = ROOT
    attach: tuple[int, int] = (-1, -1)  # (stage id, iterator id) when compute_at == ATTACHED
    origin: int = -1  # the ComputeDAG stage this block comes from; -1 for stages a step added
    packed: tuple[str, ...] = ()  # arguments read through a copy in this stage's loop order (LR steps)


class State:
    """A step list and the loop structure it produces. Methods named like Ansor's append one step."""

    __slots__ = ("dag", "stages", "steps", "shapes")

    def __init__(self, dag: "ComputeDAG", stages: list[Stage], steps: list[Step],
                 shapes: dict[str, tuple[int, ...]]):
        self.dag = dag
        self.stages = stages
        self.steps = steps
        self.shapes = shapes  # buffer shapes; copied only when a step adds a buffer

    @staticmethod
    def initial(dag: "ComputeDAG") -> "State":
        stages = []
        for i, ds in enumerate(dag.stages):
            var_kind = {v.name: v.kind for v in ds.block.vars}
            iters = tuple(
                Iterator(name, extent, _kind_of(var_kind[p.var] for p in parts) if parts else "S", parts=parts)
                for name, extent, parts in ds.loops
            )
            stages.append(Stage(ds.name, iters, ds.block, origin=i))
        return State(dag, stages, [], dag.buffer_shapes)

    def copy(self) -> "State":
        return State(self.dag, list(self.stages), list(self.steps), self.shapes)

    def with_steps(self, steps: Sequence[Step]) -> "State":
        """A new state: the DAG's initial state with ``steps`` applied (used to edit one step)."""
        state = State.initial(self.dag)
        for step in steps:
            state.apply(step)
        return state

    def key(self) -> tuple[Step, ...]:
        """Hashable identity: two states with equal step lists are the same program."""
        return tuple(self.steps)

    # ------------------------------------------------------------------ stepping
    def apply(self, step: Step) -> None:
        """Apply ``step`` in place and append it to the history."""
        handler = _HANDLERS.get(type(step))
        if handler is None:
            raise StepError(f"not a transform step: {step!r}")
        handler(self, step)
        self.steps.append(step)

    def split(self, stage_id: int, iter_id: int, lengths: Sequence[Optional[int]],
              inner_to_outer: bool = True) -> None:
        extent = self._iter(stage_id, iter_id).extent
        self.apply(SplitStep(stage_id, iter_id, extent, tuple(lengths), inner_to_outer))

    def follow_split(self, stage_id: int, iter_id: int, src_step_id: int, n_split: int) -> None:
        self.apply(FollowSplitStep(stage_id, iter_id, src_step_id, n_split))

    def follow_fused_split(self, stage_id: int, iter_id: int, src_step_ids: Sequence[int], level: int,
                           factor_or_nparts: bool) -> None:
        self.apply(FollowFusedSplitStep(stage_id, iter_id, tuple(src_step_ids), level, factor_or_nparts))

    def reorder(self, stage_id: int, order: Sequence[int]) -> None:
        self.apply(ReorderStep(stage_id, tuple(order)))

    def fuse(self, stage_id: int, iter_ids: Sequence[int]) -> None:
        self.apply(FuseStep(stage_id, tuple(iter_ids)))

    def annotate(self, stage_id: int, iter_id: int, annotation: str) -> None:
        self.apply(AnnotationStep(stage_id, iter_id, annotation))

    def pragma(self, stage_id: int, iter_id: int, pragma: str) -> None:
        self.apply(PragmaStep(stage_id, iter_id, pragma))

    def storage_align(self, stage_id: int, axis: int, factor: int, offset: int) -> None:
        self.apply(StorageAlignStep(stage_id, axis, factor, offset))

    def compute_at(self, stage_id: int, target_stage_id: int, target_iter_id: int) -> None:
        self.apply(ComputeAtStep(stage_id, target_stage_id, target_iter_id))

    def compute_inline(self, stage_id: int) -> None:
        self.apply(ComputeInlineStep(stage_id))

    def compute_root(self, stage_id: int) -> None:
        self.apply(ComputeRootStep(stage_id))

    def layout_rewrite(self, stage_id: int, buffer: str) -> None:
        self.apply(LayoutRewriteStep(stage_id, buffer))

    def cache_read(self, stage_id: int, buffer: str, scope: str,
                   reader_stage_ids: Optional[Sequence[int]] = None) -> int:
        """Returns the new stage's id."""
        readers = tuple(reader_stage_ids) if reader_stage_ids else (stage_id,)
        self.apply(CacheReadStep(stage_id, buffer, scope, readers))
        return stage_id

    def cache_write(self, stage_id: int, scope: str) -> int:
        """Returns the id of the new write-back stage."""
        self.apply(CacheWriteStep(stage_id, scope))
        return stage_id + 1

    def rfactor(self, stage_id: int, iter_id: int, factor_iter_id: int) -> int:
        """Returns the id of the new ``_rf`` stage (the original stage moves to ``stage_id + 1``)."""
        self.apply(RfactorStep(stage_id, iter_id, factor_iter_id))
        return stage_id

    # ------------------------------------------------------------------ queries
    def producers(self, stage_id: int) -> list[int]:
        """Live stages whose output this stage reads (inlined stages are looked through)."""
        reads = set(self.stages[stage_id].block.read_buffers())
        return [i for i, s in enumerate(self.stages)
                if s.compute_at != INLINED and i != stage_id and reads & set(s.block.write_buffers())]

    def consumers(self, stage_id: int) -> list[int]:
        """Live stages that read this stage's output (inlined stages are looked through)."""
        writes = set(self.stages[stage_id].block.write_buffers())
        return [i for i, s in enumerate(self.stages)
                if s.compute_at != INLINED and i != stage_id and writes & set(s.block.read_buffers())]

    def attached_to(self, stage_id: int) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s.compute_at == ATTACHED and s.attach[0] == stage_id]

    def _stage(self, stage_id: int, live: bool = True) -> Stage:
        if not 0 <= stage_id < len(self.stages):
            raise StepError(f"stage {stage_id} does not exist (the state has {len(self.stages)} stages: "
                            f"{', '.join(s.name for s in self.stages)})")
        stage = self.stages[stage_id]
        if live and stage.compute_at == INLINED:
            raise StepError(f"stage {stage_id} ({stage.name}) is inlined and has no loops")
        return stage

    def _iter(self, stage_id: int, iter_id: int) -> Iterator:
        stage = self._stage(stage_id)
        if not 0 <= iter_id < len(stage.iters):
            raise StepError(f"stage {stage_id} ({stage.name}) has no iterator {iter_id} "
                            f"(it has {len(stage.iters)}: {', '.join(i.name for i in stage.iters)})")
        return stage.iters[iter_id]

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        lines: list[str] = []
        for sid, stage in enumerate(self.stages):
            if stage.compute_at == ROOT:
                self._print_stage(sid, 0, lines)
        return "\n".join(lines)

    def _print_stage(self, sid: int, indent: int, lines: list[str]) -> None:
        stage = self.stages[sid]
        children = self.attached_to(sid)
        for k, it in enumerate(stage.iters):
            head = "for" if it.annotation == "none" else it.annotation
            extent = "?" if it.extent is None else it.extent
            pragma = f"  # {it.pragma}" if it.pragma else ""
            lines.append(f"{'  ' * (indent + k)}{head} {it.name} (0,{extent}){pragma}")
            for child in children:
                if self.stages[child].attach[1] == k and child < sid:
                    self._print_stage(child, indent + k + 1, lines)
        writes = ", ".join(str(a) for a in stage.block.writes)
        lines.append(f"{'  ' * (indent + len(stage.iters))}{writes} = ...")
        for child in children:
            if child > sid:
                self._print_stage(child, indent + self.stages[child].attach[1] + 1, lines)

    def to_code(self) -> str:
        """The step list as ``tvm.s_tir.Schedule`` calls (readable; ``sch.trace`` after replay is exact)."""
        from .replay import steps_to_code
        return steps_to_code(self.dag, self.steps)


def _kind_of(kinds) -> str:
    kinds = set(kinds)
    return kinds.pop() if len(kinds) == 1 else "M"


def _set_stage(state: State, stage_id: int, stage: Stage) -> None:
    state.stages[stage_id] = stage


def _remap_attach(state: State, target: int, remap: Callable[[int], Optional[int]], why: str) -> None:
    """Move the attach points of stages under ``target`` after its iterators changed."""
    for i in state.attached_to(target):
        stage = state.stages[i]
        new_iter = remap(stage.attach[1])
        if new_iter is None:
            raise StepError(f"{why}: stage {i} ({stage.name}) is computed at iterator {stage.attach[1]} "
                            f"of stage {target} ({state.stages[target].name}), in between the loops")
        if new_iter != stage.attach[1]:
            state.stages[i] = replace(stage, attach=(target, new_iter))


def _insert_stage(state: State, index: int, stage: Stage) -> None:
    """Insert a stage; later stage ids (and attach points naming them) shift by one."""
    for i, s in enumerate(state.stages):
        if s.compute_at == ATTACHED and s.attach[0] >= index:
            state.stages[i] = replace(s, attach=(s.attach[0] + 1, s.attach[1]))
    state.stages.insert(index, stage)


def _split_iter(state: State, stage_id: int, iter_id: int, lengths: Sequence[Optional[int]],
                inner_to_outer: bool) -> None:
    it = state._iter(stage_id, iter_id)
    for length in lengths:
        if length is not None and (not isinstance(length, int) or length <= 0):
            raise StepError(f"split lengths must be positive integers or None, got {list(lengths)}")
    known = all(v is not None for v in lengths)
    inferred = (math.ceil(it.extent / math.prod(lengths))  # type: ignore[arg-type]
                if known and it.extent is not None else None)
    extents = [inferred, *lengths] if inner_to_outer else [*lengths, inferred]
    parts = split_parts(it.parts, extents)
    new = tuple(Iterator(f"{it.name}_{k}", e, it.kind, parts=p) for k, (e, p) in enumerate(zip(extents, parts)))
    stage = state.stages[stage_id]
    n = len(lengths)
    _set_stage(state, stage_id, replace(stage, iters=stage.iters[:iter_id] + new + stage.iters[iter_id + 1:]))
    _remap_attach(state, stage_id, lambda k: k + n if k >= iter_id else k, "split")


def _apply_split(state: State, step: Step) -> None:
    lengths, inner_to_outer = split_lengths(step, state.steps)
    _split_iter(state, step.stage_id, step.iter_id, lengths, inner_to_outer)


def _apply_reorder(state: State, step: ReorderStep) -> None:
    stage = state._stage(step.stage_id)
    n = len(stage.iters)
    if sorted(step.after_ids) != list(range(n)):
        raise StepError(f"reorder of stage {step.stage_id} ({stage.name}) needs a permutation of 0..{n - 1}, "
                        f"got {list(step.after_ids)}")
    moved = [k for k in range(n) if step.after_ids[k] != k]
    if moved:
        lo, hi = moved[0], moved[-1]
        _remap_attach(state, step.stage_id, lambda k: None if lo <= k < hi else k, "reorder")
    _set_stage(state, step.stage_id, replace(stage, iters=tuple(stage.iters[k] for k in step.after_ids)))


def _apply_fuse(state: State, step: FuseStep) -> None:
    stage = state._stage(step.stage_id)
    ids = list(step.fused_ids)
    if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
        raise StepError(f"fuse needs consecutive iterators, got {ids}")
    its = [state._iter(step.stage_id, k) for k in ids]
    extent = None if any(i.extent is None for i in its) else math.prod(i.extent for i in its)  # type: ignore
    fused = Iterator("_".join(i.name for i in its) + "_fused", extent, _kind_of(i.kind for i in its),
                     parts=tuple(p for i in its for p in i.parts))
    first, last = ids[0], ids[-1]
    _set_stage(state, step.stage_id, replace(stage, iters=stage.iters[:first] + (fused,) + stage.iters[last + 1:]))
    _remap_attach(state, step.stage_id,
                  lambda k: k if k < first else (first if k == last else (None if k < last else k - len(ids) + 1)),
                  "fuse")


def _apply_annotation(state: State, step: AnnotationStep) -> None:
    if step.annotation not in ANNOTATIONS:
        raise StepError(f"unknown annotation {step.annotation!r}; valid: {', '.join(ANNOTATIONS)}")
    it = state._iter(step.stage_id, step.iter_id)
    _replace_iter(state, step.stage_id, step.iter_id, replace(it, annotation=step.annotation))


def _apply_pragma(state: State, step: PragmaStep) -> None:
    name, _, value = step.pragma.partition("$")
    if name not in PRAGMAS or not value.isdigit():
        raise StepError(f"bad pragma {step.pragma!r}; expected NAME$INT with NAME in {', '.join(PRAGMAS)}")
    it = state._iter(step.stage_id, step.iter_id)
    _replace_iter(state, step.stage_id, step.iter_id, replace(it, pragma=step.pragma))


def _replace_iter(state: State, stage_id: int, iter_id: int, it: Iterator) -> None:
    stage = state.stages[stage_id]
    _set_stage(state, stage_id, replace(stage, iters=stage.iters[:iter_id] + (it,) + stage.iters[iter_id + 1:]))


def _apply_storage_align(state: State, step: StorageAlignStep) -> None:
    stage = state._stage(step.stage_id)
    rank = len(state.shapes[stage.block.writes[0].buffer])
    if not 0 <= step.axis < rank or step.factor <= 0 or step.offset < 0:
        raise StepError(f"storage_align of {stage.name}: axis {step.axis} factor {step.factor} "
                        f"offset {step.offset} does not fit a rank-{rank} buffer")


def _apply_compute_at(state: State, step: ComputeAtStep) -> None:
    stage = state._stage(step.stage_id)
    target = state._stage(step.target_stage_id)
    state._iter(step.target_stage_id, step.target_iter_id)
    if step.stage_id == step.target_stage_id:
        raise StepError(f"stage {step.stage_id} ({stage.name}) cannot be computed at itself")
    if state.attached_to(step.stage_id):
        raise StepError(f"stage {step.stage_id} ({stage.name}) has stages computed at its loops; move them first")
    if stage.compute_at != ROOT:
        raise StepError(f"stage {step.stage_id} ({stage.name}) is already computed at stage {stage.attach[0]}; "
                        "edit that CA step instead of adding another")
    consumers, producers = state.consumers(step.stage_id), state.producers(step.stage_id)
    if step.target_stage_id in consumers and consumers != [step.target_stage_id]:
        raise StepError(f"stage {step.stage_id} ({stage.name}) has other consumers ({consumers}) that would "
                        f"not be under stage {step.target_stage_id}'s loop")
    if step.target_stage_id in producers and producers != [step.target_stage_id]:
        raise StepError(f"stage {step.stage_id} ({stage.name}) has other producers ({producers}) that would "
                        f"not be under stage {step.target_stage_id}'s loop")
    inner = [it.parts for it in target.iters[step.target_iter_id + 1:]]
    if _scope_of(state, stage.block.writes[0].buffer) == "shared":
        # TensorIR sizes a shared buffer for the whole thread block: loops already bound to threads or
        # vthreads above the attach point are walked in full (that is what makes cooperative fetching).
        inner += [it.parts for it in target.iters[:step.target_iter_id + 1]
                  if it.annotation.startswith(("threadIdx", "vthread"))]
    ranges = var_ranges(target.block, inner)
    written = set(stage.block.write_buffers())
    shared = [b for b in target.block.read_buffers() if b in written]
    if shared:  # target consumes the stage: compute_at, cover what the target reads
        region = region_extents(target.block.reads_of(shared[0]), ranges, state.shapes[shared[0]])
        own = stage.block.writes[0]
    else:  # target produces what the stage reads: reverse_compute_at, cover what the target writes
        made = [a for a in target.block.writes if a.buffer in stage.block.read_buffers()]
        if made and any(v.kind == "R" for v in stage.block.vars):
            raise StepError(f"stage {step.stage_id} ({stage.name}) is a reduction: it can be computed at a "
                            "consumer's loop, not fused under its producer")
        if not made:
            raise StepError(f"stage {step.stage_id} ({stage.name}) neither feeds nor reads stage "
                            f"{step.target_stage_id} ({target.name}); compute_at needs a data dependence")
        region = region_extents(made, ranges, state.shapes[made[0].buffer])
        own = stage.block.reads_of(made[0].buffer)[0]
    used = target.block.reads_of(shared[0]) if shared else made
    if any(i is None for acc in used for i in acc.indices):
        raise StepError(f"stage {step.target_stage_id} ({target.name}) accesses {used[0].buffer} non-affinely; "
                        f"the region stage {step.stage_id} ({stage.name}) must cover cannot be bounded")
    dim_of = {idx.single_var(): d for d, idx in enumerate(own.indices) if idx is not None and idx.single_var()}
    iters = []
    for k, v in enumerate(stage.block.vars):
        extent: Optional[int] = v.extent
        if v.kind == "S" and v.name in dim_of:
            extent = region[dim_of[v.name]]
            if extent is not None:
                extent = min(extent, v.extent)
        iters.append(Iterator(f"ax{k}", extent, v.kind, parts=(LoopPart(v.name, 1, extent),)))
    _set_stage(state, step.stage_id, replace(stage, iters=tuple(iters), compute_at=ATTACHED,
                                             attach=(step.target_stage_id, step.target_iter_id)))


def _scope_of(state: State, buffer: str) -> str:
    """Storage scope of a buffer: the scope of the cache step that made it, else global."""
    for step in state.steps:
        if isinstance(step, CacheReadStep) and f"{step.buffer}_{step.scope}" == buffer:
            return step.scope
    return "global"


def _apply_compute_inline(state: State, step: ComputeInlineStep) -> None:
    stage = state._stage(step.stage_id)
    if any(v.kind == "R" for v in stage.block.vars):
        raise StepError(f"stage {step.stage_id} ({stage.name}) is a reduction and cannot be inlined")
    if set(stage.block.write_buffers()) & state.dag.param_buffers:
        raise StepError(f"stage {step.stage_id} ({stage.name}) writes an output of the function; "
                        "it cannot be inlined")
    if state.attached_to(step.stage_id):
        raise StepError(f"stage {step.stage_id} ({stage.name}) has stages computed at its loops")
    out = stage.block.writes[0]
    for i, other in enumerate(state.stages):
        if i == step.stage_id or out.buffer not in other.block.read_buffers():
            continue
        reads: list[Access] = [a for a in other.block.reads if a.buffer != out.buffer]
        for use in other.block.reads_of(out.buffer):
            mapping: dict[str, Optional[Affine]] = {}
            for d, idx in enumerate(out.indices):
                name = idx.single_var() if idx is not None and not idx.const else None
                if name is not None:
                    mapping[name] = use.indices[d]
            for var in stage.block.vars:
                mapping.setdefault(var.name, None)
            for r in stage.block.reads:
                reads.append(Access(r.buffer, tuple(None if x is None else x.substitute(mapping) for x in r.indices)))
        state.stages[i] = replace(other, block=replace(other.block, reads=tuple(reads)))
    _set_stage(state, step.stage_id, replace(stage, iters=(), compute_at=INLINED))


def _apply_compute_root(state: State, step: ComputeRootStep) -> None:
    stage = state._stage(step.stage_id)
    if stage.compute_at == ATTACHED:
        raise StepError(f"stage {step.stage_id} ({stage.name}) is computed at stage {stage.attach[0]}: "
                        "TensorIR cannot move it back to the root; drop its CA step instead")


def _identity_loops(vars_: tuple[BlockVar, ...]) -> tuple[Iterator, ...]:
    return tuple(Iterator(f"ax{k}", v.extent, v.kind, parts=(LoopPart(v.name, 1, v.extent),))
                 for k, v in enumerate(vars_))


def _copy_block(buffer: str, new_buffer: str, shape: tuple[int, ...]) -> BlockInfo:
    vars_ = tuple(BlockVar(f"v{d}", "S", n) for d, n in enumerate(shape))
    index = tuple(Affine.var(v.name) for v in vars_)
    return BlockInfo(vars_, (Access(buffer, index),), (Access(new_buffer, index),))


def _rename(accesses: tuple[Access, ...], old: str, new: str) -> tuple[Access, ...]:
    return tuple(Access(new, a.indices) if a.buffer == old else a for a in accesses)


def _require_free(state: State, stage_id: int, what: str) -> Stage:
    """CHW/CHR/RF need a stage alone in its root loop nest: TensorIR puts the new block elsewhere otherwise."""
    stage = state._stage(stage_id)
    if stage.compute_at != ROOT or state.attached_to(stage_id):
        raise StepError(f"{what} of stage {stage_id} ({stage.name}) needs it at the root with no stage "
                        "computed at its loops; add caches and rfactors before compute_at")
    return stage


def _apply_cache_write(state: State, step: CacheWriteStep) -> None:
    stage = _require_free(state, step.stage_id, "cache_write")
    out = stage.block.writes[0].buffer
    cache = f"{out}_{step.scope}"
    shape = state.shapes[out]
    state.shapes = {**state.shapes, cache: shape}
    _set_stage(state, step.stage_id, replace(stage, block=replace(
        stage.block, writes=_rename(stage.block.writes, out, cache))))
    block = _copy_block(cache, out, shape)
    _insert_stage(state, step.stage_id + 1, Stage(cache, _identity_loops(block.vars), block))


def _apply_cache_read(state: State, step: CacheReadStep) -> None:
    if step.stage_id not in step.reader_stage_ids:
        raise StepError(f"cache_read: reader stages {list(step.reader_stage_ids)} must include {step.stage_id}")
    for r in step.reader_stage_ids:
        if step.buffer not in _require_free(state, r, "cache_read").block.read_buffers():
            raise StepError(f"cache_read: stage {r} ({state.stages[r].name}) does not read {step.buffer!r}")
    cache = f"{step.buffer}_{step.scope}"
    shape = state.shapes[step.buffer]
    state.shapes = {**state.shapes, cache: shape}
    for r in step.reader_stage_ids:
        s = state.stages[r]
        state.stages[r] = replace(s, block=replace(s.block, reads=_rename(s.block.reads, step.buffer, cache)))
    block = _copy_block(step.buffer, cache, shape)
    _insert_stage(state, step.stage_id, Stage(cache, _identity_loops(block.vars), block))


def _apply_rfactor(state: State, step: RfactorStep) -> None:
    stage = _require_free(state, step.stage_id, "rfactor")
    it = state._iter(step.stage_id, step.iter_id)
    if it.kind != "R":
        raise StepError(f"rfactor needs a reduction iterator; {it.name} of {stage.name} is {it.kind}")
    if any(i.kind == "M" for i in stage.iters):
        raise StepError(f"rfactor of {stage.name}: a loop fuses spatial and reduce iterators")
    out = stage.block.writes[0]
    rank = len(out.indices)
    if not 0 <= step.factor_iter_id <= rank:
        raise StepError(f"rfactor factor_iter_id {step.factor_iter_id} must be in 0..{rank}")
    # TensorIR gives the factored loop a spatial variable and every other reduce loop a variable of its own.
    new_var = {k: f"v{i.name}" for k, i in enumerate(stage.iters) if i.kind == "R"}
    rf_var = new_var[step.iter_id]
    mapping: dict[str, Optional[Affine]] = {}
    terms: dict[str, list[tuple[str, int]]] = {}
    for k, i in enumerate(stage.iters):
        if i.kind != "R":
            continue
        for p in i.parts:
            terms.setdefault(p.var, []).append((new_var[k], p.stride))
        if len(i.parts) > 1:
            for p in i.parts:
                mapping[p.var] = None
    for var, t in terms.items():
        mapping.setdefault(var, Affine(tuple(t), 0))
    spatial = [v for v in stage.block.vars if v.kind == "S"]
    rf_vars = (BlockVar(rf_var, "S", it.extent or 1), *spatial,
               *(BlockVar(new_var[k], "R", i.extent or 1) for k, i in enumerate(stage.iters)
                 if i.kind == "R" and k != step.iter_id))
    rf_index = out.indices[:step.factor_iter_id] + (Affine.var(rf_var),) + out.indices[step.factor_iter_id:]
    rf_buffer = f"{out.buffer}_rf"
    shape = state.shapes[out.buffer]
    state.shapes = {**state.shapes, rf_buffer: shape[:step.factor_iter_id] + (it.extent or 1,)
                    + shape[step.factor_iter_id:]}
    rf_reads = tuple(Access(a.buffer, tuple(None if x is None else x.substitute(mapping) for x in a.indices))
                     for a in stage.block.reads)
    rf_iters = tuple(
        replace(i, kind="S" if k == step.iter_id else i.kind,
                parts=(LoopPart(new_var[k], 1, i.extent),) if i.kind == "R" else i.parts)
        for k, i in enumerate(stage.iters))
    rf_stage = Stage(f"{stage.name}_rf", rf_iters, BlockInfo(rf_vars, rf_reads, (Access(rf_buffer, rf_index),)))
    keep = [k for k, i in enumerate(stage.iters) if i.kind == "S" or k == step.iter_id]
    wb_iters = tuple(replace(stage.iters[k], annotation="none",
                             parts=(LoopPart(rf_var, 1, it.extent),) if k == step.iter_id else stage.iters[k].parts)
                     for k in keep)
    wb_block = BlockInfo((BlockVar(rf_var, "R", it.extent or 1), *spatial),
                         (Access(rf_buffer, rf_index),), stage.block.writes)
    _set_stage(state, step.stage_id, replace(stage, iters=wb_iters, block=wb_block))
    _insert_stage(state, step.stage_id, rf_stage)


def _apply_layout_rewrite(state: State, step: LayoutRewriteStep) -> None:
    stage = state._stage(step.stage_id)
    if stage.compute_at != ROOT:
        raise StepError(f"layout rewrite of {step.buffer}: stage {step.stage_id} ({stage.name}) must be at the root")
    if step.buffer not in state.dag.param_buffers or step.buffer not in stage.block.read_buffers():
        raise StepError(f"layout rewrite: stage {step.stage_id} ({stage.name}) does not read an argument named "
                        f"{step.buffer!r}")
    if step.buffer in stage.packed or stage.block.plain_axes(step.buffer) is None:
        raise StepError(f"layout rewrite of {step.buffer} for stage {step.stage_id} ({stage.name}): already "
                        "packed, or not read as buffer[v0, v1, ...]")
    _set_stage(state, step.stage_id, replace(stage, packed=stage.packed + (step.buffer,)))


_HANDLERS: dict[type, Callable[[State, Step], None]] = {
    SplitStep: _apply_split,
    FollowSplitStep: _apply_split,
    FollowFusedSplitStep: _apply_split,
    ReorderStep: _apply_reorder,
    FuseStep: _apply_fuse,
    AnnotationStep: _apply_annotation,
    PragmaStep: _apply_pragma,
    StorageAlignStep: _apply_storage_align,
    ComputeAtStep: _apply_compute_at,
    ComputeInlineStep: _apply_compute_inline,
    ComputeRootStep: _apply_compute_root,
    CacheReadStep: _apply_cache_read,
    CacheWriteStep: _apply_cache_write,
    RfactorStep: _apply_rfactor,
    LayoutRewriteStep: _apply_layout_rewrite,
}
