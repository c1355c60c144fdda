"""The TE computations of bf16 products: a layer's ``A16`` (its activation rounded to bf16 bits at the
kernel's load, padded, and laid out so that the rows a tile or a dot product reads are a box) and the
product of ``A16`` with the weight packed by :mod:`.bf16`, which decides which form each layer takes."""

from __future__ import annotations

import math
from typing import Callable

import tvm
from tvm import te

from ..state.tensor_intrin import BF16_BITS, bf16_to_f32
from ..task.te_ops import BF16_LANES, BF16_PAIR, bf16_bits_where, bf16_rounded, unpadded


def _channel_bits(data: te.Tensor, channels: int, inside: list, *index) -> tvm.tirx.PrimExpr:
    """``data[index]`` as bf16 bits where ``inside`` holds, in an ``A16`` of ``channels`` channels: zero in
    the channel :func:`.bf16.even_channels` adds."""
    ci = int(data.shape[-1])
    return bf16_bits_where(inside + ([index[-1] < ci] if channels != ci else []), data(*index))


def _channels_last(f: Callable, dims: int) -> Callable:
    """``f(b, *pixel, c)`` with its parameters named (TE names a computation's loops after them, ``i0, i1, ...``
    for ``*args``): ``b, y, x, c``, or ``b, z, y, x, c`` for a 3-D convolution."""
    if dims == 2:
        return lambda b, y, x, c: f(b, y, x, c)
    return lambda b, z, y, x, c: f(b, z, y, x, c)


def _loop_names(dims: int, last: str) -> list[str]:
    """The names of a channels-last computation's pixel loops and its last one, ``last`` (``te.compute``'s
    ``varargs_names``, for a function of ``b, *index``: TE would name them ``i0, i1, ...``)."""
    return [*("z", "y", "x")[-dims:], last]


def _cut(product: te.Tensor, channels: int, width: int = 0) -> te.Tensor:
    """A convolution's output without the zero channels :func:`.bf16.whole_lanes` added (and, ``width``, the
    zero columns a row widened to a tile's rows computed)."""
    shape = [int(d) for d in product.shape[:-1]]
    shape[-1] = width or shape[-1]
    return unpadded(product, (*shape, channels), "conv_bf16_unpadded")


def _padded_bits(data: te.Tensor, channels: int, padding: list[int]) -> tuple[tuple[int, ...], Callable]:
    """The shape and the element of ``data`` (channels last, 2-D or 3-D) rounded to bf16 bits and zero-padded
    (``padding``: the front of each spatial axis, then the back: top, left, bottom, right; ``channels``: with
    the zero channel of :func:`.bf16.even_channels`)."""
    n, *space, _ = (int(d) for d in data.shape)
    before, after = padding[:len(space)], padding[len(space):]

    def rounded(b, *index):
        *pixel, c = index
        if not any(padding):
            return _channel_bits(data, channels, [], b, *pixel, c)
        inside = [cond for p, lo, size in zip(pixel, before, space) for cond in (p >= lo, p < size + lo)]
        return _channel_bits(data, channels, inside, b, *(p - lo for p, lo in zip(pixel, before)), c)

    shape = (n, *(size + lo + hi for size, lo, hi in zip(space, before, after)), channels)
    return shape, _channels_last(rounded, len(space))


def _padded_a16(data: te.Tensor, channels: int, padding: list[int]) -> te.Tensor:
    """``A16`` of a convolution: ``data`` rounded to bf16 bits and zero-padded (:func:`_padded_bits`); an
    unpadded activation its producer stored as bf16 bits (:mod:`.bf16_storage`) is ``A16`` as it is."""
    if data.dtype == BF16_BITS and not any(padding) and channels == int(data.shape[-1]):
        return data
    return te.compute(*_padded_bits(data, channels, padding), name="A16")


def _rounded_values(data: te.Tensor, padding: list[int]) -> te.Tensor:
    """``A32``: ``data`` rounded to bf16 (or, stored as bf16 bits, decoded) as fp32 values, zero-padded. A
    depthwise layer's FMAs read each input element once a tap: converted here, the search may convert it once
    (MobileNet-V3's 3x3 and 5x5 ones, reading bits converted at each tap: 7-43 % slower than fp32; Zen 4)."""
    shape, bits = _padded_bits(data, int(data.shape[-1]), padding)
    return te.compute(shape, lambda b, y, x, ch: bf16_to_f32(bits(b, y, x, ch)), name="A32")


def _out_size(a16: te.Tensor, taps: tuple[int, ...], strides: list[int], dilation: list[int]) -> tuple[int, ...]:
    """The output size along each spatial axis of a convolution over the padded ``a16``."""
    return tuple((int(a16.shape[1 + i]) - dilation[i] * (taps[i] - 1) - 1) // strides[i] + 1
                 for i in range(len(taps)))


def conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, ...], strides: list[int], padding: list[int],
                 dilation: list[int], channels: int, block: int = 0, width: int = 0) -> te.Tensor:
    """Channels-last output (NHWC, or NDHWC for a 3-D convolution) of the convolution of ``data`` (rounded,
    padded: ``A16``) by the packed weight, its first ``channels`` (the rest are :func:`.bf16.whole_lanes`' zero
    channels); ``block``, a grouped one's: every ``block`` output channels read the next ``K`` input channels
    (:func:`.bf16.block_diagonal`), where without it all read all; ``width``: the output's own width, where
    ``padding`` adds zero columns on the right to widen its rows to a tile's (AMX)."""
    n = int(data.shape[0])
    ci = k = int(packed.shape[-3]) * BF16_PAIR
    if block:
        ci = int(packed.shape[0]) * BF16_LANES // block * k
    elif tuple(taps) == (1, 1) and not any(padding) and tuple(strides) != (1, 1):
        return _cut(subsampled_product(data, packed, strides), channels)
    a16 = _padded_a16(data, ci, padding)
    names = ("rz", "ry", "rx")[-len(taps):]
    rtaps = [te.reduce_axis((0, t), name=name) if t > 1 else 0 for t, name in zip(taps, names)]
    rc = te.reduce_axis((0, k), name="rc")
    axes = [r for r in rtaps if not isinstance(r, int)] + [rc]

    def channel(o):
        return o // block * k + rc if block else rc

    def product(b, *index):
        *out, o = index
        pixel = [p * s + r * d for p, s, r, d in zip(out, strides, rtaps, dilation)]
        return te.sum(bf16_to_f32(a16[(b, *pixel, channel(o))]) * bf16_to_f32(
            packed[(o // BF16_LANES, *rtaps, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR)]), axis=axes)

    shape = (n, *_out_size(a16, taps, strides, dilation), packed.shape[0] * BF16_LANES)
    return _cut(te.compute(shape, _channels_last(product, len(taps)), name="conv_bf16"), channels, width)


def subsampled_product(data: te.Tensor, packed: te.Tensor, strides: list[int]) -> te.Tensor:
    """A strided 1x1 convolution as a product over the pixels it reads, gathered as they are rounded
    (``A16``): a row of outputs is then a box of ``A16``, as an AMX tile loads it, where in ``data`` it is
    every second pixel (a stride-2 tile's rows, which TensorIR cannot match to a box)."""
    n, h, w, _ = (int(d) for d in data.shape)
    ci = int(packed.shape[-3]) * BF16_PAIR
    sy, sx = strides
    shape = (n, (h - 1) // sy + 1, (w - 1) // sx + 1, ci)
    a16 = te.compute(shape, lambda b, y, x, c: _channel_bits(data, ci, [], b, y * sy, x * sx, c), name="A16")
    rc = te.reduce_axis((0, ci), name="rc")
    return te.compute((*shape[:3], packed.shape[0] * BF16_LANES), lambda b, y, x, o: te.sum(
        bf16_to_f32(a16[b, y, x, rc])
        * bf16_to_f32(packed[o // BF16_LANES, 0, 0, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=rc), name="conv_bf16")


def flat_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, int], padding: list[int],
                      dilation: list[int], channels: int, rows: int) -> te.Tensor:
    """A stride-1 convolution (AMX targets) over its padded image flattened, each pixel a row of ``A16[b, p,
    c]``: output ``(y, x)`` is row ``Wp y + x`` of a product over ``rows`` rows (``Wp``: the padded width),
    tap ``(ry, rx)`` reads row ``p + Wp dy ry + dx rx``, so a tile's rows are one box wherever they fall, across
    image rows too. Rows past an output row's end (``x >= out_w``) and past the image are computed and cut. A
    1x1 convolution is a dense layer over its pixels so (Inception's 17 x 17 = 289 as 304 rows, 19 tiles of
    16), a 7x1 one nearly (289 as 304 too), a 1x7 one computes 6 columns more a row (17 x 23 as 400); tiles
    of 16 rows that way took less than a widened row's (:func:`.bf16.flat_rows`)."""
    n, h, w, _ = (int(d) for d in data.shape)
    ci = int(packed.shape[-3]) * BF16_PAIR
    (kh, kw), (dy, dx) = taps, dilation
    top, left, bottom, right = padding
    wp = w + left + right
    out_h, out_w = h + top + bottom - dy * (kh - 1), wp - dx * (kw - 1)

    def rounded(b, p, c):
        y, x = p // wp - top, p % wp - left
        inside = [y >= 0, y < h, x >= 0, x < w] if any(padding) else [p < h * w]
        return _channel_bits(data, ci, inside, b, y, x, c)

    a16 = te.compute((n, rows + dy * (kh - 1) * wp + dx * (kw - 1), ci), rounded, name="A16")
    ry, rx = (te.reduce_axis((0, t), name=name) if t > 1 else 0 for t, name in zip(taps, ("ry", "rx")))
    rc = te.reduce_axis((0, ci), name="rc")
    product = te.compute((n, rows, packed.shape[0] * BF16_LANES), lambda b, p, o: te.sum(
        bf16_to_f32(a16[b, p + ry * dy * wp + rx * dx, rc])
        * bf16_to_f32(packed[o // BF16_LANES, ry, rx, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=[r for r in (ry, rx) if not isinstance(r, int)] + [rc]), name="conv_bf16")
    return te.compute((n, out_h, out_w, channels), lambda b, y, x, o: product[b, y * wp + x, o],
                      name="conv_bf16_unpadded")


def _tap(t: tvm.tirx.PrimExpr, taps: tuple[int, ...], axis: int) -> tvm.tirx.PrimExpr:
    """The tap along ``axis`` of unfolded tap ``t`` (taps in row-major order: the last axis's move fastest)."""
    inner = math.prod(taps[axis + 1:])
    index = t // inner if inner > 1 else t
    return index if axis == 0 else index % taps[axis]


def unfolded_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, ...], strides: list[int],
                          padding: list[int], unfold: int, channels: int, width: int = 0) -> te.Tensor:
    """A convolution of few input channels (AMX targets; 2-D or 3-D) with ``unfold`` of its taps in ``A16``'s
    channels: ``A16[b, y, x, (t, c)]`` is the padded pixel that output ``(y, x)``'s tap ``t`` reads, channel
    ``c`` (all taps unfolded: a 1x1 convolution over them), or, a row of taps unfolded, that output column's
    tap ``t`` in padded input row ``y`` (a ``KH x 1`` convolution of vertical stride ``sy`` over them; for a
    3-D one, ``b, z, y, x``: ``KD x KH x 1``). Consecutive outputs of a row then read a box of ``A16``, 32 or
    64 channels deep, as AMX tiles take it, where the activation holds 3 channels a pixel, strided. ``width``:
    the output's own width, where ``padding`` widens its rows (:func:`conv_product`)."""
    n, *space, ci = (int(d) for d in data.shape)
    k = int(packed.shape[-3]) * BF16_PAIR
    dims = len(space)
    before, after = padding[:dims], padding[dims:]
    out = [(size + lo + hi - t) // s + 1 for size, lo, hi, t, s in zip(space, before, after, taps, strides)]
    full = unfold == math.prod(taps)

    def rounded(b, *index):
        *lead, x, j = index
        t, c = j // ci, j % ci
        pixel = [(p * s + _tap(t, taps, i) if full else p) - lo
                 for i, (p, s, lo) in enumerate(zip(lead, strides, before))]
        pixel.append(x * strides[-1] + t % taps[-1] - before[-1])
        inside = [cond for p, size in zip(pixel, space) for cond in (p >= 0, p < size)]
        return bf16_bits_where([j < unfold * ci, *inside], data(b, *pixel, c))

    lead_size = out[:-1] if full else [size + lo + hi for size, lo, hi in zip(space[:-1], before, after)]
    a16 = te.compute((n, *lead_size, out[-1], k), rounded, name="A16", varargs_names=_loop_names(dims, "j"))
    rc = te.reduce_axis((0, k), name="rc")
    rtaps = [0] * (dims - 1) if full else [te.reduce_axis((0, t), name=name)
                                           for t, name in zip(taps[:-1], ("rz", "ry")[-(dims - 1):])]

    def product(b, *index):
        *lead, x, o = index
        pixel = lead if full else [p * s + r for p, s, r in zip(lead, strides, rtaps)]
        return te.sum(bf16_to_f32(a16[(b, *pixel, x, rc)]) * bf16_to_f32(
            packed[(o // BF16_LANES, *rtaps, 0, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR)]),
            axis=[rc] if full else [*rtaps, rc])

    return _cut(te.compute((n, *out, packed.shape[0] * BF16_LANES), product, name="conv_bf16",
                           varargs_names=_loop_names(dims, "o")), channels, width)


def row_phased_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, ...], strides: list[int],
                            padding: list[int], channels: int, width: int = 0) -> te.Tensor:
    """A strided convolution (AMX targets; 2-D or 3-D) over its input in phases along its rows:
    ``A16[b, px, z, y, x, c]`` is padded pixel ``(z, y, sx * x + px)``, and output ``(z, y, x)``'s tap
    ``(rz, ry, sx * qx + px)`` reads ``A16[b, px, sz * z + rz, sy * y + ry, x + qx, c]``: a row of outputs is
    a box, as a tile loads it, where in the activation it is every second pixel (a tile's rows are one output
    row's, so the other axes need no phases: a 3x3 kernel of stride 2 computes 12 taps for 9, in phases along
    both axes 16). The reduction runs over ``rz, ry, qx, px`` and the channels (:func:`.bf16.row_phase_weight`);
    ``width``: the output's own width, where ``padding`` widens its rows (:func:`conv_product`)."""
    n, *space, _ = (int(d) for d in data.shape)
    ci = int(packed.shape[-3]) * BF16_PAIR
    dims = len(space)
    before, after = padding[:dims], padding[dims:]
    sx, qw = strides[-1], -(-taps[-1] // strides[-1])
    out = [(size + lo + hi - t) // s + 1 for size, lo, hi, t, s in zip(space, before, after, taps, strides)]

    def rounded(b, px, *index):
        *pixel, x, c = index
        pixel = [p - lo for p, lo in zip(pixel, before)] + [x * sx + px - before[-1]]
        inside = [cond for p, size in zip(pixel, space) for cond in (p >= 0, p < size)]
        return _channel_bits(data, ci, inside, b, *pixel, c)

    lead_size = [size + lo + hi for size, lo, hi in zip(space[:-1], before, after)]
    a16 = te.compute((n, sx, *lead_size, out[-1] + qw - 1, ci), rounded, name="A16",
                     varargs_names=_loop_names(dims, "c"))
    rtaps = [te.reduce_axis((0, t), name=name) for t, name in zip(taps[:-1], ("rz", "ry")[-(dims - 1):])]
    qx, px = te.reduce_axis((0, qw), name="qx"), te.reduce_axis((0, sx), name="px")
    rc = te.reduce_axis((0, ci), name="rc")

    def product(b, *index):
        *lead, x, o = index
        pixel = [p * s + r for p, s, r in zip(lead, strides, rtaps)]
        return te.sum(bf16_to_f32(a16[(b, px, *pixel, x + qx, rc)]) * bf16_to_f32(
            packed[(o // BF16_LANES, *rtaps, qx, px, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR)]),
            axis=[*rtaps, qx, px, rc])

    return _cut(te.compute((n, *out, packed.shape[0] * BF16_LANES), product, name="conv_bf16",
                           varargs_names=_loop_names(dims, "o")), channels, width)


def paired_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, int], padding: list[int],
                         channels: int) -> te.Tensor:
    """A grouped convolution of 16-channel blocks (:func:`.bf16.block_diagonal`; AMX targets, stride 1) with each two
    taps of a row in ``A16``'s channels: ``A16[b, y, x, (g, t, c)]`` is padded pixel ``(y, x + t)``, channel
    ``16 g + c``, so output ``x``'s pair ``q`` reads ``A16[b, y + ry, x + 2q, (g, :, :)]``: 32 values a row of a
    tile, as its depth takes them, where a block's own channels are 16 (twice the activation's bytes; a
    3-tap row computes 4)."""
    n, h, w, _ = (int(d) for d in data.shape)
    depth = int(packed.shape[-3]) * BF16_PAIR
    k, blocks = depth // 2, int(packed.shape[0])
    (kh, kw), pairs = taps, int(packed.shape[2])
    top, left, bottom, right = padding
    out_h, out_w = h + top + bottom - kh + 1, w + left + right - kw + 1

    def rounded(b, y, x, j):
        yy, xx = y - top, x + j % depth // k - left
        return _channel_bits(data, blocks * k, [yy >= 0, yy < h, xx >= 0, xx < w], b, yy, xx,
                             j // depth * k + j % k)

    a16 = te.compute((n, out_h + kh - 1, out_w + 2 * (pairs - 1), blocks * depth), rounded, name="A16")
    ry, qx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, pairs), name="qx")
    rc = te.reduce_axis((0, depth), name="rc")
    return _cut(te.compute((n, out_h, out_w, blocks * BF16_LANES), lambda b, y, x, o: te.sum(
        bf16_to_f32(a16[b, y + ry, x + 2 * qx, o // BF16_LANES * depth + rc]) * bf16_to_f32(
            packed[o // BF16_LANES, ry, qx, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=[ry, qx, rc]), name="conv_bf16"), channels)


def phased_paired_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, int], strides: list[int],
                               padding: list[int], channels: int) -> te.Tensor:
    """A strided grouped convolution of 16-channel blocks (AMX targets) over its input in phases, so that a row
    of outputs reads consecutive pixels of a phase (:func:`row_phased_conv_product`; here along both axes), with
    each two taps of a phase's row in ``A16``'s channels (:func:`paired_conv_product`): ``A16[b, py, px, y, x,
    (g, t, c)]`` is padded pixel ``(sy * y + py, sx * (x + t) + px)``, channel ``16 g + c``; the reduction runs
    over ``qy, py``, the pairs ``qp``, ``px`` and the 32 channels (:func:`.bf16.paired_taps`)."""
    n, h, w, _ = (int(d) for d in data.shape)
    depth = int(packed.shape[-3]) * BF16_PAIR
    k, blocks = depth // 2, int(packed.shape[0])
    (kh, kw), (sy, sx) = taps, strides
    top, left, bottom, right = padding
    qh, pairs = -(-kh // sy), int(packed.shape[3])
    out_h, out_w = (h + top + bottom - kh) // sy + 1, (w + left + right - kw) // sx + 1

    def rounded(b, py, px, y, x, j):
        yy, xx = y * sy + py - top, (x + j % depth // k) * sx + px - left
        return _channel_bits(data, blocks * k, [yy >= 0, yy < h, xx >= 0, xx < w], b, yy, xx,
                             j // depth * k + j % k)

    a16 = te.compute((n, sy, sx, out_h + qh - 1, out_w + 2 * (pairs - 1), blocks * depth), rounded, name="A16")
    qy, py = te.reduce_axis((0, qh), name="qy"), te.reduce_axis((0, sy), name="py")
    qp, px = te.reduce_axis((0, pairs), name="qp"), te.reduce_axis((0, sx), name="px")
    rc = te.reduce_axis((0, depth), name="rc")
    return _cut(te.compute((n, out_h, out_w, blocks * BF16_LANES), lambda b, y, x, o: te.sum(
        bf16_to_f32(a16[b, py, px, y + qy, x + 2 * qp, o // BF16_LANES * depth + rc]) * bf16_to_f32(
            packed[o // BF16_LANES, qy, py, qp, px, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=[qy, py, qp, px, rc]), name="conv_bf16"), channels)


def grouped_conv_product(data: te.Tensor, weight: te.Tensor, groups: int, strides: list[int],
                          padding: list[int], dilation: list[int]) -> te.Tensor:
    """NHWC output of a grouped (depthwise: one channel a group) convolution of ``data`` (rounded, padded:
    ``A32``) by ``weight`` (HWIO, ``[KH, KW, CI / groups, CO]``, fp32 values of bf16), in fp32 FMA: output
    channel ``o`` reads the input channels of its group, ``o // (CO / groups)``."""
    kh, kw, ci_group, co = (int(d) for d in weight.shape)
    co_group = co // groups
    a32 = _rounded_values(data, padding)
    out_h, out_w = _out_size(a32, (kh, kw), strides, dilation)
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, ci_group), name="rc") if ci_group > 1 else 0
    axes = [ry, rx] + ([rc] if ci_group > 1 else [])

    def channel(o):
        return o if (ci_group, co_group) == (1, 1) else o // co_group * ci_group + rc

    return te.compute((int(data.shape[0]), out_h, out_w, co), lambda b, y, x, o: te.sum(
        a32[b, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1], channel(o)]
        * weight[ry, rx, rc, o], axis=axes), name="group_conv_bf16")


def dense_product(data: te.Tensor, packed: te.Tensor, padded: tuple[int, ...], columns: int) -> te.Tensor:
    """``data @ weight`` over the last axis of ``data`` (rounded: ``A16``) and the packed weight, its leading
    dimensions ``padded``: more rows than ``data`` has pads it with zero rows, computed and never read, in a
    product without the unit dimensions after the padded one (rows then columns, as a tile product takes
    them: ``[197, 1, 768]`` on 208 rows); the output is cut back to ``data``'s rows and ``columns`` (without
    :func:`.bf16.whole_lanes`' zero columns)."""
    *lead, k = (int(d) for d in data.shape)
    grown = [j for j, (p, d) in enumerate(zip(padded, lead)) if p != d]
    rows = [j for j in range(len(lead)) if not grown or j <= grown[0] or lead[j] != 1]

    def a16_bits(*i):
        index = [0] * len(lead)
        for j, v in zip(rows, i):
            index[j] = v
        return bf16_bits_where([index[j] < lead[j] for j in rows if padded[j] != lead[j]], data(*index, i[-1]))

    a16 = bf16_rounded(data, (*padded, k)) if len(rows) == len(lead) else te.compute(
        (*(padded[j] for j in rows), k), a16_bits, name="A16")
    r = te.reduce_axis((0, k), name="k")
    product = te.compute((*(padded[j] for j in rows), packed.shape[0] * BF16_LANES), lambda *i: te.sum(
        bf16_to_f32(a16(*i[:-1], r))
        * bf16_to_f32(packed[i[-1] // BF16_LANES, r // BF16_PAIR, i[-1] % BF16_LANES, r % BF16_PAIR]),
        axis=r), name="dense_bf16")
    if len(rows) == len(lead):
        return unpadded(product, (*lead, columns), "dense_bf16_unpadded")
    return te.compute((*lead, columns), lambda *i: product(*(i[j] for j in rows), i[-1]),
                      name="dense_bf16_unpadded")
