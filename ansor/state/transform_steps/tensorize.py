"""``TZ`` (ours): the innermost loops of a stage become one call of a tensor intrinsic (the CPU's bf16 units,
:mod:`ansor.state.tensor_intrin`).

The step marks the first of those loops ``tensorize:<intrinsic>``; the mark travels with the loop through
later splits and fusions of the outer loops. Like ``LR``, replay applies it after every other step
(:func:`ansor.state.replay.replay`): the intrinsic's buffers must see the final layouts, and the reduction's
initialisation must already be hoisted out (TensorIR matches the update alone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from ...errors import StepError, short_repr
from ..tensor_intrin import TENSORIZE, BF16Intrin
from .base import CodeNames, Replay, Step

if TYPE_CHECKING:
    from ..loop_state import State

#: The intrinsics a ``TZ`` step may name (logs are untrusted input).
INTRINSICS = tuple(i.value for i in BF16Intrin)


@dataclass(frozen=True, slots=True)
class TensorizeStep(Step):
    """Loops ``iter_id`` to the last of stage ``stage_id`` become one call of tensor intrinsic ``intrin``."""

    stage_id: int
    iter_id: int
    intrin: str
    TAG: ClassVar[str] = "TZ"

    def check(self) -> None:
        if self.intrin not in INTRINSICS:
            raise StepError(f"unknown tensor intrinsic {short_repr(self.intrin)}; valid: {', '.join(INTRINSICS)}")

    def apply_to_state(self, state: "State") -> None:
        self.check()
        stage = state.checked_stage(self.stage_id)
        state.checked_iter(self.stage_id, self.iter_id)
        want = BF16Intrin(self.intrin).loops
        have = tuple((it.extent, it.kind) for it in stage.iters[self.iter_id:])
        if have != want or any(it.annotation != "none" for it in stage.iters[self.iter_id:]):
            shape = ", ".join(f"{n} {k.value}" for n, k in want)
            raise StepError(f"tensorize {stage.name} with {self.intrin}: its innermost loops must be exactly "
                            f"({shape}) and unannotated, got {[(n, k.value) for n, k in have]}")
        it = stage.iters[self.iter_id]
        state.replace_iter(self.stage_id, self.iter_id, replace(it, annotation=TENSORIZE + self.intrin))

    def apply_to_schedule(self, replay: Replay) -> None:
        """Nothing yet: replay tensorizes after every other step (the module docstring says why)."""

    def to_code(self, names: CodeNames) -> str:
        return (f"# {names.loop(self.stage_id, self.iter_id)} and the loops inside it: one call of "
                f"{self.intrin} (after every other step)")
