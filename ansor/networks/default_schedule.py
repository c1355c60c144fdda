"""The schedule a PrimFunc gets when nothing better is known: parallel outer loops, vector inner loops.

TVM compiles an unscheduled PrimFunc as naive single-threaded scalar loops. A network where only some
tasks were tuned (or none: a quick first build) should still use every core and the vector unit, so every
untuned PrimFunc gets this cheap, safe schedule instead:

* element-wise stages that are not outputs are inlined into their consumers;
* a reduction (convolution, matmul, pooling) keeps its innermost contiguous spatial loop (output
  channels in NHWC) innermost, split to the vector width, below the reduction loops: each reduction step
  is then one vector multiply-add;
* outer spatial loops are fused until there is enough parallelism (Ansor's rule: more than 16 per core)
  and run in parallel; the innermost contiguous spatial loop of every stage is vectorized;
* a reduction reads its constant weights packed in its loop order (:mod:`ansor.state.layout_rewrite`), which the
  network build folds, so it costs nothing at inference.

The schedule is an ansor :class:`~ansor.state.loop_state.State` built from our own steps, so it is printable,
loggable and replayable like a tuned one. PrimFuncs that :class:`~ansor.state.compute_dag.ComputeDAG` cannot
analyse get the same idea applied with ``tvm.s_tir.Schedule`` directly (:func:`default_tir_schedule`).
"""

from __future__ import annotations

import logging
import math
import random
from typing import Callable, Optional

import tvm
from tvm import sym
from tvm.ir.expr import TensorLoad

from ..state.access import IterKind
from ..state.compute_dag import branch_periods
from ..errors import AnsorError, StepError
from ..state.layout_rewrite import packable_arguments
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..target import device_kind
from ..task.search_task import SearchTask
from ..sketch.tensor_rules import fitting_intrinsics, is_bf16_product, product_loops, tile_around
from ..sketch.annotation import (
    MAX_VECTORIZE_LANES, annotate_parallel, annotate_vectorize, branch_run_lanes, contiguous,
    largest_divisor_at_most,
)

logger = logging.getLogger("ansor")

#: Auto-unroll limit put on reduction stages: unrolls small kernel windows (3x3), not whole reductions.
UNROLL_STEPS = 16
#: Output rows (columns of an NHWC image, rows of a matmul) a reduction computes at once from registers.
REGISTER_ROWS = 8
#: A bf16 product's register block: rows by 16-channel dot products, 12 accumulators of the 32 zmm
#: registers (vdpbf16ps: latency 5-6 cycles on two ports wants about 10 in flight). Not yet timed.
DOT_ROWS, DOT_COLUMNS = 6, 2
#: Where the target has AMX: output tiles a reduction step updates, rows by columns (oneDNN's 2 x 2: each A and
#: B tile loaded serves two products, codegen's amx_tiles keeps all four in tile registers). Not yet timed.
TILE_ROWS, TILE_COLUMNS = 2, 2


def default_state(task: SearchTask) -> State:
    """A validated default schedule of ``task`` as a State (weaker variants if TVM rejects the full one).

    Raises
    ------
    AnsorError
        If not even the parallel-only variant replays (:func:`default_tir_schedule` is the way out).
    """
    errors = []
    for variant in (_dot_products, _packed_vector_parallel, _vector_parallel, _parallel_only):
        try:
            state = variant(task)
            task.compute_dag.replay(state)  # TVM checks every primitive: only legal schedules pass
            return state
        except StepError as err:
            errors.append(f"{variant.__name__.strip('_')}: {err}")
            logger.debug("default schedule of %s: %s", task.desc, err)
    raise AnsorError(f"no default schedule fits {task.desc}: {'; '.join(errors)}")


def _inline_elementwise(state: State) -> None:
    for sid, ds in enumerate(state.dag.stages):
        if ds.strictly_inlineable:
            try:
                state.compute_inline(sid)
            except StepError:
                continue


def _register_tile_reduction(task: SearchTask, state: State, stage_id: int) -> None:
    """Move a small spatial tile below the reduction loops: ``S... R... s v`` (``v`` vector lanes).

    ``v`` is a vector-width piece of the innermost contiguous spatial loop (output channels in NHWC) and
    ``s`` a piece of the next spatial loop (output columns), so every reduction step loads one vector of
    the operand that ``v`` walks (weights) and reuses it ``s`` times from registers. Where that loop holds
    at most half of :data:`REGISTER_ROWS` (a 4x4 output), a piece of the loop outside it (output rows) joins
    ``s``: ResNet3D-18's 4x4x512 layers read their 28 MB of weights twice, not four times (1.6-1.8x faster).
    """
    stage = state.stages[stage_id]
    if not any(it.kind == IterKind.REDUCE for it in stage.iters):
        return
    vector = [k for k, it in enumerate(stage.iters)
              if it.kind == IterKind.SPATIAL and (it.extent or 1) > 1 and contiguous(stage, (it,))]
    if not vector:
        return
    pos = vector[-1]
    lanes = state.vector_lanes(stage_id, task.hardware_params.vector_unit_bytes)
    factor = largest_divisor_at_most(stage.iters[pos].extent or 1, lanes)
    if factor == 1:
        return
    others = [k for k in range(pos) if stage.iters[k].kind == IterKind.SPATIAL and (stage.iters[k].extent or 1) > 1]
    pieces = []  # (iterator id, length) of the spatial pieces in registers, outermost first
    rows = largest_divisor_at_most(stage.iters[others[-1]].extent or 1, REGISTER_ROWS) if others else 1
    if rows > 1 and 2 * rows <= REGISTER_ROWS and len(others) > 1:
        outer = largest_divisor_at_most(stage.iters[others[-2]].extent or 1, REGISTER_ROWS // rows)
        if outer > 1:
            pieces.append((others[-2], outer))
    if rows > 1:
        pieces.append((others[-1], rows))
    inner = []  # iterator ids, after the splits below, of the pieces that go innermost
    for k, (row, length) in enumerate(pieces):
        state.split(stage_id, row + k, [length])
        inner.append(row + k + 1)
    pos += len(pieces)
    state.split(stage_id, pos, [factor])
    inner.append(pos + 1)
    n = len(state.stages[stage_id].iters)
    state.reorder(stage_id, [k for k in range(n) if k not in inner] + inner)
    for k in range(len(pieces)):
        state.annotate(stage_id, n - 1 - len(pieces) + k, "unroll")


def _unroll_reductions(state: State) -> None:
    for sid, stage in enumerate(state.stages):
        if stage.compute_at == AttachKind.ROOT and any(it.kind == IterKind.REDUCE for it in stage.iters):
            state.pragma(sid, 0, f"auto_unroll_max_step${UNROLL_STEPS}")


def _vector_parallel(task: SearchTask) -> State:
    state = task.compute_dag.init_state()
    _inline_elementwise(state)
    for sid, stage in enumerate(state.stages):
        if stage.compute_at == AttachKind.ROOT:
            _register_tile_reduction(task, state, sid)
    annotate_parallel(state, task)
    _unroll_reductions(state)
    annotate_vectorize(state, random.Random(0))  # the generator only picks among equally legal fusions
    return state


def _packed_vector_parallel(task: SearchTask) -> State:
    """:func:`_vector_parallel` reading each constant weight packed in its loop order (free at inference)."""
    state = _vector_parallel(task)
    packable = [(sid, buffer) for sid, stage in enumerate(state.stages) if stage.compute_at == AttachKind.ROOT
                for buffer in packable_arguments(state, sid) if buffer in state.dag.layout_free
                and any(it.kind == IterKind.REDUCE for it in stage.iters)]
    if not packable:
        raise StepError("no constant weight to pack")
    for sid, buffer in packable:
        state.layout_rewrite(sid, buffer)
    return state


def _dot_products(task: SearchTask) -> State:
    """Each bf16 product tiled around the target's first intrinsic that fits it (:mod:`ansor.sketch.tensor_rules`):
    AMX tiles, up to :data:`TILE_ROWS` by :data:`TILE_COLUMNS` of them updated by each reduction step, or a
    register block of up to :data:`DOT_ROWS` rows by :data:`DOT_COLUMNS` dot products below the whole
    reduction; parallel outer loops. Raises StepError for a task with no bf16 product."""
    state = task.compute_dag.init_state()
    tiled = 0
    for sid in range(len(state.stages)):
        fits = fitting_intrinsics(task.target, state, sid) if is_bf16_product(state, sid) else []
        if not fits:
            continue
        intrin = fits[0]
        m, q = product_loops(state, sid, intrin)
        iters = state.stages[sid].iters
        rows, columns = (TILE_ROWS, TILE_COLUMNS) if intrin.amx_rows else (DOT_ROWS, DOT_COLUMNS)
        space = [[1] * (2 if intrin.amx_rows else 3) for _ in range(m)]  # the last: the register (tile) block
        space[m - 1][-1] = largest_divisor_at_most((iters[m - 1].extent or 1) // intrin.spatial[-1], columns)
        if m >= 2:
            space[m - 2][-1] = largest_divisor_at_most((iters[m - 2].extent or 1) // (intrin.amx_rows or 1), rows)
        state = tile_around(state, sid, intrin, space, [[1]] * q)
        tiled += 1
    if not tiled:
        raise StepError("no bf16 product")
    _inline_elementwise(state)  # after the tiling: a product's operands are never inlined
    annotate_parallel(state, task)
    _unroll_reductions(state)
    annotate_vectorize(state, random.Random(0))
    return state


def _parallel_only(task: SearchTask) -> State:
    state = task.compute_dag.init_state()
    _inline_elementwise(state)
    annotate_parallel(state, task)
    return state


def default_candidates(task: SearchTask) -> list[State]:
    """The default schedule as a first candidate for tuning (none if it does not fit the task, or if the
    target's default build does not use it: a CUDA network's defaults are dlight's, which are no State)."""
    if device_kind(task.target).default_schedule != "ansor":
        return []
    try:
        return [default_state(task)]
    except AnsorError:
        return []


# ---------------------------------------------------------------------------------------- data movement
def copy_schedule(func: tvm.tirx.PrimFunc, num_cores: int, vector_bytes: int) -> Optional[tvm.tirx.PrimFunc]:
    """A schedule for a PrimFunc that only moves data (reshape, split, transpose, ``take``), or ``None``
    when ``func`` computes something or its accesses are not the simple kinds below.

    Every intermediate block is inlined, so each output element is read straight from the input (a
    reshape's index arithmetic simplifies away once the loop bounds are known). Then each output block
    reads every input either contiguously along its innermost output loop (vectorize that loop) or, for a
    transpose, contiguously along another loop ``u``: ``u`` and the innermost loop are split by the vector
    lanes and the two inner pieces go innermost, ``u``'s vectorized, so each vector load serves one
    lanes x lanes tile that stays in L1 while it is written. An innermost loop an input index divides by a
    constant (a transpose then reshape) is split by it first (:func:`_split_innermost`). Measured on
    BERT-base's attention copies (AMD EPYC Zen 3, 2 threads, each call timed in place in the tuned build):
    the q/k/v split 87 -> 42 us a call (its reshape was a scalar loop), K's [128,768] -> [768,128] transpose
    69 -> 17 us (element by element with 3 KB strides before), the attention output's transpose-then-reshape
    29 -> 15 us. A concatenate (``if_then_else`` of loads) is a copy too, and a single output block of no
    kind above is parallel and vectorized after the inlining (:func:`_plain_plan`): ShuffleNet-V2's channel
    shuffles made its tuned build 16 % slower as whole-buffer passes (Zen 5, 2 threads, in turn). A
    concatenate along the innermost loop is vectorized in runs that each read one input
    (:func:`_vectorize_innermost`).
    """
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        root = sch.get_sblock("root")
    except tvm.s_tir.ScheduleError:
        return None
    if not all(_is_copy(sch.get(b)) for b in sch.get_child_blocks(root)):
        return None
    for block in sch.get_child_blocks(root):
        try:
            sch.compute_inline(block)
        except tvm.s_tir.ScheduleError:  # an output block, or one TVM cannot inline
            continue
    plans = [(block, _copy_plan(sch, block) or _split_innermost(sch, block) or _plain_plan(sch, block))
             for block in sch.get_child_blocks(root)]
    if not plans or any(plan is None for _, plan in plans):
        return None
    try:
        for block, (write_pos, read_pos) in plans:
            _schedule_copy(sch, block, write_pos, read_pos, 16 * num_cores, vector_bytes)
    except tvm.s_tir.ScheduleError as err:  # TVM refused a primitive: the State default decides
        logger.debug("copy schedule refused: %s", err)
        return None
    return sch.mod["main"]


def _schedule_copy(sch: tvm.s_tir.Schedule, block, write_pos: int, read_pos: Optional[int], limit: int,
                   vector_bytes: int) -> None:
    lanes = max(1, vector_bytes * 8 // sch.get(block).writes[0].source.dtype.bits)
    loops = sch.get_loops(block)
    extents = [int(sch.get(loop).extent) for loop in loops]
    if read_pos is None or extents[read_pos] % lanes or extents[write_pos] % lanes:
        _parallel_leading(sch, block, limit)
        _vectorize_innermost(sch, block, _branch_period(sch.get(block)))
        return
    w_outer, w_inner = sch.split(loops[write_pos], [None, lanes])
    r_outer, r_inner = sch.split(loops[read_pos], [None, lanes])
    outer = [loop for k, loop in enumerate(loops) if k not in (read_pos, write_pos)]
    tiles = [loop for _, loop in sorted([(read_pos, r_outer), (write_pos, w_outer)], key=lambda p: p[0])]
    sch.reorder(*outer, *tiles, w_inner, r_inner)
    _parallel_leading(sch, block, limit, keep_inner=2)
    sch.unroll(w_inner)
    sch.vectorize(r_inner)


def _copy_plan(sch: tvm.s_tir.Schedule, block) -> Optional[tuple[int, Optional[int]]]:
    """(position of the innermost output loop, position of the loop a strided input is contiguous in, or
    ``None`` when every input is contiguous or constant along the output's innermost loop); ``None`` when
    the block is not a plain copy of that kind (an index that is not linear in the output's innermost
    loop, loops that are not the block's own or not of constant extent, two different transposed loops)."""
    blk = sch.get(block)
    ivs = [iv.var for iv in blk.iter_vars]
    loops = sch.get_loops(block)
    if len(blk.writes) != 1 or not ivs or len(loops) != len(ivs) or \
            not all(isinstance(sch.get(loop).extent, tvm.tirx.IntImm) for loop in loops):
        return None
    analyzer = sym.Analyzer()
    for iv in blk.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    inner = ivs[-1]
    if _coefficient(analyzer.simplify(blk.writes[0].region[-1].min), inner) != 1:
        return None
    read_pos: Optional[int] = None
    for region in blk.reads:
        index = [analyzer.simplify(r.min) for r in region.region]
        coefs = [_coefficient(i, inner) for i in index]
        if not index or coefs[-1] == 1 or all(c == 0 for c in coefs):
            continue  # contiguous along the output's innermost loop, or constant along it
        pos = next((k for k, v in enumerate(ivs[:-1]) if index[-1].same_as(v)), None)
        if pos is None or read_pos not in (None, pos):
            return None
        read_pos = pos
    return len(ivs) - 1, read_pos


def _plain_plan(sch: tvm.s_tir.Schedule, block) -> Optional[tuple[int, Optional[int]]]:
    """The plan of a copy with reads of no kind :func:`_copy_plan` knows, once every block before it is
    inlined (a channel shuffle: concatenate, reshape, transpose, reshape): its leading loops in parallel and
    its innermost vectorized, one pass over the data. ``None`` when intermediate blocks remain: their own
    passes over buffers of the whole size are what the State default may do better."""
    root = sch.get_sblock("root")
    if len(sch.get_child_blocks(root)) != 1 or len(sch.get(block).writes) != 1:
        return None
    return len(sch.get_loops(block)) - 1, None


def _split_innermost(sch: tvm.s_tir.Schedule, block) -> Optional[tuple[int, Optional[int]]]:
    """Split the block's innermost loop by a constant an input index divides it by (``c // 64``, ``c % 64``
    of a reshape after a transpose) when that turns the block into a copy :func:`_copy_plan` accepts; its
    plan, or ``None`` (the block unchanged)."""
    blk = sch.get(block)
    inner = blk.iter_vars[-1]
    if not isinstance(inner.dom.extent, tvm.tirx.IntImm):
        return None
    extent = int(inner.dom.extent)
    divisors = {d for region in blk.reads for r in region.region for d in _divisors_of(r.min, inner.var)}
    for d in sorted((d for d in divisors if 1 < d < extent and extent % d == 0), reverse=True):
        split = _split_last(len(blk.iter_vars), d, str(inner.var.ty))
        trial = sch.copy()
        trial.transform_block_layout(block, split)
        if _copy_plan(trial, block) is not None:
            sch.transform_block_layout(block, split)
            return _copy_plan(sch, block)
    return None


def _split_last(ndim: int, factor: int, index_dtype: str) -> tvm.tirx.IndexMap:
    """``(..., i) -> (..., i // factor, i % factor)``."""
    return tvm.tirx.IndexMap.from_func(lambda *v: (*v[:-1], v[-1] // factor, v[-1] % factor), ndim=ndim,
                                       index_dtype=index_dtype)


def _divisors_of(expr, var) -> list[int]:
    """Constants ``d`` of every ``x // d`` and ``x % d`` in ``expr`` whose ``x`` uses ``var``."""
    if isinstance(expr, tvm.tirx.Cast):
        return _divisors_of(expr.value, var)
    if not (hasattr(expr, "a") and hasattr(expr, "b")):
        return []
    found = _divisors_of(expr.a, var) + _divisors_of(expr.b, var)
    if isinstance(expr, (tvm.tirx.FloorDiv, tvm.tirx.FloorMod)) and isinstance(expr.b, tvm.tirx.IntImm) and \
            any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(expr.a)):
        found.append(int(expr.b))
    return found


def _is_copy(block) -> bool:
    """A block without reduction that stores an element it loads, or picks one of several it loads
    (concatenate, a pad), integer index arithmetic allowed."""
    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore):
        return False
    integer = str(getattr(body.value, "dtype", "float")).startswith(("int", "uint"))
    return all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in block.iter_vars) and \
        (_picks_loads(body.value) or integer)


def _picks_loads(value) -> bool:
    """A load, or an ``if_then_else``/``Select`` whose branches are loads or constants, one a load at least
    (a concatenate's and a pad's values)."""
    if isinstance(value, TensorLoad):
        return True
    if isinstance(value, tvm.tirx.Select):
        branches = [value.true_value, value.false_value]
    elif isinstance(value, tvm.ir.expr.Call) and str(getattr(value.op, "name", "")).endswith("if_then_else"):
        branches = list(value.args[1:])
    else:
        return False
    constant = (tvm.tirx.IntImm, tvm.tirx.FloatImm)
    return all(isinstance(b, constant) or _picks_loads(b) for b in branches) and \
        not all(isinstance(b, constant) for b in branches)


def _coefficient(expr, var) -> Optional[int]:
    """The coefficient of ``var`` in ``expr`` if ``expr`` is linear in it, else ``None``."""
    found = sym.detect_linear_equation(expr, [var])
    return int(found[0]) if len(found) == 2 and isinstance(found[0], tvm.tirx.IntImm) else None


# ---------------------------------------------------------------------------------------------- raw TIR
def default_tir_schedule(func: tvm.tirx.PrimFunc, num_cores: int) -> tvm.tirx.PrimFunc:
    """Parallel + vectorize with ``s_tir.Schedule`` directly, for PrimFuncs ComputeDAG cannot analyse.

    Each root-level block gets its leading loops fused and parallel (stopping at the first one TVM refuses
    to parallelise, e.g. a reduction) and its innermost loop vectorized if TVM accepts it. Every primitive
    is tried on a copy first, so a refusal leaves the program as it was.
    """
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    try:
        root = sch.get_sblock("root")
    except tvm.s_tir.ScheduleError:  # hand-written (ir_builder) code, e.g. TOPI's scatter: keep it as is
        return func
    limit = 16 * num_cores
    for block in sch.get_child_blocks(root):
        _try(sch, lambda s, b=block: _parallel_leading(s, b, limit))
        _try(sch, lambda s, b=block: _vectorize_innermost(s, b))
    return sch.mod["main"]


def _vectorize_innermost(sch: tvm.s_tir.Schedule, block, period: Optional[int] = None) -> None:
    """Vectorize at most :data:`MAX_VECTORIZE_LANES` iterations of the block's innermost loop (its largest
    divisor up to that), never the whole of a long loop: a 768-wide gather (a transpose of ConvNeXt's
    [1,768,7,7]) is one LLVM vector of 768 floats, which LLVM took over 15 minutes to compile.

    ``period``: the loop's value picks another input only at its multiples (a concatenate). The vectors
    then divide it and their runs are unrolled, so each vector reads one input; across inputs LLVM
    compiles the loads to gathers (:func:`~ansor.sketch.annotation.branch_run_lanes`, as the State
    default's ``vectorize_branch_runs``)."""
    loop = sch.get_loops(block)[-1]
    extent = _const_extent(sch.get(loop).extent, 0)
    factor = largest_divisor_at_most(extent, MAX_VECTORIZE_LANES) if extent > 1 else 1
    runs = branch_run_lanes(period, extent) if period and extent > 1 else 0
    if runs and runs < extent:
        outer, inner = sch.split(loop, [None, runs])
        sch.unroll(outer)
        sch.vectorize(inner)
        return
    if factor <= 1:
        return
    if factor < extent:
        loop = sch.split(loop, [None, factor])[-1]
    sch.vectorize(loop)


def _branch_period(block) -> Optional[int]:
    """The period along the block's innermost variable at whose multiples alone its ``if_then_else`` and
    ``Select`` conditions can change (:func:`~ansor.state.compute_dag.branch_periods`), or ``None``."""
    name = block.iter_vars[-1].var.name
    periods: dict[str, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.tirx.Select):
            branch_periods(expr.condition, {name}, periods)
            children = [expr.true_value, expr.false_value]
        elif isinstance(expr, tvm.ir.expr.Call):
            if str(getattr(expr.op, "name", "")).endswith("if_then_else"):
                branch_periods(expr.args[0], {name}, periods)
            children = list(expr.args)
        elif isinstance(expr, tvm.tirx.Cast):
            children = [expr.value]
        else:
            children = [getattr(expr, "a", None), getattr(expr, "b", None)]
        for child in children:
            if isinstance(child, tvm.ir.expr.Expr):
                visit(child)

    visit(block.body.value)
    return periods.get(name)


def _parallel_leading(sch: tvm.s_tir.Schedule, block, limit: int, keep_inner: int = 1) -> None:
    """Fuse the block's leading loops (never its ``keep_inner`` innermost) until they reach ``limit``
    iterations, and run them in parallel."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [_const_extent(sch.get(l).extent, limit + 1) for l in loops]
    n = 1
    while n < len(loops) - keep_inner and math.prod(extents[:n]) <= limit:
        n += 1
    for k in range(n, 0, -1):  # the widest prefix TVM accepts as one parallel loop
        trial = sch.copy()
        try:
            fused = trial.fuse(*trial.get_loops(block)[:k]) if k > 1 else trial.get_loops(block)[0]
            trial.parallel(fused)
        except Exception:  # TVM refuses loops that carry a reduction or that other blocks share
            continue
        fused = sch.fuse(*loops[:k]) if k > 1 else loops[0]
        sch.parallel(fused)
        return


def _const_extent(extent, default: int) -> int:
    try:
        return int(extent)
    except TypeError:  # a symbolic extent: treat it as plenty of parallelism
        return default


def _try(sch: tvm.s_tir.Schedule, primitive: Callable[[tvm.s_tir.Schedule], None]) -> None:
    trial = sch.copy()
    try:
        primitive(trial)
    except Exception:  # an illegal primitive: keep the schedule without it
        return
    primitive(sch)
