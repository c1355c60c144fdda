"""The model zoo of ``ansor bench --zoo``: real models of many families, each exported to ONNX from its own
library's definition as a user would export it.

The built-in networks (``ansor/networks/``) are the ones ansor was written against; a zoo of models it was
not written against is what tells whether it works on a user's model. Each entry says where the model comes
from (torchvision, or Hugging Face ``transformers`` built from a config), its family and its input; the
export uses random weights (``weights=None``; no download: the machines that run this reach no model hub),
eval mode, batch 1, opset 17 and the TorchScript exporter (``dynamo=False``), as ``ansor bench`` exports the
built-in networks. Random weights time the same as trained ones: latency depends on shapes, not values.

The values still matter to the check against ONNX Runtime, which means nothing when the output does not
depend on the input. torchvision's own initialisation makes some outputs constant: GoogLeNet's truncated
normals (std 0.01) shrink the features until two inputs give outputs 3e-11 apart, ViT-B/16's head is zeros,
Inception-v3's overflows to 1e12 and EfficientNet-B0's ends at 1e-14. Every torchvision entry therefore gets
He-normal convolution and linear weights and zero biases (variance-preserving through ReLU nets: outputs of
order 1e-3 to 1e4 over the zoo), and the export refuses a model whose output does not move with its input.
It also refuses a chaotic one, whose output a change of the input by one part in a million moves by more
than a thousandth: there any two compilers' rounding differs by more than the check's tolerance. He-normal
made EfficientNet-V2-S so (outputs of 1e6, moved by a quarter by such a nudge: its 10-minute tuning ended
in a failed check); it gets the gain of a linear layer instead (outputs of 5e-4, moved by 2e-6).

Two entries are not a library's whole model: the SSDlite detector is exported as backbone and head, without
the transform and non-maximum suppression (data-dependent shapes, which no compiler of static graphs takes;
a user exports the same part), and the transformers take ``input_ids`` alone, with an all-ones attention
mask made inside the graph (one made of the benchmark's random integers would be meaningless).

Everything heavy is imported on first use: ``import ansor.bench.zoo`` loads neither torch nor TVM, so the
zoo can be listed and its names checked without the ``zoo`` extra (``pip install -e ".[zoo]"``).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("ansor")

TORCHVISION = "torchvision"
TRANSFORMERS = "transformers"

# The families the zoo must cover (issue 33): each one stresses a different part of the compiler.
MOBILE_SE = "mobile CNN with SE and SiLU/hardswish"
DEPTHWISE = "depthwise-heavy CNN"
GROUPED = "grouped convolutions"
DENSE = "densely connected"
INCEPTION = "Inception-style branches"
CONVNEXT = "ConvNeXt-style"
VIT = "vision transformer"
RESIDUAL = "classic CNN"
SEGMENTATION = "segmentation"
DETECTOR = "detector"
VIDEO = "3D CNN (video)"
ENCODER = "encoder transformer"
DECODER = "decoder transformer"
FAMILIES = (MOBILE_SE, DEPTHWISE, GROUPED, DENSE, INCEPTION, CONVNEXT, VIT, RESIDUAL, SEGMENTATION, DETECTOR,
            VIDEO, ENCODER, DECODER)

OPSET = 17
# Two seeded inputs must move the output by at least this fraction of its largest magnitude. With He-normal
# weights the zoo's models move by 1e-2 (DenseNet-121) to 1.5 (ConvNeXt-T); the constant ones by 0 to 3e-11.
INPUT_DEPENDENCE = 1e-3
# Scaling the input by 1 + NUDGE may move the output by at most CHAOS of its largest magnitude. The zoo's models
# move by 5e-7 to 2e-5; EfficientNet-V2-S with He-normal weights by 0.24.
NUDGE = 1e-6
CHAOS = 1e-3
IMAGE = (("input", (1, 3, 224, 224), "float32"),)
TOKENS = (("input_ids", (1, 128), "int64"),)  # sequence length 128


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo and how a user gets it as ONNX.

    ``constructor``: the name in ``torchvision.models`` (or its ``segmentation``/``detection``/``video``
    submodule, see ``module``), or the ``transformers`` model class built from ``config`` (its config class)
    with ``options`` as the config's fields; for torchvision, ``options`` are the constructor's keyword
    arguments beside ``weights=None``. ``outputs`` says what the exported graph returns: ``plain`` (the
    model's own outputs), ``out`` (a segmentation model's ``"out"`` entry) or ``ssd`` (the detector's box
    regression and class logits from backbone and head).
    """

    name: str
    family: str
    library: str
    constructor: str
    inputs: tuple[tuple[str, tuple[int, ...], str], ...] = IMAGE
    options: tuple[tuple[str, Any], ...] = ()
    module: str = ""
    config: str = ""
    outputs: str = "plain"
    gain: str = "relu"  # the He-normal gain, as torch names it ("linear": 1) where "relu" makes it chaotic

    @property
    def source(self) -> str:
        """Where the definition comes from, as a user would name it."""
        if self.library == TRANSFORMERS:
            return f"transformers.{self.constructor}({self.config})"
        return ".".join(filter(None, ("torchvision.models", self.module, self.constructor)))


def _tv(name: str, family: str, constructor: str = "", **kw: Any) -> ZooModel:
    options = tuple(sorted(kw.pop("options", {}).items()))
    return ZooModel(name, family, TORCHVISION, constructor or name, options=options, **kw)


def _hf(name: str, family: str, constructor: str, config: str, **options: Any) -> ZooModel:
    return ZooModel(name, family, TRANSFORMERS, constructor, TOKENS, tuple(sorted(options.items())), config=config)


SEG = (("input", (1, 3, 520, 520), "float32"),)  # torchvision's segmentation eval transform resizes to 520
ZOO: tuple[ZooModel, ...] = (
    _tv("mobilenet_v3_large", MOBILE_SE),
    _tv("efficientnet_b0", MOBILE_SE),
    _tv("efficientnet_v2_s", MOBILE_SE, inputs=(("input", (1, 3, 384, 384), "float32"),), gain="linear"),
    _tv("mobilenet_v2", DEPTHWISE),
    _tv("mnasnet1_0", DEPTHWISE),
    _tv("shufflenet_v2_x1_0", DEPTHWISE),
    _tv("resnext50_32x4d", GROUPED),
    _tv("regnet_y_400mf", GROUPED),
    _tv("densenet121", DENSE),
    _tv("inception_v3", INCEPTION, inputs=(("input", (1, 3, 299, 299), "float32"),),
        options={"aux_logits": False, "init_weights": True}),
    _tv("googlenet", INCEPTION, options={"aux_logits": False, "init_weights": True}),
    _tv("convnext_tiny", CONVNEXT),
    _tv("vit_b_16", VIT),
    _tv("swin_t", VIT),
    _tv("resnet50", RESIDUAL),
    _tv("squeezenet1_1", RESIDUAL),
    _tv("deeplabv3_mobilenet_v3_large", SEGMENTATION, module="segmentation", inputs=SEG, outputs="out",
        options={"aux_loss": False, "weights_backbone": None}),
    _tv("lraspp_mobilenet_v3_large", SEGMENTATION, module="segmentation", inputs=SEG, outputs="out",
        options={"weights_backbone": None}),
    _tv("ssdlite320_mobilenet_v3_large", DETECTOR, module="detection", outputs="ssd",
        inputs=(("input", (1, 3, 320, 320), "float32"),), options={"weights_backbone": None}),
    _tv("r3d_18", VIDEO, module="video", inputs=(("input", (1, 3, 16, 112, 112), "float32"),)),
    _hf("bert-base", ENCODER, "BertModel", "BertConfig"),
    _hf("gpt2", DECODER, "GPT2Model", "GPT2Config"),
)

BY_NAME = {m.name: m for m in ZOO}


def zoo_model(name: str) -> ZooModel:
    """The zoo's entry called ``name``; an unknown name is a NetworkError that lists the zoo."""
    from ..networks.network import NetworkError
    if name not in BY_NAME:
        raise NetworkError(f"no model {name!r} in the zoo (choose from {', '.join(BY_NAME)})")
    return BY_NAME[name]


def build_module(model: ZooModel) -> Any:
    """The model as its library defines it, seeded random weights, eval mode (a ``torch.nn.Module``)."""
    import torch
    torch.manual_seed(0)
    if model.library == TRANSFORMERS:
        import transformers
        config = getattr(transformers, model.config)(**dict(model.options))
        config.use_cache = False
        config.return_dict = False
        config._attn_implementation = "eager"  # the plain matmul/softmax graph, traceable by every version
        return _adapters()["tensors"](getattr(transformers, model.constructor)(config)).eval()
    import torchvision.models as tvm_models
    namespace = getattr(tvm_models, model.module) if model.module else tvm_models
    net = getattr(namespace, model.constructor)(weights=None, **dict(model.options)).eval()
    _variance_preserving(net, model.gain)
    return _adapters()[model.outputs](net).eval() if model.outputs != "plain" else net


def _variance_preserving(net: Any, gain: str) -> None:
    """He-normal weights (fan in, ``gain``) and zero biases for every convolution and linear layer: the
    activations keep their scale through the depth, so the output depends on the input (module docstring)."""
    import torch
    for layer in net.modules():
        if isinstance(layer, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(layer.weight, nonlinearity=gain)
            if layer.bias is not None:
                torch.nn.init.zeros_(layer.bias)


def input_dependence(first: list[Any], second: list[Any]) -> float:
    """How far the outputs for two inputs lie apart: the largest change of any output over its largest
    magnitude (numpy arrays); 0 when an output is constant or all zeros, nan when one is not finite."""
    import numpy as np
    moved = []
    for a, b in zip(first, second):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return float("nan")
        scale = np.abs(a).max(initial=0.0)
        moved.append(np.abs(a - b).max(initial=0.0) / scale if scale > 0 else 0.0)
    return min(moved, default=0.0)


def _check_input_dependence(model: ZooModel, module: Any) -> None:
    """Refuse a model whose output does not move with its input, or moves wildly with a rounding-sized
    change of it: checking it against ONNX Runtime would prove nothing, or fail whatever the compiler did."""
    import torch
    from ..networks.network import NetworkError
    first, second = example_inputs(model, 0), example_inputs(model, 1)
    nudged = tuple(x * (1 + NUDGE) if x.is_floating_point() else x for x in first)
    with torch.no_grad():
        outputs = [module(*inputs) for inputs in (first, second, nudged)]
    a, b, n = [[t.numpy() for t in (out if isinstance(out, tuple) else (out,))] for out in outputs]
    moved = input_dependence(a, b)
    if not moved >= INPUT_DEPENDENCE:
        raise NetworkError(f"{model.source} with random weights gives outputs that do not depend on its input "
                           f"(two inputs move them by {moved:.1e} of their scale, at least {INPUT_DEPENDENCE:g} "
                           f"needed): its check against ONNX Runtime would prove nothing")
    chaos = max(input_dependence([x], [y]) for x, y in zip(a, n))
    if not chaos <= CHAOS:
        raise NetworkError(f"{model.source} with random weights is chaotic: scaling its input by 1 + {NUDGE:g} "
                           f"moves its outputs by {chaos:.1e} of their scale (at most {CHAOS:g} allowed), more "
                           f"than any two compilers' rounding may differ")


def example_inputs(model: ZooModel, seed: int = 0) -> tuple[Any, ...]:
    """Seeded example inputs: for the export, and a second seed to check the output depends on them."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _, shape, dtype in model.inputs:
        if dtype.startswith("int"):
            out.append(torch.randint(0, 100, shape, generator=generator, dtype=getattr(torch, dtype)))
        else:
            out.append(torch.rand(shape, generator=generator, dtype=getattr(torch, dtype)) * 2 - 1)
    return tuple(out)


def export(model: ZooModel, work: Path) -> Path:
    """Write ``work/<name>.onnx`` unless it exists, and return its path. The file appears whole or not at
    all (written beside it, then renamed), so a run killed mid-export leaves nothing a rerun would trust."""
    from ..errors import short_message
    from ..networks.network import NetworkError
    path = Path(work) / f"{model.name}.onnx"
    if path.exists():
        return path
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    logger.info("exporting %s from %s to %s", model.name, model.source, path)
    try:
        import torch
        module = build_module(model)
        _check_input_dependence(model, module)
        # nn.MultiheadAttention's fast path (eval, no grad: vit_b_16) is one fused operator the exporter does
        # not know; off, it traces as the matmuls and softmax it stands for.
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.no_grad():
                torch.onnx.export(module, example_inputs(model), str(partial), opset_version=OPSET, dynamo=False,
                                  input_names=[n for n, _, _ in model.inputs], do_constant_folding=True)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        os.replace(partial, path)
    except NetworkError:
        raise
    except ImportError as err:
        raise NetworkError(f"exporting {model.source} needs {err.name or 'torch'}: pip install -e '.[zoo]'") from None
    except Exception as err:  # the exporter's own errors: an operator it does not know, a trace that fails
        raise NetworkError(f"exporting {model.source} failed: {short_message(err, None, pick='last')}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


@functools.cache
def _adapters() -> dict[str, type]:
    """The output adapters, ``torch.nn.Module`` classes defined on first use (defining them needs torch)."""
    import torch

    class DictEntry(torch.nn.Module):
        """A segmentation model's ``"out"`` entry: the exporter takes tensors, not a dict."""

        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: Any) -> Any:
            return self.net(x)["out"]

    class SSDHead(torch.nn.Module):
        """SSDlite's backbone and head, without the transform and the box decoding and NMS after them."""

        def __init__(self, net: Any) -> None:
            super().__init__()
            self.backbone, self.head = net.backbone, net.head

        def forward(self, x: Any) -> Any:
            out = self.head(list(self.backbone(x).values()))
            return out["bbox_regression"], out["cls_logits"]

    class Tensors(torch.nn.Module):
        """A transformers model returning a tuple of tensors (``return_dict=False``), exported as such."""

        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids: Any) -> Any:
            # An all-ones mask (no padding): without one, transformers 5 checks position ids for packed
            # sequences with torch.diff, which the exporter does not know.
            return tuple(self.net(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)))

    return {"out": DictEntry, "ssd": SSDHead, "tensors": Tensors}
