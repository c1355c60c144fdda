"""Steps that add a stage: ``CHR`` (a cache the readers read through), ``CHW`` (a cache the stage writes to)
and ``RF`` (a reduction factored into a stage of its own). Later stage ids shift by one, as in Ansor.

``CHW`` keeps the computation in the original stage (now writing the cache) and adds the write-back stage
right after it; Ansor added the cache stage before. ``CHR`` adds the copy before the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Optional

from ..access import Access, Affine, BlockInfo, BlockVar, IterKind, LoopPart
from ...errors import StepError
from ..loop_nest import AttachKind, Iterator, Stage
from .base import P, CodeNames, Replay, Step, ident

if TYPE_CHECKING:
    from ..loop_state import State


@dataclass(frozen=True, slots=True)
class CacheReadStep(Step):
    """Read ``buffer`` through a cache in ``scope``: a new stage before ``stage_id``.

    ``reader_stage_ids`` are the stages that read through the cache (``stage_id`` among them).
    """

    stage_id: int
    buffer: str
    scope: str
    reader_stage_ids: tuple[int, ...]
    TAG: ClassVar[str] = "CHR"
    NEW_STAGE: ClassVar[Optional[int]] = 0

    def apply_to_state(self, state: "State") -> None:
        if self.stage_id not in self.reader_stage_ids:
            raise StepError(f"cache_read: reader stages {list(self.reader_stage_ids)} must include {self.stage_id}")
        for r in self.reader_stage_ids:
            if self.buffer not in _free_stage(state, r, "cache_read").block.read_buffers():
                raise StepError(f"cache_read: stage {r} ({state.stages[r].name}) does not read {self.buffer!r}")
        cache = f"{self.buffer}_{self.scope}"
        shape = state.shapes[self.buffer]
        state.shapes = {**state.shapes, cache: shape}
        for r in self.reader_stage_ids:
            s = state.stages[r]
            state.stages[r] = replace(s, block=replace(s.block, reads=_rename(s.block.reads, self.buffer, cache)))
        _insert_copy(state, self.stage_id, self.buffer, cache, shape, name=cache)

    def apply_to_schedule(self, replay: Replay) -> None:
        reads = [r.source.name for r in replay.sch.get(replay.blocks[self.stage_id]).reads]
        if self.buffer not in reads:
            raise StepError(f"cache_read: block {replay.state.stages[self.stage_id].name} does not read "
                            f"{self.buffer!r}")
        new = P.cache_read(replay.sch, replay.blocks[self.stage_id], reads.index(self.buffer), self.scope,
                           consumer_blocks=[replay.blocks[r] for r in self.reader_stage_ids])
        replay.blocks.insert(self.stage_id, new)

    def to_code(self, names: CodeNames) -> str:
        readers = ", ".join(names.block(r) for r in self.reader_stage_ids)
        return (f'{ident(self.buffer + "_" + self.scope)} = sch.cache_read({names.block(self.stage_id)}, '
                f'"{self.buffer}", "{self.scope}", consumer_blocks=[{readers}])')


@dataclass(frozen=True, slots=True)
class CacheWriteStep(Step):
    """Compute the stage into a ``scope`` cache; a write-back stage is added right after it."""

    stage_id: int
    scope: str
    TAG: ClassVar[str] = "CHW"
    NEW_STAGE: ClassVar[Optional[int]] = 1

    def apply_to_state(self, state: "State") -> None:
        stage = _free_stage(state, self.stage_id, "cache_write")
        out = stage.block.writes[0].buffer
        cache = f"{out}_{self.scope}"
        shape = state.shapes[out]
        state.shapes = {**state.shapes, cache: shape}
        state.stages[self.stage_id] = replace(stage, block=replace(
            stage.block, writes=_rename(stage.block.writes, out, cache)))
        _insert_copy(state, self.stage_id + 1, cache, out, shape, name=cache)

    def apply_to_schedule(self, replay: Replay) -> None:
        replay.blocks.insert(self.stage_id + 1, P.cache_write(replay.sch, replay.blocks[self.stage_id], 0, self.scope))

    def to_code(self, names: CodeNames) -> str:
        out = names.state.stages[self.stage_id].block.writes[0].buffer
        return f'{ident(out + "_" + self.scope)} = sch.cache_write({names.block(self.stage_id)}, 0, "{self.scope}")'


@dataclass(frozen=True, slots=True)
class RfactorStep(Step):
    """Factor reduction iterator ``iter_id`` out into a new ``<name>_rf`` stage placed before the stage.

    ``factor_iter_id`` is where the factored axis goes in the new intermediate buffer.
    """

    stage_id: int
    iter_id: int
    factor_iter_id: int
    TAG: ClassVar[str] = "RF"
    NEW_STAGE: ClassVar[Optional[int]] = 0

    def apply_to_state(self, state: "State") -> None:
        stage = _free_stage(state, self.stage_id, "rfactor")
        it = state.checked_iter(self.stage_id, self.iter_id)
        if it.kind != IterKind.REDUCE:
            raise StepError(f"rfactor needs a reduction iterator; {it.name} of {stage.name} is {it.kind}")
        if any(i.kind == IterKind.MIXED for i in stage.iters):
            raise StepError(f"rfactor of {stage.name}: a loop fuses spatial and reduce iterators")
        out = stage.block.writes[0]
        rank = len(out.indices)
        if not 0 <= self.factor_iter_id <= rank:
            raise StepError(f"rfactor factor_iter_id {self.factor_iter_id} must be in 0..{rank}")
        # TensorIR gives the factored loop a spatial variable and every other reduce loop a variable of its own.
        reduce = [k for k, i in enumerate(stage.iters) if i.kind == IterKind.REDUCE]
        new_var = {k: f"v{stage.iters[k].name}" for k in reduce}
        rf_var = new_var[self.iter_id]
        mapping: dict[str, Optional[Affine]] = {}
        terms: dict[str, list[tuple[str, int]]] = {}
        for k in reduce:
            parts = stage.iters[k].parts
            for p in parts:
                terms.setdefault(p.var, []).append((new_var[k], p.stride))
            if len(parts) > 1:
                for p in parts:
                    mapping[p.var] = None
        for var, t in terms.items():
            mapping.setdefault(var, Affine(tuple(t), 0))
        spatial = [v for v in stage.block.vars if v.kind == IterKind.SPATIAL]
        rf_vars = (BlockVar(rf_var, IterKind.SPATIAL, it.extent or 1), *spatial,
                   *(BlockVar(new_var[k], IterKind.REDUCE, stage.iters[k].extent or 1)
                     for k in reduce if k != self.iter_id))
        rf_index = out.indices[:self.factor_iter_id] + (Affine.var(rf_var),) + out.indices[self.factor_iter_id:]
        rf_buffer = f"{out.buffer}_rf"
        shape = state.shapes[out.buffer]
        state.shapes = {**state.shapes, rf_buffer: shape[:self.factor_iter_id] + (it.extent or 1,)
                        + shape[self.factor_iter_id:]}
        rf_reads = tuple(a.substitute(mapping) for a in stage.block.reads)
        rf_iters = tuple(
            replace(i, kind=IterKind.SPATIAL if k == self.iter_id else i.kind,
                    parts=(LoopPart(new_var[k], 1, i.extent),) if k in new_var else i.parts)
            for k, i in enumerate(stage.iters))
        rf_stage = Stage(f"{stage.name}_rf", rf_iters, BlockInfo(rf_vars, rf_reads, (Access(rf_buffer, rf_index),)))
        keep = [k for k, i in enumerate(stage.iters) if i.kind == IterKind.SPATIAL or k == self.iter_id]
        wb_iters = tuple(replace(stage.iters[k], annotation="none",
                                 parts=(LoopPart(rf_var, 1, it.extent),) if k == self.iter_id else stage.iters[k].parts)
                         for k in keep)
        wb_block = BlockInfo((BlockVar(rf_var, IterKind.REDUCE, it.extent or 1), *spatial),
                             (Access(rf_buffer, rf_index),), stage.block.writes)
        state.stages[self.stage_id] = replace(stage, iters=wb_iters, block=wb_block)
        state.insert_stage(self.stage_id, rf_stage)

    def apply_to_schedule(self, replay: Replay) -> None:
        loop = replay.loops(self.stage_id)[self.iter_id]
        replay.blocks.insert(self.stage_id, P.rfactor(replay.sch, loop, self.factor_iter_id))

    def to_code(self, names: CodeNames) -> str:
        rf = ident(names.state.stages[self.stage_id].name + "_rf")
        return f"{rf} = sch.rfactor({names.loop(self.stage_id, self.iter_id)}, {self.factor_iter_id})"


def _free_stage(state: "State", stage_id: int, what: str) -> Stage:
    """CHW/CHR/RF need a stage alone in its root loop nest: TensorIR puts the new block elsewhere otherwise."""
    stage = state.checked_stage(stage_id)
    if stage.compute_at != AttachKind.ROOT or state.attached_to(stage_id):
        raise StepError(f"{what} of stage {stage_id} ({stage.name}) needs it at the root with no stage "
                        "computed at its loops; add caches and rfactors before compute_at")
    return stage


def _rename(accesses: tuple[Access, ...], old: str, new: str) -> tuple[Access, ...]:
    return tuple(Access(new, a.indices) if a.buffer == old else a for a in accesses)


def _insert_copy(state: "State", index: int, src: str, dst: str, shape: tuple[int, ...], name: str) -> None:
    """Insert a stage ``name`` copying ``src`` to ``dst`` element for element, one loop per dimension."""
    vars_ = tuple(BlockVar(f"v{d}", IterKind.SPATIAL, n) for d, n in enumerate(shape))
    index_ = tuple(Affine.var(v.name) for v in vars_)
    block = BlockInfo(vars_, (Access(src, index_),), (Access(dst, index_),))
    loops = tuple(Iterator(f"ax{k}", v.extent, v.kind, parts=(LoopPart(v.name, 1, v.extent),))
                  for k, v in enumerate(vars_))
    state.insert_stage(index, Stage(name, loops, block))
