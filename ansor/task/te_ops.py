"""TE building blocks of the built-in workloads, each a stage named as a network's would be: zero padding
is its own stage ``pad``, a convolution is ``conv``, softmax has TOPI's four stages (which the networks'
fast math reuses), so sketch rules see the producer/consumer structure of a real network.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tvm
from tvm import te

from ..state.tensor_intrin import BF16_BITS, bf16_bits, bf16_to_f32

#: The names of the spatial axes of 1-d, 2-d and 3-d convolutions, outermost first.
SPATIAL_NAMES = {1: ("l",), 2: ("h", "w"), 3: ("d", "h", "w")}
#: Output columns per bf16 dot product (``vdpbf16ps``: 16 fp32 lanes) and reduction elements per lane (a pair).
BF16_LANES, BF16_PAIR = 16, 2


def out_size(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def pad_stage(
    data: te.Tensor, before: Sequence[int], after: Sequence[int], names: Sequence[str],
    value: float = 0.0, interior: Sequence[int] | None = None,
) -> te.Tensor:
    """Padding as its own stage named "pad".

    ``interior[d] = s`` spreads the elements ``s`` apart (``s - 1`` fill values between neighbours),
    which turns a transposed convolution into an ordinary one.
    """
    interior = interior or [1] * len(before)
    extents = [int(n) for n in data.shape]
    shape = [b + (n - 1) * s + 1 + a for n, b, a, s in zip(extents, before, after, interior)]

    def fcompute(*idx):
        conds, src = [], []
        for i, n, b, a, s in zip(idx, extents, before, after, interior):
            if b == 0 and a == 0 and s == 1:
                src.append(i)
                continue
            off = i - b
            conds.append(off >= 0)
            if s > 1:
                conds.append(tvm.tirx.indexmod(off, s) == 0)
                off = tvm.tirx.indexdiv(off, s)
            conds.append(off < n)
            src.append(off)
        if not conds:
            return data(*src)
        fill = tvm.tirx.const(value, data.dtype)
        return tvm.tirx.if_then_else(tvm.tirx.all(*conds), data(*src), fill)

    return te.compute(shape, fcompute, name="pad", varargs_names=list(names))


def conv_stage(data: te.Tensor, kernel: te.Tensor, stride: int, pad: int, dilation: int = 1, groups: int = 1):
    """N-d grouped, dilated convolution: data (N, *spatial, CI), kernel (*window, CI/groups, CO)."""
    nd = len(data.shape) - 2
    spatial = SPATIAL_NAMES[nd]
    window = [int(k) for k in kernel.shape[:nd]]
    ci, co = int(data.shape[-1]), int(kernel.shape[-1])
    ci_group, co_group = ci // groups, co // groups
    out = [out_size(int(n), k, stride, pad, dilation) for n, k in zip(data.shape[1:-1], window)]
    src = data
    if pad:
        src = pad_stage(data, [0, *[pad] * nd, 0], [0, *[pad] * nd, 0], ("n", *spatial, "c"))
    r_win = [te.reduce_axis((0, k), name="r" + s) for k, s in zip(window, spatial)]
    rc = te.reduce_axis((0, ci_group), name="rc")

    def fcompute(n, *rest):
        *pos, oc = rest
        channel = rc if groups == 1 else oc // co_group * ci_group + rc
        taps = [p * stride + r * dilation for p, r in zip(pos, r_win)]
        return te.sum(src(n, *taps, channel) * kernel(*r_win, rc, oc), axis=[*r_win, rc])

    shape = (int(data.shape[0]), *out, co)
    return te.compute(shape, fcompute, name="conv", varargs_names=[*spatial, "co"])


def channel_op(x: te.Tensor, vec: te.Tensor, op: Callable, name: str) -> te.Tensor:
    """Per-output-channel elementwise stage on an NHWC tensor (bias add, batch-norm scale/shift)."""
    return te.compute(x.shape, lambda n, h, w, c: op(x[n, h, w, c], vec[c]), name=name)


def relu_stage(x: te.Tensor, names: Sequence[str], name: str = "relu") -> te.Tensor:
    zero = tvm.tirx.const(0.0, x.dtype)
    return te.compute(x.shape, lambda *i: te.max(x(*i), zero), name=name, varargs_names=list(names))


def softmax_stages(x: te.Tensor, names: Sequence[str], exp: Callable = te.exp, lanes: int = 0) -> te.Tensor:
    """Softmax over the last axis, staged the way TOPI writes it (max, exp, sum, normalise); ``exp`` maps
    a PrimExpr to its exponential (networks pass a vectorizable one). ``lanes``: a row no vector of that
    many lanes divides reduces in two steps, the row in lanes first (its tail masked), then the lanes."""
    outer, n = list(names[:-1]), x.shape[-1]  # n keeps its type: the one-step form's workload keys stay

    def over_row(row: te.Tensor, reducer: Callable, identity, name: str) -> te.Tensor:
        if lanes and int(n) % lanes and int(n) > lanes:
            return _in_lanes(row, x.shape, outer, lanes, reducer, identity, name)
        k = te.reduce_axis((0, n), name="k")
        return te.compute(x.shape[:-1], lambda *i: reducer(row(*i, k), axis=k), name=name, varargs_names=outer)

    maxelem = over_row(x, te.max, tvm.tirx.min_value("float32"), "T_softmax_maxelem")
    exps = te.compute(
        x.shape, lambda *i: exp(x(*i) - maxelem(*i[:-1])), name="T_softmax_exp", varargs_names=list(names)
    )
    expsum = over_row(exps, te.sum, tvm.tirx.const(0.0, "float32"), "T_softmax_expsum")
    return te.compute(
        x.shape, lambda *i: exps(*i) / expsum(*i[:-1]), name="T_softmax_norm", varargs_names=list(names)
    )


def _in_lanes(row: te.Tensor, shape, outer: list[str], lanes: int, reducer: Callable, identity, name: str) -> te.Tensor:
    """``reducer`` over the last axis of ``row`` in two stages: ``name``_lanes (lane ``l`` of each row reduces
    elements ``l, l + lanes, ...``, the last vector's missing elements ``identity``), then the lanes."""
    n = int(shape[-1])
    j = te.reduce_axis((0, -(-n // lanes)), name="j")

    def lane(*i):
        col = j * lanes + i[-1]
        return reducer(tvm.tirx.if_then_else(col < n, row(*i[:-1], tvm.tirx.min(col, n - 1)), identity), axis=j)

    per_lane = te.compute((*shape[:-1], lanes), lane, name=f"{name}_lanes", varargs_names=[*outer, "l"])
    k = te.reduce_axis((0, lanes), name="k")
    return te.compute(shape[:-1], lambda *i: reducer(per_lane(*i, k), axis=k), name=name, varargs_names=outer)


def bf16_bits_where(inside: Sequence[tvm.tirx.PrimExpr], value: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """``value`` rounded to bf16 bits where every condition of ``inside`` holds, zero elsewhere (a padded
    operand's border; no condition: everywhere). ``value`` is read only where they hold; a ``value`` that
    holds bf16 bits already (an activation its producer stored so) is taken as it is."""
    bits = str(value.ty.dtype) == BF16_BITS
    if not inside:
        return value if bits else bf16_bits(value)
    chosen = tvm.tirx.if_then_else(tvm.tirx.all(*inside), value, tvm.tirx.const(0, str(value.ty.dtype)))
    return chosen if bits else bf16_bits(chosen)


def bf16_rounded(data: te.Tensor, shape: Optional[Sequence[int]] = None) -> te.Tensor:
    """``A16``: ``data`` rounded to bf16 bits (``uint16``) at the kernel's load; on a larger ``shape``, zeros
    past ``data``'s extents (a product padded to whole tiles, k pairs or 16-column groups). ``data`` of bf16
    bits at its own shape is ``A16`` itself: the product reads it where its producer wrote it."""
    extents = [int(d) for d in data.shape]
    shape = list(shape or extents)
    if data.dtype == BF16_BITS and shape == extents:
        return data
    return te.compute(shape, lambda *i: bf16_bits_where(
        [c < e for c, e, p in zip(i, extents, shape) if p != e], data(*i)), name="A16")


def to_bf16_bits(data: te.Tensor) -> te.Tensor:
    """``data`` rounded to bf16 bits, element by element: an activation stored for bf16 products alone."""
    return te.compute(data.shape, lambda *i: bf16_bits(data(*i)), name="bf16_bits")


def unpadded(product: te.Tensor, shape: Sequence[int], name: str) -> te.Tensor:
    """``product``'s first ``shape`` elements (an identity where it has that shape already)."""
    if [int(d) for d in product.shape] == list(shape):
        return product
    return te.compute(shape, lambda *i: product(*i), name=name)


def bf16_matmul(a: te.Tensor, b: te.Tensor, name: str = "matmul_bf16",
                extents: Optional[tuple[int, int, int]] = None) -> te.Tensor:
    """``a @ b`` over the last two axes in bf16: both operands rounded in the kernel, ``a`` as ``A16`` and ``b``
    as ``B16``, packed in the k pairs of 16 columns the bf16 dot product reads; products and sums in fp32.
    ``extents`` (rows, k, n), at least ``a``'s and ``b``'s: the product on operands padded with zeros to them
    (whole k pairs and 16-column groups; rows for AMX tiles), its output then cut back (``name`` + "_unpadded")."""
    *lead, k0, n0 = (int(d) for d in b.shape)
    m0 = int(a.shape[-2])
    m, k, n = extents or (m0, k0, n0)
    a16 = bf16_rounded(a, (*lead, m, k))

    def b_bits(*i):
        kk, nn = i[-3] * BF16_PAIR + i[-1], i[-4] * BF16_LANES + i[-2]
        return bf16_bits_where([c < e for c, e, p in ((kk, k0, k), (nn, n0, n)) if p != e], b(*i[:-4], kk, nn))

    b16 = te.compute((*lead, n // BF16_LANES, k // BF16_PAIR, BF16_LANES, BF16_PAIR), b_bits, name="B16")
    r = te.reduce_axis((0, k), name="k")
    product = te.compute((*lead, m, n), lambda *i: te.sum(
        bf16_to_f32(a16(*i[:-1], r)) * bf16_to_f32(
            b16(*i[:-2], i[-1] // BF16_LANES, r // BF16_PAIR, i[-1] % BF16_LANES, r % BF16_PAIR)),
        axis=r), name=name)
    return unpadded(product, (*lead, m0, n0), name + "_unpadded")


def matmul_stage(a: te.Tensor, b: te.Tensor, name: str = "C") -> te.Tensor:
    """``a @ b`` over the last two axes in fp32 (leading axes batch both operands alike)."""
    *lead, m, k = (int(d) for d in a.shape)
    r = te.reduce_axis((0, k), name="k")
    return te.compute((*lead, m, int(b.shape[-1])), lambda *i: te.sum(a(*i[:-1], r) * b(*i[:-2], r, i[-1]), axis=r),
                      name=name)
