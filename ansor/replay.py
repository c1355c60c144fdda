"""The second interpreter of the step list: replay onto ``tvm.s_tir.Schedule``.

The Python :class:`~ansor.loop_state.State` is advanced in lockstep, which tells us which loops a stage owns
(the innermost ``len(stage.iters)`` of ``get_loops``) and which way a ``CA`` goes. TVM validates every
primitive, so a replayed schedule is a legal program; any TVM refusal becomes a :class:`StepError` that
names the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import tvm

from .errors import StepError
from .layout_rewrite import PREPROC_ANNOTATION, packed_layout
from .loop_state import State
from .transform_steps import (
    AnnotationStep, CacheReadStep, CacheWriteStep, ComputeAtStep, ComputeInlineStep, ComputeRootStep,
    FollowFusedSplitStep, FollowSplitStep, FuseStep, LayoutRewriteStep, PragmaStep, ReorderStep, RfactorStep,
    SplitStep, Step, StorageAlignStep, split_lengths, step_to_json,
)

if TYPE_CHECKING:
    from .compute_dag import ComputeDAG



class _Prims:
    """Schedule primitives without the Python-side argument type checker.

    ``tvm.s_tir.Schedule`` wraps every primitive in a runtime type check that costs about half of a
    replay; our arguments are built by this module, and TVM's C++ side still validates each schedule.
    """

    def __getattr__(self, name: str):
        fn = getattr(tvm.s_tir.Schedule, name)
        fn = getattr(fn, "__wrapped__", fn)
        setattr(self, name, fn)
        return fn


P = _Prims()
_THREAD_AXES = ("vthread", "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def replay(dag: "ComputeDAG", steps: Sequence[Step], verify: bool = False,
           postprocess: bool = True) -> tvm.s_tir.Schedule:
    """Build the schedule ``steps`` describe. ``verify`` also checks every loop extent against the State.

    ``postprocess`` then hoists each reduction's initialisation out of its reduction loops
    (``decompose_reduction``): left inside, it is a ``k == 0`` branch in the innermost loop that blocks
    vectorization and costs a factor of two on matmul. It is not a step: it never changes the loop
    structure the search sees.
    """
    sch = tvm.s_tir.Schedule(dag.mod)
    state = State.initial(dag)
    blocks = [P.get_sblock(sch, s.name) for s in state.stages]
    for step in steps:
        try:
            _apply(sch, state, blocks, step)
        except StepError:
            raise
        except Exception as err:  # TVM reports schedule errors as RuntimeError/ValueError/TypeError
            raise StepError(f"TVM rejected step {step_to_json(step)}: {_reason(err)}") from None
        state.apply(step)
        if verify:
            _check(sch, state, blocks, step)
    if postprocess:
        _decompose_reductions(sch, state, blocks)
    try:
        _rewrite_layouts(sch, state, blocks)
    except StepError:
        raise
    except Exception as err:  # TVM refuses a layout it cannot prove bijective, and the like
        raise StepError(f"TVM rejected a layout rewrite: {_reason(err)}") from None
    return sch


def _rewrite_layouts(sch: tvm.s_tir.Schedule, state: State, blocks: list) -> None:
    """Apply the ``LR`` steps: each packed argument is read through a copy in the stage's loop order.

    A constant argument's copy is marked as TVM's layout-rewrite preprocessing, which a network build moves
    out of the kernel and folds; a runtime input's copy is scheduled to run in parallel inside the kernel.
    """
    for sid, stage in enumerate(state.stages):
        for buffer in stage.packed:
            layout = packed_layout(state, sid, buffer)
            reads = [r.source for r in sch.get(blocks[sid]).reads]
            index = next((k for k, r in enumerate(reads) if r.name == buffer), None)
            if index is None:
                raise StepError(f"layout rewrite: block {stage.name} does not read {buffer!r}")
            index_map = layout.index_map(str(reads[index].shape[0].ty))
            copy = P.cache_read(sch, blocks[sid], index, "global")
            P.transform_layout(sch, blocks[sid], ("read", index), index_map)
            if buffer in state.dag.layout_free:
                P.annotate(sch, copy, PREPROC_ANNOTATION, 1)
            else:
                _schedule_copy(sch, copy, index_map, layout.dims[-1].extent)


def _schedule_copy(sch: tvm.s_tir.Schedule, copy, index_map, innermost: int) -> None:
    """Walk a runtime packing copy in packed order: outer dimensions in parallel, the innermost vectorized."""
    P.transform_block_layout(sch, copy, index_map)
    loops = P.get_loops(sch, copy)
    if len(loops) > 1:
        P.parallel(sch, P.fuse(sch, *loops[:-1]) if len(loops) > 2 else loops[0])
    if 1 < innermost <= 64:
        P.vectorize(sch, P.get_loops(sch, copy)[-1])


def _decompose_reductions(sch: tvm.s_tir.Schedule, state: State, blocks: list) -> None:
    for sid, stage in enumerate(state.stages):
        first_reduce = next((k for k, it in enumerate(stage.iters) if it.kind != "S"), None)
        if stage.compute_at == "inline" or first_reduce is None:
            continue
        loop = _own_loops(sch, state, blocks, sid)[first_reduce]
        try:
            P.decompose_reduction(sch, blocks[sid], loop)
        except Exception:  # TVM refuses some shapes (e.g. under a thread binding); the init then stays
            continue


def _reason(err: Exception) -> str:
    """The one informative line of a TVM schedule error (it prints the whole IR around it)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Error message:"):
            return line[len("Error message:"):].strip()
    return lines[-1] if lines else type(err).__name__


def _own_loops(sch: tvm.s_tir.Schedule, state: State, blocks: list, stage_id: int) -> list:
    n = len(state.stages[stage_id].iters)
    loops = P.get_loops(sch, blocks[stage_id])
    return list(loops[len(loops) - n:]) if n else []


def _apply(sch: tvm.s_tir.Schedule, state: State, blocks: list, step: Step) -> None:
    sid = step.stage_id
    if isinstance(step, (SplitStep, FollowSplitStep, FollowFusedSplitStep)):
        lengths, inner_to_outer = split_lengths(step, state.steps)
        if any(v is None for v in lengths):
            raise StepError(f"step {step_to_json(step)} has unfilled split lengths {list(lengths)}")
        loop = _own_loops(sch, state, blocks, sid)[step.iter_id]
        factors = [None, *lengths] if inner_to_outer else [*lengths, None]
        P.split(sch, loop, factors=factors, preserve_unit_iters=True)
    elif isinstance(step, ReorderStep):
        loops = _own_loops(sch, state, blocks, sid)
        moved = [k for k, old in enumerate(step.after_ids) if old != k]
        if moved:
            P.reorder(sch, *[loops[step.after_ids[k]] for k in range(moved[0], moved[-1] + 1)])
    elif isinstance(step, FuseStep):
        loops = _own_loops(sch, state, blocks, sid)
        P.fuse(sch, *[loops[k] for k in step.fused_ids], preserve_unit_iters=True)
    elif isinstance(step, AnnotationStep):
        loop = _own_loops(sch, state, blocks, sid)[step.iter_id]
        if step.annotation == "parallel":
            P.parallel(sch, loop)
        elif step.annotation == "vectorize":
            P.vectorize(sch, loop)
        elif step.annotation == "unroll":
            P.unroll(sch, loop)
        elif step.annotation in _THREAD_AXES:
            P.bind(sch, loop, "vthread.x" if step.annotation == "vthread" else step.annotation)
    elif isinstance(step, PragmaStep):
        loop = _own_loops(sch, state, blocks, sid)[step.iter_id]
        name, _, value = step.pragma.partition("$")
        P.annotate(sch, loop, f"pragma_{name}", int(value))
        if name == "auto_unroll_max_step":
            P.annotate(sch, loop, "pragma_unroll_explicit", 1)
    elif isinstance(step, StorageAlignStep):
        P.storage_align(sch, blocks[sid], 0, step.axis, step.factor, step.offset)
    elif isinstance(step, ComputeAtStep):
        loop = _own_loops(sch, state, blocks, step.target_stage_id)[step.target_iter_id]
        primitive = getattr(P, _compute_at_primitive(state, step))
        primitive(sch, blocks[sid], loop, preserve_unit_loops=True)
    elif isinstance(step, ComputeInlineStep):
        P.compute_inline(sch, blocks[sid])
    elif isinstance(step, ComputeRootStep):
        pass  # a statement of intent: the State rejects it for an attached stage
    elif isinstance(step, CacheReadStep):
        reads = [r.source.name for r in sch.get(blocks[sid]).reads]
        if step.buffer not in reads:
            raise StepError(f"cache_read: block {state.stages[sid].name} does not read {step.buffer!r}")
        new = P.cache_read(sch, blocks[sid], reads.index(step.buffer), step.scope,
                             consumer_blocks=[blocks[r] for r in step.reader_stage_ids])
        blocks.insert(sid, new)
    elif isinstance(step, CacheWriteStep):
        blocks.insert(sid + 1, P.cache_write(sch, blocks[sid], 0, step.scope))
    elif isinstance(step, RfactorStep):
        loop = _own_loops(sch, state, blocks, sid)[step.iter_id]
        blocks.insert(sid, P.rfactor(sch, loop, step.factor_iter_id))
    elif isinstance(step, LayoutRewriteStep):
        pass  # applied after every other step, when the stage's loops are final (_rewrite_layouts)
    else:
        raise StepError(f"not a transform step: {step!r}")


def _compute_at_primitive(state: State, step: ComputeAtStep) -> str:
    """``compute_at`` when the target consumes the stage, else ``reverse_compute_at`` (see transform_steps)."""
    stage, target = state.stages[step.stage_id], state.stages[step.target_stage_id]
    feeds = set(stage.block.write_buffers()) & set(target.block.read_buffers())
    return "compute_at" if feeds else "reverse_compute_at"


def _check(sch: tvm.s_tir.Schedule, state: State, blocks: list, step: Step) -> None:
    """Both interpreters must agree on every live stage's loops; a mismatch is a bug in ours."""
    for sid, stage in enumerate(state.stages):
        if stage.compute_at == "inline":
            continue
        loops = P.get_loops(sch, blocks[sid])
        extents = [int(sch.get(l).extent) for l in loops[len(loops) - len(stage.iters):]]
        ours = [it.extent for it in stage.iters]
        if len(loops) < len(stage.iters) or any(o is not None and o != e for o, e in zip(ours, extents)):
            raise StepError(f"after {step_to_json(step)}: stage {stage.name} has loops {extents} in TensorIR "
                            f"but {ours} in the State")


def steps_to_code(dag: "ComputeDAG", steps: Sequence[Step]) -> str:
    """Readable ``s_tir.Schedule`` code for a step list, named after the state's stages and loops."""
    state = State.initial(dag)
    lines = [f'{_ident(s.name)} = sch.get_sblock("{s.name}")' for s in state.stages]

    def loops_line(sid: int) -> str:
        stage = state.stages[sid]
        names = ", ".join(_ident(f"{stage.name}_{it.name}") for it in stage.iters)
        return f"{'*_, ' if stage.compute_at != 'root' else ''}{names}{',' if len(stage.iters) == 1 else ''} " \
               f"= sch.get_loops({_ident(stage.name)})"

    lines += [loops_line(i) for i in range(len(state.stages))]
    for step in steps:
        sid = step.stage_id
        stage = state.stages[sid]
        loop = (lambda k: _ident(f"{stage.name}_{stage.iters[k].name}"))
        blk = _ident(stage.name)
        if isinstance(step, (SplitStep, FollowSplitStep, FollowFusedSplitStep)):
            lengths, inner = split_lengths(step, state.steps)
            factors = [None, *lengths] if inner else [*lengths, None]
            code = f"sch.split({loop(step.iter_id)}, factors={factors})"
        elif isinstance(step, ReorderStep):
            code = f"sch.reorder({', '.join(loop(k) for k in step.after_ids)})"
        elif isinstance(step, FuseStep):
            code = f"sch.fuse({', '.join(loop(k) for k in step.fused_ids)})"
        elif isinstance(step, AnnotationStep):
            prim = {"parallel": "parallel", "vectorize": "vectorize", "unroll": "unroll"}.get(step.annotation)
            code = (f"sch.{prim}({loop(step.iter_id)})" if prim
                    else f'sch.bind({loop(step.iter_id)}, "{step.annotation}")')
        elif isinstance(step, PragmaStep):
            name, _, value = step.pragma.partition("$")
            code = f'sch.annotate({loop(step.iter_id)}, "pragma_{name}", {value})'
        elif isinstance(step, StorageAlignStep):
            code = f"sch.storage_align({blk}, 0, {step.axis}, {step.factor}, {step.offset})"
        elif isinstance(step, ComputeAtStep):
            target = state.stages[step.target_stage_id]
            prim = _compute_at_primitive(state, step)
            tloop = _ident(f"{target.name}_{target.iters[step.target_iter_id].name}")
            code = f"sch.{prim}({blk}, {tloop}, preserve_unit_loops=True)"
        elif isinstance(step, ComputeInlineStep):
            code = f"sch.compute_inline({blk})"
        elif isinstance(step, ComputeRootStep):
            code = f"# {stage.name} stays at the root"
        elif isinstance(step, CacheReadStep):
            readers = ", ".join(_ident(state.stages[r].name) for r in step.reader_stage_ids)
            code = (f'{_ident(step.buffer + "_" + step.scope)} = sch.cache_read({blk}, "{step.buffer}", '
                    f'"{step.scope}", consumer_blocks=[{readers}])')
        elif isinstance(step, CacheWriteStep):
            out = stage.block.writes[0].buffer
            code = f'{_ident(out + "_" + step.scope)} = sch.cache_write({blk}, 0, "{step.scope}")'
        elif isinstance(step, LayoutRewriteStep):
            code = f"# {stage.name} reads {step.buffer} packed in its loop order (after every other step)"
        else:
            code = f"{_ident(stage.name + '_rf')} = sch.rfactor({loop(step.iter_id)}, {step.factor_iter_id})"
        before = len(state.stages)
        state.apply(step)
        if isinstance(step, (SplitStep, FollowSplitStep, FollowFusedSplitStep, FuseStep, ReorderStep)):
            lines += [code, loops_line(sid)]
        elif isinstance(step, ComputeAtStep) or len(state.stages) != before:
            lines.append(code)
            lines += [loops_line(i) for i in range(len(state.stages)) if state.stages[i].compute_at != "inline"
                      and (i == sid or len(state.stages) != before)]
        else:
            lines.append(code)
    return "\n".join(lines)


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
