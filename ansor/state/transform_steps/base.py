"""What every transform step provides, and what it is given to do its work.

A step is frozen data (a dataclass whose fields are its JSON fields, in order) with one method per reader of
it: :meth:`Step.apply_to_state` (the pure-Python State), :meth:`Step.apply_to_schedule` (a
``tvm.s_tir.Schedule``, through :class:`Replay`), :meth:`Step.to_code` (readable schedule code, through
:class:`CodeNames`) and :meth:`Step.check` (the values the JSON codec accepts).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import tvm

from ..loop_nest import AttachKind

if TYPE_CHECKING:
    from ..loop_state import State


class Step:
    """Base of the transform steps; see the checklist in :mod:`ansor.state.transform_steps`."""

    __slots__ = ()
    #: The step's name in logs (the first element of its JSON list).
    TAG: ClassVar[str]
    #: Where a step that adds a stage puts it: ``stage_id + NEW_STAGE`` (CHR, RF: 0, before; CHW: 1, after).
    NEW_STAGE: ClassVar[Optional[int]] = None
    #: The step gives its stage new loop handles, which readable code must fetch again (``get_loops``).
    NEW_LOOPS: ClassVar[bool] = False
    stage_id: int

    def apply_to_state(self, state: "State") -> None:
        """Change ``state``'s loop structure as TensorIR will (raise :class:`StepError` if the step does not fit)."""
        raise NotImplementedError

    def apply_to_schedule(self, replay: "Replay") -> None:
        """Apply the step to ``replay.sch``; ``replay.state`` is still the state before the step."""
        raise NotImplementedError

    def to_code(self, names: "CodeNames") -> str:
        """The ``s_tir.Schedule`` call(s) of the step as Python, named by ``names`` (the state before it)."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise :class:`StepError` if a field holds a value no program may have (default: nothing to check)."""


class _Prims:
    """Schedule primitives without the Python-side argument type checker.

    ``tvm.s_tir.Schedule`` wraps every primitive in a runtime type check that costs about half of a
    replay; our arguments are built by the steps, and TVM's C++ side still validates each schedule.
    """

    def __getattr__(self, name: str):
        fn = getattr(tvm.s_tir.Schedule, name)
        fn = getattr(fn, "__wrapped__", fn)
        setattr(self, name, fn)
        return fn


#: ``P.split(sch, ...)`` is ``sch.split(...)`` without the type check.
P = _Prims()


@dataclass
class Replay:
    """A schedule being built from steps, with the State advanced in lockstep.

    The State says which loops a stage owns (the innermost ``len(stage.iters)`` of ``get_loops``) and which
    way a ``CA`` goes; ``blocks`` holds each stage's block, in stage order.
    """

    sch: tvm.s_tir.Schedule
    state: "State"
    blocks: list

    def loops(self, stage_id: int) -> list:
        """The loops stage ``stage_id`` owns, outermost first."""
        n = len(self.state.stages[stage_id].iters)
        loops = P.get_loops(self.sch, self.blocks[stage_id])
        return list(loops[len(loops) - n:]) if n else []


class CodeNames:
    """Python names for the blocks and loops of a state, for code that reads like a hand-written schedule."""

    def __init__(self, state: "State"):
        self.state = state

    def block(self, stage_id: int) -> str:
        return ident(self.state.stages[stage_id].name)

    def loop(self, stage_id: int, iter_id: int) -> str:
        stage = self.state.stages[stage_id]
        return ident(f"{stage.name}_{stage.iters[iter_id].name}")

    def loops_line(self, stage_id: int) -> str:
        """``a, b, c = sch.get_loops(block)`` for the loops the stage owns now."""
        stage = self.state.stages[stage_id]
        names = ", ".join(self.loop(stage_id, k) for k in range(len(stage.iters)))
        rest = "*_, " if stage.compute_at != AttachKind.ROOT else ""
        return f"{rest}{names}{',' if len(stage.iters) == 1 else ''} = sch.get_loops({self.block(stage_id)})"


def ident(name: str) -> str:
    """``name`` as a Python identifier."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def step_to_json(step: Step) -> list[Any]:
    """``[TAG, field, field, ...]`` in declaration order; tuples become lists, bools become 0/1."""
    out: list[Any] = [step.TAG]
    for f in fields(step):  # type: ignore[arg-type]
        value = getattr(step, f.name)
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, tuple):
            value = list(value)
        out.append(value)
    return out
