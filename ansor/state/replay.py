"""The second interpreter of the step list: replay onto ``tvm.s_tir.Schedule``.

Each step applies itself (:meth:`~ansor.state.transform_steps.Step.apply_to_schedule`) while a Python
:class:`~ansor.state.loop_state.State` is advanced in lockstep, which tells the steps which loops a stage owns
and which way a ``CA`` goes. TVM validates every primitive, so a replayed schedule is a legal program; any
TVM refusal becomes a :class:`StepError` that names the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import tvm

from .access import IterKind
from ..errors import StepError, short_message
from .layout_rewrite import PREPROC_ANNOTATION, packed_layout
from .loop_nest import AttachKind
from .loop_state import State
from .tensor_intrin import TENSORIZE, register
from .transform_steps import P, Replay, Step, step_to_json

if TYPE_CHECKING:
    from .compute_dag import ComputeDAG


def replay(dag: "ComputeDAG", steps: Sequence[Step], verify: bool = False) -> tvm.s_tir.Schedule:
    """Build the schedule ``steps`` describe. ``verify`` also checks every loop extent against the State.

    Then each reduction's initialisation is hoisted out of its reduction loops (``decompose_reduction``;
    not a reduction across GPU threads, :func:`_first_reduction_loops`):
    left inside, it is a ``k == 0`` branch in the innermost loop that blocks vectorization and costs a
    factor of two on matmul; and a vectorized loop whose length is not a power of two is vectorized in
    power-of-two pieces (:func:`_split_wide_vectors`). Neither is a step: they never change the loop
    structure the search sees.
    """
    sch = tvm.s_tir.Schedule(dag.mod)
    state = State.initial(dag)
    rp = Replay(sch, state, [P.get_sblock(sch, s.name) for s in state.stages])
    for step in steps:
        try:
            step.apply_to_schedule(rp)
        except StepError:
            raise
        except Exception as err:  # TVM reports schedule errors as RuntimeError/ValueError/TypeError
            raise StepError(f"TVM rejected step {step_to_json(step)}: {short_message(err)}") from None
        state.apply(step)
        if verify:
            _check(rp, step)
    reductions = _first_reduction_loops(rp)  # first: the vector split adds a loop, shifting rp.loops' indices
    _split_wide_vectors(rp)
    _decompose_reductions(rp, reductions)
    try:
        _rewrite_layouts(rp)
    except StepError:
        raise
    except Exception as err:  # TVM refuses a layout it cannot prove bijective, and the like
        raise StepError(f"TVM rejected a layout rewrite: {short_message(err)}") from None
    _tensorize(rp)
    return sch


def _tensorize(rp: Replay) -> None:
    """Apply the ``TZ`` steps: each marked loop and the loops inside it become one intrinsic call."""
    for sid, stage in enumerate(rp.state.stages):
        for k, it in enumerate(stage.iters):
            if it.annotation.startswith(TENSORIZE):
                register()
                intrin = it.annotation[len(TENSORIZE):]
                try:
                    P.tensorize(rp.sch, rp.loops(sid)[k], intrin)
                except Exception as err:  # TensorIR's matcher names the first mismatch
                    raise StepError(f"TVM could not tensorize {stage.name} with {intrin}: "
                                    f"{short_message(err)}") from None


def _rewrite_layouts(rp: Replay) -> None:
    """Apply the ``LR`` steps: each packed argument is read through a copy in the stage's loop order.

    A constant argument's copy is marked as TVM's layout-rewrite preprocessing, which a network build moves
    out of the kernel and folds; a runtime input's copy is scheduled to run in parallel inside the kernel.
    """
    sch, state = rp.sch, rp.state
    for sid, stage in enumerate(state.stages):
        for buffer in stage.packed:
            layout = packed_layout(state, sid, buffer)
            reads = [r.source for r in sch.get(rp.blocks[sid]).reads]
            index = next((k for k, r in enumerate(reads) if r.name == buffer), None)
            if index is None:
                raise StepError(f"layout rewrite: block {stage.name} does not read {buffer!r}")
            index_map = layout.index_map(str(reads[index].shape[0].ty))
            copy = P.cache_read(sch, rp.blocks[sid], index, "global")
            P.transform_layout(sch, rp.blocks[sid], ("read", index), index_map)
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


def _first_reduction_loops(rp: Replay) -> dict[int, object]:
    """The outermost reduction loop of each stage that has one: where its initialisation goes.

    Not a reduction bound to GPU threads: TVM turns it into a cross-thread reduction only while its block
    keeps its initialisation; decomposed, every thread adds into one accumulator (a race: on an H200 all
    of ResNet-50's classifier candidates with more than one thread computed wrong outputs).
    """
    out = {}
    for sid, stage in enumerate(rp.state.stages):
        first_reduce = next((k for k, it in enumerate(stage.iters) if it.kind != IterKind.SPATIAL), None)
        if stage.compute_at != AttachKind.INLINED and first_reduce is not None and not stage.reduces_across_threads:
            out[sid] = rp.loops(sid)[first_reduce]
    return out


def _decompose_reductions(rp: Replay, loops: dict[int, object]) -> None:
    for sid, loop in loops.items():
        try:
            P.decompose_reduction(rp.sch, rp.blocks[sid], loop)
        except Exception:  # TVM refuses some shapes (e.g. under a thread binding); the init then stays
            continue


def _split_wide_vectors(rp: Replay) -> None:
    """Vectorize a loop of ``n`` iterations, ``n`` not a power of two, as ``n / p`` unrolled vectors of ``p``
    lanes (``p`` the largest power of two dividing ``n``; odd lengths stay as they are).

    Why: TVM vectorizes the whole loop as one ``n``-lane vector, and a 24-lane one (three AVX2 registers)
    came out as scalar loads gathered into vectors: BERT-base's 128 x 3072 x 768 dense with 4 x 24 register
    blocks ran at 19 GFLOPS, 10x slower than with 4 x 16, which is why the search never kept the 12-
    accumulator blocks that 768-, 2304- and 3072-wide layers allow. As 3 x 8 lanes, a 128 x 768 x 768 matmul
    in 4 x 24 blocks ran at 142 GFLOPS against 124 in 4 x 16 (AMD EPYC Zen 3, 2 threads).
    """
    for sid, stage in enumerate(rp.state.stages):
        if stage.compute_at == AttachKind.INLINED:
            continue
        for it, loop in zip(stage.iters, rp.loops(sid)):
            n = it.extent
            if it.annotation != "vectorize" or n is None or n & (n - 1) == 0 or n & -n < 2:
                continue
            outer, inner = P.split(rp.sch, loop, factors=[None, n & -n], preserve_unit_iters=True)
            P.unroll(rp.sch, outer)
            P.vectorize(rp.sch, inner)


def _check(rp: Replay, step: Step) -> None:
    """Both interpreters must agree on every live stage's loops; a mismatch is a bug in ours."""
    for sid, stage in enumerate(rp.state.stages):
        if stage.compute_at == AttachKind.INLINED:
            continue
        loops = P.get_loops(rp.sch, rp.blocks[sid])
        extents = [int(rp.sch.get(l).extent) for l in loops[len(loops) - len(stage.iters):]]
        ours = [it.extent for it in stage.iters]
        if len(loops) < len(stage.iters) or any(o is not None and o != e for o, e in zip(ours, extents)):
            raise StepError(f"after {step_to_json(step)}: stage {stage.name} has loops {extents} in TensorIR "
                            f"but {ours} in the State")
