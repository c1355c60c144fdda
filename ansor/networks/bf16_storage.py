"""Activations stored as bf16 bits where only bf16 products read them.

A bf16 product rounds its activation to bf16 at the load (``A16``, :mod:`.bf16`): its producer writes fp32,
the product reads fp32 and writes and reads the bits again. Where every reader of an activation is such a
product, the rounding moves to the producer: the activation is stored as ``uint16`` bf16 bits (half the
bytes) and each product reads them as its ``A16``, or pads them, with nothing to convert. Rounding is a
function of the value, so every product reads the bits it read before and the outputs do not change.
ResNet's activations inside a bottleneck and a transformer's MLP hidden layer (GELU's output, between its
two dense layers) are such activations; a block's output, which a residual add also reads, stays fp32.

The rounding (:func:`~ansor.task.te_ops.to_bf16_bits`) is an element-wise operator after the activation, so
``FuseOps`` puts it into the PrimFunc of the product that computes the activation, as the last step of its
epilogue. It is added only where the activation comes from a bf16 product through element-wise operators
whose results nothing else reads (:data:`~.calls.ELEMENTWISE`: bias, ReLU, GELU in its erf or tanh form, a
residual add), the chains ``FuseOps`` fuses: elsewhere it would be a pass over the activation of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

import tvm
from tvm import relax, te

from ..task.te_ops import to_bf16_bits
from .calls import ELEMENTWISE, called_prim_func, mutate_relax_functions

#: The most operators between a product and an activation that are followed back; a longer chain stays fp32.
MAX_CHAIN = 32
#: TVM's op pattern kElemWise: the rounding fuses after any epilogue.
_ELEMWISE = {"op_pattern": 0}


@dataclass(frozen=True)
class Product:
    """How one bf16 product PrimFunc was made (:mod:`.bf16`): ``compute(data, packed_weight, *params)``
    under ``name``, so that it can be made again for an activation of bf16 bits."""

    compute: Callable[..., te.Tensor]
    params: tuple
    name: str


def store_bits(mod: tvm.IRModule, products: Mapping[str, Product], attrs: Mapping[str, int]) -> tuple[
        tvm.IRModule, int]:
    """``mod`` with each activation that only the calls of ``products`` (by PrimFunc name) read stored as
    bf16 bits (see the module notes; ``attrs``: the products' PrimFunc attributes), the PrimFuncs no call
    reads any more removed; and how many activations are stored."""
    mutator = _StoreBits(mod, products, attrs)
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


class _Reads:
    """One Relax function's bindings and who reads each variable."""

    def __init__(self, func: relax.Function, products: Mapping[str, Product]):
        self.bound: dict[relax.Var, relax.Expr] = {}
        self.uses: Counter = Counter()
        self.product_reads: Counter = Counter()
        self.products = products
        body = func.body
        for block in body.blocks:
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                if value is None:
                    continue
                self.bound[binding.var] = value
                self.uses.update(_vars_in(value))
                if self.is_product(value):
                    self.product_reads[value.args[1].fields[0]] += 1
        self.uses.update(_vars_in(body.body))

    def is_product(self, value: relax.Expr) -> bool:
        return isinstance(value, relax.Call) and called_prim_func(value) in self.products

    def stored(self) -> set[relax.Var]:
        """The activations to store as bits: products read them and nothing else does, and they come from a
        product through element-wise operators whose results nothing else reads."""
        return {v for v, n in self.product_reads.items() if self.uses[v] == n and self._fused_chain(v)}

    def _fused_chain(self, var: relax.Var) -> bool:
        chain, todo, product = {var}, [var], False
        while todo:
            value = self.bound.get(todo.pop())
            if self.is_product(value):
                product = True
                continue
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") in ELEMENTWISE):
                return False
            for arg in _vars_in(value):
                if arg not in chain and arg in self.bound:
                    chain.add(arg)
                    todo.append(arg)
            if len(chain) > MAX_CHAIN:
                return False
        reads = Counter(v for u in chain for v in _vars_in(self.bound[u]))
        return product and all(reads[u] == self.uses[u] for u in chain if u is not var)


@relax.expr_functor.mutator
class _StoreBits(relax.PyExprMutator):
    """Rounds each stored activation once, before its first reader, and remakes its readers for the bits."""

    def __init__(self, mod: tvm.IRModule, products: Mapping[str, Product], attrs: Mapping[str, int]):
        super().__init__(mod)
        self.products, self.attrs = products, attrs
        self.stored: set[relax.Var] = set()
        self._bits: dict[relax.Var, relax.Var] = {}

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.stored |= _Reads(func, self.products).stored()
        return super().visit_function_(func)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = called_prim_func(call)
        new = super().visit_call_(call)
        if name not in self.products or call.args[1].fields[0] not in self.stored:
            return new
        data, packed = new.args[1].fields[:2]
        if data not in self._bits:
            self._bits[data] = self.builder_.emit(self.builder_.call_te(
                to_bf16_bits, data, primfunc_name_hint="bf16_bits", primfunc_attrs=_ELEMWISE))
        product = self.products[name]
        return self.builder_.call_te(product.compute, self._bits[data], packed, *product.params,
                                     primfunc_name_hint=product.name, primfunc_attrs=dict(self.attrs))
