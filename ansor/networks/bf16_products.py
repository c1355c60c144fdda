"""The TE computations of bf16 products: a layer's ``A16`` (its activation rounded to bf16 bits at the
kernel's load, padded, and laid out so that the rows a tile or a dot product reads are a box) and the
product of ``A16`` with the weight packed by :mod:`.bf16`, which decides which form each layer takes."""

from __future__ import annotations

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


def phased_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, int], strides: list[int],
                         padding: list[int], channels: int) -> te.Tensor:
    """A strided convolution (AMX targets) over its input in phases: ``A16[b, py, px, y, x, c]`` is padded
    pixel ``(sy * y + py, sx * x + px)`` and a tap ``(sy * qy + py, sx * qx + px)`` reads ``A16[b, py, px,
    y + qy, x + qx, c]``, so consecutive outputs read consecutive pixels of a phase: a row of outputs is a box,
    as an AMX tile loads it, where in the activation it is every second pixel. The reduction runs over
    ``qy, py, qx, px`` and the channels, the taps past the kernel's zero (:func:`.bf16.phase_weight`)."""
    n, h, w, _ = (int(d) for d in data.shape)
    ci = int(packed.shape[-3]) * BF16_PAIR
    (kh, kw), (sy, sx) = taps, strides
    top, left, bottom, right = padding
    qh, qw = -(-kh // sy), -(-kw // sx)
    out_h, out_w = (h + top + bottom - kh) // sy + 1, (w + left + right - kw) // sx + 1

    def rounded(b, py, px, y, x, c):
        yy, xx = y * sy + py - top, x * sx + px - left
        return _channel_bits(data, ci, [yy >= 0, yy < h, xx >= 0, xx < w], b, yy, xx, c)

    a16 = te.compute((n, sy, sx, out_h + qh - 1, out_w + qw - 1, ci), rounded, name="A16")
    qy, py = te.reduce_axis((0, qh), name="qy"), te.reduce_axis((0, sy), name="py")
    qx, px = te.reduce_axis((0, qw), name="qx"), te.reduce_axis((0, sx), name="px")
    rc = te.reduce_axis((0, ci), name="rc")
    return _cut(te.compute((n, out_h, out_w, packed.shape[0] * BF16_LANES), lambda b, y, x, o: te.sum(
        bf16_to_f32(a16[b, py, px, y + qy, x + qx, rc]) * bf16_to_f32(
            packed[o // BF16_LANES, qy, py, qx, px, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=[qy, py, qx, px, rc]), name="conv_bf16"), channels)


def unfolded_conv_product(data: te.Tensor, packed: te.Tensor, taps: tuple[int, int], strides: list[int],
                           padding: list[int], unfold: int, channels: int) -> te.Tensor:
    """A convolution of few input channels (AMX targets) with ``unfold`` of its taps in ``A16``'s channels:
    ``A16[b, y, x, (t, c)]`` is the padded pixel that output ``(y, x)``'s tap ``t`` reads, channel ``c`` (all
    taps unfolded: a 1x1 convolution over them), or, a row of taps unfolded, that output column's tap ``t``
    in padded input row ``y`` (a ``KH x 1`` convolution of vertical stride ``sy`` over them). Consecutive
    outputs of a row then read a box of ``A16``, 32 or 64 channels deep, as AMX tiles take it, where the
    activation holds 3 channels a pixel, strided."""
    n, h, w, ci = (int(d) for d in data.shape)
    k = int(packed.shape[-3]) * BF16_PAIR
    (kh, kw), (sy, sx) = taps, strides
    top, left, bottom, right = padding
    out_h, out_w = (h + top + bottom - kh) // sy + 1, (w + left + right - kw) // sx + 1
    full = unfold == kh * kw

    def rounded(b, y, x, j):
        t, c = j // ci, j % ci
        yy = (y * sy + t // kw if full else y) - top
        xx = x * sx + t % kw - left
        return bf16_bits_where([j < unfold * ci, yy >= 0, yy < h, xx >= 0, xx < w], data(b, yy, xx, c))

    a16 = te.compute((n, out_h if full else h + top + bottom, out_w, k), rounded, name="A16")
    rc = te.reduce_axis((0, k), name="rc")
    ry = 0 if full else te.reduce_axis((0, kh), name="ry")
    axes = [rc] if full else [ry, rc]
    return _cut(te.compute((n, out_h, out_w, packed.shape[0] * BF16_LANES), lambda b, y, x, o: te.sum(
        bf16_to_f32(a16[b, y if full else y * sy + ry, x, rc]) * bf16_to_f32(
            packed[o // BF16_LANES, ry, 0, rc // BF16_PAIR, o % BF16_LANES, rc % BF16_PAIR]),
        axis=axes), name="conv_bf16"), channels)


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
    """A strided grouped convolution of 16-channel blocks (AMX targets) in phases (:func:`phased_conv_product`)
    with each two taps of a phase's row in ``A16``'s channels (:func:`paired_conv_product`): ``A16[b, py, px,
    y, x, (g, t, c)]`` is padded pixel ``(sy * y + py, sx * (x + t) + px)``, channel ``16 g + c``; the
    reduction runs over ``qy, py``, the pairs ``qp``, ``px`` and the 32 channels (:func:`.bf16.paired_taps`)."""
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
