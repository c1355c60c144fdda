"""The 14 transform steps of Ansor, and our layout rewrite, as plain, frozen data.

A step says *what* to do to one stage of a loop state; it knows nothing about how. Two interpreters give it
meaning: :mod:`ansor.loop_state` applies steps to a cheap Python :class:`~ansor.loop_state.State` (the
search does this thousands of times a round) and :mod:`ansor.replay` applies the same steps to a
``tvm.s_tir.Schedule`` to produce the real program. A record in a log is just the step list in JSON.

Stage ids are positions in the state's stage list at the moment the step is applied; iterator ids are
positions in that stage's loop list (outermost first). Steps that add stages (CHR, CHW, RF) shift later
stage ids, exactly as in Ansor.

Deliberate differences from Ansor (TVM 0.27 has no TE schedules, only TensorIR):

* ``CA`` places a stage under a loop of another stage. When the target is a *consumer* it replays as
  ``compute_at``; when the target is a *producer* it replays as ``reverse_compute_at`` (TensorIR's way of
  fusing an epilogue into a tiled producer). Either way the moved stage's loops are regenerated, one per
  block iterator, covering the region it must produce or consume.
* ``CHW`` keeps the computation in the original stage (now writing to the cache) and adds the write-back
  stage right *after* it; Ansor added the cache stage before. ``CHR`` adds the read stage before the reader.
* ``CR`` asserts that a stage stays at the root scope: TensorIR cannot detach a computed-at block.
* ``SA`` names an axis of the stage's output buffer, not an iterator.
* ``LR`` (ours) packs an argument in the order the stage's loops read it; Ansor did this for constant
  weights as an option of the whole DAG, not as a step (see :mod:`ansor.layout_rewrite`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Optional, Union

from .errors import StepError

#: Annotations an ``AN`` step may put on an iterator.
ANNOTATIONS = (
    "none", "unroll", "vectorize", "parallel", "vthread",
    "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z",
)
#: Pragmas a ``PR`` step may put on an iterator (``name$value``).
PRAGMAS = ("auto_unroll_max_step",)


@dataclass(frozen=True, slots=True)
class SplitStep:
    """Split iterator ``iter_id`` into ``len(lengths) + 1`` iterators.

    ``lengths`` are the extents of the inner parts (``inner_to_outer``: the outermost extent is
    inferred) or of the outer parts (otherwise: the innermost is inferred). ``None`` marks a length a
    sketch has not filled in yet; such a state cannot be replayed.
    """

    stage_id: int
    iter_id: int
    extent: Optional[int]
    lengths: tuple[Optional[int], ...]
    inner_to_outer: bool = True
    TAG: ClassVar[str] = "SP"


@dataclass(frozen=True, slots=True)
class FollowSplitStep:
    """Split iterator ``iter_id`` into ``n_split + 1`` parts with the lengths of an earlier ``SP`` step.

    The first ``n_split - 1`` lengths are copied; the last is the product of the remaining ones, so the
    iterator lines up with the followed one's outer levels (used to fuse a consumer into a tiled stage).
    """

    stage_id: int
    iter_id: int
    src_step_id: int
    n_split: int
    TAG: ClassVar[str] = "FSP"


@dataclass(frozen=True, slots=True)
class FollowFusedSplitStep:
    """Split iterator ``iter_id`` in two by the product of ``lengths[level]`` of several ``SP`` steps.

    ``factor_or_nparts`` says whether that product is the inner factor or the number of outer parts (GPU
    cooperative fetching splits a fused copy loop by the thread count of the stage it serves).
    """

    stage_id: int
    iter_id: int
    src_step_ids: tuple[int, ...]
    level: int
    factor_or_nparts: bool
    TAG: ClassVar[str] = "FFSP"


@dataclass(frozen=True, slots=True)
class ReorderStep:
    """Permute the iterators: ``after_ids[k]`` is the old position of the iterator now at position k."""

    stage_id: int
    after_ids: tuple[int, ...]
    TAG: ClassVar[str] = "RE"


@dataclass(frozen=True, slots=True)
class FuseStep:
    """Fuse consecutive iterators ``fused_ids`` into one."""

    stage_id: int
    fused_ids: tuple[int, ...]
    TAG: ClassVar[str] = "FU"


@dataclass(frozen=True, slots=True)
class AnnotationStep:
    """Mark an iterator parallel, vectorized, unrolled, or bound to a GPU thread axis."""

    stage_id: int
    iter_id: int
    annotation: str
    TAG: ClassVar[str] = "AN"


@dataclass(frozen=True, slots=True)
class PragmaStep:
    """Attach a pragma such as ``auto_unroll_max_step$64`` to an iterator."""

    stage_id: int
    iter_id: int
    pragma: str
    TAG: ClassVar[str] = "PR"


@dataclass(frozen=True, slots=True)
class StorageAlignStep:
    """Pad the stride of ``axis`` of the stage's output buffer to ``factor * k + offset``."""

    stage_id: int
    axis: int
    factor: int
    offset: int
    TAG: ClassVar[str] = "SA"


@dataclass(frozen=True, slots=True)
class ComputeAtStep:
    """Place a stage under iterator ``target_iter_id`` of ``target_stage_id`` (see module notes)."""

    stage_id: int
    target_stage_id: int
    target_iter_id: int
    TAG: ClassVar[str] = "CA"


@dataclass(frozen=True, slots=True)
class ComputeInlineStep:
    """Inline a stage into its consumers; it disappears from the loop structure."""

    stage_id: int
    TAG: ClassVar[str] = "CI"


@dataclass(frozen=True, slots=True)
class ComputeRootStep:
    """Keep a stage at the root scope (a no-op on the program; rejected for an attached stage)."""

    stage_id: int
    TAG: ClassVar[str] = "CR"


@dataclass(frozen=True, slots=True)
class CacheReadStep:
    """Read ``buffer`` through a cache in ``scope``: a new stage before ``stage_id``.

    ``reader_stage_ids`` are the stages that read through the cache (``stage_id`` among them).
    """

    stage_id: int
    buffer: str
    scope: str
    reader_stage_ids: tuple[int, ...]
    TAG: ClassVar[str] = "CHR"


@dataclass(frozen=True, slots=True)
class CacheWriteStep:
    """Compute the stage into a ``scope`` cache; a write-back stage is added right after it."""

    stage_id: int
    scope: str
    TAG: ClassVar[str] = "CHW"


@dataclass(frozen=True, slots=True)
class RfactorStep:
    """Factor reduction iterator ``iter_id`` out into a new ``<name>_rf`` stage placed before the stage.

    ``factor_iter_id`` is where the factored axis goes in the new intermediate buffer.
    """

    stage_id: int
    iter_id: int
    factor_iter_id: int
    TAG: ClassVar[str] = "RF"


@dataclass(frozen=True, slots=True)
class LayoutRewriteStep:
    """Stage ``stage_id`` reads argument ``buffer`` through a copy laid out in its final loop order.

    Applied after every other step (the layout follows from the final loops); see :mod:`ansor.layout_rewrite`.
    """

    stage_id: int
    buffer: str
    TAG: ClassVar[str] = "LR"


Step = Union[
    SplitStep, FollowSplitStep, FollowFusedSplitStep, ReorderStep, FuseStep, AnnotationStep, PragmaStep,
    StorageAlignStep, ComputeAtStep, ComputeInlineStep, ComputeRootStep, CacheReadStep, CacheWriteStep,
    RfactorStep, LayoutRewriteStep,
]

STEP_TYPES: dict[str, type] = {
    cls.TAG: cls
    for cls in (
        SplitStep, FollowSplitStep, FollowFusedSplitStep, ReorderStep, FuseStep, AnnotationStep, PragmaStep,
        StorageAlignStep, ComputeAtStep, ComputeInlineStep, ComputeRootStep, CacheReadStep, CacheWriteStep,
        RfactorStep, LayoutRewriteStep,
    )
}

#: Steps that add a stage at ``stage_id`` (before) or ``stage_id + 1`` (after).
STAGE_ADDING_TAGS = ("CHR", "CHW", "RF")


def step_to_json(step: Step) -> list[Any]:
    """``[TAG, field, field, ...]`` in declaration order; tuples become lists, bools become 0/1."""
    out: list[Any] = [step.TAG]
    for f in fields(step):
        value = getattr(step, f.name)
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, tuple):
            value = list(value)
        out.append(value)
    return out


def step_from_json(data: list[Any]) -> Step:
    """Inverse of :func:`step_to_json`; malformed input raises :class:`StepError`."""
    if not isinstance(data, list) or not data or data[0] not in STEP_TYPES:
        raise StepError(f"not a transform step: {data!r} (known tags: {', '.join(STEP_TYPES)})")
    cls = STEP_TYPES[data[0]]
    names = [f.name for f in fields(cls)]
    if len(data) - 1 != len(names):
        raise StepError(f"{data[0]} step needs {len(names)} fields ({', '.join(names)}), got {data!r}")
    kwargs: dict[str, Any] = {}
    for name, value in zip(names, data[1:]):
        kind = cls.__annotations__[name]
        try:
            if kind == "int":
                value = int(value)
            elif kind == "bool":
                value = bool(value)
            elif kind == "str":
                value = str(value)
            elif kind == "Optional[int]":
                value = None if value is None else int(value)
            elif kind.startswith("tuple"):
                value = tuple(None if v is None else int(v) for v in value)
        except (TypeError, ValueError) as err:
            raise StepError(f"bad field {name}={value!r} in {data!r}") from err
        kwargs[name] = value
    return cls(**kwargs)


def steps_to_json(steps: "list[Step] | tuple[Step, ...]") -> list[list[Any]]:
    return [step_to_json(s) for s in steps]


def steps_from_json(data: list[list[Any]]) -> list[Step]:
    return [step_from_json(d) for d in data]


def split_lengths(step: Step, steps: "list[Step] | tuple[Step, ...]") -> tuple[tuple[Optional[int], ...], bool]:
    """The (lengths, inner_to_outer) a split-like step resolves to, following ``FSP``/``FFSP`` sources."""
    if isinstance(step, SplitStep):
        return step.lengths, step.inner_to_outer
    if isinstance(step, FollowSplitStep):
        src = _split_source(steps, step.src_step_id)
        if not 1 <= step.n_split <= len(src.lengths):
            raise StepError(f"FSP n_split={step.n_split} does not fit step {step.src_step_id} {src.lengths}")
        lengths = list(src.lengths[: step.n_split - 1])
        rest: Optional[int] = 1
        for length in src.lengths[step.n_split - 1:]:
            rest = None if rest is None or length is None else rest * length
        return tuple(lengths + [rest]), True
    if isinstance(step, FollowFusedSplitStep):
        prod: Optional[int] = 1
        for sid in step.src_step_ids:
            src = _split_source(steps, sid)
            if not 0 <= step.level < len(src.lengths):
                raise StepError(f"FFSP level {step.level} out of range for step {sid} {src.lengths}")
            length = src.lengths[step.level]
            prod = None if prod is None or length is None else prod * length
        return (prod,), step.factor_or_nparts
    raise StepError(f"{step.TAG} is not a split step")


def _split_source(steps: "list[Step] | tuple[Step, ...]", step_id: int) -> SplitStep:
    if not 0 <= step_id < len(steps) or not isinstance(steps[step_id], SplitStep):
        raise StepError(f"step {step_id} is not an SP step to follow (the state has {len(steps)} steps)")
    return steps[step_id]  # type: ignore[return-value]
