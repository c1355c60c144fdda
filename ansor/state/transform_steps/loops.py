"""Steps that change the loops of one stage in place: ``RE`` reorder, ``FU`` fuse, ``AN`` annotate, ``PR`` pragma."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from ...errors import StepError, short_repr
from ..loop_nest import Iterator, fused_kind
from .base import P, CodeNames, Replay, Step

if TYPE_CHECKING:
    from ..loop_state import State

#: Annotations an ``AN`` step may put on an iterator.
ANNOTATIONS = (
    "none", "unroll", "vectorize", "parallel", "vthread",
    "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z",
)
#: Pragmas a ``PR`` step may put on an iterator (``name$value``).
PRAGMAS = ("auto_unroll_max_step",)
_THREAD_AXES = ("vthread", "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
_LOOP_PRIMITIVES = {"parallel": "parallel", "vectorize": "vectorize", "unroll": "unroll"}


@dataclass(frozen=True, slots=True)
class ReorderStep(Step):
    """Permute the iterators: ``after_ids[k]`` is the old position of the iterator now at position k."""

    stage_id: int
    after_ids: tuple[int, ...]
    TAG: ClassVar[str] = "RE"
    NEW_LOOPS: ClassVar[bool] = True

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        n = len(stage.iters)
        if sorted(self.after_ids) != list(range(n)):
            raise StepError(f"reorder of stage {self.stage_id} ({stage.name}) needs a permutation of 0..{n - 1}, "
                            f"got {list(self.after_ids)}")
        moved = self._moved()
        if moved:
            lo, hi = moved[0], moved[-1]
            state.remap_attach(self.stage_id, lambda k: None if lo <= k < hi else k, "reorder")
        state.stages[self.stage_id] = replace(stage, iters=tuple(stage.iters[k] for k in self.after_ids))

    def apply_to_schedule(self, replay: Replay) -> None:
        loops = replay.loops(self.stage_id)
        moved = self._moved()
        if moved:
            P.reorder(replay.sch, *[loops[self.after_ids[k]] for k in range(moved[0], moved[-1] + 1)])

    def to_code(self, names: CodeNames) -> str:
        return f"sch.reorder({', '.join(names.loop(self.stage_id, k) for k in self.after_ids)})"

    def _moved(self) -> list[int]:
        return [k for k, old in enumerate(self.after_ids) if old != k]


@dataclass(frozen=True, slots=True)
class FuseStep(Step):
    """Fuse consecutive iterators ``fused_ids`` into one."""

    stage_id: int
    fused_ids: tuple[int, ...]
    TAG: ClassVar[str] = "FU"
    NEW_LOOPS: ClassVar[bool] = True

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        ids = list(self.fused_ids)
        if not ids or ids != list(range(ids[0], ids[0] + len(ids))):
            raise StepError(f"fuse needs consecutive iterators, got {ids}")
        its = [state.checked_iter(self.stage_id, k) for k in ids]
        extent = None if any(i.extent is None for i in its) else math.prod(i.extent for i in its)  # type: ignore
        fused = Iterator("_".join(i.name for i in its) + "_fused", extent, fused_kind(i.kind for i in its),
                         parts=tuple(p for i in its for p in i.parts))
        first, last = ids[0], ids[-1]
        state.stages[self.stage_id] = replace(stage, iters=stage.iters[:first] + (fused,) + stage.iters[last + 1:])
        state.remap_attach(
            self.stage_id, lambda k: k if k < first else (first if k == last else (None if k < last else k - len(ids) + 1)),
            "fuse")

    def apply_to_schedule(self, replay: Replay) -> None:
        loops = replay.loops(self.stage_id)
        P.fuse(replay.sch, *[loops[k] for k in self.fused_ids], preserve_unit_iters=True)

    def to_code(self, names: CodeNames) -> str:
        return f"sch.fuse({', '.join(names.loop(self.stage_id, k) for k in self.fused_ids)})"


@dataclass(frozen=True, slots=True)
class AnnotationStep(Step):
    """Mark an iterator parallel, vectorized, unrolled, or bound to a GPU thread axis."""

    stage_id: int
    iter_id: int
    annotation: str
    TAG: ClassVar[str] = "AN"

    def check(self) -> None:
        if self.annotation not in ANNOTATIONS:
            raise StepError(f"unknown annotation {short_repr(self.annotation)}; valid: {', '.join(ANNOTATIONS)}")

    def apply_to_state(self, state: "State") -> None:
        self.check()
        it = state.checked_iter(self.stage_id, self.iter_id)
        if self.annotation == "vectorize" and it.extent != 1:
            inside = [state.stages[c].name for c in state.attached_to(self.stage_id)
                      if state.stages[c].attach[1] == self.iter_id]
            if inside:
                # TVM 0.27 vectorizes such a loop into wrong values: in five ResNet-50 tunings' logs, all 23
                # WRONG_ANSWER records were such programs (a Winograd output transform computed at its
                # epilogue's innermost loop), and none of the 15,557 correct ones was.
                raise StepError(f"cannot vectorize iterator {self.iter_id} ({it.name}) of stage {self.stage_id}: "
                                f"{', '.join(inside)} is computed inside it")
        state.replace_iter(self.stage_id, self.iter_id, replace(it, annotation=self.annotation))

    def apply_to_schedule(self, replay: Replay) -> None:
        loop = replay.loops(self.stage_id)[self.iter_id]
        primitive = _LOOP_PRIMITIVES.get(self.annotation)
        if primitive is not None:
            getattr(P, primitive)(replay.sch, loop)
        elif self.annotation in _THREAD_AXES:
            P.bind(replay.sch, loop, "vthread.x" if self.annotation == "vthread" else self.annotation)

    def to_code(self, names: CodeNames) -> str:
        loop = names.loop(self.stage_id, self.iter_id)
        primitive = _LOOP_PRIMITIVES.get(self.annotation)
        return f"sch.{primitive}({loop})" if primitive else f'sch.bind({loop}, "{self.annotation}")'


@dataclass(frozen=True, slots=True)
class PragmaStep(Step):
    """Attach a pragma such as ``auto_unroll_max_step$64`` to an iterator."""

    stage_id: int
    iter_id: int
    pragma: str
    TAG: ClassVar[str] = "PR"

    def check(self) -> None:
        name, _, value = self.pragma.partition("$")
        if name not in PRAGMAS or not (value.isascii() and value.isdigit()) or len(value) > 9:
            raise StepError(f"bad pragma {short_repr(self.pragma)}; expected NAME$INT with NAME in "
                            f"{', '.join(PRAGMAS)}")

    def apply_to_state(self, state: "State") -> None:
        self.check()
        it = state.checked_iter(self.stage_id, self.iter_id)
        state.replace_iter(self.stage_id, self.iter_id, replace(it, pragma=self.pragma))

    def apply_to_schedule(self, replay: Replay) -> None:
        loop = replay.loops(self.stage_id)[self.iter_id]
        name, _, value = self.pragma.partition("$")
        P.annotate(replay.sch, loop, f"pragma_{name}", int(value))
        if name == "auto_unroll_max_step":
            P.annotate(replay.sch, loop, "pragma_unroll_explicit", 1)

    def to_code(self, names: CodeNames) -> str:
        name, _, value = self.pragma.partition("$")
        return f'sch.annotate({names.loop(self.stage_id, self.iter_id)}, "pragma_{name}", {value})'
