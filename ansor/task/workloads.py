"""Registry of named workloads: the tensor programs the auto-scheduler can be asked to tune.

A workload is a name (what users type and what logs record), a function that builds the TE tensors of
the computation, and a numpy reference of the same computation, so that every tuned program can be
checked for correctness against something that shares no code with TVM.

Names understood by :func:`get_workload`:

* ``matmul-N`` / ``matmul-MxNxK`` and ``matmul-relu-N`` / ``matmul-relu-MxNxK`` (any positive sizes);
* ``bf16-matmul-N`` / ``bf16-matmul-MxNxK``: the same product in bf16 (N a multiple of 16, K even), whose
  sketch computes it with the CPU's bf16 dot product (``ansor tune-op --precision bf16``);
* ``softmax-MxN`` (``softmax`` is ``softmax-4x1024``), ``max-pool2d``, ``conv2d-bias-relu``,
  ``conv2d-nhwc-small``: small operators for sketch-generation tests;
* ``nhwc-resnet-50.C0`` ... ``nhwc-resnet-50.C22``: the 23 distinct conv2d layers of ResNet-50 v1.5
  (torchvision: stride 2 on the 3x3 conv of a bottleneck), batch 1, in order of first appearance;
* the single-operator suite of the Ansor paper (Zheng et al., OSDI'20, section 7.1) with a batch
  suffix ``-b1`` or ``-b16`` (e.g. ``C2D-b1``), each the first shape configuration of the Ansor
  artifact's shape table:

  ====  ===========================================================================
  C1D   conv1d NLC, length 256, 64 -> 128 channels, k3 s2 p1
  C2D   conv2d 224x224, 3 -> 64, k7 s2 p3
  C3D   conv3d 16x224x224 (DxHxW), 3 -> 64, k7 s2 p3 (stride and padding on depth too)
  GMM   batch matmul, 128x128 @ 128x128 per batch element
  GRP   group conv2d 56x56, 64 -> 128, k3 s2 p1, 4 groups
  DIL   conv2d 224x224, 3 -> 64, k7 s2 p3, dilation 2
  DEP   depthwise conv2d 112x112, 32 channels, k3 s1 p1, kernel (KH, KW, C)
  T2D   transposed conv2d 4x4, 512 -> 256, k4 s2 p1 (output 8x8)
  CAP   capsule conv2d 16x16, 4x4 pose matrices, 32 -> 32 capsule channels, k3 s2 p1
  NRM   Frobenius norm sqrt(sum a_ij^2) of a 256x256 matrix (what the artifact computes as "2-norm")
  ====  ===========================================================================

* the Ansor subgraphs ``conv2d-bn-relu`` (alias ``ConvLayer``): conv2d 56x56, 64 -> 64, k3 s1 p1, then
  bias add, batch-norm scale, batch-norm shift and relu as separate stages; and ``TBS``: query and key
  (batch 1, seq 128, 12 heads, dim 64) transposed to head-major, batched Q @ K^T, softmax over keys;
* whatever :func:`register_workload` added.

All tensors are float32; convolutions use NHWC data and HWIO kernels (NDHWC/DHWIO, NLC/LIO).
Zero padding is always its own ``te.compute`` stage named ``pad`` and the convolution is ``conv``, so
sketch rules see the producer/consumer structure a real network would have.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import te

from ansor.errors import WorkloadError

from ..state.tensor_intrin import bf16_bits_to_f32, round_to_bf16
from .te_ops import bf16_matmul, channel_op, conv_stage, out_size, pad_stage, relu_stage, softmax_stages

logger = logging.getLogger("ansor")

MakeFn = Callable[[], list[te.Tensor]]
ReferenceFn = Callable[[list[np.ndarray]], list[np.ndarray]]

DTYPE = "float32"
_NHWC = ("n", "h", "w", "c")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named tensor program: how to build it in TE and what it must compute (numpy).

    ``make`` returns the input tensors first and the output tensor(s) last; that order is the
    argument order of :meth:`prim_func` and of ``reference``.
    """

    name: str
    make: MakeFn
    reference: ReferenceFn
    description: str = ""

    def tensors(self) -> list[te.Tensor]:
        """Fresh TE tensors (inputs, then outputs); new objects on every call."""
        return list(self.make())

    def prim_func(self) -> tvm.tirx.PrimFunc:
        """The computation as an unscheduled TIR function, the starting point of every schedule."""
        return te.create_prim_func(self.tensors())


# numpy references (float64 inside, float32 out: the reference should be the more accurate side)


def _f64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _conv_ref(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int = 1, groups: int = 1):
    """Convolution (float64) as a sum over window offsets of strided input slices times kernel taps."""
    x, w = _f64([x, w])
    nd = x.ndim - 2
    window, batch = w.shape[:nd], x.shape[0]
    ci_group, co = w.shape[-2], w.shape[-1]
    out = [out_size(n, k, stride, pad, dilation) for n, k in zip(x.shape[1:-1], window)]
    xp = np.pad(x, [(0, 0), *[(pad, pad)] * nd, (0, 0)])
    w = w.reshape(*window, ci_group, groups, co // groups)
    acc = np.zeros((batch, *out, groups, co // groups))
    for offs in itertools.product(*[range(k) for k in window]):
        starts = [o * dilation for o in offs]
        taps = tuple(slice(a, a + stride * (n - 1) + 1, stride) for a, n in zip(starts, out))
        patch = xp[(slice(None), *taps)].reshape(batch, *out, groups, ci_group)
        acc += np.einsum("...gc,cgo->...go", patch, w[offs], optimize=True)
    return acc.reshape(batch, *out, co)


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _relu_ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0).astype(np.float32)


# Workload constructors (the parameters are the shape; tests use them for small variants)


def _matmul_workload(name: str, m: int, n: int, k: int, relu: bool = False) -> Workload:
    def make():
        A = te.placeholder((m, k), DTYPE, name="A")
        B = te.placeholder((k, n), DTYPE, name="B")
        r = te.reduce_axis((0, k), name="k")
        C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
        return [A, B, relu_stage(C, ("i", "j"), name="D") if relu else C]

    def reference(ins):
        a, b = _f64(ins)
        c = a @ b
        return [(_relu_ref(c) if relu else c).astype(np.float32)]

    tail = ", then relu" if relu else ""
    size = f"M=N=K={m}" if m == n == k else f"M={m} N={n} K={k}"
    return Workload(name, make, reference, f"matmul {size}{tail} float32")


def _bf16_matmul_workload(name: str, m: int, n: int, k: int) -> Workload:
    """``matmul-MxNxK`` in bf16 as OpenVINO means it: both inputs rounded to bf16 (``A16``, and ``B16``
    packed in the k pairs of 16 columns the CPU's bf16 dot product reads), products and sums in fp32."""
    def make():
        A = te.placeholder((m, k), DTYPE, name="A")
        B = te.placeholder((k, n), DTYPE, name="B")
        return [A, B, bf16_matmul(A, B, name="C")]

    def reference(ins):
        a, b = (bf16_bits_to_f32(round_to_bf16(x)).astype(np.float64) for x in ins[:2])
        return [(a @ b).astype(np.float32)]

    size = f"M=N=K={m}" if m == n == k else f"M={m} N={n} K={k}"
    return Workload(name, make, reference, f"matmul {size} in bf16 (inputs rounded, fp32 sums)")


def _batch_matmul_workload(name: str, batch: int, m: int, n: int, k: int) -> Workload:
    def make():
        A = te.placeholder((batch, m, k), DTYPE, name="A")
        B = te.placeholder((batch, k, n), DTYPE, name="B")
        r = te.reduce_axis((0, k), name="k")
        C = te.compute((batch, m, n), lambda b, i, j: te.sum(A[b, i, r] * B[b, r, j], axis=r), name="C")
        return [A, B, C]

    def reference(ins):
        a, b = _f64(ins)
        return [np.matmul(a, b).astype(np.float32)]

    return Workload(name, make, reference, f"batch matmul {batch}x({m}x{k} @ {k}x{n}) float32")


def _softmax_workload(name: str, m: int, n: int) -> Workload:
    def make():
        A = te.placeholder((m, n), DTYPE, name="A")
        return [A, softmax_stages(A, ("i", "j"))]

    def reference(ins):
        return [_softmax_ref(*_f64(ins))]

    return Workload(name, make, reference, f"softmax over rows of {m}x{n} float32")


def _conv_workload(
    name: str, batch: int, spatial: Sequence[int], ci: int, co: int, kernel: int, stride: int, pad: int,
    dilation: int = 1, groups: int = 1, epilogue: str = "",
) -> Workload:
    """A 1/2/3-d NHWC convolution; epilogue "bias-relu" or "bn-relu" appends per-channel stages."""
    nd = len(spatial)

    def make():
        data = te.placeholder((batch, *spatial, ci), DTYPE, name="data")
        weight = te.placeholder((*[kernel] * nd, ci // groups, co), DTYPE, name="kernel")
        out = conv_stage(data, weight, stride, pad, dilation, groups)
        if not epilogue:
            return [data, weight, out]
        bias = te.placeholder((co,), DTYPE, name="bias")
        out = channel_op(out, bias, lambda v, b: v + b, "bias_add")
        extra = []
        if epilogue == "bn-relu":
            extra = [te.placeholder((co,), DTYPE, name=n) for n in ("bn_scale", "bn_offset")]
            out = channel_op(out, extra[0], lambda v, s: v * s, "bn_mul")
            out = channel_op(out, extra[1], lambda v, o: v + o, "bn_add")
        return [data, weight, bias, *extra, relu_stage(out, _NHWC)]

    def reference(ins):
        out = _conv_ref(ins[0], ins[1], stride, pad, dilation, groups)
        if not epilogue:
            return [out.astype(np.float32)]
        out = out + ins[2]
        if epilogue == "bn-relu":
            out = out * ins[3] + ins[4]
        return [_relu_ref(out)]

    extras = [f"dilation {dilation}"] * (dilation > 1) + [f"groups {groups}"] * (groups > 1)
    extras += [{"bias-relu": "bias+relu", "bn-relu": "bias+bn+relu"}[epilogue]] if epilogue else []
    dims = "x".join(str(s) for s in (batch, *spatial, ci))
    layout = {1: "NLC", 2: "NHWC", 3: "NDHWC"}[nd]
    desc = f"conv{nd}d {layout} {dims} -> {co}, k{kernel} s{stride} p{pad}"
    return Workload(name, make, reference, ", ".join([desc, *extras]) + " float32")


def _depthwise_workload(
    name: str, batch: int, size: int, channels: int, kernel: int, stride: int, pad: int
) -> Workload:
    """Depthwise conv2d, multiplier 1; kernel layout (KH, KW, C)."""

    def make():
        data = te.placeholder((batch, size, size, channels), DTYPE, name="data")
        weight = te.placeholder((kernel, kernel, channels), DTYPE, name="kernel")
        src = pad_stage(data, [0, pad, pad, 0], [0, pad, pad, 0], _NHWC) if pad else data
        rh = te.reduce_axis((0, kernel), name="rh")
        rw = te.reduce_axis((0, kernel), name="rw")
        out = out_size(size, kernel, stride, pad)
        conv = te.compute(
            (batch, out, out, channels),
            lambda n, h, w, c: te.sum(
                src[n, h * stride + rh, w * stride + rw, c] * weight[rh, rw, c], axis=[rh, rw]
            ),
            name="conv",
        )
        return [data, weight, conv]

    def reference(ins):
        x, w = ins
        as_grouped = w.reshape(kernel, kernel, 1, channels)
        return [_conv_ref(x, as_grouped, stride, pad, groups=channels).astype(np.float32)]

    desc = f"depthwise conv2d NHWC {batch}x{size}x{size}x{channels}, k{kernel} s{stride} p{pad} float32"
    return Workload(name, make, reference, desc)


def _conv2d_transpose_workload(
    name: str, batch: int, size: int, ci: int, co: int, kernel: int, stride: int, pad: int
) -> Workload:
    """Transposed conv2d (kernel HWIO).

    Spread the input ``stride`` apart, pad by ``kernel - 1 - pad`` and convolve with the flipped kernel:
    an ordinary convolution, which is the form the scheduler knows how to tile.
    """
    border = kernel - 1 - pad
    out = (size - 1) * stride - 2 * pad + kernel

    def make():
        data = te.placeholder((batch, size, size, ci), DTYPE, name="data")
        weight = te.placeholder((kernel, kernel, ci, co), DTYPE, name="kernel")
        spread = [0, border, border, 0]
        src = pad_stage(data, spread, spread, _NHWC, interior=[1, stride, stride, 1])
        rh = te.reduce_axis((0, kernel), name="rh")
        rw = te.reduce_axis((0, kernel), name="rw")
        rc = te.reduce_axis((0, ci), name="rc")
        flip = kernel - 1
        conv = te.compute(
            (batch, out, out, co),
            lambda n, h, w, c: te.sum(
                src[n, h + rh, w + rw, rc] * weight[flip - rh, flip - rw, rc, c], axis=[rh, rw, rc]
            ),
            name="conv",
        )
        return [data, weight, conv]

    def reference(ins):
        """Scatter form: every input pixel adds kernel-weighted copies to a (size-1)*stride+kernel canvas."""
        x, w = _f64(ins)
        full = (size - 1) * stride + kernel
        canvas = np.zeros((batch, full, full, co))
        span = stride * (size - 1) + 1
        for rh, rw in itertools.product(range(kernel), repeat=2):
            canvas[:, rh : rh + span : stride, rw : rw + span : stride] += x @ w[rh, rw]
        return [canvas[:, pad : pad + out, pad : pad + out].astype(np.float32)]

    desc = f"conv2d transpose NHWC {batch}x{size}x{size}x{ci} -> {co}, k{kernel} s{stride} p{pad} float32"
    return Workload(name, make, reference, desc)


def _capsule_workload(
    name: str, batch: int, size: int, ci: int, co: int, kernel: int, stride: int, pad: int, cap: int
) -> Workload:
    """Capsule conv2d (matrix capsules, Hinton et al. 2018): each pixel holds cap x cap pose matrices."""
    out = out_size(size, kernel, stride, pad)

    def make():
        data = te.placeholder((batch, size, size, cap, cap, ci), DTYPE, name="data")
        weight = te.placeholder((kernel, kernel, cap, cap, ci, co), DTYPE, name="kernel")
        names = ("n", "h", "w", "cap_i", "cap_j", "c")
        src = pad_stage(data, [0, pad, pad, 0, 0, 0], [0, pad, pad, 0, 0, 0], names) if pad else data
        rh = te.reduce_axis((0, kernel), name="rh")
        rw = te.reduce_axis((0, kernel), name="rw")
        rk = te.reduce_axis((0, cap), name="cap_k")
        rc = te.reduce_axis((0, ci), name="rc")
        conv = te.compute(
            (batch, out, out, cap, cap, co),
            lambda n, h, w, cap_i, cap_j, c: te.sum(
                src[n, h * stride + rh, w * stride + rw, cap_i, rk, rc] * weight[rh, rw, rk, cap_j, rc, c],
                axis=[rh, rw, rk, rc],
            ),
            name="conv",
        )
        return [data, weight, conv]

    def reference(ins):
        x, w = _f64(ins)
        xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0), (0, 0), (0, 0)])
        acc = np.zeros((batch, out, out, cap, cap, co))
        span = stride * (out - 1) + 1
        for rh, rw in itertools.product(range(kernel), repeat=2):
            patch = xp[:, rh : rh + span : stride, rw : rw + span : stride]
            acc += np.einsum("nhwikc,kjco->nhwijo", patch, w[rh, rw], optimize=True)
        return [acc.astype(np.float32)]

    dims = f"{batch}x{size}x{size}x{cap}x{cap}x{ci}"
    desc = f"capsule conv2d {dims} -> {co}, k{kernel} s{stride} p{pad} float32"
    return Workload(name, make, reference, desc)


def _norm_workload(name: str, batch: int, m: int, n: int) -> Workload:
    """Frobenius norm sqrt(sum a_ij^2) of each matrix, the "NRM" of the Ansor artifact."""

    def make():
        A = te.placeholder((batch, m, n), DTYPE, name="A")
        i = te.reduce_axis((0, m), name="i")
        j = te.reduce_axis((0, n), name="j")
        sqsum = te.compute((batch,), lambda b: te.sum(A[b, i, j] * A[b, i, j], axis=[i, j]), name="sqsum")
        return [A, te.compute((batch,), lambda b: te.sqrt(sqsum[b]), name="norm")]

    def reference(ins):
        (a,) = _f64(ins)
        return [np.sqrt((a * a).sum(axis=(1, 2))).astype(np.float32)]

    return Workload(name, make, reference, f"Frobenius norm of {batch} {m}x{n} matrices float32")


def _max_pool_workload(
    name: str, batch: int, size: int, channels: int, kernel: int, stride: int, pad: int
) -> Workload:
    out = out_size(size, kernel, stride, pad)
    lowest = float(np.finfo(np.float32).min)

    def make():
        data = te.placeholder((batch, size, size, channels), DTYPE, name="data")
        src = pad_stage(data, [0, pad, pad, 0], [0, pad, pad, 0], _NHWC, value=lowest) if pad else data
        rh = te.reduce_axis((0, kernel), name="rh")
        rw = te.reduce_axis((0, kernel), name="rw")
        pool = te.compute(
            (batch, out, out, channels),
            lambda n, h, w, c: te.max(src[n, h * stride + rh, w * stride + rw, c], axis=[rh, rw]),
            name="pool",
        )
        return [data, pool]

    def reference(ins):
        xp = np.pad(ins[0], [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=-np.inf)
        span = stride * (out - 1) + 1
        offsets = itertools.product(range(kernel), repeat=2)
        taps = [xp[:, rh : rh + span : stride, rw : rw + span : stride] for rh, rw in offsets]
        return [np.max(taps, axis=0).astype(np.float32)]

    desc = f"max pool2d NHWC {batch}x{size}x{size}x{channels}, k{kernel} s{stride} p{pad} float32"
    return Workload(name, make, reference, desc)


def _tbs_workload(name: str, batch: int, heads: int, seq: int, dim: int) -> Workload:
    """Attention scores: transpose Q and K to head-major, batched Q @ K^T, softmax over keys."""

    def make():
        query = te.placeholder((batch, seq, heads, dim), DTYPE, name="query")
        key = te.placeholder((batch, seq, heads, dim), DTYPE, name="key")
        query_t = te.compute((batch, heads, seq, dim), lambda b, h, l, d: query[b, l, h, d], name="query_T")
        key_t = te.compute((batch, heads, dim, seq), lambda b, h, d, l: key[b, l, h, d], name="key_T")
        k = te.reduce_axis((0, dim), name="k")
        scores = te.compute(
            (batch, heads, seq, seq),
            lambda b, h, i, j: te.sum(query_t[b, h, i, k] * key_t[b, h, k, j], axis=k),
            name="C",
        )
        return [query, key, softmax_stages(scores, ("b", "h", "i", "j"))]

    def reference(ins):
        q, k = _f64(ins)
        return [_softmax_ref(np.einsum("bihd,bjhd->bhij", q, k, optimize=True))]

    desc = f"transpose + batch matmul + softmax, batch {batch} heads {heads} seq {seq} dim {dim} float32"
    return Workload(name, make, reference, desc)


# ResNet-50 conv layers


def _resnet50_conv_layers() -> list[tuple[int, int, int, int, int, int, int]]:
    """Distinct conv2d shapes (H, W, CI, CO, kernel, stride, pad) of ResNet-50, input 224x224.

    Derived from the architecture rather than typed in, so the table cannot drift from it: v1.5
    (torchvision) bottlenecks, i.e. the stride-2 sits on the 3x3 conv, blocks [3, 4, 6, 3], widths
    64/128/256/512, expansion 4. Order is first appearance in the forward pass (conv1, conv2, conv3,
    then the downsample projection of each block).
    """
    layers: list[tuple[int, int, int, int, int, int, int]] = []

    def add(size: int, ci: int, co: int, kernel: int, stride: int) -> int:
        shape = (size, size, ci, co, kernel, stride, kernel // 2)
        if shape not in layers:
            layers.append(shape)
        return out_size(size, kernel, stride, kernel // 2)

    size = add(224, 3, 64, 7, 2)
    size = out_size(size, 3, 2, 1)  # 3x3 stride-2 max pool
    ci = 64
    for width, blocks, first_stride in zip((64, 128, 256, 512), (3, 4, 6, 3), (1, 2, 2, 2)):
        for block in range(blocks):
            stride = first_stride if block == 0 else 1
            add(size, ci, width, 1, 1)
            out = add(size, width, width, 3, stride)
            add(out, width, 4 * width, 1, 1)
            if block == 0:
                add(size, ci, 4 * width, 1, stride)
            size, ci = out, 4 * width
    return layers


# The registry

_PATTERNS = ("matmul-N", "matmul-MxNxK", "matmul-relu-N", "matmul-relu-MxNxK", "bf16-matmul-N", "bf16-matmul-MxNxK",
             "softmax-MxN")
_MATMUL_RE = re.compile(r"(bf16-)?matmul-(relu-)?([1-9]\d*)(?:x([1-9]\d*)x([1-9]\d*))?")
_SOFTMAX_RE = re.compile(r"softmax-([1-9]\d*)x([1-9]\d*)")
_ALIASES = {"ConvLayer": "conv2d-bn-relu", "softmax": "softmax-4x1024"}
_BATCHES = (1, 16)

# The single-op suite (shapes: see the module docstring); the batch comes from the name's suffix.
_SUITE: dict[str, Callable[[str, int], Workload]] = {
    "C1D": lambda name, b: _conv_workload(name, b, (256,), 64, 128, 3, 2, 1),
    "C2D": lambda name, b: _conv_workload(name, b, (224, 224), 3, 64, 7, 2, 3),
    "C3D": lambda name, b: _conv_workload(name, b, (16, 224, 224), 3, 64, 7, 2, 3),
    "GMM": lambda name, b: _batch_matmul_workload(name, b, 128, 128, 128),
    "GRP": lambda name, b: _conv_workload(name, b, (56, 56), 64, 128, 3, 2, 1, groups=4),
    "DIL": lambda name, b: _conv_workload(name, b, (224, 224), 3, 64, 7, 2, 3, dilation=2),
    "DEP": lambda name, b: _depthwise_workload(name, b, 112, 32, 3, 1, 1),
    "T2D": lambda name, b: _conv2d_transpose_workload(name, b, 4, 512, 256, 4, 2, 1),
    "CAP": lambda name, b: _capsule_workload(name, b, 16, 32, 32, 3, 2, 1, cap=4),
    "NRM": lambda name, b: _norm_workload(name, b, 256, 256),
}


def _builtin_table() -> dict[str, Workload]:
    """Every fixed-name workload; cheap to build because nothing touches TVM until make() runs."""
    table: dict[str, Workload] = {}
    for i, (h, w, ci, co, k, s, p) in enumerate(_resnet50_conv_layers()):
        name = f"nhwc-resnet-50.C{i}"
        wl = _conv_workload(name, 1, (h, w), ci, co, k, s, p)
        table[name] = dataclasses.replace(wl, description="ResNet-50 v1.5 " + wl.description)
    for op, build in _SUITE.items():
        for batch in _BATCHES:
            table[f"{op}-b{batch}"] = build(f"{op}-b{batch}", batch)
    for wl in (
        _conv_workload("conv2d-bn-relu", 1, (56, 56), 64, 64, 3, 1, 1, epilogue="bn-relu"),
        _tbs_workload("TBS", 1, 12, 128, 64),
        _max_pool_workload("max-pool2d", 1, 56, 64, 3, 2, 1),
        _conv_workload("conv2d-bias-relu", 1, (14, 14), 32, 32, 3, 1, 1, epilogue="bias-relu"),
        _conv_workload("conv2d-nhwc-small", 1, (14, 14), 16, 32, 3, 1, 1),
    ):
        table[wl.name] = wl
    return table


_BUILTIN = _builtin_table()
_USER: dict[str, Workload] = {}


#: Elements of one buffer of a parametrised workload: TVM indexes buffers with 32-bit integers.
_MAX_ELEMENTS = 2 ** 31 - 1


def _from_pattern(name: str) -> Workload | None:
    match = _MATMUL_RE.fullmatch(name)
    if match:
        bf16, relu, m, n, k = match.groups()
        m = int(m)
        n, k = (int(n), int(k)) if n else (m, m)
        _check_elements(name, m * k, k * n, m * n)
        prefix = ("bf16-" if bf16 else "") + ("matmul-relu-" if relu else "matmul-")
        canonical = prefix + (f"{m}" if m == n == k else f"{m}x{n}x{k}")
        if not bf16:
            return _matmul_workload(canonical, m, n, k, relu=bool(relu))
        if relu or n % 16 or k % 2:
            raise WorkloadError(f"workload {name!r}: a bf16 matmul has no relu, N a multiple of 16 and K even "
                                "(the bf16 unit's k pairs of 16 columns); example: bf16-matmul-512")
        return _bf16_matmul_workload(canonical, m, n, k)
    match = _SOFTMAX_RE.fullmatch(name)
    if match:
        m, n = int(match.group(1)), int(match.group(2))
        _check_elements(name, m * n)
        return _softmax_workload(f"softmax-{m}x{n}", m, n)
    return None


def _check_elements(name: str, *buffer_sizes: int) -> None:
    if max(buffer_sizes) > _MAX_ELEMENTS:
        raise WorkloadError(f"workload {name!r} is too large: a buffer would have {max(buffer_sizes)} elements, "
                            f"more than TVM's 32-bit index range ({_MAX_ELEMENTS}); example: matmul-4096")


def _builtin(name: str) -> Workload | None:
    name = _ALIASES.get(name, name)
    return _BUILTIN.get(name) or _from_pattern(name)


def workload_names() -> list[str]:
    """Every accepted name, for help texts and errors; parametrised families appear as patterns."""
    return [*_PATTERNS, *_ALIASES, *_BUILTIN, *_USER]


def get_workload(name: str) -> Workload:
    """Resolve a workload name (see the module docstring); unknown names raise WorkloadError."""
    workload = _USER.get(name) or _builtin(name)
    if workload is None:
        hint = ""
        if name.startswith(("matmul", "softmax")):
            hint = " (sizes are positive integers: matmul-512, matmul-64x128x256, softmax-4x1024)"
        raise WorkloadError(f"unknown workload {name!r}{hint}; valid names: {', '.join(workload_names())}")
    logger.debug("workload %s resolved to %s: %s", name, workload.name, workload.description)
    return workload


def register_workload(name: str, make: MakeFn, reference: ReferenceFn, description: str = "") -> None:
    """Add a user-defined workload under ``name``.

    Built-in names (including every name a pattern accepts) cannot be taken, so a log entry for
    ``matmul-512`` always means the same computation. Registering a user name again replaces it.
    """
    if not isinstance(name, str) or not name or any(ch.isspace() for ch in name):
        raise WorkloadError(f"workload names must be non-empty strings without whitespace, got {name!r}")
    if _builtin(name) is not None:
        raise WorkloadError(f"workload name {name!r} is built in and cannot be redefined")
    if not callable(make) or not callable(reference):
        raise WorkloadError(f"workload {name!r}: make and reference must be callable")
    if name in _USER:
        logger.warning("workload %s registered again; the new definition replaces the old one", name)
    _USER[name] = Workload(name, make, reference, description)
