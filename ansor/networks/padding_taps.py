"""Convolutions whose kernel taps mostly read padding, split into regions that compute only the taps in bounds.

A dilated convolution on a small feature map multiplies mostly zeros: DeepLabV3's ASPP applies 3x3
kernels with dilation 12, 24 and 36 to a 33x33 map (a 520x520 input), and with dilation 36 every tap
but the centre reads padding at every output pixel. The schedule cannot skip them (a reduction's bounds
cannot depend on the output pixel), but the output can be cut into rectangles within which the same taps
are in bounds: per dimension, the output positions split at the first and last position each tap reads
inside the input, and each rectangle is an unpadded convolution with the kernel's in-bounds rows and
columns over a slice of the input. The rectangles are concatenated back. The sums are the same; only the
products with padding zeros are gone.

Each rectangle's kernel is a constant of its own, so the weights grow with the number of rectangles; hence
only convolutions that compute at most :data:`MAX_USEFUL_SHARE` useful products are split (in bf16,
:data:`MAX_USEFUL_SHARE_BF16`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import tvm
from tvm import relax

from .conv_rewrite import ConvRewrite, plain_nhwc, rewrite_convs

#: A convolution is split when at most this share of its products read the input, not padding: DeepLabV3's
#: dilation-24/36 ASPP convolutions (0.27, 0.11) took 9.4 and 3.4 ms, 4.2 ms split (design.md, "Why").
MAX_USEFUL_SHARE = 0.5
#: The same in bf16, whose region kernels are half fp32's bytes: DeepLabV3's dilation-12 ASPP convolution (0.57
#: useful), its tasks tuned alone 48 trials each (Zen 4), 12.3 ms whole and 7.25 split.
MAX_USEFUL_SHARE_BF16 = 0.6


@dataclass(frozen=True)
class Band:
    """Output positions ``[start, stop)`` along one dimension, and the kernel taps ``[first, last]`` that
    read inside the input there (``first > last``: none does)."""

    start: int
    stop: int
    first: int
    last: int


def bands(size: int, kernel: int, dilation: int, pad_before: int, out_size: int) -> list[Band]:
    """One dimension of a stride-1 convolution cut where the set of in-bounds taps changes."""
    def clamp(position: int) -> int:
        return min(max(position, 0), out_size)

    # reach[k]: the outputs [lo, hi) whose tap k reads inside the input
    reach = [(clamp(pad_before - k * dilation), clamp(size + pad_before - k * dilation)) for k in range(kernel)]
    cuts = sorted({0, out_size, *(edge for span in reach for edge in span)})
    out = []
    for start, stop in zip(cuts, cuts[1:]):
        taps = [k for k, (lo, hi) in enumerate(reach) if lo <= start and stop <= hi]
        out.append(Band(start, stop, taps[0], taps[-1]) if taps else Band(start, stop, 1, 0))
    return out


def useful_share(rows: list[Band], cols: list[Band], kernel: tuple[int, int]) -> float:
    """The share of the convolution's products that read the input."""
    def share(dim: list[Band], k: int) -> float:
        total = sum(b.stop - b.start for b in dim)
        return sum((b.stop - b.start) * max(0, b.last - b.first + 1) for b in dim) / (total * k)

    return share(rows, kernel[0]) * share(cols, kernel[1])


def skip_padding_taps(mod: tvm.IRModule, max_useful_share: float = MAX_USEFUL_SHARE) -> tvm.IRModule:
    """``mod`` with every eligible convolution of which at most ``max_useful_share`` of the products read the
    input split into rectangles that compute only in-bounds taps."""
    return rewrite_convs(mod, lambda m: _SkipPaddingTaps(m, max_useful_share),
                         "convolutions split into regions that skip the taps reading padding")


@relax.expr_functor.mutator
class _SkipPaddingTaps(ConvRewrite):
    def __init__(self, mod: tvm.IRModule, max_useful_share: float):
        super().__init__(mod)
        self.max_useful_share = max_useful_share

    def rewrite(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        if not plain_nhwc(call):
            return None
        _, h, w, _ = (int(d) for d in call.args[0].ty.shape)
        _, out_h, out_w, _ = (int(d) for d in call.ty.shape)
        top, left = [int(p) for p in call.attrs.padding][:2]  # top, left, bottom, right
        dil_h, dil_w = (int(d) for d in call.attrs.dilation)
        rows = bands(h, weight.shape[0], dil_h, top, out_h)
        cols = bands(w, weight.shape[1], dil_w, left, out_w)
        if useful_share(rows, cols, weight.shape[:2]) > self.max_useful_share:
            return None
        strips = [self._joined([self._region(call, weight, r, c) for c in cols], axis=2) for r in rows]
        return self._joined(strips, axis=1)

    def _joined(self, parts: list[relax.Expr], axis: int) -> relax.Expr:
        """``parts`` (unbound) concatenated along ``axis``, unbound; a lone part as it is."""
        if len(parts) == 1:
            return parts[0]
        return relax.op.concat([self.builder_.emit(p) for p in parts], axis=axis)

    def _region(self, call: relax.Call, weight: np.ndarray, r: Band, c: Band) -> relax.Expr:
        """The convolution over output rows ``r`` and columns ``c``, with their in-bounds taps only (unbound)."""
        n, _, _, channels = (int(d) for d in call.ty.shape)
        out_dtype = str(call.ty.dtype)
        pad = [int(p) for p in call.attrs.padding][:2]
        dilation = [int(d) for d in call.attrs.dilation]
        if r.first > r.last or c.first > c.last:
            return relax.op.zeros((n, r.stop - r.start, c.stop - c.start, channels), out_dtype)
        begin = [r.start - pad[0] + r.first * dilation[0], c.start - pad[1] + c.first * dilation[1]]
        end = [r.stop - pad[0] + r.last * dilation[0], c.stop - pad[1] + c.last * dilation[1]]
        data = call.args[0]
        if begin != [0, 0] or end != [int(d) for d in data.ty.shape][1:3]:
            data = self.builder_.emit(relax.op.strided_slice(data, axes=[1, 2], begin=begin, end=end))
        kernel = np.ascontiguousarray(weight[r.first:r.last + 1, c.first:c.last + 1])
        return relax.op.nn.conv2d(data, relax.const(kernel, str(kernel.dtype)), strides=1, padding=0,
                                  dilation=dilation, data_layout="NHWC", kernel_layout="HWIO", out_dtype=out_dtype)
