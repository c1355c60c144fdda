"""State: the cheap, copyable loop structure the search mutates, one transform step at a time.

A :class:`State` is a list of transform steps plus the loop structure those steps produce (one
:class:`~ansor.state.loop_nest.Stage` per block). Each step knows how to change a State
(:meth:`~ansor.state.transform_steps.Step.apply_to_state`); the structure mirrors what TensorIR builds when
:mod:`ansor.state.replay` applies the same steps (same loops, same order, same extents), so the search can reason
about programs without calling TVM. ``tests/test_loop_state.py`` checks the two interpreters agree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from .access import IterKind
from ..errors import StepError
from .loop_nest import AttachKind, Iterator, Stage, fused_kind
from .transform_steps import (
    AnnotationStep, CacheReadStep, CacheWriteStep, CodeNames, ComputeAtStep, ComputeInlineStep, ComputeRootStep,
    FollowFusedSplitStep, FollowSplitStep, FuseStep, LayoutRewriteStep, PragmaStep, ReorderStep, RfactorStep,
    SplitStep, Step, StorageAlignStep, TensorizeStep,
)

if TYPE_CHECKING:
    from .compute_dag import ComputeDAG

#: A state's structure after one of its steps: its stages and buffer shapes.
_Snapshot = tuple[tuple[Stage, ...], dict[str, tuple[int, ...]]]


class State:
    """A step list and the loop structure it produces. Methods named like Ansor's append one step.

    A state also keeps the structure after each of its steps (stages are frozen, so a snapshot is a tuple of
    references): :meth:`with_steps` replays an edited step list from the last step the edit kept, not from
    the start. A CUDA program has ~35 steps; replaying them all was 76 % of a CUDA search round.
    """

    __slots__ = ("dag", "stages", "steps", "shapes", "_after")

    def __init__(self, dag: "ComputeDAG", stages: list[Stage], steps: list[Step],
                 shapes: dict[str, tuple[int, ...]], after: Optional[list[_Snapshot]] = None):
        self.dag = dag
        self.stages = stages
        self.steps = steps
        self.shapes = shapes  # buffer shapes; copied only when a step adds a buffer
        self._after = after if after is not None else []  # _after[i]: the structure after steps[i]

    @staticmethod
    def initial(dag: "ComputeDAG") -> "State":
        stages = []
        for i, ds in enumerate(dag.stages):
            var_kind = {v.name: v.kind for v in ds.block.vars}
            iters = tuple(
                Iterator(name, extent, fused_kind(var_kind[p.var] for p in parts) if parts else IterKind.SPATIAL,
                         parts=parts)
                for name, extent, parts in ds.loops
            )
            stages.append(Stage(ds.name, iters, ds.block, origin=i))
        return State(dag, stages, [], dag.buffer_shapes)

    def copy(self) -> "State":
        return State(self.dag, list(self.stages), list(self.steps), self.shapes, list(self._after))

    def with_steps(self, steps: Sequence[Step]) -> "State":
        """A new state: the DAG's initial state with ``steps`` applied (used to edit one step).

        The steps ``steps`` shares with this state's start are not replayed: the new state starts from this
        one's structure after them.
        """
        kept = 0
        for mine, theirs in zip(self.steps, steps):
            if mine is not theirs and mine != theirs:
                break
            kept += 1
        if kept:
            stages, shapes = self._after[kept - 1]
            state = State(self.dag, list(stages), list(steps[:kept]), shapes, self._after[:kept])
        else:
            state = State.initial(self.dag)
        for step in steps[kept:]:
            state.apply(step)
        return state

    def key(self) -> tuple[Step, ...]:
        """Hashable identity: two states with equal step lists are the same program."""
        return tuple(self.steps)

    # ------------------------------------------------------------------ stepping
    def apply(self, step: Step) -> None:
        """Apply ``step`` in place and append it to the history."""
        if not isinstance(step, Step):
            raise StepError(f"not a transform step: {step!r}")
        step.apply_to_state(self)
        self.steps.append(step)
        self._after.append((tuple(self.stages), self.shapes))

    def split(self, stage_id: int, iter_id: int, lengths: Sequence[Optional[int]],
              inner_to_outer: bool = True) -> None:
        extent = self.checked_iter(stage_id, iter_id).extent
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

    def tensorize(self, stage_id: int, iter_id: int, intrin: str) -> None:
        self.apply(TensorizeStep(stage_id, iter_id, intrin))

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
                if s.compute_at != AttachKind.INLINED and i != stage_id and reads & set(s.block.write_buffers())]

    def consumers(self, stage_id: int) -> list[int]:
        """Live stages that read this stage's output (inlined stages are looked through)."""
        writes = set(self.stages[stage_id].block.write_buffers())
        return [i for i, s in enumerate(self.stages)
                if s.compute_at != AttachKind.INLINED and i != stage_id and writes & set(s.block.read_buffers())]

    def vector_lanes(self, stage_id: int, vector_bytes: int) -> int:
        """Elements of the stage's output type in one vector of ``vector_bytes``."""
        return max(1, vector_bytes * 8 // self.dag.element_bits(self.stages[stage_id].block.writes[0].buffer))

    def attached_to(self, stage_id: int) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s.compute_at == AttachKind.ITER and s.attach[0] == stage_id]

    def checked_stage(self, stage_id: int, live: bool = True) -> Stage:
        """Stage ``stage_id``; a :class:`StepError` naming the stages if there is none (or, ``live``, it is
        inlined)."""
        if not 0 <= stage_id < len(self.stages):
            raise StepError(f"stage {stage_id} does not exist (the state has {len(self.stages)} stages: "
                            f"{', '.join(s.name for s in self.stages)})")
        stage = self.stages[stage_id]
        if live and stage.compute_at == AttachKind.INLINED:
            raise StepError(f"stage {stage_id} ({stage.name}) is inlined and has no loops")
        return stage

    def checked_iter(self, stage_id: int, iter_id: int) -> Iterator:
        """Loop ``iter_id`` of a live stage; a :class:`StepError` naming its loops if there is none."""
        stage = self.checked_stage(stage_id)
        if not 0 <= iter_id < len(stage.iters):
            raise StepError(f"stage {stage_id} ({stage.name}) has no iterator {iter_id} "
                            f"(it has {len(stage.iters)}: {', '.join(i.name for i in stage.iters)})")
        return stage.iters[iter_id]

    # ------------------------------------------------------------------ edits steps make
    def replace_iter(self, stage_id: int, iter_id: int, it: Iterator) -> None:
        stage = self.stages[stage_id]
        self.stages[stage_id] = replace(stage, iters=stage.iters[:iter_id] + (it,) + stage.iters[iter_id + 1:])

    def remap_attach(self, target: int, remap: Callable[[int], Optional[int]], why: str) -> None:
        """Move the attach points of stages under ``target`` after its iterators changed."""
        for i in self.attached_to(target):
            stage = self.stages[i]
            new_iter = remap(stage.attach[1])
            if new_iter is None:
                raise StepError(f"{why}: stage {i} ({stage.name}) is computed at iterator {stage.attach[1]} "
                                f"of stage {target} ({self.stages[target].name}), in between the loops")
            if new_iter != stage.attach[1]:
                self.stages[i] = replace(stage, attach=(target, new_iter))

    def insert_stage(self, index: int, stage: Stage) -> None:
        """Insert a stage; later stage ids (and attach points naming them) shift by one."""
        for i, s in enumerate(self.stages):
            if s.compute_at == AttachKind.ITER and s.attach[0] >= index:
                self.stages[i] = replace(s, attach=(s.attach[0] + 1, s.attach[1]))
        self.stages.insert(index, stage)

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        lines: list[str] = []
        for sid, stage in enumerate(self.stages):
            if stage.compute_at == AttachKind.ROOT:
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
        """The step list as ``tvm.s_tir.Schedule`` calls, named after the stages and loops (readable;
        ``sch.trace`` after replay is exact)."""
        state = State.initial(self.dag)
        names = CodeNames(state)
        lines = [f'{names.block(i)} = sch.get_sblock("{s.name}")' for i, s in enumerate(state.stages)]
        lines += [names.loops_line(i) for i in range(len(state.stages))]
        for step in self.steps:
            lines.append(step.to_code(names))
            before = len(state.stages)
            state.apply(step)
            if len(state.stages) != before:
                lines += [names.loops_line(i) for i, s in enumerate(state.stages) if s.compute_at != AttachKind.INLINED]
            elif step.NEW_LOOPS:
                lines.append(names.loops_line(step.stage_id))
        return "\n".join(lines)
