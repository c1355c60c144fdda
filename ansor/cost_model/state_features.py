"""Per-store features read off the loop State itself, with no replay and no TVM call.

TVM's C++ ``PerStoreFeature`` needs each state replayed onto an ``s_tir.Schedule`` first (~1.75 ms for
matmul in Python) and then costs 1.6 ms (matmul) to 7 ms (conv) per program, while the search scores ~750
programs a round. Our :class:`~ansor.state.loop_state.State` already holds what Ansor's C++ extractor read from
its lowered program: every loop with its extent, annotation, pragma and the block variables it walks
(with strides), and every access as an affine index. So one row per live stage (a store of the lowered
program) is computed here in Python at a fraction of that cost (``scripts/bench/bench_cost_model.py``).

A stage's loop nest is its own loops under the loops of the stages it is computed at; those outer loops
are translated into the stage's own variables through the buffer the two stages share, so footprints
and strides are exact for the usual tiled nests (TensorIR's bounding boxes, like
:func:`~ansor.state.access.var_ranges`).

Row layout (``FEATURE_NAMES`` names every column; counts and sizes are ``log2(1 + x)``):

- the store: iterations, float ops, loops, reduction, local scope, times the stage is entered;
- vectorization, explicit unroll, the auto-unroll body, parallel extent and balance over the cores,
  GPU thread bindings;
- the target: its vector lanes for the stored type and its core count, so one model serves several ISAs
  and machine sizes (the shipped pretrained model, :mod:`~ansor.cost_model.pretrained`);
- memory: float ops and arithmetic intensity of the deepest loop level whose working set fits 32 KiB,
  1 MiB and 16 MiB; the arithmetic-intensity curve at 8 loop levels (outermost to innermost);
- for the 5 buffers with the largest footprint: read/write, footprint, bytes accessed, cache lines,
  innermost and vector strides, the stride of the next loop out that moves the buffer (and the power of
  two dividing it in bytes: a tile whose rows are a large power of two apart maps onto a few cache sets
  and thrashes, which a packed layout (``LR`` step) avoids), reuse count and distance.

A buffer the stage reads packed (``LR``) has the strides and cache lines of its packed layout.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

import numpy as np

from ..state.access import Access, IterKind
from ..errors import StepError
from ..state.layout_rewrite import packed_layout
from ..state.loop_nest import AttachKind
from ..state.loop_state import State
from ..task.search_task import SearchTask
from .features import ExtractStats

#: Buffers described per store (the largest footprints first; fewer are zero-padded).
BUFFERS_PER_STORE = 5
#: Working-set sizes whose deepest fitting loop level is described (L1-, L2- and L3-like).
CACHE_LEVELS = (32 * 1024, 1024 * 1024, 16 * 1024 * 1024)
#: Points of the arithmetic-intensity curve.
CURVE_POINTS = 8

_STORE_NAMES = [
    "iterations", "flops", "flops_per_point", "loops", "is_reduction", "writes_local", "entries",
    "vector_len", "vector_innermost", "vector_lanes_ratio", "vector_whole_lanes",
    "unroll_explicit", "auto_unroll_max", "auto_unroll_body",
    "parallel_extent", "parallel_balance", "work_per_thread", "target_lanes", "target_cores",
    "block_idx", "thread_idx", "vthread",
]
_STORE_NAMES += [f"{what}_fit_{size // 1024}k" for size in CACHE_LEVELS for what in ("flops", "intensity")]
_STORE_NAMES += [f"intensity_curve_{k}" for k in range(CURVE_POINTS)]
_BUFFER_NAMES = ["is_read", "is_write", "footprint", "bytes", "lines", "stride_innermost", "stride_vector",
                 "stride_outer", "stride_outer_pow2", "reuse_count", "reuse_distance"]
FEATURE_NAMES: tuple[str, ...] = tuple(_STORE_NAMES + [f"b{b}_{name}" for b in range(BUFFERS_PER_STORE)
                                                       for name in _BUFFER_NAMES])
NUM_STATE_FEATURES = len(FEATURE_NAMES)

_GPU_AXES = ("blockIdx", "threadIdx", "vthread")


@dataclass(frozen=True, slots=True)
class _Loop:
    extent: int
    annotation: str
    pragma: str
    parts: tuple[tuple[str, int], ...]  # (variable of the described stage, stride)


@dataclass(frozen=True, slots=True)
class _Buffer:
    is_read: bool
    is_write: bool
    shape: tuple[int, ...]
    elem_bytes: int
    # Per dimension: ((var, |coef|), ...) of the widest access and the spread of the accesses' offsets;
    # None where an index is not affine (the whole dimension).
    dims: tuple[Optional[tuple[tuple[tuple[str, int], ...], int]], ...]
    row_strides: tuple[int, ...]  # elements between neighbours along each dimension (row-major)
    coefs: tuple[dict[str, int], ...]  # signed coefficient of each var in each dimension (first access)
    # A packed argument (LR step): elements between neighbours of each (var, loop stride) the stage's loops
    # walk, in the packed layout; None for a buffer in its own layout.
    packed: Optional[dict[tuple[str, int], int]] = None


def _log(x: float) -> float:
    return math.log2(1.0 + x) if x > 0 else 0.0


class StateFeatureExtractor:
    """Per-store features of states from their loop structure: one ``(n_stores, NUM_STATE_FEATURES)`` array each.

    Same interface as :class:`~ansor.cost_model.features.FeatureExtractor` (``extract``, ``stats``), with
    an LRU cache keyed by (workload, target, step list).
    """

    name = "state"
    num_features = NUM_STATE_FEATURES

    def __init__(self, cache_size: int = 20_000):
        self.cache_size = cache_size
        self.stats = ExtractStats()
        self._cache: OrderedDict[Hashable, np.ndarray] = OrderedDict()

    def extract(self, task: SearchTask, states: Sequence[State]) -> list[Optional[np.ndarray]]:
        """Features of each state (never ``None``: every State can be described)."""
        t0 = time.perf_counter()
        out: list[Optional[np.ndarray]] = []
        task_key = (task.workload_key, task.target_str)
        hw = task.hardware_params
        for state in states:
            key = (task_key, state.key())
            feat = self._cache.get(key)
            if feat is None:
                feat = state_features(state, hw.num_cores, hw.vector_unit_bytes, hw.cache_line_bytes)
                self._cache[key] = feat
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
                self.stats.cache_hits += 1
            out.append(feat)
        self.stats.states += len(states)
        self.stats.wall_s += time.perf_counter() - t0
        return out


def state_features(state: State, cores: int, vector_bytes: int, line_bytes: int = 64) -> np.ndarray:
    """One row per live (not inlined) stage, in stage order."""
    nests: dict[int, list[_Loop]] = {}
    rows = [_store_row(state, sid, nests, cores, vector_bytes, line_bytes)
            for sid, stage in enumerate(state.stages) if stage.compute_at != AttachKind.INLINED]
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), NUM_STATE_FEATURES)


# ---------------------------------------------------------------------------------------------- loop nests
def _nest(state: State, sid: int, memo: dict[int, list[_Loop]]) -> list[_Loop]:
    """Every loop around stage ``sid``'s store, outermost first, in terms of ``sid``'s block variables."""
    if sid in memo:
        return memo[sid]
    stage = state.stages[sid]
    own = [_Loop(it.extent or 1, it.annotation, it.pragma, tuple((p.var, p.stride) for p in it.parts))
           for it in stage.iters]
    outer: list[_Loop] = []
    if stage.compute_at == AttachKind.ITER:
        target_id, iter_id = stage.attach
        target_nest = _nest(state, target_id, memo)
        n_target_outer = len(target_nest) - len(state.stages[target_id].iters)
        mapping = _var_mapping(state, target_id, sid)
        for loop in target_nest[:n_target_outer + iter_id + 1]:
            parts = tuple((mine, stride * coef) for var, stride in loop.parts for mine, coef in mapping.get(var, ()))
            outer.append(_Loop(loop.extent, loop.annotation, loop.pragma, parts))
    memo[sid] = outer + own
    return memo[sid]


def _var_mapping(state: State, target_id: int, sid: int) -> dict[str, list[tuple[str, int]]]:
    """How a variable of the target stage moves the variables of stage ``sid`` (through a shared buffer)."""
    target, stage = state.stages[target_id].block, state.stages[sid].block
    pairs: list[tuple[Access, Access]] = []
    written = set(stage.write_buffers())
    for acc in target.reads:
        if acc.buffer in written:
            pairs = [(acc, stage.writes[0])]
            break
    else:
        made = {a.buffer: a for a in target.writes}
        for acc in stage.reads:
            if acc.buffer in made:
                pairs = [(made[acc.buffer], acc)]
                break
    mapping: dict[str, list[tuple[str, int]]] = {}
    for theirs, mine in pairs:
        for t_idx, m_idx in zip(theirs.indices, mine.indices):
            m_var = m_idx.single_var() if m_idx is not None else None
            if t_idx is None or m_var is None:
                continue
            for t_var, coef in t_idx.terms:
                mapping.setdefault(t_var, []).append((m_var, coef))
    return mapping


# ---------------------------------------------------------------------------------------------- buffers
def _buffers(state: State, sid: int) -> list[_Buffer]:
    block = state.stages[sid].block
    dag = state.dag
    groups: dict[str, list[Access]] = {}
    for acc in block.reads:
        groups.setdefault(acc.buffer, []).append(acc)
    written = {a.buffer for a in block.writes}
    reduction = any(v.kind == IterKind.REDUCE for v in block.vars)
    for acc in block.writes:
        groups.setdefault(acc.buffer, []).append(acc)
    out = []
    for name, accs in groups.items():
        shape = state.shapes.get(name) or (1,)
        dims: list[Optional[tuple[tuple[tuple[str, int], ...], int]]] = []
        for d in range(len(shape)):
            idxs = [a.indices[d] if d < len(a.indices) else None for a in accs]
            if any(i is None for i in idxs):
                dims.append(None)
                continue
            widest = max(idxs, key=lambda i: len(i.terms))  # type: ignore[union-attr]
            consts = [i.const for i in idxs]  # type: ignore[union-attr]
            dims.append((tuple((v, abs(c)) for v, c in widest.terms), max(consts) - min(consts)))  # type: ignore
        row_strides = []
        step = 1
        for n in reversed(shape):
            row_strides.append(step)
            step *= n
        row_strides.reverse()
        coefs = tuple(dict(idx.terms) if idx is not None else {} for idx in accs[0].indices)
        is_write = name in written
        out.append(_Buffer(not is_write or reduction, is_write, shape, max(1, dag.element_bits(name) // 8),
                           tuple(dims), tuple(row_strides), coefs, _packed_strides(state, sid, name)))
    return out


def _packed_strides(state: State, sid: int, buffer: str) -> Optional[dict[tuple[str, int], int]]:
    """For an argument the stage reads packed: packed-layout element stride of each loop digit."""
    if buffer not in state.stages[sid].packed:
        return None
    try:
        layout = packed_layout(state, sid, buffer)
    except StepError:
        return None
    var_of = {axis: var for var, axis in (state.stages[sid].block.plain_axes(buffer) or {}).items()}
    strides: dict[tuple[str, int], int] = {}
    step = 1
    for dim in reversed(layout.dims):
        strides[(var_of[dim.axis], dim.stride)] = step
        step *= dim.extent
    return strides


def _footprint(buf: _Buffer, spans: dict[str, int], line_bytes: int) -> tuple[int, int]:
    """(elements, cache lines) of ``buf`` touched while each variable ranges over ``spans`` (+1) values."""
    exts = []
    for d, n in enumerate(buf.shape):
        dim = buf.dims[d]
        if dim is None:
            exts.append(n)
            continue
        terms, spread = dim
        e = 1 + spread + sum(c * spans.get(v, 0) for v, c in terms)
        exts.append(min(n, e))
    elems = math.prod(exts)
    if buf.packed is not None:  # a tile of a packed buffer is contiguous
        return elems, -(-elems * buf.elem_bytes // line_bytes)
    last = exts[-1] * buf.elem_bytes if exts else buf.elem_bytes
    return elems, (elems // max(1, exts[-1]) if exts else 1) * -(-last // line_bytes)


def _stride(buf: _Buffer, loop: _Loop) -> int:
    """Elements between consecutive iterations of ``loop`` in ``buf`` (0: the loop does not move it)."""
    if buf.packed is not None:
        return sum(buf.packed.get(part, 0) for part in loop.parts)
    total = 0
    for var, stride in loop.parts:
        for d, coefs in enumerate(buf.coefs):
            c = coefs.get(var)
            if c:
                total += c * stride * buf.row_strides[d]
    return abs(total)


# ---------------------------------------------------------------------------------------------- one row
def _flops_per_point(state: State, sid: int) -> float:
    """Float ops per execution of the stage's body: its DAG stage's, plus those of stages inlined into it.

    Copy stages (caches) do none; an rfactor stage does its reduction's, the write-back after it none.
    """
    dag = state.dag
    stage = state.stages[sid]
    origin = stage.origin
    if stage.block.writes and stage.block.writes[0].buffer.endswith("_rf") and sid + 1 < len(state.stages):
        origin = state.stages[sid + 1].origin
    elif sid > 0 and state.stages[sid - 1].block.writes and \
            state.stages[sid - 1].block.writes[0].buffer.endswith("_rf"):
        return 0.0
    if origin < 0:
        return 0.0
    inlined = {state.stages[i].block.writes[0].buffer: state.stages[i].origin for i in range(len(state.stages))
               if state.stages[i].compute_at == AttachKind.INLINED and state.stages[i].origin >= 0}
    total, todo, seen = 0.0, [origin], set()
    while todo:  # the stage and, transitively, every inlined stage it reads
        ds = dag.stages[todo.pop()]
        total += ds.flops / max(1, math.prod(v.extent for v in ds.block.vars))
        for buf in ds.block.read_buffers():
            if buf in inlined and buf not in seen:
                seen.add(buf)
                todo.append(inlined[buf])
    return total


def _store_row(state: State, sid: int, nests: dict[int, list[_Loop]], cores: int, vector_bytes: int,
               line_bytes: int) -> list[float]:
    stage = state.stages[sid]
    nest = _nest(state, sid, nests)
    n_outer = len(nest) - len(stage.iters)
    extents = [loop.extent for loop in nest]
    iterations = math.prod(extents)
    fpp = _flops_per_point(state, sid)
    buffers = _buffers(state, sid)
    var_limit = {v.name: v.extent - 1 for v in stage.block.vars}
    write_bytes = next((b.elem_bytes for b in buffers if b.is_write), 4)

    # Footprints per loop level, innermost first: level k = the innermost k loops vary. A buffer's footprint
    # changes only at a loop that widens the span of a variable it is indexed by (a GPU nest's many loops of
    # one iteration widen none): recomputing only those halved the calls, the hot spot of a CUDA round.
    spans: dict[str, int] = {}
    footprints = [_footprint(b, spans, line_bytes) for b in buffers]  # (elements, lines) at the current level
    indexed_by = [{v for dim in b.dims if dim is not None for v, _ in dim[0]} for b in buffers]
    level_bytes = [sum(b.elem_bytes for b in buffers)]
    for loop in reversed(nest):
        widened = set()
        for var, stride in loop.parts:
            if var in var_limit:
                span = min(var_limit[var], spans.get(var, 0) + stride * (loop.extent - 1))
                if span != spans.get(var, 0):
                    spans[var] = span
                    widened.add(var)
        if widened:
            footprints = [_footprint(b, spans, line_bytes) if widened & used else fp
                          for b, used, fp in zip(buffers, indexed_by, footprints)]
        level_bytes.append(sum(fp[0] * b.elem_bytes for b, fp in zip(buffers, footprints)))
    inner_flops = [fpp * math.prod(extents[len(extents) - k:]) for k in range(len(extents) + 1)]
    intensity = [f / max(1, by) for f, by in zip(inner_flops, level_bytes)]

    # Annotations.
    vec = [loop.extent for loop in nest if loop.annotation == "vectorize"]
    vector_len = math.prod(vec) if vec else 0
    lanes = max(1, vector_bytes // write_bytes)
    unroll_explicit = math.prod([loop.extent for loop in nest if loop.annotation == "unroll"] or [0])
    max_step = max([int(loop.pragma.rsplit("$", 1)[1]) for loop in nest
                    if loop.pragma.startswith("auto_unroll_max_step$")] or [0])
    body = 1
    for loop in reversed(nest):  # TVM unrolls inner loops while the unrolled body stays within max_step
        if loop.annotation == "vectorize":
            continue
        if loop.annotation not in ("none", "unroll") or body * loop.extent > max_step:
            break
        body *= loop.extent
    parallel = math.prod([loop.extent for loop in nest if loop.annotation == "parallel"] or [1])
    balance = parallel / (math.ceil(parallel / cores) * cores) if parallel > 1 else 0.0
    gpu = [math.prod([loop.extent for loop in nest if loop.annotation.startswith(axis)] or [0])
           for axis in _GPU_AXES]

    reduces = any(v.kind == IterKind.REDUCE for v in stage.block.vars)
    row = [_log(iterations), _log(fpp * iterations), fpp, len(nest), float(reduces),
           float(stage.block.writes[0].buffer.endswith(("_local", "_rf"))) if stage.block.writes else 0.0,
           _log(math.prod(extents[:n_outer]))]
    row += [_log(vector_len), float(bool(nest) and nest[-1].annotation == "vectorize"),
            vector_len / lanes if vector_len else 0.0, float(vector_len > 0 and vector_len % lanes == 0)]
    row += [_log(unroll_explicit), _log(max_step), _log(body if max_step else 0)]
    row += [_log(parallel if parallel > 1 else 0), balance, _log(iterations / parallel), _log(lanes), _log(cores)]
    row += [_log(g) for g in gpu]
    for size in CACHE_LEVELS:
        k = max(k for k in range(len(level_bytes)) if k == 0 or level_bytes[k] <= size)
        row += [_log(inner_flops[k]), _log(intensity[k])]
    depth = len(nest)
    for p in range(CURVE_POINTS):
        row.append(_log(intensity[depth - round(p * depth / (CURVE_POINTS - 1))]))

    # Buffers, largest footprint first.
    order = sorted(range(len(buffers)), key=lambda i: -footprints[i][0] * buffers[i].elem_bytes)
    innermost = next((loop for loop in reversed(nest) if loop.extent > 1), None)
    vector_loop = next((loop for loop in reversed(nest) if loop.annotation == "vectorize"), None)
    for i in order[:BUFFERS_PER_STORE]:
        b, (elems, lines) = buffers[i], footprints[i]
        reuse_count, reuse_distance = 0, 0
        for k in range(len(nest) - 1, -1, -1):  # innermost loop (with extent > 1) that does not move b
            loop = nest[k]
            if loop.extent > 1 and _stride(b, loop) == 0:
                reuse_count, reuse_distance = loop.extent, level_bytes[len(nest) - 1 - k]
                break
        outer = next((s for loop in reversed(nest) if loop.extent > 1 and loop.annotation != "vectorize"
                      and loop is not innermost for s in (_stride(b, loop),) if s), 0)
        outer_bytes = outer * b.elem_bytes
        row += [float(b.is_read), float(b.is_write), _log(elems * b.elem_bytes), _log(iterations * b.elem_bytes),
                _log(lines), _log(_stride(b, innermost) if innermost else 0),
                _log(_stride(b, vector_loop) if vector_loop else 0), _log(outer),
                float((outer_bytes & -outer_bytes).bit_length() - 1) if outer_bytes else 0.0,
                _log(reuse_count), _log(reuse_distance)]
    row += [0.0] * (NUM_STATE_FEATURES - len(row))
    return row
