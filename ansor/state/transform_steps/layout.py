"""Steps about how a buffer is laid out: ``SA`` pads an output axis, ``LR`` (ours) packs an argument.

``LR`` says "the stage reads this argument through a copy laid out in its final loop order"; the layout
follows from the loops, so replay applies it after every other step (:mod:`ansor.state.layout_rewrite`). Ansor
did this for constant weights as an option of the whole DAG, not as a step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from ...errors import StepError
from ..loop_nest import AttachKind
from .base import P, CodeNames, Replay, Step

if TYPE_CHECKING:
    from ..loop_state import State


@dataclass(frozen=True, slots=True)
class StorageAlignStep(Step):
    """Pad the stride of ``axis`` of the stage's output buffer to ``factor * k + offset``."""

    stage_id: int
    axis: int
    factor: int
    offset: int
    TAG: ClassVar[str] = "SA"

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        rank = len(state.shapes[stage.block.writes[0].buffer])
        if not 0 <= self.axis < rank or self.factor <= 0 or self.offset < 0:
            raise StepError(f"storage_align of {stage.name}: axis {self.axis} factor {self.factor} "
                            f"offset {self.offset} does not fit a rank-{rank} buffer")

    def apply_to_schedule(self, replay: Replay) -> None:
        P.storage_align(replay.sch, replay.blocks[self.stage_id], 0, self.axis, self.factor, self.offset)

    def to_code(self, names: CodeNames) -> str:
        return f"sch.storage_align({names.block(self.stage_id)}, 0, {self.axis}, {self.factor}, {self.offset})"


@dataclass(frozen=True, slots=True)
class LayoutRewriteStep(Step):
    """Stage ``stage_id`` reads argument ``buffer`` through a copy laid out in its final loop order."""

    stage_id: int
    buffer: str
    TAG: ClassVar[str] = "LR"

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        if stage.compute_at != AttachKind.ROOT:
            raise StepError(f"layout rewrite of {self.buffer}: stage {self.stage_id} ({stage.name}) must be at "
                            "the root")
        if self.buffer not in state.dag.param_buffers or self.buffer not in stage.block.read_buffers():
            raise StepError(f"layout rewrite: stage {self.stage_id} ({stage.name}) does not read an argument "
                            f"named {self.buffer!r}")
        if self.buffer in stage.packed or stage.block.plain_axes(self.buffer) is None:
            raise StepError(f"layout rewrite of {self.buffer} for stage {self.stage_id} ({stage.name}): already "
                            "packed, or not read as buffer[v0, v1, ...]")
        state.stages[self.stage_id] = replace(stage, packed=stage.packed + (self.buffer,))

    def apply_to_schedule(self, replay: Replay) -> None:
        """Nothing yet: replay packs the buffer after every other step, when the stage's loops are final."""

    def to_code(self, names: CodeNames) -> str:
        return (f"# {names.state.stages[self.stage_id].name} reads {self.buffer} packed in its loop order "
                "(after every other step)")
