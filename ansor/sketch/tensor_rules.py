"""Sketches whose innermost tile is a tensor intrinsic: a bf16 product computed by the CPU's bf16 unit.

A bf16 product is a reduction over ``uint16`` operands holding bf16 bits (``bf16-matmul-*``: ``A16`` and
``Bp``, rounded from fp32 and ``Bp`` packed in the k pairs of 16 columns ``vdpbf16ps`` reads; a network's
convolutions and dense layers, :mod:`ansor.networks.bf16`). Its spatial loops come first, the output
channels last of them, then its reductions, the pairs' last. Its sketch is Ansor's CPU tiling (``SSRSRS``)
of every loop but 16 columns and a k pair, which stay innermost and become one intrinsic call (a ``TZ``
step); random annotation fills the tile sizes, parallel loops, unrolling and compute locations as for any
sketch. The operands' conversions are not inlined: the intrinsic reads
them from memory, in the layout their stages write.

On a target without AVX512_BF16 the same sketch uses the intrinsic's portable form (the description as its
own implementation): the same program structure in fp32 code, so the search runs, and is tested, anywhere.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tvm

from ..errors import TargetError
from ..host_cpu import host_cpu
from ..state.access import IterKind
from ..state.loop_state import State
from ..state.tensor_intrin import BF16Intrin
from ..target import target_label
from ..task.search_task import SearchTask
from .rules import CPU_STRUCTURE, Cond, SketchRule, needs_multi_level_tiling

#: The dtype of a buffer of bf16 bits (TVM's own bfloat16 never reaches the unit: tensor_intrin says why).
BF16_BITS = "uint16"


def is_bf16_product(state: State, stage_id: int) -> bool:
    """A reduction whose every read is a buffer of bf16 bits."""
    stage = state.stages[stage_id]
    reads = stage.block.read_buffers()
    return (needs_multi_level_tiling(state, stage_id) and any(it.kind == IterKind.REDUCE for it in stage.iters)
            and bool(reads) and all(state.dag.buffer_dtypes.get(b) == BF16_BITS for b in reads))


def feeds_bf16_product(state: State, stage_id: int) -> bool:
    """A stage that writes bf16 bits only bf16 products read."""
    consumers = state.consumers(stage_id)
    written = state.stages[stage_id].block.write_buffers()
    return (bool(consumers) and all(state.dag.buffer_dtypes.get(b) == BF16_BITS for b in written)
            and all(is_bf16_product(state, c) for c in consumers))


def dot_intrinsic(target: tvm.target.Target) -> BF16Intrin:
    """``vdpbf16ps`` where the target has AVX512_BF16, else the portable form of the same intrinsic."""
    try:
        native = bool(tvm.target.codegen.target_has_features("avx512bf16", target))
    except Exception:  # not an x86 LLVM target
        native = False
    return BF16Intrin.AVX512_DOT_16x2 if native else BF16Intrin.PORTABLE_DOT_16x2


def require_bf16_unit(target: tvm.target.Target) -> None:
    """Tuning in bf16 needs a target the search gives the bf16 dot product (not its portable form): one
    error line naming what is missing and what this CPU has, where it is missing."""
    if dot_intrinsic(target) is not BF16Intrin.AVX512_DOT_16x2:
        cpu = host_cpu()
        raise TargetError(f"--precision bf16 needs the CPU's bf16 dot product (cpuinfo flag avx512_bf16: AMD "
                          f"Zen 4/5, Intel Xeon 4th gen on), which target {target_label(target)} lacks; this CPU "
                          f"({cpu.model or 'unknown'}) has {cpu.units}")


class BF16DotProduct(SketchRule):
    """Tile a bf16 product around its innermost dot products; leave its operands' conversions at the root."""

    name = "bf16_dot_product"

    def condition(self, task: SearchTask, state: State, stage_id: int) -> Cond:
        if is_bf16_product(state, stage_id) or feeds_bf16_product(state, stage_id):
            return Cond.APPLY_AND_SKIP_REST
        return Cond.PASS

    def apply(self, task: SearchTask, state: State, stage_id: int) -> list[tuple[State, int]]:
        if not is_bf16_product(state, stage_id):
            return [(state, stage_id - 1)]  # an operand's conversion: computed, not inlined
        tiled = tile_around_dot(state, stage_id, dot_intrinsic(task.target))
        return [] if tiled is None else [(tiled, stage_id - 1)]


Lengths = Sequence[Sequence[Optional[int]]]


def product_loops(state: State, stage_id: int, intrin: BF16Intrin) -> Optional[tuple[int, int]]:
    """(spatial, reduction) loop counts of a product ``intrin`` can compute the innermost tile of: spatial
    loops first, the output channels last of them (a multiple of the intrinsic's columns), then reductions,
    the last in whole pairs; None for any other stage."""
    columns, pair = (n for n, _ in intrin.loops)
    iters = state.stages[stage_id].iters
    spatial = [k for k, it in enumerate(iters) if it.kind == IterKind.SPATIAL]
    reduce = [k for k, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    m, q = len(spatial), len(reduce)
    if spatial != list(range(m)) or reduce != list(range(m, m + q)) or not q or not m \
            or (iters[m - 1].extent or 0) % columns or (iters[-1].extent or 0) % pair:
        return None
    return m, q


def tile_around_dot(state: State, stage_id: int, intrin: BF16Intrin, space: Optional[Lengths] = None,
                    reduce: Optional[Lengths] = None) -> Optional[State]:
    """A copy of ``state`` whose product ``stage_id`` is Ansor's CPU tiling around ``intrin``'s dot products,
    or None if it is not such a product (:func:`product_loops`). ``space[a]`` / ``reduce[b]``: the inner
    tile lengths of spatial loop ``a`` (the output channels counted in whole intrinsic columns) / reduction
    loop ``b`` (the last in pairs); None leaves them to random annotation."""
    loops = product_loops(state, stage_id, intrin)
    if loops is None:
        return None
    m, q = loops
    columns, pair = (n for n, _ in intrin.loops)
    n_space, n_reduce = CPU_STRUCTURE.count("S"), CPU_STRUCTURE.count("R")
    space = space or [[None] * (n_space - 1)] * m
    reduce = reduce or [[None] * (n_reduce - 1)] * q
    s = state.copy()
    s.split(stage_id, m - 1, [columns])  # rows..., jo, j16, reduction..., k
    s.split(stage_id, m + q, [pair])  # rows..., jo, j16, reduction..., ko, k2
    for b in reversed(range(q)):  # from the back, so the positions before stay put
        s.split(stage_id, m + 1 + b, list(reduce[b]))
    for a in reversed(range(m)):
        s.split(stage_id, a, list(space[a]))
    # Now: each spatial loop's n_space levels, j16, each reduction loop's n_reduce levels, k2.
    j16 = m * n_space
    levels = {"S": [[a * n_space + lv for a in range(m)] for lv in range(n_space)],
              "R": [[j16 + 1 + b * n_reduce + lv for b in range(q)] for lv in range(n_reduce)]}
    order, taken = [], {"S": 0, "R": 0}
    for ch in CPU_STRUCTURE:
        order += levels[ch][taken[ch]]
        taken[ch] += 1
    order += [j16, j16 + 1 + q * n_reduce]  # j16, k2 innermost
    s.reorder(stage_id, order)
    s.tensorize(stage_id, len(order) - 2, intrin.value)
    return s
