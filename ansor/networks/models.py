"""Ansor's benchmark networks (and a tiny one for tests), written with ``tvm.relax.frontend.nn``.

No framework is needed: the graphs are written out here and the weights are seeded random numbers, so
a network is the same in every process. Choices, and why:

* **Layout.** 2-D and 3-D convolutions are channels-last (``NHWC`` / ``NDHWC`` data, ``HWIO`` / ``DHWIO``
  kernels), as Ansor tuned them on CPU; the nn frontend's ``Conv2D`` only makes OIHW kernels, so the
  layers below call ``relax.op.nn.conv2d`` with explicit layouts. DCGAN stays ``NCHW``: TOPI's
  ``conv2d_transpose`` is legalized for NCHW/IOHW only.
* **Batch norm is folded** into the convolution weights and a per-channel bias, which is what Ansor's
  Relay graphs became after ``SimplifyInference`` + ``FoldScaleAxis`` + ``FoldConstant``, so the fused
  subgraphs are ``conv2d + add + relu`` as in the paper.
* **Dense weights are stored (in, out)**, so no transpose runs at inference time.
* **Weights** are normal with He scaling (``sqrt(2 / fan_in)``) for convolutions and dense layers and
  BERT's 0.02 for the transformer; residual branches end with a smaller gain, so activations of deep
  networks stay finite and comparisons between builds stay meaningful.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op, wrap_nested

_INIT = "ansor_init"  # Parameter.attrs key: (mean, std) of the normal distribution the weight is drawn from


def param(shape: Sequence[int], std: float, mean: float = 0.0, dtype: str = "float32") -> nn.Parameter:
    """An nn Parameter that remembers how to draw its random value."""
    p = nn.Parameter(tuple(shape), dtype)
    p.attrs[_INIT] = (mean, std)
    return p


def random_params(model: nn.Module, seed: int) -> dict[str, np.ndarray]:
    """Seeded values for every parameter of ``model`` (one generator, parameters in definition order)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_parameters():
        mean, std = p.attrs.get(_INIT, (0.0, 0.02))
        shape = tuple(int(d) for d in p.shape)
        value = rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)
        out[name] = value.astype(p.dtype)
    return out


def _activate(x: relax.Expr, act: Optional[str]) -> relax.Expr:
    if act == "relu":
        return relax.op.nn.relu(x)
    if act == "relu6":
        return relax.op.clip(x, 0.0, 6.0)
    if act == "tanh":
        return relax.op.tanh(x)
    return x


# ---------------------------------------------------------------------------------------------- layers
class ConvBN(nn.Module):
    """Channels-last 2-D or 3-D convolution + folded batch norm (a bias) + optional activation."""

    def __init__(self, cin: int, cout: int, kernel: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: int | Sequence[int] = 0, groups: int = 1, act: Optional[str] = "relu",
                 dims: int = 2, gain: float = 1.0):
        kernel = (kernel,) * dims if isinstance(kernel, int) else tuple(kernel)
        fan_in = math.prod(kernel) * cin // groups
        self.weight = param((*kernel, cin // groups, cout), gain * math.sqrt(2.0 / fan_in))
        self.bias = param((cout,), 0.05)
        self.stride, self.padding, self.groups, self.act, self.dims = stride, padding, groups, act, dims

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        if self.dims == 2:
            y = relax.op.nn.conv2d(x._expr, self.weight._expr, strides=self.stride, padding=self.padding,
                                   groups=self.groups, data_layout="NHWC", kernel_layout="HWIO")
        else:
            y = relax.op.nn.conv3d(x._expr, self.weight._expr, strides=self.stride, padding=self.padding,
                                   groups=self.groups, data_layout="NDHWC", kernel_layout="DHWIO")
        return wrap_nested(_activate(relax.op.add(y, self.bias._expr), self.act), "conv")


class Dense(nn.Module):
    """``x @ W + b`` with ``W`` stored (in, out) and an optional activation."""

    def __init__(self, cin: int, cout: int, act: Optional[str] = None, std: Optional[float] = None):
        self.weight = param((cin, cout), std if std is not None else math.sqrt(2.0 / cin))
        self.bias = param((cout,), 0.02 if std is not None else 0.05)
        self.act = act

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = op.add(op.matmul(x, self.weight), self.bias)
        if self.act == "gelu":
            return op.gelu(y)
        return wrap_nested(_activate(y._expr, self.act), "dense")


class LayerNorm(nn.Module):
    """Layer norm over the last axis (gamma 1, beta 0, as freshly initialised BERT)."""

    def __init__(self, dim: int, eps: float = 1e-12):
        self.weight = param((dim,), 0.0, mean=1.0)
        self.bias = param((dim,), 0.0)
        self.dim, self.eps = dim, eps

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return op.layer_norm(x, [self.dim], self.weight, self.bias, eps=self.eps)


def _add_relu(a: nn.Tensor, b: nn.Tensor) -> nn.Tensor:
    return op.relu(op.add(a, b))


def _max_pool(x: nn.Tensor, dims: int, size: int = 3, stride: int = 2, padding: int = 1) -> nn.Tensor:
    if dims == 2:
        y = relax.op.nn.max_pool2d(x._expr, size, stride, padding, layout="NHWC")
    else:
        y = relax.op.nn.max_pool3d(x._expr, size, stride, padding, layout="NDHWC")
    return wrap_nested(y, "max_pool")


def _global_avg_pool(x: nn.Tensor, dims: int) -> nn.Tensor:
    """Mean over the spatial axes, flattened to (batch, channels)."""
    if dims == 2:
        y = relax.op.nn.adaptive_avg_pool2d(x._expr, 1, layout="NHWC")
    else:
        y = relax.op.nn.adaptive_avg_pool3d(x._expr, 1, layout="NDHWC")
    pooled = wrap_nested(y, "avg_pool")
    return op.reshape(pooled, (pooled.shape[0], pooled.shape[-1]))


# ---------------------------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    """ResNet-50 block (v1.5: the stride sits on the 3x3 convolution)."""

    def __init__(self, cin: int, width: int, stride: int):
        cout = width * 4
        self.conv1 = ConvBN(cin, width, 1)
        self.conv2 = ConvBN(width, width, 3, stride, 1)
        self.conv3 = ConvBN(width, cout, 1, act=None, gain=0.5)
        self.down = ConvBN(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        shortcut = self.down(x) if self.down is not None else x
        return _add_relu(self.conv3(self.conv2(self.conv1(x))), shortcut)


class BasicBlock(nn.Module):
    """ResNet-18 block; ``dims=3`` makes the 3-D variant."""

    def __init__(self, cin: int, cout: int, stride: int, dims: int):
        self.conv1 = ConvBN(cin, cout, 3, stride, 1, dims=dims)
        self.conv2 = ConvBN(cout, cout, 3, 1, 1, act=None, dims=dims, gain=0.5)
        self.down = ConvBN(cin, cout, 1, stride, act=None, dims=dims) if stride != 1 or cin != cout else None

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        shortcut = self.down(x) if self.down is not None else x
        return _add_relu(self.conv2(self.conv1(x)), shortcut)


def resnet_plan(blocks: Sequence[int], bottleneck: bool) -> tuple[list[tuple[int, int, int]], int]:
    """(input channels, width, stride) of every residual block in order, and the channels after the last.

    Shared with the PyTorch copy (``torch_baseline.py``) so both build the same network.
    """
    plan, cin = [], 64
    for i, n in enumerate(blocks):
        width = 64 * 2 ** i
        for j in range(n):
            plan.append((cin, width, 2 if j == 0 and i > 0 else 1))
            cin = width * 4 if bottleneck else width
    return plan, cin


class ResNet(nn.Module):
    """ResNet-50 (``bottleneck=True``, 2-D) or ResNet-18 (2-D or, with ``dims=3``, 3-D)."""

    def __init__(self, blocks: Sequence[int], bottleneck: bool, dims: int = 2, num_classes: int = 1000):
        self.dims = dims
        if dims == 2:
            self.stem = ConvBN(3, 64, 7, 2, 3)
        else:  # 3-D ResNet: keep the temporal resolution in the stem, as in Hara et al.
            self.stem = ConvBN(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), dims=3)
        plan, cout = resnet_plan(blocks, bottleneck)
        self.layers = nn.ModuleList([Bottleneck(cin, width, stride) if bottleneck else
                                     BasicBlock(cin, width, stride, dims) for cin, width, stride in plan])
        self.fc = Dense(cout, num_classes, std=math.sqrt(1.0 / cout))

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        y = _max_pool(self.stem(data), self.dims)
        for layer in self.layers:
            y = layer(y)
        return self.fc(_global_avg_pool(y, self.dims))


# ---------------------------------------------------------------------------------------------- MobileNet
class InvertedResidual(nn.Module):
    """MobileNet-V2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection (+ identity shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        hidden = cin * expand
        self.expand = ConvBN(cin, hidden, 1, act="relu6") if expand != 1 else None
        self.depthwise = ConvBN(hidden, hidden, 3, stride, 1, groups=hidden, act="relu6")
        self.project = ConvBN(hidden, cout, 1, act=None, gain=0.5)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return op.add(y, x) if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNet-V2 (width 1.0) for 224x224 images."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # (expansion, channels, repeats, first stride)

    def __init__(self, num_classes: int = 1000):
        self.stem = ConvBN(3, 32, 3, 2, 1, act="relu6")
        blocks = []
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for j in range(n):
                blocks.append(InvertedResidual(cin, c, s if j == 0 else 1, t))
                cin = c
        self.blocks = nn.ModuleList(blocks)
        self.head = ConvBN(cin, 1280, 1, act="relu6")
        self.fc = Dense(1280, num_classes, std=math.sqrt(1.0 / 1280))

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        y = self.stem(data)
        for block in self.blocks:
            y = block(y)
        return self.fc(_global_avg_pool(self.head(y), 2))


# ---------------------------------------------------------------------------------------------- BERT
class EncoderLayer(nn.Module):
    """One BERT encoder layer on a (batch * seq, hidden) activation matrix."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq: int):
        self.qkv = Dense(hidden, 3 * hidden, std=0.02)
        self.out = Dense(hidden, hidden, std=0.02)
        self.norm1 = LayerNorm(hidden)
        self.ffn1 = Dense(hidden, ffn, act="gelu", std=0.02)
        self.ffn2 = Dense(ffn, hidden, std=0.02)
        self.norm2 = LayerNorm(hidden)
        self.hidden, self.heads, self.seq = hidden, heads, seq

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        tokens = x.shape[0]
        batch, head_dim = tokens // self.seq, self.hidden // self.heads
        qkv = op.reshape(self.qkv(x), (batch, self.seq, 3, self.heads, head_dim))
        q, k, v = (op.permute_dims(op.squeeze(t, 2), (0, 2, 1, 3)) for t in op.split(qkv, 3, axis=2))
        scores = op.matmul(q, op.permute_dims(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(head_dim))
        context = op.matmul(op.softmax(scores, axis=-1), v)
        context = op.reshape(op.permute_dims(context, (0, 2, 1, 3)), (tokens, self.hidden))
        y = self.norm1(op.add(self.out(context), x))
        return self.norm2(op.add(self.ffn2(self.ffn1(y)), y))


class Bert(nn.Module):
    """BERT encoder (base: 12 layers, hidden 768, 12 heads, FFN 3072); returns the last hidden states."""

    def __init__(self, seq: int = 128, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                 vocab: int = 30522):
        self.word = param((vocab, hidden), 0.02)
        self.position = param((seq, hidden), 0.02)  # position + token-type-0 embeddings, summed
        self.norm = LayerNorm(hidden)
        self.layers = nn.ModuleList([EncoderLayer(hidden, heads, ffn, seq) for _ in range(layers)])
        self.seq, self.hidden = seq, hidden

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        batch = input_ids.shape[0]
        emb = op.add(op.take(self.word, op.reshape(input_ids, (batch * self.seq,)), axis=0),
                     op.reshape(op.broadcast_to(self.position, (batch, self.seq, self.hidden)),
                                (batch * self.seq, self.hidden)))
        y = self.norm(emb)
        for layer in self.layers:
            y = layer(y)
        return op.reshape(y, (batch, self.seq, self.hidden))


# ---------------------------------------------------------------------------------------------- DCGAN
class Deconv(nn.Module):
    """NCHW transposed convolution (kernel 4, stride 2, padding 1: doubles H and W) + bias + activation."""

    def __init__(self, cin: int, cout: int, act: str):
        self.weight = param((cin, cout, 4, 4), math.sqrt(2.0 / (cin * 4)))
        self.bias = param((1, cout, 1, 1), 0.05)
        self.act = act

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = relax.op.nn.conv2d_transpose(x._expr, self.weight._expr, strides=2, padding=1,
                                         data_layout="NCHW", kernel_layout="IOHW")
        return wrap_nested(_activate(relax.op.add(y, self.bias._expr), self.act), "deconv")


class DCGANGenerator(nn.Module):
    """DCGAN generator: 100-d noise -> 4x4x1024 -> ... -> 3x64x64 image (tanh)."""

    def __init__(self, noise: int = 100, ngf: int = 128):
        self.project = Dense(noise, ngf * 8 * 4 * 4, act="relu")
        self.deconvs = nn.ModuleList([Deconv(ngf * 8, ngf * 4, "relu"), Deconv(ngf * 4, ngf * 2, "relu"),
                                      Deconv(ngf * 2, ngf, "relu"), Deconv(ngf, 3, "tanh")])
        self.ngf = ngf

    def forward(self, noise: nn.Tensor) -> nn.Tensor:
        y = op.reshape(self.project(noise), (noise.shape[0], self.ngf * 8, 4, 4))
        for deconv in self.deconvs:
            y = deconv(y)
        return y


# ---------------------------------------------------------------------------------------------- tiny
class TinyCNN(nn.Module):
    """conv+relu, max pool, conv+relu, global average pool, dense: a whole network that builds in seconds."""

    def __init__(self, num_classes: int = 10):
        self.conv1 = ConvBN(3, 16, 3, 1, 1)
        self.conv2 = ConvBN(16, 32, 3, 1, 1)
        self.fc = Dense(32, num_classes, std=math.sqrt(1.0 / 32))

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        y = _max_pool(self.conv1(data), 2, size=2, stride=2, padding=0)
        return self.fc(_global_avg_pool(self.conv2(y), 2))
