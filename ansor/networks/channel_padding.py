"""Convolutions whose output channels fill no whole number of vectors, widened to a multiple of the vector.

The schedule vectorizes a convolution's output channels in vectors whose length divides their count, so a
count with a small power-of-two factor runs on part of each vector register: SqueezeNet's classifier, a
1x1 convolution 13x13x512 -> 1000, gets vectors of 8 floats on a CPU with 16-float (AVX-512) registers,
as 1000 = 8 x 125. Such a convolution is computed with its weights padded by zero output channels up to a
multiple of the vector length, and a slice drops the extra channels. Only convolutions that gain are
widened: little padding (:data:`MAX_CHANNEL_WASTE`), a reduction long enough that the slice's copy is small
beside it (:data:`MIN_REDUCTION`), and at least a vector of output pixels (a convolution of one pixel, as
a squeeze-excitation block's, reads each weight once and is bound by memory, not by the vector width).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tvm
from tvm import relax

from .conv_rewrite import ConvRewrite, rewrite_convs, ungrouped_nhwc

#: Widen only when the padded channels add at most this share of the work. 1000 -> 1008 channels adds
#: 0.8 %, 440 -> 448 (RegNet-Y) 1.8 %; 120 -> 128 (6.7 %) stays as it is.
MAX_CHANNEL_WASTE = 1 / 16
#: Multiply-adds per output element below which slicing the padded output costs about what the wider
#: vectors gain; SqueezeNet's classifier (512): 0.589 ms at 1000 channels, 0.445 at 1008 (design.md).
MIN_REDUCTION = 256


def pad_output_channels(mod: tvm.IRModule, vector_bytes: int) -> tvm.IRModule:
    """``mod`` with every eligible constant-weight NHWC convolution computing its output channels rounded
    up to a multiple of the ``vector_bytes``-wide vector (see the module notes), then sliced back."""
    return rewrite_convs(mod, lambda m: _PadChannels(m, vector_bytes),
                         "convolutions widened to a whole number of vectors of output channels")


def padded_channels(channels: int, lanes: int) -> int:
    """``channels`` rounded up to a multiple of ``lanes``."""
    return -(-channels // lanes) * lanes


@relax.expr_functor.mutator
class _PadChannels(ConvRewrite):
    def __init__(self, mod: tvm.IRModule, vector_bytes: int):
        super().__init__(mod)
        self.vector_bytes = vector_bytes

    def rewrite(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        if not ungrouped_nhwc(call):
            return None
        a = call.attrs
        _, out_h, out_w, channels = (int(d) for d in call.ty.shape)
        lanes = max(1, self.vector_bytes // np.dtype(str(call.ty.dtype)).itemsize)
        wide = padded_channels(channels, lanes)
        reduction = weight.shape[0] * weight.shape[1] * weight.shape[2]
        if (wide == channels or wide - channels > MAX_CHANNEL_WASTE * channels or reduction < MIN_REDUCTION
                or out_h * out_w < lanes):
            return None
        kernel = np.zeros((*weight.shape[:3], wide), weight.dtype)
        kernel[..., :channels] = weight
        widened = self.builder_.emit(relax.op.nn.conv2d(
            call.args[0], relax.const(kernel, str(kernel.dtype)), strides=a.strides, padding=a.padding,
            dilation=a.dilation, data_layout="NHWC", kernel_layout="HWIO", out_dtype=str(call.ty.dtype)))
        return relax.op.strided_slice(widened, axes=[3], begin=[0], end=[channels])
