"""PyTorch eager copies of the benchmark networks: the baseline the Ansor paper compares with.

Ansor's network tables (and the ResNet-50 goal of this project, at most 0.8x PyTorch's latency) compare a
tuned network with the framework a user would otherwise run it in. PyTorch is optional: this module imports
it only when a function here is called, and raises :class:`TorchUnavailableError` (a
:class:`~ansor.networks.NetworkError`, so scripts print one line) when it is missing. Install it with the
``torch`` extra (``pip install -e ".[torch]"``).

The five definitions mirror :mod:`ansor.networks.models` layer for layer, so both sides run the same
amount of work:

* **same structure and shapes**: widths, strides, block counts, kernel sizes, BERT's 12 layers with a fused
  QKV projection and explicit ``matmul`` + ``softmax`` attention, DCGAN's dense projection and four
  transposed convolutions; the input shapes are the registry's for the given batch size;
* **batch norm folded** into a convolution bias, as on the Relax side (what an inference export does);
* **layout NCHW** (``NCDHW`` for the 3-D ResNet): what PyTorch users run by default, and what PyTorch's
  CPU kernels (oneDNN for convolutions) are used with. The Relax networks are channels-last; the inputs are
  the network's seeded inputs moved to channels-first, so both sides see the same values;
* **weights** drawn from a ``torch.Generator`` seeded with
  :data:`~ansor.networks.registry.WEIGHT_SEED`, with the same distributions as the Relax weights (He
  normal, BERT's 0.02, smaller gain at the end of residual branches): the values themselves differ from
  the Relax weights and do not matter for latency, but they keep activations finite and away from
  denormals, which would slow the CPU down;
* evaluation mode and ``torch.inference_mode()`` (no autograd bookkeeping).

``tiny-cnn`` and ONNX models have no definition here; callers fall back to the default build for them.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from .evaluate import Timing
from .models import resnet_plan
from .network import Network, NetworkError
from .registry import BERT_SEQ_LEN, WEIGHT_SEED, get_network
from ..task.timing import REPORT

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("ansor")

#: Built-in networks that have a PyTorch definition here, in the registry's order.
TORCH_NETWORKS = ("resnet-50", "mobilenet-v2", "resnet3d-18", "bert", "dcgan")
#: How the baseline runs: ``eager``, or ``torch.compile`` (its default mode: Inductor) for the GPU rows of
#: ``ansor bench --target cuda``.
TORCH_MODES = ("eager", "torch.compile")

_INIT = "_ansor_init"  # attribute of a torch Parameter: (mean, std) of the normal it is drawn from


class TorchUnavailableError(NetworkError):
    """PyTorch is needed (the PyTorch eager baseline) but cannot be imported."""


def import_torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise TorchUnavailableError(
            f"PyTorch is not installed ({err}); the PyTorch eager baseline needs it: "
            "pip install -e \".[torch]\"") from None
    return torch


def torch_available() -> bool:
    """Whether PyTorch imports (a broken installation counts as missing)."""
    try:
        import_torch()
    except TorchUnavailableError:
        return False
    return True


def has_torch_definition(network: Network) -> bool:
    """Whether ``network`` is a built-in network defined here too.

    The name alone is not enough: an ONNX file called ``resnet-50.onnx`` is named ``resnet-50`` but is
    another program, so the entry function and the inputs must also be the registry's.
    """
    if network.name not in TORCH_NETWORKS:
        return False
    builtin = get_network(network.name, network.batch_size)
    return network.entry == builtin.entry and network.inputs == builtin.inputs


# ---------------------------------------------------------------------------------------------- models
@functools.lru_cache(maxsize=1)
def _definitions() -> dict[str, Callable[[], "torch.nn.Module"]]:
    """The model constructors, made on first use because their classes derive from ``torch.nn.Module``."""
    torch = import_torch()
    nn, F = torch.nn, torch.nn.functional

    def init(p: "torch.nn.Parameter", std: float, mean: float = 0.0) -> None:
        setattr(p, _INIT, (mean, std))

    def activate(x: "torch.Tensor", act: Optional[str]) -> "torch.Tensor":
        if act == "relu":
            return F.relu(x)
        if act == "relu6":
            return F.relu6(x)
        if act == "tanh":
            return torch.tanh(x)
        return x

    class ConvBN(nn.Module):
        """2-D or 3-D convolution with the folded batch norm as its bias, then an optional activation."""

        def __init__(self, cin: int, cout: int, kernel: int | Sequence[int], stride: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, groups: int = 1, act: Optional[str] = "relu",
                     dims: int = 2, gain: float = 1.0):
            super().__init__()
            kernel = (kernel,) * dims if isinstance(kernel, int) else tuple(kernel)
            conv = nn.Conv2d if dims == 2 else nn.Conv3d
            self.conv = conv(cin, cout, kernel, stride, padding, groups=groups, bias=True)
            init(self.conv.weight, gain * math.sqrt(2.0 / (math.prod(kernel) * cin // groups)))
            init(self.conv.bias, 0.05)
            self.act = act

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            return activate(self.conv(x), self.act)

    class Dense(nn.Module):
        """``nn.Linear`` (weight stored (out, in), as PyTorch does) and an optional activation."""

        def __init__(self, cin: int, cout: int, act: Optional[str] = None, std: Optional[float] = None):
            super().__init__()
            self.linear = nn.Linear(cin, cout)
            init(self.linear.weight, std if std is not None else math.sqrt(2.0 / cin))
            init(self.linear.bias, 0.02 if std is not None else 0.05)
            self.act = act

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            y = self.linear(x)
            return F.gelu(y) if self.act == "gelu" else activate(y, self.act)

    def layer_norm(dim: int) -> "torch.nn.LayerNorm":
        norm = nn.LayerNorm(dim, eps=1e-12)
        init(norm.weight, 0.0, mean=1.0)
        init(norm.bias, 0.0)
        return norm

    def max_pool(dims: int) -> "torch.nn.Module":
        return (nn.MaxPool2d if dims == 2 else nn.MaxPool3d)(3, 2, 1)

    def global_avg_pool(x: "torch.Tensor", dims: int) -> "torch.Tensor":
        pool = F.adaptive_avg_pool2d if dims == 2 else F.adaptive_avg_pool3d
        return torch.flatten(pool(x, 1), 1)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * 4
            self.conv1 = ConvBN(cin, width, 1)
            self.conv2 = ConvBN(width, width, 3, stride, 1)
            self.conv3 = ConvBN(width, cout, 1, act=None, gain=0.5)
            self.down = ConvBN(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            shortcut = self.down(x) if self.down is not None else x
            return F.relu(self.conv3(self.conv2(self.conv1(x))) + shortcut)

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, dims: int):
            super().__init__()
            self.conv1 = ConvBN(cin, cout, 3, stride, 1, dims=dims)
            self.conv2 = ConvBN(cout, cout, 3, 1, 1, act=None, dims=dims, gain=0.5)
            self.down = ConvBN(cin, cout, 1, stride, act=None, dims=dims) if stride != 1 or cin != cout else None

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            shortcut = self.down(x) if self.down is not None else x
            return F.relu(self.conv2(self.conv1(x)) + shortcut)

    class ResNet(nn.Module):
        def __init__(self, blocks: Sequence[int], bottleneck: bool, dims: int = 2, num_classes: int = 1000):
            super().__init__()
            self.dims = dims
            if dims == 2:
                self.stem = ConvBN(3, 64, 7, 2, 3)
            else:
                self.stem = ConvBN(3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3), dims=3)
            self.pool = max_pool(dims)
            plan, cout = resnet_plan(blocks, bottleneck)
            self.layers = nn.Sequential(*[Bottleneck(cin, width, stride) if bottleneck else
                                          BasicBlock(cin, width, stride, dims) for cin, width, stride in plan])
            self.fc = Dense(cout, num_classes, std=math.sqrt(1.0 / cout))

        def forward(self, data: "torch.Tensor") -> "torch.Tensor":
            y = self.layers(self.pool(self.stem(data)))
            return self.fc(global_avg_pool(y, self.dims))

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int):
            super().__init__()
            hidden = cin * expand
            self.expand = ConvBN(cin, hidden, 1, act="relu6") if expand != 1 else None
            self.depthwise = ConvBN(hidden, hidden, 3, stride, 1, groups=hidden, act="relu6")
            self.project = ConvBN(hidden, cout, 1, act=None, gain=0.5)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            y = self.expand(x) if self.expand is not None else x
            y = self.project(self.depthwise(y))
            return y + x if self.residual else y

    class MobileNetV2(nn.Module):
        SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                    (6, 320, 1, 1))  # (expansion, channels, repeats, first stride), as in models.py

        def __init__(self, num_classes: int = 1000):
            super().__init__()
            self.stem = ConvBN(3, 32, 3, 2, 1, act="relu6")
            blocks, cin = [], 32
            for t, c, n, s in self.SETTINGS:
                for j in range(n):
                    blocks.append(InvertedResidual(cin, c, s if j == 0 else 1, t))
                    cin = c
            self.blocks = nn.Sequential(*blocks)
            self.head = ConvBN(cin, 1280, 1, act="relu6")
            self.fc = Dense(1280, num_classes, std=math.sqrt(1.0 / 1280))

        def forward(self, data: "torch.Tensor") -> "torch.Tensor":
            return self.fc(global_avg_pool(self.head(self.blocks(self.stem(data))), 2))

    class EncoderLayer(nn.Module):
        """One BERT layer on a (batch * seq, hidden) matrix, attention written out as in models.py."""

        def __init__(self, hidden: int, heads: int, ffn: int, seq: int):
            super().__init__()
            self.qkv = Dense(hidden, 3 * hidden, std=0.02)
            self.out = Dense(hidden, hidden, std=0.02)
            self.norm1 = layer_norm(hidden)
            self.ffn1 = Dense(hidden, ffn, act="gelu", std=0.02)
            self.ffn2 = Dense(ffn, hidden, std=0.02)
            self.norm2 = layer_norm(hidden)
            self.hidden, self.heads, self.seq = hidden, heads, seq

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            tokens = x.shape[0]
            batch, head_dim = tokens // self.seq, self.hidden // self.heads
            qkv = self.qkv(x).reshape(batch, self.seq, 3, self.heads, head_dim)
            q, k, v = (t.permute(0, 2, 1, 3) for t in qkv.unbind(2))
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
            context = context.permute(0, 2, 1, 3).reshape(tokens, self.hidden)
            y = self.norm1(self.out(context) + x)
            return self.norm2(self.ffn2(self.ffn1(y)) + y)

    class Bert(nn.Module):
        def __init__(self, seq: int = 128, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072,
                     vocab: int = 30522):
            super().__init__()
            self.word = nn.Parameter(torch.empty(vocab, hidden))
            self.position = nn.Parameter(torch.empty(seq, hidden))  # position + token-type-0, summed
            init(self.word, 0.02)
            init(self.position, 0.02)
            self.norm = layer_norm(hidden)
            self.layers = nn.Sequential(*[EncoderLayer(hidden, heads, ffn, seq) for _ in range(layers)])
            self.seq, self.hidden = seq, hidden

        def forward(self, input_ids: "torch.Tensor") -> "torch.Tensor":
            batch = input_ids.shape[0]
            emb = F.embedding(input_ids.reshape(batch * self.seq), self.word)
            emb = emb + self.position.expand(batch, self.seq, self.hidden).reshape(batch * self.seq, self.hidden)
            y = self.layers(self.norm(emb))
            return y.reshape(batch, self.seq, self.hidden)

    class Deconv(nn.Module):
        """Transposed convolution, kernel 4, stride 2, padding 1 (doubles H and W), then an activation."""

        def __init__(self, cin: int, cout: int, act: str):
            super().__init__()
            self.deconv = nn.ConvTranspose2d(cin, cout, 4, 2, 1)  # weight (cin, cout, 4, 4): IOHW, as in Relax
            init(self.deconv.weight, math.sqrt(2.0 / (cin * 4)))
            init(self.deconv.bias, 0.05)
            self.act = act

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            return activate(self.deconv(x), self.act)

    class DCGANGenerator(nn.Module):
        def __init__(self, noise: int = 100, ngf: int = 128):
            super().__init__()
            self.project = Dense(noise, ngf * 8 * 4 * 4, act="relu")
            self.deconvs = nn.Sequential(Deconv(ngf * 8, ngf * 4, "relu"), Deconv(ngf * 4, ngf * 2, "relu"),
                                         Deconv(ngf * 2, ngf, "relu"), Deconv(ngf, 3, "tanh"))
            self.ngf = ngf

        def forward(self, noise: "torch.Tensor") -> "torch.Tensor":
            return self.deconvs(self.project(noise).reshape(noise.shape[0], self.ngf * 8, 4, 4))

    return {
        "resnet-50": lambda: ResNet((3, 4, 6, 3), bottleneck=True),
        "mobilenet-v2": MobileNetV2,
        "resnet3d-18": lambda: ResNet((2, 2, 2, 2), bottleneck=False, dims=3),
        "bert": lambda: Bert(seq=BERT_SEQ_LEN),
        "dcgan": DCGANGenerator,
    }


def make_torch_model(name: str) -> "torch.nn.Module":
    """The PyTorch eager model of a built-in network, with seeded weights, in evaluation mode.

    Raises
    ------
    TorchUnavailableError
        PyTorch cannot be imported.
    NetworkError
        ``name`` has no PyTorch definition (``tiny-cnn``, ONNX models, unknown names).
    """
    torch = import_torch()
    if name not in TORCH_NETWORKS:
        raise NetworkError(f"{name!r} has no PyTorch definition (those with one: {', '.join(TORCH_NETWORKS)})")
    model = _definitions()[name]()
    generator = torch.Generator().manual_seed(WEIGHT_SEED)
    with torch.no_grad():
        for p in model.parameters():  # definition order, one generator: the same weights in every process
            mean, std = getattr(p, _INIT)
            if std > 0:
                p.normal_(mean, std, generator=generator)
            else:
                p.fill_(mean)
    return model.eval()


def export_onnx(name: str, batch_size: int, path: "os.PathLike[str] | str", opset: int = 17) -> None:
    """Write the PyTorch model of a built-in network to ``path`` as ONNX, as a user exports theirs.

    Channels-first (PyTorch's layout: the ONNX model is NCHW), seeded weights, batch ``batch_size``, inputs
    named as the built-in network's. Exported with the TorchScript exporter (``dynamo=False``), which needs
    only the ``onnx`` package beside torch.
    """
    torch = import_torch()
    network = get_network(name, batch_size)
    model = make_torch_model(name)
    inputs = tuple(torch_inputs(network))
    with torch.no_grad():
        torch.onnx.export(model, inputs, str(path), input_names=[s.name for s in network.inputs],
                          output_names=["output"], opset_version=opset, dynamo=False, do_constant_folding=True)


def torch_inputs(network: Network, seed: int = 0) -> list["torch.Tensor"]:
    """The network's seeded inputs (:meth:`Network.random_inputs`), moved to PyTorch's channels-first layout."""
    torch = import_torch()
    out = []
    for array in network.random_inputs(seed):
        if network.layout in ("NHWC", "NDHWC"):  # channels last -> NCHW / NCDHW
            array = np.ascontiguousarray(np.moveaxis(array, -1, 1))
        out.append(torch.from_numpy(array))
    return out


def time_torch(name: str, batch_size: int, threads: int, repeat: int = REPORT.repeat,
               min_repeat_ms: int = REPORT.min_repeat_ms, warmup: int = 3, device: str = "cpu",
               mode: str = "eager") -> Timing:
    """Time the PyTorch model of a built-in network once (:class:`TorchBaseline`, whose arguments these are)."""
    return TorchBaseline(name, batch_size, device, mode).time(threads, repeat, min_repeat_ms, warmup)


class TorchBaseline:
    """A built-in network's PyTorch model on ``device``, made (and with ``mode="torch.compile"``, compiled)
    once, timed as :func:`~ansor.networks.time_network` times a build.

    ``device="cuda"``: on the GPU, in float32 with TF32 off (as ansor computes), synchronized before each
    clock reading.

    Raises
    ------
    TorchUnavailableError
        PyTorch cannot be imported, or ``device`` is ``cuda`` and PyTorch sees no GPU.
    NetworkError
        No PyTorch definition of ``name``, an unknown name, mode or device, or a bad batch size.
    """

    def __init__(self, name: str, batch_size: int, device: str = "cpu", mode: str = "eager"):
        torch = self.torch = import_torch()
        if mode not in TORCH_MODES or device not in ("cpu", "cuda"):
            raise NetworkError(f"PyTorch runs {mode!r} on {device!r}: choose a mode from "
                               f"{', '.join(TORCH_MODES)} and the device cpu or cuda")
        if device == "cuda" and not torch.cuda.is_available():
            raise TorchUnavailableError(f"PyTorch {torch.__version__} sees no CUDA GPU")
        self.name, self.device, self.mode = name, device, mode
        model = make_torch_model(name).to(device)
        self.model = torch.compile(model) if mode == "torch.compile" else model
        self.inputs = [x.to(device) for x in torch_inputs(get_network(name, batch_size))]

    def time(self, threads: int, repeat: int = REPORT.repeat, min_repeat_ms: int = REPORT.min_repeat_ms,
             warmup: int = 3) -> Timing:
        """``torch.set_num_threads(threads)`` for the measurement (pass the target's core count; the
        previous count is restored afterwards). ``warmup`` runs come first, since PyTorch's first calls
        create oneDNN primitives and allocate memory (and compile, for ``torch.compile``). Then each of
        ``repeat`` repeats runs the model as often as fits in ``min_repeat_ms`` (estimated from one timed
        run) and records the average; the statistics are over the repeats, like the VM timer's."""
        torch, model, inputs = self.torch, self.model, self.inputs
        if threads < 1 or repeat < 1:
            raise NetworkError(f"threads and repeat must be positive, got {threads} and {repeat}")
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        previous = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            with torch.inference_mode():
                for _ in range(warmup):
                    model(*inputs)
                sync()
                start = time.perf_counter()
                model(*inputs)
                sync()
                number = max(1, math.ceil(min_repeat_ms / 1e3 / (time.perf_counter() - start)))
                ms = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    for _ in range(number):
                        model(*inputs)
                    sync()
                    ms.append((time.perf_counter() - start) / number * 1e3)
            used = torch.get_num_threads()
        finally:
            torch.set_num_threads(previous[0])
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous[1:]
        values = np.asarray(ms)
        timing = Timing(float(values.mean()), float(np.median(values)), float(values.max()), float(values.min()),
                        float(values.std()), used, len(values))
        logger.info("%s (PyTorch %s %s on %s): %s", self.name, torch.__version__, self.mode, self.device, timing)
        return timing
