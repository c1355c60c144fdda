"""Layout rewrite: read an argument in exactly the order a tiled stage walks it.

A tiled matmul reads ``B[k, j]`` a few columns at a time down all of ``k``: with a power-of-two row length
every row of the tile falls into the same few cache sets, and the tile thrashes L1. Measured on a Zen 3
core (AVX2): a 512^3 matmul tile that ran at 23 GFLOPS reading ``B`` as given ran at 81 GFLOPS reading a
copy laid out in its loop order, and at 60 GFLOPS with a 528-wide ``B``. Ansor's answer (its
``RewriteLayout`` of constant weights), and ours: the ``LR`` step says "stage S reads buffer X through a
copy whose dimensions are the loop tiles that index X, in loop order". Tile ``j3`` of ``B[k, j]`` split
``j0 j1 k0 j2 k1 j3`` becomes ``B'[j0, j1, k0, j2, k1, j3]``: the inner loops stream it.

The packed layout follows from the stage's final loops, so ``LR`` is applied after every other step and a
log replays into the same layout. For a constant weight (a ``layout_free_buffers`` argument of the
PrimFunc, as TVM's ``AttachAttrLayoutFreeBuffers`` marks network weights) the copy is a layout-rewrite
block that a network build splits off and folds at compile time; measurement times the kernel on a
pre-packed weight. For a runtime input the copy runs inside the kernel, and the search decides whether
it pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import StepError

if TYPE_CHECKING:
    from .loop_state import State

#: Block annotation TVM's ``SplitLayoutRewritePreproc`` and ``RemoveWeightLayoutRewriteBlock`` look for.
PREPROC_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


@dataclass(frozen=True)
class PackedDim:
    """One dimension of a packed buffer: digit ``(index[axis] // stride) % extent`` of an original axis."""

    axis: int
    stride: int
    extent: int


@dataclass(frozen=True)
class PackedLayout:
    """How argument ``param`` (position ``index`` in the PrimFunc) is laid out for a tiled stage."""

    param: str
    index: int
    shape: tuple[int, ...]
    dims: tuple[PackedDim, ...]

    @property
    def packed_shape(self) -> tuple[int, ...]:
        return tuple(d.extent for d in self.dims)

    def index_map(self, index_dtype: str = "int32"):
        """Original indices -> packed coordinates, as the ``tvm.tirx.IndexMap`` ``transform_layout`` takes
        (``index_dtype``: the buffer's; TE programs index with int32, legalized Relax ones with int64)."""
        from tvm import tirx
        return tirx.IndexMap.from_func(self._coordinates, ndim=len(self.shape), index_dtype=index_dtype)

    def _coordinates(self, *indices):
        from tvm import tirx
        outermost: dict[int, int] = {}
        for d in self.dims:
            outermost[d.axis] = max(outermost.get(d.axis, 0), d.stride)
        coords = []
        for d in self.dims:
            digit = tirx.floordiv(indices[d.axis], d.stride) if d.stride > 1 else indices[d.axis]
            coords.append(digit if d.stride == outermost[d.axis] else tirx.floormod(digit, d.extent))
        return coords

    def pack(self, array: np.ndarray) -> np.ndarray:
        """``array`` (original layout) in the packed layout: each axis cut into its digits, then permuted."""
        if tuple(array.shape) != self.shape:
            raise ValueError(f"{self.param}: expected shape {self.shape}, got {tuple(array.shape)}")
        digits: list[PackedDim] = []  # reshape order: axis by axis, most significant digit first
        for axis, n in enumerate(self.shape):
            mine = sorted((d for d in self.dims if d.axis == axis), key=lambda d: -d.stride)
            digits += mine or [PackedDim(axis, 1, n)]  # an axis of extent 1 has no digit
        position = {d: k for k, d in enumerate(digits)}
        order = [position[d] for d in self.dims]
        order += [k for k in range(len(digits)) if k not in set(order)]  # unit axes, dropped by the reshape
        split = array.reshape([d.extent for d in digits])
        return np.ascontiguousarray(split.transpose(order)).reshape(self.packed_shape)


def packed_layout(state: "State", stage_id: int, buffer: str) -> PackedLayout:
    """The layout of ``buffer`` that stage ``stage_id``'s loops walk in order (raises StepError if none)."""
    stage = state.stages[stage_id]
    axes = stage.block.plain_axes(buffer)
    if axes is None:
        raise StepError(f"layout rewrite of {buffer} for stage {stage_id} ({stage.name}): it is not read as "
                        f"{buffer}[v0, v1, ...] with distinct block variables")
    shape = state.shapes[buffer]
    dims = [PackedDim(axes[p.var], p.stride, p.extent) for it in stage.iters for p in it.parts
            if p.var in axes and p.extent is not None and p.extent > 1]
    for axis, n in enumerate(shape):
        digits = sorted((d for d in dims if d.axis == axis), key=lambda d: d.stride)
        expected = 1
        for d in digits:
            if d.stride != expected:
                break
            expected *= d.extent
        if expected != n:
            raise StepError(f"layout rewrite of {buffer} for stage {stage_id} ({stage.name}): its loops do not "
                            f"split axis {axis} ({n}) into whole tiles")
    if not dims:
        raise StepError(f"layout rewrite of {buffer} for stage {stage_id} ({stage.name}): nothing to pack")
    param = state.dag.param_names.index(buffer)
    return PackedLayout(buffer, param, tuple(shape), tuple(dims))


def packable_arguments(state: "State", stage_id: int) -> list[str]:
    """Arguments stage ``stage_id`` could read packed: constants (layout-free) read as ``X[v0, v1, ...]``,
    and runtime inputs read so that also walk the stage's innermost output dimension (``B[k, j]`` of a
    matmul; its vector loads stride through ``k``). Inputs read along other dimensions (``A[i, k]``) are
    broadcast one element at a time and gain nothing."""
    stage = state.stages[stage_id]
    out_index = stage.block.writes[0].indices[-1] if stage.block.writes else None
    innermost = out_index.single_var() if out_index is not None else None
    out = []
    for buffer in stage.block.read_buffers():
        axes = stage.block.plain_axes(buffer)
        if buffer not in state.dag.param_buffers or buffer in stage.packed or axes is None:
            continue
        if buffer in state.dag.layout_free or (innermost is not None and innermost in axes):
            out.append(buffer)
    return out


def packed_layouts(state: "State", layout_free_only: bool = True) -> list[PackedLayout]:
    """The packed layouts of a state's ``LR`` steps (by default only of constant arguments)."""
    out = []
    for sid, stage in enumerate(state.stages):
        for buffer in stage.packed:
            if not layout_free_only or buffer in state.dag.layout_free:
                out.append(packed_layout(state, sid, buffer))
    return out


def pack_arguments(layouts: Sequence[PackedLayout], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arguments a kernel built with pre-packed weights takes: ``arrays`` with each packed one replaced."""
    out = list(arrays)
    for layout in layouts:
        out[layout.index] = layout.pack(out[layout.index])
    return out
