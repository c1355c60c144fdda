"""Activations stored as bf16 bits where only bf16 products read them.

A bf16 product rounds its activation to bf16 at the load (``A16``, :mod:`.bf16`): its producer writes fp32,
the product reads fp32 and writes and reads the bits again. Where every reader of an activation is such a
product, the rounding moves to the producer: the activation is stored as ``uint16`` bf16 bits (half the
bytes) and each product reads them as its ``A16``, or pads them, with nothing to convert. Rounding is a
function of the value, so every product reads the bits it read before and the outputs do not change.
ResNet's activations inside a bottleneck and a transformer's MLP hidden layer (GELU's output, between its
two dense layers) are such activations; a block's output, which a residual add also reads, stays fp32.

The rounding (:func:`~ansor.task.te_ops.to_bf16_bits`) is an element-wise operator after the activation, so
``FuseOps`` puts it into the PrimFunc that computes the activation, as the last step of its epilogue. It is
added only where a kernel computes the activation anyway, a product, an element-wise operator
(:data:`~.calls.ELEMENTWISE`: bias, ReLU, GELU, a residual add, a batch norm's scale and shift, a
squeeze-excitation's scaling) or one whose kernel takes an element-wise epilogue (:data:`EPILOGUE_FUSABLE`:
a pooling, a mean, a layer norm), whatever that kernel reads: elsewhere (a reshape, a function's input) it
would be a pass over the activation of its own. DenseNet's batch norm and ReLU before each convolution and
MobileNet's squeeze-excitation outputs are stored so, besides the products' own outputs.

With ``shared`` (:attr:`~ansor.task.precision.Precision.BF16_STORED`) an activation that a product reads
is stored as bits even where element-wise operators read it too: each of them decodes the bits at its load
(:func:`from_bf16_bits`, fused into it), so it reads the rounded value where it read the fp32 one. That is
how OpenVINO stores a bf16 network's activations, a residual stream included: a residual block's output is
written once, as bits, for the next block's products and its residual add.

Two operators make bf16 values of bf16 values, exactly, and so run on the bits between products
(:data:`ON_BITS`): a concatenation copies them, and a max pooling picks one of each window's (rounding is
monotone, so the max of the rounded values is the rounded max). GoogLeNet's and SqueezeNet's concatenated
branches, which convolutions and a max pooling read, and a stem's output, which a max pooling reads before
the first convolutions, are stored as bits so: the branches' products round their outputs, the
concatenation copies half the bytes, the pooling decodes its window's bits and stores its max as bits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import tvm
from tvm import relax, te

from ..state.tensor_intrin import bf16_to_f32
from ..task.te_ops import to_bf16_bits
from .calls import ELEMENTWISE, called_prim_func, mutate_relax_functions, op_name

#: TVM's op pattern kElemWise: the rounding fuses after any epilogue.
_ELEMWISE = {"op_pattern": 0}
_CONCAT, _MAX_POOL = "relax.concat", "relax.nn.max_pool2d"
#: Operators whose output holds bf16 values when their input does (the module notes): they run on the bits.
ON_BITS = frozenset({_CONCAT, _MAX_POOL})
#: Operators besides the element-wise ones whose kernel an element-wise epilogue fuses into (TVM's
#: kOutEWiseFusable and reductions): the rounding of their output costs no pass of its own.
EPILOGUE_FUSABLE = frozenset(f"relax.{name}" for name in (
    "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "mean", "nn.layer_norm"))


@dataclass(frozen=True)
class Product:
    """How one bf16 product PrimFunc was made (:mod:`.bf16`): ``compute(data, packed_weight, *params)``
    under ``name``, so that it can be made again for an activation of bf16 bits."""

    compute: Callable[..., te.Tensor]
    params: tuple
    name: str


def store_bits(mod: tvm.IRModule, products: Mapping[str, Product], attrs: Mapping[str, int],
               shared: bool = False) -> tuple[tvm.IRModule, int]:
    """``mod`` with each activation that only the calls of ``products`` (by PrimFunc name) read stored as
    bf16 bits (see the module notes; ``attrs``: the products' PrimFunc attributes), the PrimFuncs no call
    reads any more removed; and how many activations are stored. ``shared``: element-wise operators may read
    a stored activation too, decoded at their load."""
    mutator = _StoreBits(mod, products, attrs, shared)
    return relax.transform.DeadCodeElimination()(mutate_relax_functions(mutator)), len(mutator.stored)


def _vars_in(expr: relax.Expr) -> list[relax.Var]:
    """The variables ``expr`` reads, each as often as it reads it."""
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _vars_in(a)]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _vars_in(f)]
    if isinstance(expr, relax.TupleGetItem):
        return _vars_in(expr.tuple_value)
    return []


def _on_bits_inputs(value: relax.Expr) -> list[relax.Var] | None:
    """The tensors an :data:`ON_BITS` call of float32 tensors reads, or None for any other expression."""
    if op_name(value) not in ON_BITS:
        return None
    data = value.args[0]
    inputs = list(data.fields) if isinstance(data, relax.Tuple) else [data]
    if not all(isinstance(v, relax.Var) and getattr(v.ty, "dtype", "") == "float32" for v in inputs):
        return None
    if op_name(value) == _MAX_POOL and not value.attrs.layout == value.attrs.out_layout == "NHWC":
        return None
    return inputs


def _elementwise(value: relax.Expr) -> bool:
    return op_name(value) in ELEMENTWISE


def from_bf16_bits(bits: te.Tensor) -> te.Tensor:
    """The fp32 values of bf16 ``bits``, element by element: a stored activation an element-wise operator reads."""
    return te.compute(bits.shape, lambda *i: bf16_to_f32(bits(*i)), name="bf16_decode")


class _Reads:
    """One Relax function's bindings and who reads each variable."""

    def __init__(self, func: relax.Function, products: Mapping[str, Product], shared: bool = False):
        self.bound: dict[relax.Var, relax.Expr] = {}
        self.uses: Counter = Counter()
        self.product_reads: Counter = Counter()
        self.decoded_reads: Counter = Counter()  # reads by element-wise operators, where they may decode bits
        self.shared = shared
        self.readers: dict[relax.Var, list[relax.Var]] = {}  # the variables bound to what reads each one
        self.on_bits: dict[relax.Var, list[relax.Var]] = {}  # the inputs of each ON_BITS operator's result
        self.products = products
        body = func.body
        for block in body.blocks:
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                if value is None:
                    continue
                self.bound[binding.var] = value
                inputs = _on_bits_inputs(value)
                if inputs is not None:
                    self.on_bits[binding.var] = inputs
                read = _vars_in(value)
                self.uses.update(read)
                for v in read:
                    self.readers.setdefault(v, []).append(binding.var)
                if self.is_product(value):
                    self.product_reads[value.args[1].fields[0]] += 1
                elif shared and _elementwise(value):
                    self.decoded_reads.update(read)
        self.uses.update(_vars_in(body.body))

    def is_product(self, value: relax.Expr) -> bool:
        return isinstance(value, relax.Call) and called_prim_func(value) in self.products

    def stored(self) -> set[relax.Var]:
        """The activations to store as bits: products and :data:`ON_BITS` operators stored as bits read them and
        nothing else does (with ``shared``, element-wise operators may too), and a kernel that is there anyway
        computes them (a product, or an element-wise or :data:`EPILOGUE_FUSABLE` operator: the rounding fuses
        into it), or such an operator whose every input is stored as bits."""
        read_so = {v for v, readers in self.readers.items()
                   if self.product_reads[v] or any(r in self.on_bits for r in readers)}
        if self.shared:
            read_so |= set(self.on_bits)
        stored = {v for v in read_so if v in self.on_bits or self._computed_in_a_kernel(v)}
        changed = True
        while changed:  # drop what reads or is read by anything not stored, until nothing more is dropped
            changed = False
            for v in list(stored):
                on_bits = sum(self.on_bits[r].count(v) for r in set(self.readers.get(v, ()))
                              if r in stored and r in self.on_bits)
                if self.uses[v] != self.product_reads[v] + on_bits + self.decoded_reads[v] or not all(
                        u in stored for u in self.on_bits.get(v, ())):
                    stored.discard(v)
                    changed = True
        return stored

    def _computed_in_a_kernel(self, var: relax.Var) -> bool:
        value = self.bound.get(var)
        return self.is_product(value) or op_name(value) in ELEMENTWISE | EPILOGUE_FUSABLE


def max_pool_bits(bits: te.Tensor, out_shape: Sequence[int], pool_size: Sequence[int], strides: Sequence[int],
                  dilation: Sequence[int], padding: Sequence[int]) -> te.Tensor:
    """An NHWC max pooling of bf16 bits into bf16 bits (``out_shape``: the pooling's own, ``ceil_mode``
    included; ``padding``: top, left, bottom, right): each tap decoded where it is read, the window's max (one
    of its bf16 values, or the padding's lowest float, which rounds to -inf as it does in fp32) stored as bits.
    One stage and its rounding: a padded copy of the input, TOPI's way, cost GoogLeNet's poolings 3-6x their
    time in the network (a 0.9 MB buffer a call)."""
    (kh, kw), (sh, sw), (dh, dw) = pool_size, strides, dilation
    top, left = padding[0], padding[1]
    height, width = int(bits.shape[1]), int(bits.shape[2])
    rh, rw = te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")
    lowest = tvm.tirx.min_value("float32")

    def tap(b, y, x, c):
        iy, ix = y * sh + rh * dh - top, x * sw + rw * dw - left
        inside = tvm.tirx.all(iy >= 0, iy < height, ix >= 0, ix < width)
        return tvm.tirx.if_then_else(inside, bf16_to_f32(bits[b, iy, ix, c]), lowest)

    pooled = te.compute(tuple(out_shape), lambda b, y, x, c: te.max(tap(b, y, x, c), axis=[rh, rw]),
                        name="pool_max")
    return to_bf16_bits(pooled)


@relax.expr_functor.mutator
class _StoreBits(relax.PyExprMutator):
    """Rounds each stored activation once, before its first reader, and remakes its readers for the bits."""

    def __init__(self, mod: tvm.IRModule, products: Mapping[str, Product], attrs: Mapping[str, int],
                 shared: bool):
        super().__init__(mod)
        self.products, self.attrs, self.shared = products, attrs, shared
        self.stored: set[relax.Var] = set()
        self._bits: dict[relax.Var, relax.Var] = {}

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.stored |= _Reads(func, self.products, self.shared).stored()
        return super().visit_function_(func)

    def _bits_of(self, var: relax.Var) -> relax.Var:
        """The bits of stored ``var`` (an original variable), rounded where first needed."""
        if var not in self._bits:
            self._bits[var] = self.builder_.emit(self.builder_.call_te(
                to_bf16_bits, self.visit_expr(var), primfunc_name_hint="bf16_bits", primfunc_attrs=_ELEMWISE))
        return self._bits[var]

    def _decoded(self, var: relax.Var) -> relax.Var:
        """Stored ``var``'s values from its bits, for one element-wise reader (one each: each fuses into its own)."""
        return self.builder_.emit(self.builder_.call_te(
            from_bf16_bits, self._bits_of(var), primfunc_name_hint="bf16_decode", primfunc_attrs=_ELEMWISE))

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        inputs = _on_bits_inputs(value) if binding.var in self.stored else None
        if inputs is None:
            super().visit_var_binding_(binding)
            return
        bits = [self._bits_of(u) for u in inputs]  # the fp32 result it replaces is read by nothing else
        if value.op.name == _CONCAT:
            self._bits[binding.var] = self.builder_.emit(relax.op.concat(bits, axis=value.attrs.axis))
        else:
            a = value.attrs
            self._bits[binding.var] = self.builder_.emit(self.builder_.call_te(
                max_pool_bits, bits[0], [int(d) for d in binding.var.ty.shape.values],
                *([int(x) for x in attr] for attr in (a.pool_size, a.strides, a.dilation, a.padding)),
                primfunc_name_hint="max_pool2d_bits"))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = called_prim_func(call)
        new = super().visit_call_(call)
        if self.shared and _elementwise(call) and any(a in self.stored for a in call.args):
            args = [self._decoded(a) if a in self.stored else n for a, n in zip(call.args, new.args)]
            return relax.Call(new.op, args, new.attrs, new.ty_args)
        data = call.args[1].fields[0] if name in self.products else None
        if data not in self.stored:
            return new
        packed = new.args[1].fields[1]
        product = self.products[name]
        return self.builder_.call_te(product.compute, self._bits_of(data), packed, *product.params,
                                     primfunc_name_hint=product.name, primfunc_attrs=dict(self.attrs))
