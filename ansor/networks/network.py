"""The :class:`Network` record every network source (built-in definitions, ONNX) produces.

A network is a Relax IRModule whose entry function takes the inputs first and the weights after them
(``num_input`` inputs, as ``tvm.relax.frontend.nn`` and ``from_onnx(keep_params_in_input=True)`` both
make it), plus the weights as numpy arrays. Keeping weights out of the module keeps the module small
(ResNet-50 has 25 M parameters) so it can be printed, hashed and passed around cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np
import tvm

from ..errors import AnsorError


class NetworkError(AnsorError):
    """An unknown network name, an unreadable model file, or a network that cannot be built."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one network input or weight."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Network:
    """A Relax model ready for task extraction and end-to-end runs.

    Attributes
    ----------
    name
        Registry name (``resnet-50``) or the ONNX file name.
    mod
        The Relax IRModule (before legalization); ``mod[entry]`` takes ``*inputs, *weights``.
    inputs
        The data inputs, in call order.
    weights
        The weight arguments, in call order (their values are :attr:`params`).
    batch_size
        The batch dimension of the inputs.
    layout
        Data layout of the convolutions (``NHWC``, ``NDHWC``, ``NCHW``; empty when there are none).
    entry
        Name of the Relax function to call.
    param_factory
        Makes the weight values on first use: random weights cost seconds for BERT, and task extraction
        never needs them.
    """

    name: str
    mod: tvm.IRModule
    inputs: tuple[TensorSpec, ...]
    weights: tuple[TensorSpec, ...]
    batch_size: int
    layout: str
    entry: str = "main"
    param_factory: Callable[[], dict[str, np.ndarray]] = field(default=dict, repr=False)

    @cached_property
    def params(self) -> dict[str, np.ndarray]:
        """Weight values by name (seeded, so every call of a process and every process agree)."""
        values = self.param_factory()
        missing = [w.name for w in self.weights if w.name not in values]
        if missing:
            raise NetworkError(f"network {self.name}: no value for weights {', '.join(missing[:5])}")
        return values

    def weight_arrays(self) -> list[np.ndarray]:
        """Weight values in call order."""
        return [self.params[w.name] for w in self.weights]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs: floats in [-1, 1), integers (token ids) in [0, 100)."""
        rng = np.random.default_rng(seed)
        out = []
        for spec in self.inputs:
            if spec.dtype.startswith(("float", "bfloat")):
                out.append(rng.uniform(-1.0, 1.0, size=spec.shape).astype(spec.dtype))
            else:
                out.append(rng.integers(0, 100, size=spec.shape).astype(spec.dtype))
        return out


