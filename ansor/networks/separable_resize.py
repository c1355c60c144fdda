"""Bilinear resizes written along the rows as two passes, one along each axis, the second reading whole rows.

TVM's bilinear resize computes every output pixel from four input pixels at indices computed from the
pixel's coordinates. Channels last (NHWC) those loads run along the channels, contiguous; but where the row
is the innermost axis (NCHW), they are four gathers an output. A segmentation model's last resize is such a
one: 21 classes to 520x520 channels last, then permuted to NCHW as PyTorch returns it, a task of 5.6 ms
tuned (fp32, Zen 4), where LR-ASPP's bf16 build took 23 ms in all. The interpolation is separable,
``lerp(lerp(p00, p01, wx), lerp(p10, p11, wx), wy)``: its two inner lerps are input rows resized along the
width. So a width pass resizes each input row (the gathers, over ``H_in x W_out`` pixels: an eighth of the
output at LR-ASPP's scale) and a height pass lerps two of those rows per output row, its loads contiguous
along the row; the operations and their order are TVM's, so are the floats. Where the only reader of an NHWC
resize permutes it to NCHW, the width pass reads NHWC and writes NCHW, and the permutation is gone. Tuned
alone, 64 trials each: LR-ASPP's 5.62 ms became 0.47 + 0.60, DeepLabV3's 5.84 ms 0.25 + 0.53; their fp32
default builds 64.5 -> 51.2 and 117 -> 104 ms.
"""

from __future__ import annotations

import logging
from typing import Optional

import tvm
from tvm import relax, te
from tvm.topi.image.resize import get_inx

from .calls import mutate_relax_functions
from .transpose_sinking import PERMUTE, permute_axes, static_shape

logger = logging.getLogger("ansor")

RESIZE = "relax.image.resize2d"
#: Coordinate modes whose input coordinate depends on the output coordinate alone (not on a region).
MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")
#: Where (batch, channel, row, column) sit in a 4-D tensor of each layout.
AXES = {"NHWC": (0, 3, 1, 2), "NCHW": (0, 1, 2, 3)}
TO_NCHW = (0, 3, 1, 2)
#: TVM's op pattern kOpaque for the width pass: fused with the height pass, the search would inline it there
#: (an injective stage), which is the four gathers an output again.
_UNFUSED = {"op_pattern": 8}


def separable_resizes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each :func:`separable` resize that writes NCHW (its own layout, or an NHWC one whose only
    reader permutes it to NCHW) computed in two passes (see the module notes); the permutations they absorb
    and dead bindings are removed."""
    mutator = _Separate(mod)
    mod = mutate_relax_functions(mutator)
    if mutator.count:
        logger.info("separable resizes: %d", mutator.count)
    return relax.transform.DeadCodeElimination()(mod)


def separable(call: relax.Call) -> bool:
    """Whether ``call`` is a float32 bilinear 2-D resize, of static shape, that does not shrink the rows."""
    if getattr(call.op, "name", "") != RESIZE or not static_shape(call) or not static_shape(call.args[0]):
        return False
    a = call.attrs
    data = call.args[0].ty
    if (a.method != "linear" or a.coordinate_transformation_mode not in MODES or a.layout not in AXES
            or str(data.dtype) != "float32" or str(call.ty.dtype) != "float32"):
        return False
    row = AXES[a.layout][2]
    return int(call.ty.shape[row]) >= int(data.shape[row])


def _at(layout: str, n, c, y, x) -> tuple:
    """The index (or shape) of (batch n, channel c, row y, column x) in ``layout``."""
    index = [None] * 4
    for axis, value in zip(AXES[layout], (n, c, y, x)):
        index[axis] = value
    return tuple(index)


def _coordinate(out: tvm.tirx.PrimExpr, in_len: int, out_len: int, mode: str) -> tuple:
    """TVM's bilinear arithmetic along one axis: the first input index and the weight of the second."""
    at = get_inx(out, tvm.tirx.const(in_len, "int32"), tvm.tirx.const(out_len, "int32"), mode)
    first = te.floor(at).astype("int32")
    return first, at - first


def _clamped(i: tvm.tirx.PrimExpr, length: int) -> tvm.tirx.PrimExpr:
    return te.max(te.min(i, length - 1), 0)


def _lerp(a, b, t):
    return a * (1.0 - t) + b * t  # as TVM's resize writes it


def resize_width(data: te.Tensor, layout: str, out_layout: str, out_w: int, mode: str) -> te.Tensor:
    """Each input row resized to ``out_w`` columns (the inner lerps), read in ``layout``, in ``out_layout``."""
    n, c, h, w = (int(data.shape[a]) for a in AXES[layout])

    def pixel(*index):
        b, ch, y, x = (index[a] for a in AXES[out_layout])
        first, weight = _coordinate(x, w, out_w, mode)
        left = data[_at(layout, b, ch, y, _clamped(first, w))]
        right = data[_at(layout, b, ch, y, _clamped(first + 1, w))]
        return _lerp(left, right, weight)

    return te.compute(_at(out_layout, n, c, h, out_w), pixel, name="resize_width")


def resize_height(rows: te.Tensor, layout: str, out_h: int, mode: str) -> te.Tensor:
    """``rows`` (a :func:`resize_width` result) resized to ``out_h`` rows (the outer lerp)."""
    n, c, h, w = (int(rows.shape[a]) for a in AXES[layout])

    def pixel(*index):
        b, ch, y, x = (index[a] for a in AXES[layout])
        first, weight = _coordinate(y, h, out_h, mode)
        top = rows[_at(layout, b, ch, _clamped(first, h), x)]
        bottom = rows[_at(layout, b, ch, _clamped(first + 1, h), x)]
        return _lerp(top, bottom, weight)

    return te.compute(_at(layout, n, c, out_h, w), pixel, name="resize_height")


@relax.expr_functor.mutator
class _Separate(relax.PyExprMutator):
    """Each :func:`separable` resize becomes its two passes; a ``permute_dims`` to NCHW that is an NHWC
    resize's only reader becomes the two passes writing NCHW."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0
        bound: dict[int, relax.Call] = {}  # variable -> the separable resize bound to it
        readers: dict[int, list[Optional[relax.Call]]] = {}  # variable -> the calls reading it (None: returned)
        for _, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:
                for binding in block.bindings:
                    value = getattr(binding, "value", None)
                    if isinstance(value, relax.Call) and separable(value):
                        bound[binding.var.__chandle__()] = value
                    for var in relax.analysis.free_vars(value) if value is not None else ():
                        readers.setdefault(var.__chandle__(), []).append(value)
            for var in relax.analysis.free_vars(func.body.body):
                readers.setdefault(var.__chandle__(), []).append(None)
        #: NHWC resizes whose only reader permutes them to NCHW: each is done at that reader
        self.absorbed = {k: call for k, call in bound.items() if call.attrs.layout == "NHWC"
                         and [_op_axes(r) for r in readers.get(k, [])] == [TO_NCHW]}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if _op_axes(call) == TO_NCHW and isinstance(call.args[0], relax.Var):
            resize = self.absorbed.get(call.args[0].__chandle__())
            if resize is not None:
                return self._emit(resize, "NCHW")
        if separable(call) and call.attrs.layout == "NCHW":  # NHWC stays TVM's: its loads run along the channels
            return self._emit(call, "NCHW")
        return super().visit_call_(call)

    def _emit(self, resize: relax.Call, out_layout: str) -> relax.Expr:
        """The two passes of ``resize`` (as the module has it, not yet visited), writing ``out_layout``."""
        self.count += 1
        data, layout = self.visit_expr(resize.args[0]), resize.attrs.layout
        mode = resize.attrs.coordinate_transformation_mode
        _, _, out_h, out_w = (int(resize.ty.shape[a]) for a in AXES[layout])
        rows = self.builder_.emit(self.builder_.call_te(resize_width, data, layout, out_layout, out_w, mode,
                                                        primfunc_name_hint="resize_width", primfunc_attrs=_UNFUSED))
        return self.builder_.call_te(resize_height, rows, out_layout, out_h, mode,
                                     primfunc_name_hint="resize_height")


def _op_axes(call: Optional[relax.Call]) -> Optional[tuple[int, ...]]:
    """The axes of a ``permute_dims`` call; None for anything else."""
    if not isinstance(call, relax.Call) or getattr(call.op, "name", "") != PERMUTE:
        return None
    return permute_axes(call)
