"""The transform steps: Ansor's 14, our layout rewrite and tensorize, each one class that says all it means.

A step says *what* to do to one stage of a loop state. It is frozen data, and a record in a log is just the
step list in JSON. Each step class also carries everything that reads it:

=======================  ==============================================================================
``apply_to_state``       the pure-Python :class:`~ansor.state.loop_state.State` (the search does this thousands
                         of times a round)
``apply_to_schedule``    a ``tvm.s_tir.Schedule``, through :func:`ansor.state.replay.replay` (the real program)
``to_code``              readable schedule code (:meth:`ansor.state.loop_state.State.to_code`)
fields + ``check``       the JSON codec below (:func:`step_to_json`, :func:`step_from_json`)
=======================  ==============================================================================

Stage ids are positions in the state's stage list at the moment the step is applied; iterator ids are
positions in that stage's loop list (outermost first). Steps that add stages (CHR, CHW, RF) shift later
stage ids, exactly as in Ansor. How each step departs from Ansor (TVM 0.27 has only TensorIR) is said in
the module of its kind: :mod:`.split`, :mod:`.loops`, :mod:`.placement`, :mod:`.stages`, :mod:`.layout`,
:mod:`.tensorize`.

How to add a step
-----------------
1. Write a ``@dataclass(frozen=True, slots=True)`` subclass of :class:`Step` in the module of its kind.
   Its fields are its JSON fields, in order; each is an ``int``, ``Optional[int]``, ``bool``, ``str`` or a
   tuple of (optional) ints. Give it a ``TAG`` no other step has (logs store it), ``NEW_STAGE`` if it
   adds a stage, and ``NEW_LOOPS`` if it replaces its stage's loops.
2. ``apply_to_state``: what it does to the loop structure, exactly as TensorIR will (raise ``StepError``
   where TensorIR would refuse, or where our bound inference cannot predict TensorIR).
3. ``apply_to_schedule``: the ``tvm.s_tir.Schedule`` primitives (``P.<name>``), on ``replay.loops(...)`` and
   ``replay.blocks`` (insert the new block there if it adds a stage).
4. ``to_code``: the same primitives as readable Python.
5. ``check`` if a field takes only some values (the JSON reader calls it: logs are untrusted).
6. Add the class to :data:`STEP_TYPES` below, and a ``State`` method named like Ansor's if the search
   builds it.
7. ``docs/log_format.md``: the tag list and the number of tags (16 now). ``tests/test_transform_steps.py`` fails
   until the step has an example there and every method above.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Sequence

from ...errors import StepError, short_repr
from .base import P, CodeNames, Replay, Step, ident, step_to_json
from .layout import LayoutRewriteStep, StorageAlignStep
from .loops import ANNOTATIONS, PRAGMAS, AnnotationStep, FuseStep, PragmaStep, ReorderStep
from .placement import ComputeAtStep, ComputeInlineStep, ComputeRootStep, consumers_beside
from .split import FollowFusedSplitStep, FollowSplitStep, SplitLike, SplitStep
from .stages import CacheReadStep, CacheWriteStep, RfactorStep
from .tensorize import INTRINSICS, TensorizeStep

__all__ = [
    "ANNOTATIONS", "PRAGMAS", "STEP_TYPES", "AnnotationStep", "CacheReadStep", "CacheWriteStep", "CodeNames",
    "ComputeAtStep", "ComputeInlineStep", "ComputeRootStep", "FollowFusedSplitStep", "FollowSplitStep", "FuseStep",
    "LayoutRewriteStep", "P", "PragmaStep", "ReorderStep", "Replay", "RfactorStep", "SplitLike", "SplitStep", "Step",
    "StorageAlignStep", "TensorizeStep", "INTRINSICS", "consumers_beside", "ident", "step_from_json",
    "step_to_json", "steps_to_json",
]

#: Every step class by its tag: what the JSON reader accepts.
STEP_TYPES: dict[str, type[Step]] = {
    cls.TAG: cls
    for cls in (
        SplitStep, FollowSplitStep, FollowFusedSplitStep, ReorderStep, FuseStep, AnnotationStep, PragmaStep,
        StorageAlignStep, ComputeAtStep, ComputeInlineStep, ComputeRootStep, CacheReadStep, CacheWriteStep,
        RfactorStep, LayoutRewriteStep, TensorizeStep,
    )
}


def steps_to_json(steps: Sequence[Step]) -> list[list[Any]]:
    return [step_to_json(s) for s in steps]


def step_from_json(data: list[Any]) -> Step:
    """Inverse of :func:`step_to_json`; malformed input raises :class:`StepError`.

    Strict, because the data comes from log files: an int field takes only a JSON integer of int64 range
    (not ``4.0``, ``1e999``, ``"4"`` or ``true``), a bool field 0/1 (or true/false), a tuple field a list
    of such integers (``null`` where a length may be unknown), and a field with a ``check`` (annotations,
    pragmas) only the values it allows.
    """
    tag = data[0] if isinstance(data, list) and data else None
    cls = STEP_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise StepError(f"not a transform step: {short_repr(data)} (known tags: {', '.join(STEP_TYPES)})")
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if len(data) - 1 != len(names):
        raise StepError(f"{tag} step needs {len(names)} fields ({', '.join(names)}), got {short_repr(data)}")
    kwargs: dict[str, Any] = {}
    for name, value in zip(names, data[1:]):
        ok, kwargs[name] = _field_from_json(cls.__annotations__[name], value)
        if not ok:
            raise StepError(f"bad field {name}={short_repr(value)} in {short_repr(data)}")
    step = cls(**kwargs)
    step.check()
    return step


#: Longest string and tuple a step field may hold in JSON (names and scopes are short; tuples are loop lists).
_MAX_JSON_STR = 256
_MAX_JSON_TUPLE = 64
_INT64 = 2 ** 63


def _field_from_json(kind: str, value: Any) -> tuple[bool, Any]:
    """(fits, value as the step holds it) for one field of annotation ``kind``."""
    if kind == "int" or kind == "Optional[int]":
        if value is None:
            return kind == "Optional[int]", None
        return type(value) is int and -_INT64 <= value < _INT64, value
    if kind == "bool":
        return type(value) in (int, bool) and value in (0, 1), bool(value) if type(value) in (int, bool) else None
    if kind == "str":
        return type(value) is str and len(value) <= _MAX_JSON_STR, value
    # tuple[int, ...] or tuple[Optional[int], ...]
    if type(value) is not list or len(value) > _MAX_JSON_TUPLE:
        return False, None
    nullable = "Optional" in kind
    fits = all((type(v) is int and -_INT64 <= v < _INT64) or (v is None and nullable) for v in value)
    return fits, tuple(value)
