"""A ``take`` of one constant index through reshapes and transposes becomes a slice of their source.

PyTorch's multi-head attention projects queries, keys and values in one matmul and splits them with
``unflatten -> unsqueeze -> transpose -> squeeze`` and three ``Gather``s of index 0, 1 and 2. Compiled as
written, that is a transposed copy of the whole projection and three copies out of it: ViT-B/16 spent 2.0
of its 48 ms in them (x12 layers; Xeon with AMX, bf16). Each gathered tensor is one box of the projection,
``qkv[:, :, i * 768:(i + 1) * 768]``: as a ``strided_slice`` it fuses into the operator that reads it, and
the copies go.

Which box, if any, is found with numpy: the source's element numbers are sent through the chain of layout
operators and the take, and the result must be a slice along one axis of the source, in its order.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tvm
from tvm import relax

from .calls import mutate_relax_functions, op_name
from .conv_rewrite import bound_constant
from .transpose_sinking import permute_axes, static_shape

#: Operators that only move elements, and how each moves an array of element numbers.
_LAYOUT = {
    "relax.reshape": lambda a, call: a.reshape(_shape(call)),
    "relax.expand_dims": lambda a, call: a.reshape(_shape(call)),
    "relax.squeeze": lambda a, call: a.reshape(_shape(call)),
    "relax.permute_dims": lambda a, call: np.transpose(a, permute_axes(call)),
}
#: Sources larger than this keep their takes: the element numbers are an int64 array of the source's size.
MAX_ELEMENTS = 1 << 24


def slice_takes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each such ``take`` a ``strided_slice`` (and a reshape) of the layout chain's source; the
    chain's copies, read by nothing else, are removed."""
    mod = mutate_relax_functions(_TakeSlicer(mod))
    return relax.transform.DeadCodeElimination()(mod)


def _shape(call: relax.Call) -> tuple[int, ...]:
    return tuple(int(d) for d in call.ty.shape.values)


def find_slice(numbers: np.ndarray, shape: tuple[int, ...]) -> Optional[tuple[int, int, int]]:
    """``(axis, begin, end)`` if ``numbers`` (element numbers of an array of ``shape``, row-major) are the
    slice ``[begin, end)`` along ``axis``, in that slice's own order; else None."""
    coords = np.unravel_index(numbers.ravel(), shape)
    for axis, along in enumerate(coords):
        begin, end = int(along.min()), int(along.max()) + 1
        if (end - begin) * math.prod(shape) // shape[axis] != numbers.size:
            continue
        box = np.take(np.arange(math.prod(shape)).reshape(shape), range(begin, end), axis=axis)
        if np.array_equal(box.ravel(), numbers.ravel()):
            return axis, begin, end
    return None


@relax.expr_functor.mutator
class _TakeSlicer(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.take" or not static_shape(call):
            return call
        index = bound_constant(self, call.args[1])
        if index is None or index.size != 1 or call.attrs.axis is None:
            return call
        chain, source = [], call.args[0]
        while isinstance(source, relax.Var):
            bound = self.lookup_binding(source)
            if op_name(bound) not in _LAYOUT or not static_shape(bound):
                break
            chain.append(bound)
            source = bound.args[0]
        if not chain or not static_shape(source):
            return call
        shape = tuple(int(d) for d in source.ty.shape.values)
        if math.prod(shape) > MAX_ELEMENTS:
            return call
        numbers = np.arange(math.prod(shape)).reshape(shape)
        for op in reversed(chain):
            numbers = _LAYOUT[op_name(op)](numbers, op)
        taken = np.take(numbers, int(index.ravel()[0]) % numbers.shape[int(call.attrs.axis)],
                        axis=int(call.attrs.axis))
        found = find_slice(taken, shape)
        if found is None:
            return call
        axis, begin, end = found
        sliced = self.builder_.emit(relax.op.strided_slice(source, [axis], [begin], [end]))
        return relax.op.reshape(sliced, _shape(call))
