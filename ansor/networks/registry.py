"""Network registry: ``get_network("resnet-50", batch_size=1)`` -> :class:`Network`.

Each entry builds its nn model, exports it to Relax with static input shapes, and hands back the weights
as a lazily made, seeded dict. The names are Ansor's evaluation networks plus ``tiny-cnn`` for tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from tvm.relax.frontend import nn

from .models import Bert, DCGANGenerator, MobileNetV2, ResNet, TinyCNN, random_params
from .network import Network, NetworkError, TensorSpec

logger = logging.getLogger("ansor")

#: Every network's weights come from this seed (plus nothing else), so runs are reproducible.
WEIGHT_SEED = 0
BERT_SEQ_LEN = 128


@dataclass(frozen=True)
class _Entry:
    """How to build one registered network."""

    make_model: Callable[[], nn.Module]
    input_shape: Callable[[int], tuple[int, ...]]
    input_name: str
    input_dtype: str
    layout: str
    description: str


_NETWORKS: dict[str, _Entry] = {
    "resnet-50": _Entry(lambda: ResNet((3, 4, 6, 3), bottleneck=True), lambda b: (b, 224, 224, 3), "data",
                        "float32", "NHWC", "ResNet-50 v1.5, 224x224 images"),
    "mobilenet-v2": _Entry(MobileNetV2, lambda b: (b, 224, 224, 3), "data", "float32", "NHWC",
                           "MobileNet-V2 1.0, 224x224 images"),
    "resnet3d-18": _Entry(lambda: ResNet((2, 2, 2, 2), bottleneck=False, dims=3), lambda b: (b, 16, 112, 112, 3),
                          "data", "float32", "NDHWC", "3-D ResNet-18, 16 frames of 112x112"),
    "bert": _Entry(lambda: Bert(seq=BERT_SEQ_LEN), lambda b: (b, BERT_SEQ_LEN), "input_ids", "int64", "",
                   f"BERT-base encoder, sequence length {BERT_SEQ_LEN}"),
    "dcgan": _Entry(DCGANGenerator, lambda b: (b, 100), "noise", "float32", "NCHW",
                    "DCGAN generator, 100-d noise to 3x64x64 images"),
    "tiny-cnn": _Entry(TinyCNN, lambda b: (b, 32, 32, 3), "data", "float32", "NHWC",
                       "conv+relu, max pool, conv+relu, average pool, dense on 32x32 images"),
}


def network_names() -> list[str]:
    """Names :func:`get_network` accepts."""
    return list(_NETWORKS)


def describe_network(name: str) -> str:
    """One line about a registered network."""
    return _entry(name).description


def _entry(name: str) -> _Entry:
    entry = _NETWORKS.get(name)
    if entry is None:
        raise NetworkError(f"unknown network {name!r}; valid names: {', '.join(_NETWORKS)}")
    return entry


def get_network(name: str, batch_size: int = 1) -> Network:
    """Build a registered network's Relax module for ``batch_size``.

    Raises
    ------
    NetworkError
        For an unknown name (the message lists the valid ones) or a batch size below 1.
    """
    entry = _entry(name)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise NetworkError(f"batch size must be a positive integer, got {batch_size!r}")
    model = entry.make_model()
    shape = entry.input_shape(batch_size)
    spec = {"forward": {entry.input_name: nn.spec.Tensor(shape, entry.input_dtype)}}
    mod, named = model.export_tvm(spec=spec)
    weights = tuple(TensorSpec(n, tuple(int(d) for d in p.shape), p.dtype) for n, p in named)
    logger.debug("network %s (batch %d): %d weights", name, batch_size, len(weights))
    return Network(name=name, mod=mod, inputs=(TensorSpec(entry.input_name, shape, entry.input_dtype),),
                   weights=weights, batch_size=batch_size, layout=entry.layout, entry="forward",
                   param_factory=lambda: random_params(model, WEIGHT_SEED))
