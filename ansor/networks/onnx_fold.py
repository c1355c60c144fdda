"""Fold an ONNX model's shape computations into constants, for static input shapes.

Exporters (``torch.onnx.export`` of Hugging Face BERT, for one) compute shapes inside the graph:
``Shape -> Gather -> Unsqueeze -> Concat`` feeding ``Reshape``, ``Expand``, ``Slice`` and
``ConstantOfShape`` (``tensor.view(b, s, heads, d)``, ``position_ids[:, :seq]``, ``expand(b, s)``).
TVM's ONNX importer turns such values into run-time tensors and then fails on the ops that need them
as shapes (``broadcast_to expects ...``, ``Slice requires a statically known input rank``). With static
input shapes these values are constants: this module evaluates them with numpy, as onnxruntime's
basic-level graph optimisation does, and leaves every other node alone.

A node is folded when every input is a constant (an initializer, a ``Constant`` or a folded value) —
``Shape`` and ``Size`` need only their input's static shape, from ONNX shape inference — and its output
has at most ``max_elements`` elements; it is replaced by ``Constant`` nodes. The ops of :data:`FOLDERS`
are evaluated here, any other op of the standard domain by ``onnx.reference`` (torchvision's ViT and Swin
compute shapes with ``Mod``, Swin its attention mask with ``ScatterND``). Folding repeats until nothing
changes (a folded shape lets shape inference find more static shapes). Nodes producing graph outputs and
nodes with subgraphs stay. The model keeps computing the same function for these input shapes.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..errors import short_message

logger = logging.getLogger("ansor")

#: Largest folded value (elements): shape values are tiny; this also caps e.g. a folded zero tensor.
MAX_FOLD_ELEMENTS = 1 << 20


@dataclass
class FoldReport:
    """What :func:`fold_shape_subgraphs` did: folded op types and their counts, passes, input shapes."""

    folded: Counter = field(default_factory=Counter)
    passes: int = 0
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.folded.values())

    def __str__(self) -> str:
        if not self.total:
            return "nothing to fold"
        ops = ", ".join(f"{op} x{n}" for op, n in self.folded.most_common())
        shapes = ", ".join(f"{k}{list(v)}" for k, v in self.input_shapes.items())
        return f"folded {self.total} shape-computing nodes into constants ({ops}) for inputs {shapes}"


# ------------------------------------------------------------------------------------------ evaluation
Evaluator = Callable[[list, dict], list]


def _int_list(a: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _unsqueeze(x: list, attrs: dict) -> list:
    axes = _int_list(x[1]) if len(x) > 1 and x[1] is not None else list(attrs["axes"])
    rank = x[0].ndim + len(axes)
    out = x[0]
    for axis in sorted(a % rank for a in axes):
        out = np.expand_dims(out, axis)
    return [out]


def _squeeze(x: list, attrs: dict) -> list:
    axes = _int_list(x[1]) if len(x) > 1 and x[1] is not None else attrs.get("axes")
    return [np.squeeze(x[0], axis=None if axes is None else tuple(a % x[0].ndim for a in axes))]


def _slice(x: list, attrs: dict) -> list:
    data = x[0]
    if len(x) > 1:  # opset >= 10: starts, ends, axes, steps are inputs
        starts, ends = _int_list(x[1]), _int_list(x[2])
        axes = _int_list(x[3]) if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = _int_list(x[4]) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    else:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % data.ndim] = slice(s, e, st)
    return [data[tuple(index)]]


def _div(x: list, _attrs: dict) -> list:
    a, b = x
    if np.issubdtype(a.dtype, np.integer):  # ONNX integer division truncates towards zero
        q = np.abs(a) // np.abs(b)
        return [np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)]
    return [(a / b).astype(a.dtype)]


def _constant(_x: list, attrs: dict) -> list:
    from onnx import numpy_helper
    if "value" in attrs:
        return [numpy_helper.to_array(attrs["value"])]
    for key, dtype in (("value_int", np.int64), ("value_ints", np.int64), ("value_float", np.float32),
                       ("value_floats", np.float32)):
        if key in attrs:
            return [np.array(attrs[key], dtype=dtype)]
    raise _CannotFold("Constant without a dense value")


def _constant_of_shape(x: list, attrs: dict) -> list:
    from onnx import numpy_helper
    value = numpy_helper.to_array(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
    return [np.full(tuple(_int_list(x[0])), value[0], dtype=value.dtype)]


def _reshape(x: list, attrs: dict) -> list:
    shape = _int_list(x[1])
    if not attrs.get("allowzero", 0):  # 0 copies the input's dimension
        shape = [x[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x[0].reshape(shape)]


def _expand(x: list, _attrs: dict) -> list:
    shape = np.broadcast_shapes(x[0].shape, tuple(_int_list(x[1])))
    return [np.array(np.broadcast_to(x[0], shape))]


def _cast(x: list, attrs: dict) -> list:
    from onnx import helper
    return [x[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))]


def _same_dtype(fn: Callable) -> Evaluator:
    return lambda x, _a: [np.asarray(fn(*x)).astype(x[0].dtype)]


def _boolean(fn: Callable) -> Evaluator:
    return lambda x, _a: [np.asarray(fn(*x), dtype=bool)]


#: Op type -> numpy evaluation (inputs, attributes) -> outputs.
FOLDERS: dict[str, Evaluator] = {
    "Identity": lambda x, _a: [x[0]],
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Gather": lambda x, a: [np.take(x[0], x[1], axis=a.get("axis", 0))],
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda x, a: [np.concatenate([np.atleast_1d(v) for v in x], axis=a["axis"])],
    "Slice": _slice,
    "Cast": _cast,
    "Reshape": _reshape,
    "Expand": _expand,
    "Range": lambda x, _a: [np.arange(x[0], x[1], x[2], dtype=x[0].dtype)],
    "Transpose": lambda x, a: [np.transpose(x[0], a.get("perm"))],
    "Tile": lambda x, _a: [np.tile(x[0], _int_list(x[1]))],
    "Add": _same_dtype(np.add),
    "Sub": _same_dtype(np.subtract),
    "Mul": _same_dtype(np.multiply),
    "Div": _div,
    "Neg": _same_dtype(np.negative),
    "Abs": _same_dtype(np.abs),
    "Floor": _same_dtype(np.floor),
    "Ceil": _same_dtype(np.ceil),
    "Sqrt": _same_dtype(np.sqrt),
    "Pow": _same_dtype(np.power),
    "Max": lambda x, _a: [np.maximum.reduce(np.broadcast_arrays(*x)).astype(x[0].dtype)],
    "Min": lambda x, _a: [np.minimum.reduce(np.broadcast_arrays(*x)).astype(x[0].dtype)],
    "Equal": _boolean(np.equal),
    "Less": _boolean(np.less),
    "Greater": _boolean(np.greater),
    "LessOrEqual": _boolean(np.less_equal),
    "GreaterOrEqual": _boolean(np.greater_equal),
    "Not": _boolean(np.logical_not),
    "And": _boolean(np.logical_and),
    "Or": _boolean(np.logical_or),
    "Where": lambda x, _a: [np.where(x[0], x[1], x[2]).astype(np.result_type(x[1], x[2]))],
}
_SHAPE_OPS = ("Shape", "Size")

#: Standard ops never folded by the general evaluator: their outputs are not functions of their inputs.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                         "Multinomial", "Bernoulli"})


def _reference_evaluator(node: Any, opset: int) -> Optional[Evaluator]:
    """Any other standard op, evaluated by ``onnx.reference`` (numpy) at the model's opset; else ``None``.

    Exporters compute shapes with ops the table above does not list (``Mod`` in torchvision's ViT and
    Swin, ``ScatterND`` building Swin's shifted-window mask, ...): every op of the standard domain is
    evaluated once all its inputs are constants.
    """
    if node.op_type in _NOT_FOLDED or not node.input or not all(node.output):
        return None
    from onnx.reference import ReferenceEvaluator
    try:
        evaluator = ReferenceEvaluator(node, opsets={"": opset})
    except Exception:  # an op onnx.reference does not implement at this opset
        return None
    names = list(node.input)

    def run(x: list, _attrs: dict) -> list:
        try:
            return evaluator.run(None, {n: v for n, v in zip(names, x) if n and v is not None})
        except Exception as err:  # the op refuses these values: the node stays for TVM to judge
            raise _CannotFold(short_message(err, 200)) from None
    return run


class _CannotFold(Exception):
    """This node stays (unsupported attribute form, evaluation error)."""


# ------------------------------------------------------------------------------------------- folding
def fold_shape_subgraphs(model: Any, input_shapes: Mapping[str, Sequence[int]],
                         max_elements: int = MAX_FOLD_ELEMENTS) -> tuple[Any, FoldReport]:
    """A copy of the ONNX ``model`` with its shape computations folded for ``input_shapes``.

    ``input_shapes`` (input name -> static shape) are also written into the copy's input types.
    Returns the copy and a :class:`FoldReport`.
    """
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = FoldReport(input_shapes={k: tuple(int(d) for d in v) for k, v in input_shapes.items()})
    _set_input_shapes(out.graph, report.input_shapes)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), None)
    while True:
        shapes = _static_shapes(out, report.input_shapes)
        folded = _fold_pass(out.graph, shapes, max_elements, report.folded, opset)
        report.passes += 1
        if not folded:
            break
    return out, report


def _set_input_shapes(graph: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    for value in graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[value.name]:
                dims.add().dim_value = d


def _static_shapes(model: Any, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Static shapes of the graph's values that ONNX shape inference can tell."""
    import onnx
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as err:  # inference refuses some models (custom domains); fold what constants give
        logger.info("ONNX shape inference failed (%s); folding constants only", short_message(err, 200))
        inferred = model
    shapes: dict[str, tuple[int, ...]] = dict(input_shapes)
    graph = inferred.graph
    for value in [*graph.value_info, *graph.input, *graph.output]:
        t = value.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes.setdefault(value.name, tuple(int(d.dim_value) for d in t.shape.dim))
    for init in graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _fold_pass(graph: Any, shapes: Mapping[str, tuple[int, ...]], max_elements: int, counts: Counter,
               opset: Optional[int] = None) -> int:
    """Fold what can be folded now; rewrites ``graph`` in place and returns the number of folded nodes.

    A folded node becomes ``Constant`` nodes, not initializers: TVM's importer turns initializers into
    function parameters (``keep_params_in_input``), and a shape that is a parameter is a run-time shape
    again. ``Constant`` nodes and initializers nothing reads any more are removed.
    """
    from onnx import helper, numpy_helper

    init_protos = {init.name: init for init in graph.initializer}
    constants: dict[str, np.ndarray] = {}
    keep_outputs = {o.name for o in graph.output}

    def value(name: str) -> Optional[np.ndarray]:
        if name in constants:
            return constants[name]
        if name in init_protos:
            proto = init_protos[name]
            if int(np.prod(proto.dims, dtype=np.int64)) > max_elements:
                return None
            constants[name] = numpy_helper.to_array(proto)
            return constants[name]
        return None

    nodes, folded = [], 0
    for node in graph.node:
        if any(o in keep_outputs for o in node.output) or _has_subgraph(node):
            nodes.append(node)
            continue
        try:
            outputs = _evaluate(node, value, shapes, opset)
        except _CannotFold:
            outputs = None
        if outputs is None or any(o.size > max_elements for o in outputs):
            nodes.append(node)
            continue
        for name, array in zip(node.output, outputs):
            constants[name] = array
        if node.op_type == "Constant":
            nodes.append(node)
            continue
        counts[node.op_type] += 1
        folded += 1
        nodes.extend(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))
                     for name, array in zip(node.output, outputs))
    nodes = _without_dead_constants(nodes, keep_outputs)
    used = _used_names(nodes) | keep_outputs
    dropped = {init.name for init in graph.initializer} - used
    if not folded and not dropped and len(nodes) == len(graph.node):
        return 0
    kept_inits = [init for init in graph.initializer if init.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    kept_info = [v for v in graph.value_info if v.name not in constants]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    kept_inputs = [v for v in graph.input if v.name not in dropped]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    return folded


def _without_dead_constants(nodes: list, keep_outputs: set[str]) -> list:
    """``nodes`` without the ``Constant`` nodes whose output nothing reads."""
    while True:
        used = _used_names(nodes) | keep_outputs
        alive = [n for n in nodes if n.op_type != "Constant" or any(o in used for o in n.output)]
        if len(alive) == len(nodes):
            return nodes
        nodes = alive


def _evaluate(node: Any, value: Callable[[str], Optional[np.ndarray]], shapes: Mapping[str, tuple[int, ...]],
              opset: Optional[int] = None) -> Optional[list[np.ndarray]]:
    """The node's outputs if it can be folded now, else ``None``.

    ``opset`` is the model's standard-domain opset; without it only the ops of :data:`FOLDERS` fold.
    """
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in _SHAPE_OPS:
        shape = shapes.get(node.input[0])
        if shape is None:
            known = value(node.input[0])
            shape = known.shape if known is not None else None
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        start, end = attrs.get("start", 0), attrs.get("end")
        return [np.array(shape[start:end], dtype=np.int64)]
    fn = FOLDERS.get(node.op_type)
    if fn is None and opset is None:
        return None
    inputs = []
    for name in node.input:
        if not name:  # an omitted optional input
            inputs.append(None)
            continue
        v = value(name)
        if v is None:
            return None
        inputs.append(v)
    while inputs and inputs[-1] is None:
        inputs.pop()
    if fn is None:  # every input is constant now: worth building the general evaluator
        fn = _reference_evaluator(node, opset)
        if fn is None:
            return None
    try:
        return [np.asarray(o) for o in fn(inputs, attrs)]
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise _CannotFold(str(err)) from None


def _has_subgraph(node: Any) -> bool:
    from onnx import AttributeProto
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _used_names(nodes: Sequence[Any]) -> set[str]:
    """Every value name the nodes read, including names read inside their subgraphs."""
    from onnx import AttributeProto
    used: set[str] = set()
    for node in nodes:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for g in graphs:
                used |= _used_names(list(g.node))
    return used
