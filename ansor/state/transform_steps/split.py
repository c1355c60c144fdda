"""Split steps: ``SP`` with its own lengths, ``FSP`` and ``FFSP`` with lengths taken from earlier ``SP`` steps."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Optional, Sequence

from ..access import split_parts
from ...errors import StepError
from ..loop_nest import Iterator
from .base import P, CodeNames, Replay, Step, step_to_json

if TYPE_CHECKING:
    from ..loop_state import State


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending: the lengths a split of a loop of ``n`` iterations may take."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


#: A padded tiling rounds the extent up to a multiple of one of these, and pads at most MAX_PAD_WASTE of it.
PAD_MULTIPLES = (2, 4, 8, 16)
MAX_PAD_WASTE = 0.125


@functools.lru_cache(maxsize=4096)
def padded_extents(extent: int) -> tuple[int, ...]:
    """The extents a tiling of ``extent`` may pad it to, its tiles not dividing it (TVM guards the last
    one): the next multiples of :data:`PAD_MULTIPLES`, at most :data:`MAX_PAD_WASTE` longer (none for a
    multiple of 16: its divisors serve)."""
    rounded = {-(-extent // m) * m for m in PAD_MULTIPLES} - {extent}
    return tuple(sorted(p for p in rounded if p - extent <= MAX_PAD_WASTE * extent))


class SplitLike(Step):
    """A step that splits one loop; subclasses say where its lengths come from (:meth:`resolve`)."""

    __slots__ = ()
    iter_id: int
    NEW_LOOPS: ClassVar[bool] = True

    def resolve(self, steps: Sequence[Step]) -> tuple[tuple[Optional[int], ...], bool]:
        """The (lengths, inner_to_outer) of the split, given the steps before it."""
        raise NotImplementedError

    def apply_to_state(self, state: "State") -> None:
        lengths, inner_to_outer = self.resolve(state.steps)
        it = state.checked_iter(self.stage_id, self.iter_id)
        for length in lengths:
            if length is not None and (not isinstance(length, int) or length <= 0):
                raise StepError(f"split lengths must be positive integers or None, got {list(lengths)}")
        known = all(v is not None for v in lengths)
        inferred = (math.ceil(it.extent / math.prod(lengths))  # type: ignore[arg-type]
                    if known and it.extent is not None else None)
        extents = [inferred, *lengths] if inner_to_outer else [*lengths, inferred]
        parts = split_parts(it.parts, extents)
        new = tuple(Iterator(f"{it.name}_{k}", e, it.kind, parts=p) for k, (e, p) in enumerate(zip(extents, parts)))
        stage = state.stages[self.stage_id]
        state.stages[self.stage_id] = replace(
            stage, iters=stage.iters[:self.iter_id] + new + stage.iters[self.iter_id + 1:])
        n, first = len(lengths), self.iter_id
        state.remap_attach(self.stage_id, lambda k: k + n if k >= first else k, "split")

    def apply_to_schedule(self, replay: Replay) -> None:
        lengths, inner_to_outer = self.resolve(replay.state.steps)
        if any(v is None for v in lengths):
            raise StepError(f"step {step_to_json(self)} has unfilled split lengths {list(lengths)}")
        P.split(replay.sch, replay.loops(self.stage_id)[self.iter_id], factors=_factors(lengths, inner_to_outer),
                preserve_unit_iters=True)

    def to_code(self, names: CodeNames) -> str:
        factors = _factors(*self.resolve(names.state.steps))
        return f"sch.split({names.loop(self.stage_id, self.iter_id)}, factors={factors})"


def _factors(lengths: Sequence[Optional[int]], inner_to_outer: bool) -> list[Optional[int]]:
    """``Schedule.split``'s factors: ``None`` where the extent is inferred."""
    return [None, *lengths] if inner_to_outer else [*lengths, None]


@dataclass(frozen=True, slots=True)
class SplitStep(SplitLike):
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

    def resolve(self, steps: Sequence[Step]) -> tuple[tuple[Optional[int], ...], bool]:
        return self.lengths, self.inner_to_outer


@dataclass(frozen=True, slots=True)
class FollowSplitStep(SplitLike):
    """Split iterator ``iter_id`` into ``n_split + 1`` parts with the lengths of an earlier ``SP`` step.

    The first ``n_split - 1`` lengths are copied; the last is the product of the remaining ones, so the
    iterator lines up with the followed one's outer levels (used to fuse a consumer into a tiled stage).
    """

    stage_id: int
    iter_id: int
    src_step_id: int
    n_split: int
    TAG: ClassVar[str] = "FSP"

    def resolve(self, steps: Sequence[Step]) -> tuple[tuple[Optional[int], ...], bool]:
        src = split_source(steps, self.src_step_id)
        if not 1 <= self.n_split <= len(src.lengths):
            raise StepError(f"FSP n_split={self.n_split} does not fit step {self.src_step_id} {src.lengths}")
        lengths = list(src.lengths[: self.n_split - 1])
        rest: Optional[int] = 1
        for length in src.lengths[self.n_split - 1:]:
            rest = None if rest is None or length is None else rest * length
        return tuple(lengths + [rest]), True


@dataclass(frozen=True, slots=True)
class FollowFusedSplitStep(SplitLike):
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

    def resolve(self, steps: Sequence[Step]) -> tuple[tuple[Optional[int], ...], bool]:
        prod: Optional[int] = 1
        for sid in self.src_step_ids:
            src = split_source(steps, sid)
            if not 0 <= self.level < len(src.lengths):
                raise StepError(f"FFSP level {self.level} out of range for step {sid} {src.lengths}")
            length = src.lengths[self.level]
            prod = None if prod is None or length is None else prod * length
        return (prod,), self.factor_or_nparts


def split_source(steps: Sequence[Step], step_id: int) -> SplitStep:
    """The ``SP`` step a follower names (a :class:`StepError` if step ``step_id`` is not one)."""
    if not 0 <= step_id < len(steps) or not isinstance(steps[step_id], SplitStep):
        raise StepError(f"step {step_id} is not an SP step to follow (the state has {len(steps)} steps)")
    return steps[step_id]  # type: ignore[return-value]
