"""The walk the convolution rewrites of :mod:`.prepare` share: every ``conv2d`` call whose weight is a
constant, offered to a subclass's :meth:`ConvRewrite.rewrite` (Winograd, skipped padding taps, padded output
channels)."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import numpy as np
import tvm
from tvm import relax

from .calls import mutate_relax_functions

logger = logging.getLogger("ansor")


def bound_constant(mutator: relax.PyExprMutator, expr: relax.Expr) -> Optional[np.ndarray]:
    """The value of ``expr`` if it is a tensor constant, or a variable ``mutator`` saw bound to one earlier
    in the dataflow block (maybe a constant folded there); None otherwise."""
    if isinstance(expr, relax.Var):
        expr = mutator.lookup_binding(expr)
    value = getattr(expr, "value", None)  # scalar constants (PrimValue) hold a Python number: not a tensor
    return value.numpy() if isinstance(value, tvm.runtime.Tensor) else None


def _static_layout(call: relax.Call, data: str = "NHWC", kernel: str = "HWIO") -> bool:
    a = call.attrs
    return (str(a.data_layout) == data and str(a.kernel_layout) == kernel and str(a.out_layout) in (data, "")
            and all(isinstance(d, tvm.tirx.IntImm) for d in call.args[0].ty.shape))


def ungrouped_nhwc(call: relax.Call) -> bool:
    """An NHWC/HWIO convolution with no groups and a static input shape."""
    return _static_layout(call) and int(call.attrs.groups) == 1


def ungrouped_ndhwc(call: relax.Call) -> bool:
    """A 3-D NDHWC/DHWIO convolution with no groups and a static input shape."""
    return _static_layout(call, "NDHWC", "DHWIO") and int(call.attrs.groups) == 1


def grouped_nhwc(call: relax.Call) -> bool:
    """An NHWC/HWIO convolution of several groups (depthwise: one channel each) and a static input shape."""
    return _static_layout(call) and int(call.attrs.groups) > 1


def plain_nhwc(call: relax.Call) -> bool:
    """An :func:`ungrouped_nhwc` convolution with stride 1."""
    return ungrouped_nhwc(call) and [int(s) for s in call.attrs.strides] == [1, 1]


class ConvRewrite(relax.PyExprMutator):
    """Offers each ``conv2d`` call with a constant weight to :meth:`rewrite` and counts the rewritten ones.
    A subclass is decorated with ``relax.expr_functor.mutator`` and run by :func:`rewrite_convs`."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") != "relax.nn.conv2d":
            return call
        weight = bound_constant(self, call.args[1])
        new = None if weight is None else self.rewrite(call, weight)
        if new is None:
            return call
        self.count += 1
        return new

    def rewrite(self, call: relax.Call, weight: np.ndarray) -> Optional[relax.Expr]:
        """What replaces ``call`` (unbound: an alias binding in between would be opaque to FuseOps), or None."""
        raise NotImplementedError


def rewrite_convs(mod: tvm.IRModule, rewrite: Callable[[tvm.IRModule], ConvRewrite], done: str) -> tvm.IRModule:
    """``mod`` with every Relax function walked by ``rewrite`` (a decorated :class:`ConvRewrite`); ``done``
    says what it did, for the log line ("3x3 convolutions computed by Winograd F(2x2, 3x3)")."""
    mutator = rewrite(mod)
    mod = mutate_relax_functions(mutator)
    if mutator.count:
        logger.info("%d %s", mutator.count, done)
    return mod
