"""Sketches whose innermost tile is a tensor intrinsic: a bf16 product computed by the CPU's bf16 unit.

A bf16 product is a reduction over ``uint16`` operands holding bf16 bits (``bf16-matmul-*``: ``A16`` and
``B16``, rounded from fp32 and ``B16`` packed in the k pairs of 16 columns ``vdpbf16ps`` reads; a network's
convolutions and dense layers, :mod:`ansor.networks.bf16`). Its spatial loops come first, the output
channels last of them, then its reductions, the pairs' last. Its sketch is Ansor's CPU tiling (``SSRSRS``)
of every loop but 16 columns and a k pair, which stay innermost and become one intrinsic call (a ``TZ``
step); on a target with AMX a second sketch leaves 16 rows, 16 columns and 32 reduction channels innermost
for one ``tdpbf16ps`` tile product (where the rows are one dense box of the activation; fewer than 16 rows
where 16 do not divide them: a 56-pixel row in tiles of 14). Each also comes with
its element-wise epilogue under its first or second spatial tile level, as Ansor fuses it. Random annotation
fills the tile sizes, parallel loops, unrolling and compute locations as for any sketch. The operands'
conversions are not inlined: the intrinsic reads them from memory, in the layout their stages write.

On a target without AVX512_BF16 the same sketch uses the intrinsic's portable form (the description as its
own implementation): the same program structure in fp32 code, so the search runs, and is tested, anywhere.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tvm

from ..errors import TargetError
from ..host_cpu import allow_amx, host_cpu
from ..state.access import IterKind
from ..state.loop_state import State
from ..state.tensor_intrin import AMX_ROWS, BF16_BITS, BF16Intrin
from ..target import has_x86_feature, target_label
from ..task.search_task import SearchTask
from .rules import CPU_STRUCTURE, Cond, SketchRule, needs_multi_level_tiling, single_elementwise_consumer


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
    return BF16Intrin.AVX512_DOT_16x2 if has_x86_feature(target, "avx512bf16") else BF16Intrin.PORTABLE_DOT_16x2


def has_amx(target: tvm.target.Target) -> bool:
    """Whether ``target``'s code may use AMX's bf16 tiles (so the process running it needs the tile state)."""
    return has_x86_feature(target, "amx-bf16") and has_x86_feature(target, "amx-tile")


def intrinsics(target: tvm.target.Target) -> list[BF16Intrin]:
    """The intrinsics a bf16 product's sketches may be built around on ``target``: AMX's tile products
    where the target has AMX (first, most rows first: :data:`~ansor.state.tensor_intrin.AMX_ROWS`), and
    the dot product (:func:`dot_intrinsic`) always."""
    return [BF16Intrin[f"AMX_TILE_{m}x16x32"] for m in AMX_ROWS] * has_amx(target) + [dot_intrinsic(target)]


def fitting_intrinsics(target: tvm.target.Target, state: State, stage_id: int) -> list[BF16Intrin]:
    """The intrinsics of :func:`intrinsics` that bf16 product ``stage_id`` takes (:func:`product_loops`): the
    AMX tile product of the most rows that fit, if any, then the dot product where it fits."""
    fits = [i for i in intrinsics(target) if product_loops(state, stage_id, i) is not None]
    return [i for i in fits if i.amx_rows][:1] + [i for i in fits if not i.amx_rows]


def require_bf16_unit(target: tvm.target.Target) -> None:
    """Tuning in bf16 needs a target the search gives the bf16 dot product (not its portable form): one
    error line naming what is missing and what this CPU has, where it is missing. Where the target has AMX
    and this CPU too, this process asks Linux for the tile state (it times the final build): a refusal
    is one :class:`~ansor.host_cpu.AmxError` line."""
    if dot_intrinsic(target) is not BF16Intrin.AVX512_DOT_16x2:
        cpu = host_cpu()
        raise TargetError(f"--precision bf16 needs the CPU's bf16 dot product (cpuinfo flag avx512_bf16: AMD "
                          f"Zen 4/5, Intel Xeon 4th gen on), which target {target_label(target)} lacks; this CPU "
                          f"({cpu.model or 'unknown'}) has {cpu.units}")
    if has_amx(target):
        allow_amx()


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
        consumer = single_elementwise_consumer(state, stage_id, prefix=True)  # a padded product's rows, cut back
        out = []
        for intrin in fitting_intrinsics(task.target, state, stage_id):
            tiled = tile_around(state, stage_id, intrin)
            if consumer is not None:  # the epilogue under an output tile, as MultiLevelTilingWithFusion does
                for end in fusion_points(state, stage_id, intrin):
                    fused = tiled.copy()
                    fused.compute_at(consumer, stage_id, end)
                    out.append(fused)
            out.append(tiled)
        return [(s, stage_id - 1) for s in out]


Lengths = Sequence[Sequence[Optional[int]]]


def product_loops(state: State, stage_id: int, intrin: BF16Intrin) -> Optional[tuple[int, int]]:
    """(spatial, reduction) loop counts of a product whose innermost tile ``intrin`` can compute: spatial
    loops first, then reductions; the intrinsic's spatial loops are the product's last ones (rows, then the
    output channels), its reduction the last reduction (channels, in pairs); each a multiple of the
    intrinsic's extent. A tile of several rows (AMX) reads them as one box: consecutive rows of every
    operand that the rows move must be consecutive there (a stride-1 convolution, not a stride-2 one).
    None for any other stage."""
    iters = state.stages[stage_id].iters
    spatial = [k for k, it in enumerate(iters) if it.kind == IterKind.SPATIAL]
    reduce = [k for k, it in enumerate(iters) if it.kind == IterKind.REDUCE]
    m, q = len(spatial), len(reduce)
    inner_s, inner_r = intrin.spatial, intrin.reduction
    if spatial != list(range(m)) or reduce != list(range(m, m + q)) or not q or m < len(inner_s):
        return None
    extents = [it.extent or 0 for it in iters[m - len(inner_s):m]] + [iters[-1].extent or 0]
    if any(e % n for e, n in zip(extents, [*inner_s, inner_r])):
        return None
    if len(inner_s) > 1 and not _unit_stride(state, stage_id, m - len(inner_s)):
        return None
    return m, q


def _unit_stride(state: State, stage_id: int, position: int) -> bool:
    """Whether block variable ``position`` of the stage moves each index it appears in by exactly 1 (and
    appears in one index at most) in every read."""
    block = state.stages[stage_id].block
    var = block.vars[position].name
    for access in block.reads:
        if access.moved_opaquely({var}):
            return False
        coefs = [dict(index.terms).get(var, 0) for index in access.indices if index is not None]
        if sum(c != 0 for c in coefs) > 1 or any(c not in (0, 1) for c in coefs):
            return False
    return True


def fusion_points(state: State, stage_id: int, intrin: BF16Intrin) -> tuple[int, ...]:
    """Where :func:`tile_around`'s tiling of the product can take its element-wise consumer: the last loop of
    the first and of the second spatial level (Ansor's fusion under tile level 1 or 2)."""
    m, q = product_loops(state, stage_id, intrin) or (0, 0)
    return tuple(level[-1] for level in _spatial_levels(tiling_structure(intrin), m, q)[:2])


def _spatial_levels(structure: str, m: int, q: int) -> list[range]:
    """The loop positions of each spatial level of ``structure`` once tiled: ``m`` loops a spatial level,
    ``q`` a reduction one."""
    levels, start = [], 0
    for ch in structure:
        width = m if ch == "S" else q
        if ch == "S":
            levels.append(range(start, start + width))
        start += width
    return levels


def tiling_structure(intrin: BF16Intrin) -> str:
    """The loop levels around ``intrin``: Ansor's CPU tiling, whose innermost tile is spatial; for AMX's tile
    product a reduction innermost, so that a loop of products accumulates into one tile, kept in its
    register across the loop (:mod:`ansor.codegen.amx_tiles`), where a spatial tile there would store and reload it
    at every step."""
    return AMX_STRUCTURE if intrin.amx_rows else CPU_STRUCTURE


#: AMX's tiling: output tiles (S), a reduction block (R), its accumulator tiles (S, unrolled: codegen's
#: tile rewrite runs up to 4 side by side, sharing A and B tiles), their reduction loop (R).
AMX_STRUCTURE = "SSRSR"


def tile_around(state: State, stage_id: int, intrin: BF16Intrin, space: Optional[Lengths] = None,
                reduce: Optional[Lengths] = None) -> Optional[State]:
    """A copy of ``state`` whose product ``stage_id`` is tiled around ``intrin`` (:func:`tiling_structure`), or None if
    the intrinsic does not fit it (:func:`product_loops`). ``space[a]`` / ``reduce[b]``: the inner tile
    lengths of spatial loop ``a`` / reduction loop ``b`` (those the intrinsic takes a part of counted in
    whole intrinsic extents); None leaves them to random annotation."""
    loops = product_loops(state, stage_id, intrin)
    if loops is None:
        return None
    m, q = loops
    inner_s, inner_r = intrin.spatial, intrin.reduction
    n_in = len(inner_s)
    structure = tiling_structure(intrin)
    n_space, n_reduce = structure.count("S"), structure.count("R")
    space = space or [[None] * (n_space - 1)] * m
    reduce = reduce or [[None] * (n_reduce - 1)] * q
    s = state.copy()
    # The intrinsic's pieces split off and moved innermost: spatial..., reduction..., then its own loops.
    s.split(stage_id, m + q - 1, [inner_r])
    for t in reversed(range(n_in)):
        s.split(stage_id, m - n_in + t, [inner_s[t]])
    pieces = [m - n_in + 2 * t + 1 for t in range(n_in)]  # the inner halves of the split spatial loops
    outer = [k for k in range(m + n_in + q + 1) if k not in pieces and k != m + n_in + q]
    s.reorder(stage_id, outer + pieces + [m + n_in + q])
    # Ansor's levels on the outer loops, from the back so the positions before stay put.
    for b in reversed(range(q)):
        s.split(stage_id, m + b, list(reduce[b]))
    for a in reversed(range(m)):
        s.split(stage_id, a, list(space[a]))
    first_r = m * n_space
    levels = {"S": [[a * n_space + lv for a in range(m)] for lv in range(n_space)],
              "R": [[first_r + b * n_reduce + lv for b in range(q)] for lv in range(n_reduce)]}
    order, taken = [], {"S": 0, "R": 0}
    for ch in structure:
        order += levels[ch][taken[ch]]
        taken[ch] += 1
    inner = list(range(first_r + q * n_reduce, first_r + q * n_reduce + n_in + 1))
    s.reorder(stage_id, order + inner)
    s.tensorize(stage_id, len(order), intrin.value)
    if structure == AMX_STRUCTURE:  # the output tiles of a reduction block, unrolled: see AMX_STRUCTURE
        for position in _spatial_levels(structure, m, q)[-1]:
            s.annotate(stage_id, position, "unroll")
    return s
