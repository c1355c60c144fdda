"""Load an ONNX model as a :class:`Network` through ``tvm.relax.frontend.onnx``.

The ``onnx`` package is an optional extra (``pip install ansor[onnx]``); it is imported only here and
only when a model is loaded. Weights stay out of the Relax module (``keep_params_in_input``), as for the
built-in networks, so the module stays small and its PrimFuncs do not depend on weight values. Before
conversion, the shape computations exporters put in the graph are folded into constants for the static
input shapes (:mod:`.onnx_fold`), which TVM's importer needs. Ops whose output shapes depend on the input's
values (a detector's non-maximum suppression) are refused in one line naming them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from ..errors import short_message
from .calls import mutate_relax_functions
from .network import Network, NetworkError, TensorSpec

logger = logging.getLogger("ansor")

#: Ops whose output shape depends on the values of their inputs, not only on the input shapes: a
#: detector's post-processing (score thresholds, non-maximum suppression). Tuned kernels need static shapes.
VALUE_SHAPED_OPS = ("NonMaxSuppression", "NonZero", "Unique", "Compress")


def _import_onnx():
    try:
        import onnx
    except ImportError:
        raise NetworkError("loading ONNX models needs the onnx package: pip install 'ansor[onnx]'") from None
    return onnx


def _input_specs(onnx, model, path: Path, shapes: Mapping[str, Sequence[int]]) -> list[TensorSpec]:
    """The graph inputs that are not initializers, with static shapes (symbolic dims: override or 1)."""
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise NetworkError(f"{path}: input {value.name!r} is a {(kind or 'untyped').replace('_type', '')}, "
                               "not a tensor; only models whose inputs are all tensors can be tuned")
        tensor_type = value.type.tensor_type
        try:
            dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
        except (KeyError, TypeError):
            raise NetworkError(f"{path}: input {value.name!r} has no usable element type "
                               f"(ONNX type {tensor_type.elem_type})") from None
        if value.name in shapes:
            shape = tuple(int(d) for d in shapes[value.name])
        else:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
            if any(d is None for d in dims):
                logger.info("%s: input %s has symbolic dimensions %s; using 1 (pass shapes= to choose)",
                            path, value.name, dims)
            shape = tuple(1 if d is None else int(d) for d in dims)
        specs.append(TensorSpec(value.name, shape, dtype))
    unknown = set(shapes) - {s.name for s in specs}
    if unknown:
        raise NetworkError(f"{path}: no input named {', '.join(sorted(unknown))}; "
                           f"inputs: {', '.join(s.name for s in specs)}")
    return specs


def _refuse_value_shaped(graph, path: Path) -> None:
    """Raise :class:`NetworkError` naming the ops left (after folding) whose output shapes depend on values."""
    from onnx import AttributeProto

    found: dict[str, list[str]] = {}

    def scan(g) -> None:
        for node in g.node:
            if node.op_type in VALUE_SHAPED_OPS and node.domain in ("", "ai.onnx"):
                found.setdefault(node.op_type, []).append(node.name or node.output[0])
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
                    scan(sub)

    scan(graph)
    if found:
        ops = ", ".join(f"{op} x{len(found[op])} (first: {found[op][0]})" for op in VALUE_SHAPED_OPS if op in found)
        raise NetworkError(f"{path}: cannot import {ops}: output shapes that depend on the input's values "
                           "(a detector's thresholds and non-maximum suppression) cannot be compiled with "
                           "static shapes; export the model without that post-processing (backbone and head)")


def unstack_reductions(mod):
    """``mod`` with ``max``/``min``/``sum`` over a ``stack`` on a new first axis as binary element-wise ops.

    TVM's importer writes ONNX's variadic ``Max``/``Min``/``Sum`` (``torch.clamp`` with tensor bounds, e.g.
    clipping a detector's boxes) as ``broadcast_to`` each input, ``stack`` them, reduce the new axis.
    ``ConvertLayout`` fails on that ``stack`` (TVM 0.27: "Invalid SLayout: can't find S in source layout",
    "Index -1 out of bounds"), and the stacked copy is work the element-wise form does not need.
    """
    import tvm
    from tvm import relax

    binary = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum, "relax.sum": relax.op.add}
    stack = tvm.ir.Op.get("relax.stack")

    @relax.expr_functor.mutator
    class Unstack(relax.PyExprMutator):
        def bound(self, expr):
            value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
            return expr if value is None else value

        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = getattr(call.op, "name", None)
            if op not in binary or call.attrs.keepdims or call.attrs.axis is None:
                return call
            if [int(a) for a in call.attrs.axis] != [0]:
                return call
            stacked = self.bound(call.args[0])
            if not (isinstance(stacked, relax.Call) and stacked.op.same_as(stack) and int(stacked.attrs.axis) == 0):
                return call
            parts = self.bound(stacked.args[0])
            if not isinstance(parts, relax.Tuple) or not parts.fields:
                return call
            out = parts.fields[0]
            for part in parts.fields[1:]:
                out = self.builder_.emit(binary[op](out, part))
            return out

    return relax.transform.DeadCodeElimination()(mutate_relax_functions(Unstack(mod)))


def load_onnx(path: Union[str, os.PathLike], shapes: Optional[Mapping[str, Sequence[int]]] = None,
              name: Optional[str] = None) -> Network:
    """Load the ONNX model at ``path`` as a network.

    Parameters
    ----------
    path
        An ``.onnx`` file.
    shapes
        Input name -> static shape, overriding the file's (needed for a symbolic batch size other than 1).
    name
        The network's name; default: the file name without its suffix.

    Raises
    ------
    NetworkError
        One line naming the file: missing, unreadable, not a valid ONNX model, or not convertible.
    """
    path = Path(path)
    onnx = _import_onnx()
    if not path.is_file():
        raise NetworkError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # protobuf DecodeError, ValidationError, OSError ...
        raise NetworkError(f"{path}: not a valid ONNX model ({short_message(err, None, pick='last')})") from None
    inputs = _input_specs(onnx, model, path, dict(shapes or {}))
    # Exporters compute shapes in the graph; TVM's importer needs them constant (see onnx_fold).
    from .onnx_fold import fold_shape_subgraphs
    model, folding = fold_shape_subgraphs(model, {s.name: s.shape for s in inputs})
    if folding.total:
        logger.info("%s: %s", path, folding)
    _refuse_value_shaped(model.graph, path)
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # TVM prints the failing node with all its inputs' IR
            mod = from_onnx(model, shape_dict={s.name: list(s.shape) for s in inputs},
                            dtype_dict={s.name: s.dtype for s in inputs}, keep_params_in_input=True)
        mod, detached = relax.frontend.detach_params(mod)
        mod = unstack_reductions(mod)
    except Exception as err:  # unsupported operators and the like
        logger.debug("%s", printed.getvalue())
        folded = f"; {folding}" if folding.total else ""
        reason = short_message(err, None, pick="last")
        failed = re.search(r"Error converting operator (\w+)", printed.getvalue())
        if failed and failed.group(1) not in reason:
            reason = f"{failed.group(1)}: {reason}"
        raise NetworkError(f"{path}: cannot convert the ONNX model to Relax ({reason}){folded}") from None
    sys.stdout.write(printed.getvalue())
    func = mod["main"]
    weight_vars = list(func.params)[len(inputs):]
    values = [t.numpy() for t in detached.get("main", [])]
    if len(values) != len(weight_vars):
        raise NetworkError(f"{path}: the converted model has {len(weight_vars)} weight arguments "
                           f"but {len(values)} weight values")
    weights = tuple(TensorSpec(v.name, tuple(a.shape), str(a.dtype)) for v, a in zip(weight_vars, values))
    params = {w.name: a for w, a in zip(weights, values)}
    batch = inputs[0].shape[0] if inputs and inputs[0].shape else 1
    logger.info("%s: %d inputs, %d weights", path, len(inputs), len(weights))
    return Network(name=name or path.stem, mod=mod, inputs=tuple(inputs), weights=weights, batch_size=batch,
                   layout="", entry="main", param_factory=lambda: params)
