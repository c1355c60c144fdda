"""Winograd F(2x2, 3x3) for the 3x3 stride-1 NHWC convolutions of a CPU network with constant weights.

A 3x3 convolution computes each 2x2 output tile with 36 multiply-adds per channel pair; Winograd's
minimal filtering does it with 16, in three steps that each become a tuning task:

1. the input transform ``V = B^T d B`` of every overlapping 4x4 input tile (adds and subtracts only);
2. 16 independent matrix products ``M[t] = V[t] @ U[t]`` over the channels (a batched ``R.matmul``, which
   the search tiles like any dense layer and whose constant ``U`` :mod:`ansor.state.layout_rewrite` packs);
3. the output transform ``Y = A^T M A`` of each tile, with the convolution's epilogue (bias, ReLU,
   residual add) fused into it by ``FuseOps`` because it is element-wise in form.

The weight transform ``U = G g G^T`` runs once, here, in numpy. F(2x2, 3x3) and not F(4x4, 3x3): its
transformed weights are (4/3)^2 = 1.8 times the original, F(4x4)'s 4 times, which deep layers (512
channels: 16.8 MB) would read from memory at every inference; its error is that of a plain convolution
(the transforms' entries are 0, 1/2 and 1); and even on DenseNet-121's small-weight 56x56 layers F(4x4)'s
default build measured slower (17.5 against 15.6 ms: its input transforms cost more than its products save).

Adopted because it measured faster (docs/design.md, "Winograd"): ResNet-50's four 3x3 stride-1 layer
shapes took less time as the three tasks than as one direct convolution, each tuned alone.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tvm
from tvm import relax, te

from .conv_rewrite import ConvRewrite, plain_nhwc, rewrite_convs

#: F(2x2, 3x3): input transform B^T, weight transform G, output transform A^T (Lavin and Gray, 2015).
_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype="float64")
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype="float64")
_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype="float64")
_TILE = 2  # output tile side
_ALPHA = 4  # input tile side
#: The tile count is rounded up to a multiple of this (zero tiles), so the products' rows can be register
#: blocked: ResNet-50's 14x14 layers have 49 tiles, and their product [16,49,256]x[16,256,256] tuned alone
#: (128 trials) ran 0.90 ms, padded to 56 rows 0.80 ms, to 52 rows 0.83.
_ROWS = 8
#: Thinner convolutions stay direct: their matrix products would be too thin to tile (ResNet-50's layers,
#: 64-512 channels, are what was measured).
MIN_CHANNELS = 16
#: TVM's op pattern kInjective: the analysis calls the transforms opaque (selects in their indices), and
#: an opaque output transform would not take the convolution's epilogue.
_INJECTIVE = {"op_pattern": 2}


def winograd_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every eligible convolution (:func:`eligible`) computed by Winograd F(2x2, 3x3)."""
    return rewrite_convs(mod, _WinogradConvs, "3x3 convolutions computed by Winograd F(2x2, 3x3)")


def eligible(call: relax.Call, weight) -> bool:
    """A float32 NHWC/HWIO 3x3 convolution, stride 1, no dilation or groups, with a constant weight and at
    least :data:`MIN_CHANNELS` input and output channels."""
    if weight is None:
        return False
    a = call.attrs
    return (plain_nhwc(call) and [int(d) for d in a.dilation] == [1, 1]
            and weight.shape[:2] == (3, 3) and min(weight.shape[2:]) >= MIN_CHANNELS and weight.dtype == np.float32
            and str(call.args[0].ty.dtype) == "float32" and str(a.out_dtype) in ("", "None", "float32"))


def transform_weight(weight: np.ndarray) -> np.ndarray:
    """HWIO 3x3 weight -> ``U`` of shape (16, CI, CO): ``U[4 e + n] = (G g G^T)[e, n]`` per channel pair."""
    u = np.einsum("ei,ijcd,nj->encd", _G, weight.astype("float64"), _G)
    return np.ascontiguousarray(u.reshape(_ALPHA * _ALPHA, *weight.shape[2:]).astype(weight.dtype))


@relax.expr_functor.mutator
class _WinogradConvs(ConvRewrite):

    def rewrite(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        if not eligible(call, weight):
            return None
        pad = [int(p) for p in call.attrs.padding]  # top, left, bottom, right
        n, h, w, _ = (int(d) for d in call.args[0].ty.shape)
        out_h, out_w = h + pad[0] + pad[2] - 2, w + pad[1] + pad[3] - 2
        tiles = (n, -(-out_h // _TILE), -(-out_w // _TILE))
        count = tiles[0] * tiles[1] * tiles[2]
        rows = -(-count // _ROWS) * _ROWS
        data = self.builder_.emit_te(_input_transform, call.args[0], pad[0], pad[1], tiles, rows,
                                     primfunc_name_hint="winograd_input", primfunc_attrs=_INJECTIVE)
        u = transform_weight(weight)
        product = self.builder_.emit(relax.op.matmul(data, relax.const(u, "float32")))
        return self.builder_.call_te(_output_transform, product, (n, out_h, out_w), tiles,
                                     primfunc_name_hint="winograd_output", primfunc_attrs=_INJECTIVE)


def _row_terms(matrix: np.ndarray, row) -> list[tuple[tvm.tirx.PrimExpr, tvm.tirx.PrimExpr]]:
    """The nonzero entries of ``matrix[row]`` for a symbolic ``row``: (column, value) pairs, one per rank.

    Every row of the Winograd matrices has the same number of nonzeros, so term ``k`` of a row is its
    ``k``-th nonzero; column and value are picked by ``row`` (loop-invariant selects the compiler hoists).
    """
    nonzero = [np.flatnonzero(r) for r in matrix]
    assert len({len(c) for c in nonzero}) == 1, "rows with different numbers of nonzeros"

    def pick(values: list, dtype: str) -> tvm.tirx.PrimExpr:
        expr = tvm.tirx.const(values[-1], dtype)
        for i in range(len(values) - 2, -1, -1):
            if values[i] != values[-1]:
                expr = tvm.tirx.Select(row == i, tvm.tirx.const(values[i], dtype), expr)
        return expr

    return [(pick([int(c[k]) for c in nonzero], str(row.ty)),
             pick([float(matrix[r, c[k]]) for r, c in enumerate(nonzero)], "float32"))
            for k in range(len(nonzero[0]))]


def _input_transform(data: te.Tensor, pad_top: int, pad_left: int, tiles: tuple[int, int, int],
                     rows: int) -> te.Tensor:
    """``V[4 e + n, p, c]``: tile ``p``'s ``(B^T d B)[e, n]`` of channel ``c``, the padding read as zeros."""
    _, h, w, c = data.shape
    batch, tiles_h, tiles_w = tiles
    count = batch * tiles_h * tiles_w

    def value(t, p, ci):
        b, th, tw = p // (tiles_h * tiles_w), p // tiles_w % tiles_h, p % tiles_w
        total = None
        for row_a, coef_a in _row_terms(_BT, t // _ALPHA):
            for row_b, coef_b in _row_terms(_BT, t % _ALPHA):
                y, x = th * _TILE + row_a - pad_top, tw * _TILE + row_b - pad_left
                inside = tvm.tirx.all(y >= 0, y < h, x >= 0, x < w)
                if rows > count:
                    inside = tvm.tirx.all(p < count, inside)
                term = tvm.tirx.if_then_else(inside, data[b, y, x, ci], tvm.tirx.const(0, data.dtype))
                term = term * (coef_a * coef_b)
                total = term if total is None else total + term
        return total

    return te.compute((_ALPHA * _ALPHA, rows, c), value, name="winograd_input")


def _output_transform(product: te.Tensor, out_shape: tuple[int, int, int], tiles: tuple[int, int, int]) -> te.Tensor:
    """``Y[b, y, x, c] = (A^T M A)[y % 2, x % 2]`` of the tile holding pixel ``(y, x)``."""
    _, tiles_h, tiles_w = tiles
    n, out_h, out_w = out_shape

    def value(b, y, x, co):
        p = (b * tiles_h + y // _TILE) * tiles_w + x // _TILE
        total = None
        for col_a, coef_a in _row_terms(_AT, y % _TILE):
            for col_b, coef_b in _row_terms(_AT, x % _TILE):
                term = product[col_a * _ALPHA + col_b, p, co] * (coef_a * coef_b)
                total = term if total is None else total + term
        return total

    return te.compute((n, out_h, out_w, product.shape[2]), value, name="winograd_output")
