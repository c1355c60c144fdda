"""A network's products in bf16, as OpenVINO and oneDNN mean it: each convolution's and dense layer's inputs
rounded to bf16, every product and sum in fp32, everything else (epilogues, norms, softmax) fp32.

Each eligible ``conv2d`` (NHWC/HWIO, no groups), ``conv3d`` (NDHWC/DHWIO, no groups: a depth tap more) and
``matmul`` by a constant ``[K, N]`` weight becomes one PrimFunc of two stages, the form
:class:`~ansor.sketch.tensor_rules.BF16DotProduct` tiles around the CPU's bf16 dot product:

1. ``A16``: the activation rounded to bf16 bits (``uint16``) at the kernel's load, its padding included (an
   activation only such products read is stored as bf16 bits by its producer instead, :mod:`.bf16_storage`,
   and ``A16`` is a zero-padded copy of them, or, unpadded, the activation itself);
2. the product over ``A16`` and the weight, which is rounded and packed **here, once**, in numpy
   (:func:`pack_weight`), into the k pairs of 16 output channels ``vdpbf16ps`` reads.

A ``matmul`` of two activations (attention's ``Q K^T`` and ``P V``: ``[..., M, K] x [..., K, N]``, the same
leading dimensions) rounds and packs both operands in the kernel instead (``A16`` and ``B16``, the latter
``K x N`` conversions a call, as the ``bf16-matmul-*`` workloads do), padded with zeros to whole k pairs and
16-column groups (ViT's 197 tokens: 198 and 208; :func:`padded_to`), the output sliced back.

For a target with AMX, the rows of a dense layer or of a product of two activations that no tile's rows
divide (ViT's 197 tokens) are padded to the multiple of a tile's rows that takes the fewest tiles
(:func:`amx_padded_rows`): the product runs on 208 rows, the output is its first 197; and a
strided convolution reads its input in phases along rows (:func:`row_phased_conv_product`), so that a row of
its outputs reads a box of ``A16``, as a tile loads it (a strided 1x1 one, on any target, gathers the pixels it
reads). A
convolution of fewer input channels than a tile's 32 (an RGB stem) unfolds its taps into ``A16``'s channels
instead (:func:`unfolded_conv_product`): all of them (a 3x3 stem's 27 values as 32), or each row of taps
(ResNet-50's 7x7: 21 as 32), where they fill the tile's 32 at most twice over. A convolution's output rows
that no tile's rows divide are computed wider, on zero columns, and cut back (:func:`widened_row`: Inception's
17 pixels as 21); a 1x1 one's pixels are padded instead, as a dense layer's rows, and a stride-1 one's rows
run over its flattened image where that takes fewer tiles (:func:`flat_conv_product`, :func:`flat_rows`).

A grouped convolution whose groups tile 16 output channels (RegNet's and ResNeXt's) is a product of 16-channel
blocks, each reading the input channels of its groups, its weight zero outside each output channel's group
(:func:`block_diagonal`: groups of 8 compute twice their products, of 16 or more none). Where that waste would
pass :data:`MAX_GROUP_WASTE` (a depthwise convolution, MobileNet's: each output channel reads one channel of
its own, not one pair that 16 lanes share), the convolution rounds its inputs all the same (``A32``: the
activation's bf16 values as fp32; the weight's, rounded here), and multiplies and adds them in fp32 FMA
(:func:`grouped_conv_product`): OpenVINO's bf16 numbers, and an activation between it and the layers
around it may be stored as bf16 bits (:mod:`.bf16_storage`), half the bytes of a memory-bound layer.

The PrimFunc is marked output-element-wise fusable, so ``FuseOps`` gives it the layer's epilogue (bias, ReLU,
residual add) as for an fp32 convolution. A convolution of an odd number of input channels (an RGB stem's 3)
reads them as one more, a zero channel in ``A16`` and in the weight (:func:`even_channels`). A layer whose
output channels are not a multiple of 16 computes zero channels up to one, its output cut back in the same
PrimFunc (:func:`whole_lanes`: a classifier's 1000 as 1008, MobileNet-V3's 40 as 48); where that would add
more than :data:`MAX_PADDED_CHANNELS` (a squeeze-excitation's 8 channels), or a dense layer's reduction is
odd, the layer stays fp32.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Optional

import numpy as np
import tvm
from tvm import relax, te

from ..state.tensor_intrin import AMX_DEPTH, AMX_ROWS, BF16_BITS, bf16_bits_to_f32, round_to_bf16
from ..task.te_ops import BF16_LANES, BF16_PAIR, bf16_matmul
from .bf16_products import (
    conv_product, dense_product, flat_conv_product, grouped_conv_product, paired_conv_product,
    phased_paired_conv_product, row_phased_conv_product, unfolded_conv_product,
)
from .bf16_storage import Product, store_bits
from .calls import called_prim_func, mutate_relax_functions
from .channel_padding import padded_channels
from .conv_rewrite import bound_constant, grouped_nhwc, ungrouped_ndhwc, ungrouped_nhwc

logger = logging.getLogger("ansor")

#: How far two builds of one bf16 network may differ, as a share of the output's scale. Their sums run in
#: other orders, so an activation near a rounding boundary may round to neighbouring bf16 values (2^-8 of
#: itself apart) in the two, and the next layers carry that; a wrong schedule is off by the whole scale.
BF16_BUILD_RTOL = 1e-2
#: Where two bf16 builds differ by more, how much further from the fp32 build the tuned one may be than the
#: default bf16 build: LR-ASPP's segmentation map amplifies rounding, its default and tuned bf16 builds were
#: 29.5 % and 30.1 % of the output's scale from fp32 (OpenVINO's bf16 26 %) and 4.3 % from each other.
BF16_NOISE_SLACK = 1.5
#: How far a bf16 network's output may be from the fp32 network's, as a share of the output's scale:
#: OpenVINO's bf16 outputs were 4e-3 to 1.2e-2 of it from ONNX Runtime's fp32 on five models (issue 56).
BF16_VS_FP32_RTOL = 5e-2
#: How much longer a product's rows (for AMX tiles), columns or reduction may be padded with zeros: ViT-B/16's
#: 197 tokens as 208 (+5.6 %) put its linear layers on tiles and its attention products in bf16 (untimed here).
MAX_PADDED_ROWS = 1 / 8
#: How much longer, for AMX, a product of two activations' reduction may be padded to a tile's 32 channels:
#: ViT-B/16's P V reduces over 197 tokens, as 198 on vdpbf16ps (5.35 of 52.0 ms, 142 GFLOPS), as 224 on tiles.
MAX_PADDED_DEPTH = 1 / 4
#: How many more output channels a convolution or dense layer may compute to fill whole 16-channel dot
#: products (zero weights, the output cut back): up to half, as the bf16 unit does twice fp32's products an
#: instruction. MobileNet-V3's 24, 40 and 72 channels as 32, 48 and 80; a classifier's 1000 as 1008.
MAX_PADDED_CHANNELS = 1 / 2
#: How many times its useful products a grouped convolution may compute as 16-channel dot products (zero weights
#: outside each group): RegNet-Y-400MF's 14 layers of groups of 8 (5 tasks), per-task bests after 10 minutes,
#: fp32 FMA 1.05 ms, dot products 0.85 (Zen 4); no task slower.
MAX_GROUP_WASTE = 2
#: The same for a grouped convolution in AMX tiles, two taps a tile row (:func:`paired_conv_product`).
MAX_PAIRED_GROUP_WASTE = 4
#: The narrowest output row a convolution on AMX computes wider, with zero columns, to fill tiles' rows
#: (:func:`widened_row`): SqueezeNet's 13-pixel rows as 14, its 55 as 56.
MIN_WIDENED_ROW = 8
#: How much wider, at most: Inception-V3's 17-pixel rows as 21 (3 tiles of 7), where they ran on vdpbf16ps
#: near 190 GFLOPS (half its 10-minute bf16 build's 37 ms, 3.9x OpenVINO's; Xeon with AMX).
MAX_WIDENED_ROWS = 1 / 4
#: How many times its outputs a convolution may compute as rows of its flattened image (:func:`flat_rows`):
#: Inception-V3's 17 x 17 maps of 1x7 kernels as 400 rows for 289 (its 7x1 ones, 304), in 16-row tiles, took
#: 15-30 % less than widened to 21 (3 tiles of 7) a row (3 seeds, 128 trials each; Xeon with AMX).
MAX_FLAT_ROWS = 2.0
#: How many more products a strided convolution may compute in its AMX form (phases, zero taps): a 3x3 one of
#: stride 2 computes 12 for 9 taps on tiles (16 in a grouped one's phases on both axes), against vdpbf16ps on
#: its 9 (ResNet-50: 0.69 of 7.96 GFLOP).
MAX_PHASE_WASTE = 2.0
#: How many times its products a convolution may compute to fill tiles' 32 reduction channels (AMX): zero input
#: channels (24 as 32), or a stem's taps unfolded (ResNet-50's 7x7: 21 values a tap row as 32; 2.00 ms of 10.75
#: on vdpbf16ps in phases, 0.35 on tiles; Xeon with AMX, 10 minutes of tuning).
MAX_DEPTH_WASTE = 2.0
#: The most values an unfolded row of taps may hold (a stem's RGB channels times its taps): more read too
#: many bytes of ``A16`` for each one of the activation.
MAX_UNFOLDED = 64
#: The fewest input channels an odd count is padded with a zero channel from: ResNet-50's RGB stem (3 as 4, a
#: third more products) took 0.89 ms in bf16 against 1.26 in fp32 (Zen 4, 64 trials each); 1 would double them.
MIN_ODD_CHANNELS = 3
#: TVM's op pattern kOutEWiseFusable: an element-wise epilogue fuses into the product, as into a convolution.
_OUT_FUSABLE = {"op_pattern": 4}


def use_bf16(mod: tvm.IRModule, amx: bool = False, shared: bool = False) -> tvm.IRModule:
    """``mod`` with every eligible convolution and dense layer computed in bf16 (see the module notes);
    ``amx``: for a target with AMX tiles (rows padded where no tile's rows divide them, strided
    convolutions in phases: the module notes); ``shared``: activations that products read stored as bf16
    where element-wise operators read them too (:mod:`.bf16_storage`)."""
    mutator = _BF16Products(mod, amx)
    mod, stored = store_bits(mutate_relax_functions(mutator), mutator.products, _OUT_FUSABLE, shared)
    logger.info("bf16: %d convolutions (grouped ones whose groups tile 16 channels included), %d grouped ones in "
                "fp32 FMA, %d dense layers and %d products of two activations take bf16 inputs; %d products stay "
                "fp32 (not NHWC, not float32, output channels that need over %.0f %% more to fill 16 lanes, an odd "
                "reduction, broadcast operands, or padding over %.0f %%); %d activations stored as bf16 bits",
                mutator.convs, mutator.grouped, mutator.denses, mutator.batched, mutator.kept,
                100 * MAX_PADDED_CHANNELS, 100 * MAX_PADDED_ROWS, stored)
    return mod


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """A ``[..., K, N]`` weight (HWIO: ``[KH, KW, CI, CO]``; dense: ``[K, N]``) rounded to bf16 bits and packed
    as ``[N // 16, ..., K // 2, 16, 2]``: each 16 output channels' k pairs side by side."""
    *taps, k, n = weight.shape
    bits = round_to_bf16(weight).reshape(*taps, k // BF16_PAIR, BF16_PAIR, n // BF16_LANES, BF16_LANES)
    axes = len(taps)
    order = (axes + 2, *range(axes), axes, axes + 3, axes + 1)  # n_o, taps..., k_o, n16, k2
    return np.ascontiguousarray(bits.transpose(order))


def packable(weight: np.ndarray) -> bool:
    """A float32 weight whose output channels fill whole dot products and whose reduction is in pairs."""
    return weight.dtype == np.float32 and weight.shape[-1] % BF16_LANES == 0 and weight.shape[-2] % BF16_PAIR == 0


def zeros_after(weight: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``weight`` with zeros appended along ``axis`` up to ``size``."""
    shape = list(weight.shape)
    shape[axis] = size - shape[axis]
    return np.concatenate([weight, np.zeros(shape, weight.dtype)], axis=axis)


def whole_lanes(weight: np.ndarray) -> np.ndarray:
    """A ``[..., K, N]`` weight with zero output channels added up to a multiple of 16, where that adds at most
    :data:`MAX_PADDED_CHANNELS`; else ``weight`` itself (then not :func:`packable`)."""
    n = weight.shape[-1]
    wide = padded_channels(n, BF16_LANES)
    if wide == n or wide - n > MAX_PADDED_CHANNELS * n:
        return weight
    return zeros_after(weight, -1, wide)


def block_diagonal(weight: np.ndarray, groups: int, waste: float = MAX_GROUP_WASTE
                   ) -> Optional[tuple[np.ndarray, int]]:
    """A grouped HWIO weight ``[KH, KW, CI / groups, CO]`` as the weight of a product of 16-channel blocks,
    ``[KH, KW, K, CO']``, and ``block``: every ``block = max(16, CO / groups)`` output channels read ``K``
    input channels from ``o // block * K`` (their groups' channels); zero where a channel is outside an output
    channel's group; ``CO'``: whole 16s (:func:`whole_lanes`). None where groups do not tile 16 channels, ``K``
    is odd, or the block computes over ``waste`` times its useful products."""
    kh, kw, ci_group, co = weight.shape
    co_group = co // groups
    if co_group % BF16_LANES and (BF16_LANES % co_group or BF16_LANES // co_group > waste):
        return None
    span, block = ci_group * max(1, BF16_LANES // co_group), max(BF16_LANES, co_group)
    wide = whole_lanes(weight)
    if span % BF16_PAIR or not packable(wide):
        return None
    blocks = np.zeros((kh, kw, span, wide.shape[-1]), weight.dtype)
    for o in range(co):
        first = o // co_group * ci_group - o // block * span  # its group's channels, in the block's
        blocks[:, :, first:first + ci_group, o] = weight[..., o]
    return blocks, block


def _packed(weight: np.ndarray) -> relax.Constant:
    return relax.const(pack_weight(weight), BF16_BITS)


def even_channels(weight: np.ndarray) -> np.ndarray:
    """An HWIO weight of an odd number (at least :data:`MIN_ODD_CHANNELS`) of input channels with a zero
    channel added, so that its reduction comes in k pairs (an RGB stem's 3 as 4); else ``weight`` itself."""
    ci = weight.shape[-2]
    if ci % BF16_PAIR == 0 or ci < MIN_ODD_CHANNELS:
        return weight
    return zeros_after(weight, -2, ci + 1)


def _float32(expr: relax.Expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "float32"


def _static_shape(expr: relax.Expr) -> Optional[tuple[int, ...]]:
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return tuple(int(d) for d in shape)


@relax.expr_functor.mutator
class _BF16Products(relax.PyExprMutator):
    """Replaces each eligible product by a call of its bf16 PrimFunc and counts what it did."""

    def __init__(self, mod: tvm.IRModule, amx: bool):
        super().__init__(mod)
        self.amx = amx
        self.convs = self.grouped = self.denses = self.batched = self.kept = 0
        self.products: dict[str, Product] = {}  # each conv or dense PrimFunc made, by name: bf16_storage remakes them

    def _product(self, compute: Callable[..., te.Tensor], data: relax.Expr, weight: relax.Constant, *params,
                 name: str) -> relax.Expr:
        """A call of ``compute(data, weight, *params)``'s PrimFunc, recorded in :attr:`products`."""
        call = self.builder_.call_te(compute, data, weight, *params, primfunc_name_hint=name,
                                     primfunc_attrs=_OUT_FUSABLE)
        self.products[called_prim_func(call)] = Product(compute, params, name)
        return call

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        op = getattr(call.op, "name", "")
        if op not in ("relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul"):
            return call
        weight = bound_constant(self, call.args[1])
        if weight is None:
            new = self._batched(call) if op == "relax.matmul" else None
        else:
            new = self._dense(call, weight) if op == "relax.matmul" else self._conv(call, weight)
        self.kept += new is None
        return call if new is None else new

    def _conv(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        a = call.attrs
        if not (_float32(call.args[0]) and str(a.out_dtype) in ("", "None", "float32")):
            return None
        strides, padding = [int(s) for s in a.strides], [int(p) for p in a.padding]
        dilation = [int(d) for d in a.dilation]
        if grouped_nhwc(call):
            width = int(call.args[0].ty.shape[2]) + padding[1] + padding[3]
            paired = block_diagonal(weight, int(a.groups), MAX_PAIRED_GROUP_WASTE) if self.amx else None
            if paired is not None and pairs_taps(paired[0].shape, paired[1], strides, dilation, width):
                self.convs += 1
                blocks, taps = paired[0], paired[0].shape[:2]
                if list(strides) == [1, 1]:
                    return self._product(paired_conv_product, call.args[0], _packed(paired_taps(blocks)), taps,
                                         padding, weight.shape[-1], name="bfloat_group_conv2d")
                return self._product(phased_paired_conv_product, call.args[0],
                                     _packed(paired_taps(phase_weight(blocks, strides), axis=2)), taps, strides,
                                     padding, weight.shape[-1], name="bfloat_group_conv2d")
            diagonal = block_diagonal(weight, int(a.groups))
            if diagonal is not None:
                self.convs += 1
                blocks, block = diagonal
                return self._product(conv_product, call.args[0], _packed(blocks), blocks.shape[:2], strides,
                                     padding, dilation, weight.shape[-1], block, name="bfloat_group_conv2d")
            self.grouped += 1
            rounded = relax.const(bf16_bits_to_f32(round_to_bf16(weight)))
            return self._product(grouped_conv_product, call.args[0], rounded, int(a.groups), strides, padding,
                                 dilation, name="bfloat_group_conv2d")
        if not (ungrouped_nhwc(call) or ungrouped_ndhwc(call)):
            return None
        channels, wide = weight.shape[-1], whole_lanes(weight)
        weight = even_channels(wide)
        if not packable(weight):
            return None
        self.convs += 1
        taps = weight.shape[:-2]
        dims, kind = len(taps), f"bfloat_conv{len(taps)}d"
        width = int(call.args[0].ty.shape[-2]) + padding[dims - 1] + padding[-1]
        unfold = self.amx and unfolded_taps(wide.shape, strides, dilation, width)
        if unfold:
            out_w = (width - taps[-1]) // strides[-1] + 1
            wide_w = widened_row(out_w)
            return self._product(unfolded_conv_product, call.args[0], _packed(unfold_weight(wide, unfold)), taps,
                                 strides, widened(padding, strides, out_w, wide_w), unfold, channels,
                                 wide_w and out_w, name=kind)
        if self.amx and row_phased(taps, strides, dilation, width):  # 2-D or 3-D
            out_w = (width - taps[-1]) // strides[-1] + 1
            wide_w = widened_row(out_w)
            weight = row_phase_weight(tile_depth(weight, wide_w or out_w), strides[-1])
            return self._product(row_phased_conv_product, call.args[0], _packed(weight), taps, strides,
                                 widened(padding, strides, out_w, wide_w), channels, wide_w and out_w, name=kind)
        if dims == 3 or not (self.amx and (list(strides) == [1, 1] or tuple(taps) == (1, 1))):
            return self._product(conv_product, call.args[0], _packed(weight), taps, strides, padding, dilation,
                                 channels, name=kind)
        height = int(call.args[0].ty.shape[1]) + padding[0] + padding[2]  # a form tiles take (AMX)
        out_h, out_w = ((size - d * (t - 1) - 1) // st + 1
                        for size, t, st, d in zip((height, width), taps, strides, dilation))
        one_by_one, rows = tuple(taps) == (1, 1), None
        if one_by_one and list(strides) == [1, 1] and not any(padding):  # its pixels as a dense layer's rows
            rows = amx_padded_rows(out_h * out_w)
        if one_by_one and not rows:
            return self._product(conv_product, call.args[0], _packed(tile_depth(weight, out_h * out_w)), taps,
                                 strides, padding, dilation, channels, name=kind)
        wide_w = widened_row(out_w)
        if not one_by_one and not fits_tiles(out_w):
            rows = flat_rows(out_h, out_w, width, wide_w)
        if rows:
            return self._product(flat_conv_product, call.args[0], _packed(tile_depth(weight, rows)), taps,
                                 padding, dilation, channels, rows, name=kind)
        return self._product(conv_product, call.args[0], _packed(tile_depth(weight, wide_w or out_w)), taps,
                             strides, widened(padding, strides, out_w, wide_w), dilation, channels, 0,
                             wide_w and out_w, name=kind)

    def _dense(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        data, columns = call.args[0], weight.shape[-1]
        weight = whole_lanes(weight)
        shape = _static_shape(data)
        if (weight.ndim != 2 or not packable(weight) or not _float32(data) or shape is None
                or shape[-1] != weight.shape[0]):
            return None
        self.denses += 1
        lead = list(shape[:-1])
        # Rows of several leading dimensions become one (networks.flatten): only where one dimension holds
        # them all (ViT's [1, 197, 768], and [197, 1, 768] before its attention) can padding it pad them.
        rows = [d for d in lead if d != 1]
        if self.amx and len(rows) == 1 and (tiled := amx_padded_rows(rows[0])):
            lead[lead.index(rows[0])] = tiled
        return self._product(dense_product, data, _packed(weight), tuple(lead), columns, name="bfloat_dense")

    def _batched(self, call: relax.Call) -> Optional[relax.Expr]:
        a, b = (_static_shape(x) for x in call.args[:2])
        if (a is None or b is None or len(a) != len(b) or len(a) < 2 or a[:-2] != b[:-2] or a[-1] != b[-2]
                or not all(map(_float32, call.args[:2]))):
            return None
        (m, k), n = a[-2:], b[-1]
        tile_k = padded_channels(k, AMX_DEPTH)  # a tile's 32 channels, for AMX; else (and past that) k pairs
        depth = tile_k if self.amx and tile_k - k <= MAX_PADDED_DEPTH * k else padded_to(k, BF16_PAIR)
        padded = (self.amx and amx_padded_rows(m)) or m, depth, padded_to(n, BF16_LANES)
        if None in padded:
            return None
        self.batched += 1
        return self.builder_.call_te(bf16_matmul, call.args[0], call.args[1], "matmul_bf16", padded,
                                     primfunc_name_hint="bfloat_matmul", primfunc_attrs=_OUT_FUSABLE)


def pairs_taps(shape: tuple[int, ...], block: int, strides: list[int], dilation: list[int], width: int) -> bool:
    """Whether a grouped convolution's block-diagonal weight (``shape``: ``[KH, KW, K, CO']``, every ``block``
    output channels reading ``K`` input channels) takes its AMX form in tap pairs: 16 channels a block, half
    a tile's depth, two taps of a row filling it; stride 1 with output rows of a ``width``-pixel padded input
    that a tile's rows divide (:func:`paired_conv_product`), or a strided one in phases (:func:`phased`) of two
    taps or more a row (:func:`phased_paired_conv_product`)."""
    kh, kw, k, _ = shape
    if k * BF16_PAIR != AMX_DEPTH or block != BF16_LANES or list(dilation) != [1, 1]:
        return False
    if list(strides) == [1, 1]:
        return kw >= 2 and fits_tiles(width - kw + 1)
    return -(-kw // strides[1]) >= 2 and phased((kh, kw), strides, dilation, width)


def paired_taps(weight: np.ndarray, axis: int = 1) -> np.ndarray:
    """A weight ``[..., K, CO']`` (block-diagonal HWIO; or in phases, :func:`phase_weight`) with the taps along
    ``axis`` in pairs side by side along the channels: ``[KH, ceil(KW / 2), 2K, CO']``, taps ``2q`` and
    ``2q + 1`` of a row as channels ``c`` and ``K + c`` (zero past the row's last tap)."""
    taps, k, co = weight.shape[axis], weight.shape[-2], weight.shape[-1]
    pairs = -(-taps // 2)
    padding = [(0, 0)] * weight.ndim
    padding[axis] = (0, 2 * pairs - taps)
    split = np.pad(weight, padding).reshape(*weight.shape[:axis], pairs, 2, *weight.shape[axis + 1:])
    together = np.moveaxis(split, axis + 1, -3)
    return np.ascontiguousarray(together.reshape(*together.shape[:-3], 2 * k, co))


def padded_to(extent: int, multiple: int, waste: float = MAX_PADDED_ROWS) -> Optional[int]:
    """``extent`` rounded up to a multiple of ``multiple`` (an attention product's 197 columns: 208, its 197
    reduction channels: 198), if that adds at most ``waste`` of it; else None."""
    padded = padded_channels(extent, multiple)
    return padded if padded - extent <= waste * extent else None


def fits_tiles(rows: int) -> bool:
    """Whether a tile's rows (:data:`AMX_ROWS`) divide a product's ``rows``."""
    return any(rows % m == 0 for m in AMX_ROWS)


def amx_padded_rows(rows: int, least: int = 16, waste: float = MAX_PADDED_ROWS) -> Optional[int]:
    """The rows a product of ``rows`` rows computes on a target with AMX, where no tile's rows (``AMX_ROWS``)
    divide them: the next multiple of a tile's rows that adds at most ``waste``, in the fewest tiles, then
    rows (ViT's 197 tokens, a prime: 208, 13 tiles of 16; 50 rows: 56, 4 of 14; 13: 14, not 16); None
    where a tile fits, padding would cost more, or there are fewer than ``least`` (a handful of a dense
    layer's rows is not worth a tile)."""
    if rows < least or fits_tiles(rows):
        return None
    fits = [(padded // m, padded) for m in AMX_ROWS if (padded := padded_to(rows, m, waste)) is not None]
    return min(fits)[1] if fits else None


def flat_rows(out_h: int, out_w: int, width: int, wide_w: int) -> int:
    """The rows a stride-1 convolution whose output rows no tile's rows divide computes over its flattened
    image (:func:`~.bf16_products.flat_conv_product`: ``out_h`` rows of the ``width``-pixel padded width, in
    whole tiles of 16), where that takes fewer tiles than its rows widened to ``wide_w`` (0: not widened, each
    row on ``vdpbf16ps``) and at most :data:`MAX_FLAT_ROWS` times its outputs; else 0."""
    rows = padded_channels(out_h * width, AMX_ROWS[0])
    tiles = out_h * wide_w // max(m for m in AMX_ROWS if wide_w % m == 0) if wide_w else math.inf
    return rows if rows // AMX_ROWS[0] < tiles and rows <= MAX_FLAT_ROWS * out_h * out_w else 0


def widened(padding: list[int], strides: list[int], out_w: int, wide_w: int) -> list[int]:
    """A convolution's ``padding`` (the last entry: the right's) with the zero columns that widen its output
    rows from ``out_w`` to ``wide_w`` pixels (0: none)."""
    return [*padding[:-1], padding[-1] + (wide_w - out_w) * strides[-1]] if wide_w else list(padding)


def widened_row(out_w: int) -> int:
    """The width a convolution's output rows that no tile's rows divide are computed at on AMX, zero columns
    on the right (:data:`MIN_WIDENED_ROW`, :data:`MAX_WIDENED_ROWS`: a row repeats down the image, so a tile
    short of it costs every row); 0 where they are not widened."""
    return amx_padded_rows(out_w, MIN_WIDENED_ROW, MAX_WIDENED_ROWS) or 0


def phased(taps: tuple[int, ...], strides: list[int], dilation: list[int], width: int) -> bool:
    """Whether a strided grouped convolution of a ``width``-pixel padded input takes its AMX form in phases along
    both axes (:func:`phased_paired_conv_product`): taps wider than the stride, at most :data:`MAX_PHASE_WASTE`
    products more, and output rows a tile's rows divide, widened (:func:`widened_row`) or not; else that form
    would only add products to ``vdpbf16ps``."""
    if list(dilation) != [1, 1] or list(strides) == [1, 1] or all(k <= s for k, s in zip(taps, strides)):
        return False
    out_w = (width - taps[1]) // strides[1] + 1
    if not fits_tiles(out_w) and not widened_row(out_w):
        return False
    return np.prod([-(-k // s) * s / k for k, s in zip(taps, strides)]) <= MAX_PHASE_WASTE


def phase_weight(weight: np.ndarray, strides: list[int]) -> np.ndarray:
    """An HWIO (DHWIO) weight as ``[qy, py, qx, px, CI, CO]``: tap ``(sy * qy + py, sx * qx + px)``, zero where
    that is past the taps (a 3x3 kernel of stride 2 becomes 2 x 2 phases of 2 x 2 taps, 7 of the 16 zero)."""
    *taps, ci, co = weight.shape
    q = [-(-k // st) for k, st in zip(taps, strides)]
    padded = np.zeros((*(n * st for n, st in zip(q, strides)), ci, co), np.float32)
    padded[tuple(slice(k) for k in taps)] = weight
    return np.ascontiguousarray(padded.reshape(*(d for n, st in zip(q, strides) for d in (n, st)), ci, co))


def tile_depth(weight: np.ndarray, rows: int) -> np.ndarray:
    """An HWIO weight with zero input channels up to a multiple of a tile's 32 (AMX), where a tile's rows
    divide the output's ``rows`` (a row of pixels; a 1x1 convolution's, all of them) and the product grows
    at most :data:`MAX_DEPTH_WASTE` times; else ``weight`` itself. ``A16`` reads zeros there too."""
    ci = weight.shape[-2]
    deep = padded_channels(ci, AMX_DEPTH)
    if deep == ci or deep > MAX_DEPTH_WASTE * ci or not fits_tiles(rows):
        return weight
    return zeros_after(weight, -2, deep)


def unfolded_taps(shape: tuple[int, ...], strides: list[int], dilation: list[int], width: int) -> int:
    """How many of a convolution's taps (``shape``: its HWIO or DHWIO weight) an AMX target unfolds into
    ``A16``'s channels (:func:`unfolded_conv_product`): all of them where their values fit
    :data:`MAX_UNFOLDED` (MobileNet's 3x3 RGB stem: 27 as 32), else each row of taps (ResNet-50's 7x7: 21 as
    32, ViT-B/16's 16x16 patches: 48 as 64, ResNet3D-18's 3x7x7: 21 as 32), padded to whole tiles' 32 with at
    most :data:`MAX_DEPTH_WASTE` times the products; 0 (not unfolded) where the channels fill a tile as they
    are, no tile's rows divide the output's (widened or not: :func:`widened_row`), or dilation spreads the
    taps."""
    *taps, ci, _ = shape
    out_w = (width - taps[-1]) // strides[-1] + 1
    if ci >= AMX_DEPTH or any(d != 1 for d in dilation) or not (fits_tiles(out_w) or widened_row(out_w)):
        return 0
    for unfold in (int(np.prod(taps)), taps[-1]):
        values = unfold * ci
        if values <= MAX_UNFOLDED and padded_channels(values, AMX_DEPTH) <= MAX_DEPTH_WASTE * values:
            return unfold
    return 0


def unfold_weight(weight: np.ndarray, taps: int) -> np.ndarray:
    """An HWIO (DHWIO) weight ``[KH, KW, CI, CO]`` as the weight of its unfolded convolution
    (:func:`unfolded_taps`): ``[KH, 1, K, CO]`` (a row of taps unfolded; ``[KD, KH, 1, K, CO]``) or
    ``[1, 1, K, CO]`` (all), each tap's channels in turn along ``K`` and zeros after them up to a multiple of 32."""
    *lead, kw, ci, co = weight.shape
    lead = lead if taps == kw else [1] * len(lead)
    return zeros_after(weight.reshape(*lead, 1, taps * ci, co), -2, padded_channels(taps * ci, AMX_DEPTH))


def row_phased(taps: tuple[int, ...], strides: list[int], dilation: list[int], width: int) -> bool:
    """Whether a convolution of a ``width``-pixel padded input takes its AMX form in phases along rows
    (:func:`row_phased_conv_product`): a strided one (a 3-D one of stride 1 too, in one phase) whose taps along
    the rows are wider than their stride, at most :data:`MAX_PHASE_WASTE` products more, and output rows a
    tile's rows divide, widened (:func:`widened_row`) or not."""
    kw, sx = taps[-1], strides[-1]
    out_w = (width - kw) // sx + 1
    if (len(taps) == 2 and list(strides) == [1, 1]) or any(d != 1 for d in dilation) or kw <= sx:
        return False
    return (fits_tiles(out_w) or bool(widened_row(out_w))) and -(-kw // sx) * sx / kw <= MAX_PHASE_WASTE


def row_phase_weight(weight: np.ndarray, sx: int) -> np.ndarray:
    """A DHWIO weight as ``[KD, KH, qx, px, CI, CO]``: :func:`phase_weight` along the rows alone (a row of 3 taps
    of stride 2 as 2 x 2, one zero), the other axes' unit phases dropped."""
    *taps, ci, co = weight.shape
    return phase_weight(weight, [1] * (len(taps) - 1) + [sx]).reshape(*taps[:-1], -1, sx, ci, co)
