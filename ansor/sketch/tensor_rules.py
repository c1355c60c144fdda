"""Sketches whose innermost tile is a tensor intrinsic: a bf16 product computed by the CPU's bf16 unit.

A bf16 product is a reduction over ``uint16`` operands holding bf16 bits (``bf16-matmul-*``: ``A16`` and
``Bp``, rounded from fp32 and ``Bp`` packed in the k pairs of 16 columns ``vdpbf16ps`` reads). Its sketch
is Ansor's CPU tiling (``SSRSRS``) of every loop but 16 columns and a k pair, which stay innermost and
become one intrinsic call (a ``TZ`` step); random annotation fills the tile sizes, parallel loops, unrolling
and compute locations as for any sketch. The operands' conversions are not inlined: the intrinsic reads
them from memory, in the layout their stages write.

On a target without AVX512_BF16 the same sketch uses the intrinsic's portable form (the description as its
own implementation): the same program structure in fp32 code, so the search runs, and is tested, anywhere.
"""

from __future__ import annotations

import tvm

from ..state.access import IterKind
from ..state.loop_state import State
from ..state.tensor_intrin import BF16Intrin
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
        intrin = dot_intrinsic(task.target)
        columns, pair = (n for n, _ in intrin.loops)
        iters = state.stages[stage_id].iters
        spatial = [k for k, it in enumerate(iters) if it.kind == IterKind.SPATIAL]
        reduce = [k for k, it in enumerate(iters) if it.kind == IterKind.REDUCE]
        if len(spatial) != 2 or len(reduce) != 1 or spatial[1] != 1 or reduce[0] != 2 \
                or (iters[1].extent or 0) % columns or (iters[2].extent or 0) % pair:
            return []  # not the (rows, columns, k) product this sketch is for
        s = state.copy()
        s.split(stage_id, 1, [columns])  # i, jo, j16, k
        s.split(stage_id, 3, [pair])  # i, jo, j16, ko, k2
        n_space, n_reduce = CPU_STRUCTURE.count("S"), CPU_STRUCTURE.count("R")
        s.split(stage_id, 0, [None] * (n_space - 1))  # i0..i3, jo, j16, ko, k2
        s.split(stage_id, n_space, [None] * (n_space - 1))  # i0..i3, j0..j3, j16, ko, k2
        k_first = 2 * n_space + 1
        s.split(stage_id, k_first, [None] * (n_reduce - 1))  # ..., j16, k0, k1, k2
        rows, cols = list(range(n_space)), list(range(n_space, 2 * n_space))
        ks = list(range(k_first, k_first + n_reduce))
        order, taken = [], {"S": 0, "R": 0}
        for ch in CPU_STRUCTURE:
            level = taken[ch]
            order += [rows[level], cols[level]] if ch == "S" else [ks[level]]
            taken[ch] += 1
        order += [2 * n_space, k_first + n_reduce]  # j16, k2 innermost
        s.reorder(stage_id, order)
        s.tensorize(stage_id, len(order) - 2, intrin.value)
        return [(s, stage_id - 1)]
