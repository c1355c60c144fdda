"""Where a stage is computed: ``CA`` under another stage's loop, ``CI`` inlined, ``CR`` at the root.

``CA`` replays as ``compute_at`` when the target consumes the stage (or every other consumer of the stage
is already computed at that loop) and as ``reverse_compute_at`` when the target produces what the stage
reads (TensorIR's way of fusing an epilogue into a tiled producer). Either way the moved stage's loops
are regenerated, one per block iterator, covering the bounding box TensorIR infers. ``CR`` only asserts
that a stage stays at the root: TensorIR cannot detach a computed-at block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Optional

from ..access import Access, Affine, IterKind, LoopPart, region_extents, var_ranges
from ...errors import StepError
from ..loop_nest import AttachKind, Iterator
from ..tensor_intrin import TENSORIZE
from .base import P, CodeNames, Replay, Step
from .stages import CacheReadStep

if TYPE_CHECKING:
    from ..loop_state import State


@dataclass(frozen=True, slots=True)
class ComputeAtStep(Step):
    """Place a stage under iterator ``target_iter_id`` of ``target_stage_id`` (see the module notes)."""

    stage_id: int
    target_stage_id: int
    target_iter_id: int
    TAG: ClassVar[str] = "CA"
    NEW_LOOPS: ClassVar[bool] = True

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        target = state.checked_stage(self.target_stage_id)
        loop = state.checked_iter(self.target_stage_id, self.target_iter_id)
        if loop.annotation == "vectorize" and loop.extent != 1:  # see AnnotationStep
            raise StepError(f"cannot compute stage {self.stage_id} ({stage.name}) at iterator "
                            f"{self.target_iter_id} of stage {self.target_stage_id}: it is vectorized")
        beside = self._check_placement(state)
        inner = [it.parts for it in target.iters[self.target_iter_id + 1:]]
        if _scope_of(state, stage.block.writes[0].buffer) == "shared":
            # TensorIR sizes a shared buffer for the whole thread block: loops already bound to threads or
            # vthreads above the attach point are walked in full (that is what makes cooperative fetching).
            inner += [it.parts for it in target.iters[:self.target_iter_id + 1]
                      if it.annotation.startswith(("threadIdx", "vthread"))]
        ranges = var_ranges(target.block, inner)
        written = set(stage.block.write_buffers())
        shared = [b for b in target.block.read_buffers() if b in written]
        if shared or beside:  # read under the target loop: compute_at, cover what every reader there reads
            buffer = shared[0] if shared else stage.block.writes[0].buffer
            readers = [(target, ranges)] if shared else []
            for c in beside:
                reader = state.stages[c]
                readers.append((reader, var_ranges(reader.block, [it.parts for it in reader.iters])))
            reads = [(reader.block.reads_of(buffer), spans) for reader, spans in readers]
            used = [acc for accs, _ in reads for acc in accs]
            regions = [region_extents(accs, spans, state.shapes[buffer]) for accs, spans in reads]
            region = [None if any(r[d] is None for r in regions) else max(r[d] for r in regions)
                      for d in range(len(regions[0]))]
            own = stage.block.writes[0]
        else:  # target produces what the stage reads: reverse_compute_at, cover what the target writes
            made = [a for a in target.block.writes if a.buffer in stage.block.read_buffers()]
            if made and any(v.kind == IterKind.REDUCE for v in stage.block.vars):
                raise StepError(f"stage {self.stage_id} ({stage.name}) is a reduction: it can be computed at a "
                                "consumer's loop, not fused under its producer")
            if not made:
                raise StepError(f"stage {self.stage_id} ({stage.name}) neither feeds nor reads stage "
                                f"{self.target_stage_id} ({target.name}); compute_at needs a data dependence")
            region = region_extents(made, ranges, state.shapes[made[0].buffer])
            own = stage.block.reads_of(made[0].buffer)[0]
            used = made
        if any(i is None for acc in used for i in acc.indices):
            raise StepError(f"stage {self.target_stage_id} ({target.name}) accesses {used[0].buffer} non-affinely; "
                            f"the region stage {self.stage_id} ({stage.name}) must cover cannot be bounded")
        dim_of = {idx.single_var(): d for d, idx in enumerate(own.indices) if idx is not None and idx.single_var()}
        iters = []
        for k, v in enumerate(stage.block.vars):
            extent: Optional[int] = v.extent
            if v.kind == IterKind.SPATIAL and v.name in dim_of:
                extent = region[dim_of[v.name]]
                if extent is not None:
                    extent = min(extent, v.extent)
            iters.append(Iterator(f"ax{k}", extent, v.kind, parts=(LoopPart(v.name, 1, extent),)))
        state.stages[self.stage_id] = replace(stage, iters=tuple(iters), compute_at=AttachKind.ITER,
                                              attach=(self.target_stage_id, self.target_iter_id))

    def _check_placement(self, state: "State") -> list[int]:
        """The stage must be free to move, and every stage it exchanges data with must be the target or
        already computed at the target loop (:func:`consumers_beside`); returns the latter."""
        stage = state.stages[self.stage_id]
        if self.stage_id == self.target_stage_id:
            raise StepError(f"stage {self.stage_id} ({stage.name}) cannot be computed at itself")
        if state.attached_to(self.stage_id):
            raise StepError(f"stage {self.stage_id} ({stage.name}) has stages computed at its loops; move them first")
        if stage.compute_at != AttachKind.ROOT:
            raise StepError(f"stage {self.stage_id} ({stage.name}) is already computed at stage {stage.attach[0]}; "
                            "edit that CA step instead of adding another")
        beside = consumers_beside(state, self.stage_id, self.target_stage_id, self.target_iter_id)
        for role, others in (("consumers", state.consumers(self.stage_id)), ("producers", state.producers(self.stage_id))):
            away = [o for o in others if o != self.target_stage_id and o not in beside]
            if self.target_stage_id in others and away:
                raise StepError(f"stage {self.stage_id} ({stage.name}) has other {role} ({away}) that would "
                                f"not be under stage {self.target_stage_id}'s loop")
        return beside

    def primitive(self, state: "State") -> str:
        """``compute_at`` when the stage is read under the target loop, else ``reverse_compute_at``."""
        stage, target = state.stages[self.stage_id], state.stages[self.target_stage_id]
        feeds = set(stage.block.write_buffers()) & set(target.block.read_buffers())
        beside = consumers_beside(state, self.stage_id, self.target_stage_id, self.target_iter_id)
        return "compute_at" if feeds or beside else "reverse_compute_at"

    def apply_to_schedule(self, replay: Replay) -> None:
        loop = replay.loops(self.target_stage_id)[self.target_iter_id]
        getattr(P, self.primitive(replay.state))(replay.sch, replay.blocks[self.stage_id], loop,
                                                 preserve_unit_loops=True)

    def to_code(self, names: CodeNames) -> str:
        return (f"sch.{self.primitive(names.state)}({names.block(self.stage_id)}, "
                f"{names.loop(self.target_stage_id, self.target_iter_id)}, preserve_unit_loops=True)")


def consumers_beside(state: "State", stage_id: int, target_id: int, iter_id: int) -> list[int]:
    """The stage's consumers already computed at loop ``iter_id`` of ``target_id``, when that is every
    consumer but the target itself (else none): the stage may then be computed at that loop too, ahead of
    them, as a layer norm's mean and variance are computed under the row loop of the normalization that
    reads them. The stage's region then covers what each of them reads."""
    if set(state.stages[target_id].block.write_buffers()) & set(state.stages[stage_id].block.read_buffers()):
        return []  # the target produces what the stage reads: the stage is its epilogue (reverse_compute_at)
    consumers = [c for c in state.consumers(stage_id) if c != target_id]
    here = (target_id, iter_id)
    if consumers and all(state.stages[c].compute_at == AttachKind.ITER and state.stages[c].attach == here
                         for c in consumers):
        return consumers
    return []


def _scope_of(state: "State", buffer: str) -> str:
    """Storage scope of a buffer: the scope of the cache step that made it, else global."""
    for step in state.steps:
        if isinstance(step, CacheReadStep) and f"{step.buffer}_{step.scope}" == buffer:
            return step.scope
    return "global"


@dataclass(frozen=True, slots=True)
class ComputeInlineStep(Step):
    """Inline a stage into its consumers; it disappears from the loop structure."""

    stage_id: int
    TAG: ClassVar[str] = "CI"

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        if any(v.kind == IterKind.REDUCE for v in stage.block.vars):
            raise StepError(f"stage {self.stage_id} ({stage.name}) is a reduction and cannot be inlined")
        if set(stage.block.write_buffers()) & state.dag.param_buffers:
            raise StepError(f"stage {self.stage_id} ({stage.name}) writes an output of the function; "
                            "it cannot be inlined")
        if state.attached_to(self.stage_id):
            raise StepError(f"stage {self.stage_id} ({stage.name}) has stages computed at its loops")
        out = stage.block.writes[0]
        for i, other in enumerate(state.stages):
            if i == self.stage_id or out.buffer not in other.block.read_buffers():
                continue
            if any(it.annotation.startswith(TENSORIZE) for it in other.iters):
                raise StepError(f"stage {self.stage_id} ({stage.name}) feeds the tensorized stage {other.name}, "
                                "whose intrinsic reads it from memory: it cannot be inlined")
            reads: list[Access] = [a for a in other.block.reads if a.buffer != out.buffer]
            periods = dict(other.block.branch_periods)
            for use in other.block.reads_of(out.buffer):
                mapping: dict[str, Optional[Affine]] = {}
                for d, idx in enumerate(out.indices):
                    name = idx.single_var() if idx is not None and not idx.const else None
                    if name is not None:
                        mapping[name] = use.indices[d]
                for var in stage.block.vars:
                    mapping.setdefault(var.name, None)
                for r in stage.block.reads:
                    reads.append(r.substitute(mapping))
                for var, period in stage.block.branch_periods:
                    _moved_period(mapping[var], period, [v.name for v in other.block.vars], periods)
            state.stages[i] = replace(other, block=replace(other.block, reads=tuple(reads),
                                                           branch_periods=tuple(sorted(periods.items()))))
        state.stages[self.stage_id] = replace(stage, iters=(), compute_at=AttachKind.INLINED)

    def apply_to_schedule(self, replay: Replay) -> None:
        P.compute_inline(replay.sch, replay.blocks[self.stage_id])

    def to_code(self, names: CodeNames) -> str:
        return f"sch.compute_inline({names.block(self.stage_id)})"


def _moved_period(index: Optional[Affine], period: int, names: list[str], periods: dict[str, int]) -> None:
    """Note in ``periods`` the period along the consumer's variables of a branch whose period is ``period``
    along the inlined stage's variable that ``index`` (of the consumer's variables ``names``) reads."""
    if index is not None and len(index.terms) == 1 and abs(index.terms[0][1]) == 1:
        name = index.terms[0][0]
        periods[name] = math.gcd(periods.get(name, 0), period, index.const)
        return
    for name in ([n for n, _ in index.terms] if index is not None else names):
        periods[name] = 1


@dataclass(frozen=True, slots=True)
class ComputeRootStep(Step):
    """Keep a stage at the root scope (a no-op on the program; rejected for an attached stage)."""

    stage_id: int
    TAG: ClassVar[str] = "CR"

    def apply_to_state(self, state: "State") -> None:
        stage = state.checked_stage(self.stage_id)
        if stage.compute_at == AttachKind.ITER:
            raise StepError(f"stage {self.stage_id} ({stage.name}) is computed at stage {stage.attach[0]}: "
                            "TensorIR cannot move it back to the root; drop its CA step instead")

    def apply_to_schedule(self, replay: Replay) -> None:
        """A statement of intent: the State rejects it for an attached stage."""

    def to_code(self, names: CodeNames) -> str:
        return f"# {names.state.stages[self.stage_id].name} stays at the root"
