"""Move transposes below element-wise operators until they meet their inverse and cancel.

A PyTorch model that permutes its own activations keeps those permutes after layout conversion, which only
rewrites around the convolutions. ConvNeXt's block ends ``linear -> permute to NCHW -> layer scale ->
residual add``, and the next block's convolution, now NHWC, permutes straight back: every block ran two
transposes of the whole feature map, and its layer scale and residual add as a kernel of their own that
reads one operand transposed (3 of ConvNeXt-T's 33 tasks took 0.14-0.30 ms each with their default schedule
where a tuned one took 0.055 ms).

One walk over each dataflow block, in binding order, with ``v = permute_dims(b, p)`` read from ``v``'s
binding:

* ``permute_dims(permute_dims(b, p), a)`` becomes one ``permute_dims(b, p∘a)``, or ``b`` itself when that is
  the identity; an identity ``permute_dims`` is dropped;
* an element-wise operator whose tensor operands are all ``permute_dims(·, p)`` (broadcast along the same
  axes before and after), or constants (transposed here, with numpy), computes on the untransposed operands
  and is transposed after, ``op(permute_dims(b, p), c) = permute_dims(op(b, c'), p)``, when its result
  reaches a ``permute_dims`` that undoes ``p`` through element-wise operators only (:class:`_Uses`).

The transpose moves down past each element-wise operator and cancels where the model permutes back. Where
nothing undoes it, it stays where the model put it: moved for nothing, it changed which operators fuse
(ViT-B/16's query scaling went from before its head transpose to after it, a task of another kind).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from .calls import ELEMENTWISE, mutate_relax_functions, op_name
from .conv_rewrite import bound_constant

PERMUTE = "relax.permute_dims"


def sink_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its transposes moved below element-wise operators and cancelled where they meet
    their inverse (see the module notes); dead bindings are removed."""
    mod = mutate_relax_functions(_TransposeSinker(mod, _Uses(mod)))
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def static_shape(expr: relax.Expr) -> bool:
    """Whether ``expr``'s tensor shape is known in every dimension."""
    shape = getattr(expr.ty, "shape", None)
    return isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)


def permute_axes(call: relax.Call) -> tuple[int, ...]:
    """A ``permute_dims`` call's axes (``None`` in the call: reversed)."""
    axes = call.attrs.axes
    ndim = call.args[0].ty.ndim
    return tuple(range(ndim - 1, -1, -1)) if axes is None else tuple(int(a) for a in axes)


def _is_identity(perm: Sequence[int]) -> bool:
    return all(i == p for i, p in enumerate(perm))


class _Uses:
    """The bindings of a module's Relax functions by the variables they use, to tell whether a transposed
    element-wise result reaches a transpose that undoes it."""

    def __init__(self, mod: tvm.IRModule):
        self.users: dict[int, list[relax.VarBinding]] = {}
        self.bound: dict[int, relax.Var] = {}  # call -> the variable it is bound to
        for _, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding, relax.VarBinding) and isinstance(binding.value, relax.Call):
                        self.bound[binding.value.__chandle__()] = binding.var
                        for arg in binding.value.args:
                            if isinstance(arg, relax.Var):
                                self.users.setdefault(arg.__chandle__(), []).append(binding)
        self._memo: dict[tuple[int, tuple[int, ...]], bool] = {}

    def cancels(self, var: relax.Var, perm: tuple[int, ...]) -> bool:
        """True if ``var``, were it ``permute_dims(·, perm)``, reaches a ``permute_dims`` that undoes
        ``perm`` through element-wise operators."""
        key = (var.__chandle__(), perm)
        if key not in self._memo:
            self._memo[key] = False  # a cycle (none in a dataflow block) would read False
            self._memo[key] = any(
                _is_identity(tuple(perm[a] for a in permute_axes(b.value))) if op_name(b.value) == PERMUTE
                else op_name(b.value) in ELEMENTWISE and self.cancels(b.var, perm)
                for b in self.users.get(var.__chandle__(), ()))
        return self._memo[key]


@relax.expr_functor.mutator
class _TransposeSinker(relax.PyExprMutator):

    def __init__(self, mod: tvm.IRModule, uses: _Uses):
        super().__init__(mod)
        self.uses = uses

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        var = self.uses.bound.get(call.__chandle__())  # the call as the module has it, before the visit
        call = super().visit_call_(call)
        name = op_name(call)
        if name == PERMUTE:
            return self._compose(call)
        sunk = self._sink(call, var) if name in ELEMENTWISE and var is not None else None
        return call if sunk is None else sunk

    def _permuted(self, expr: relax.Expr) -> Optional[tuple[relax.Expr, tuple[int, ...]]]:
        """(b, p) if ``expr`` is a variable bound to ``permute_dims(b, p)`` in this block."""
        if not isinstance(expr, relax.Var):
            return None
        bound = self.lookup_binding(expr)
        if isinstance(bound, relax.Call) and op_name(bound) == PERMUTE:
            return bound.args[0], permute_axes(bound)
        return None

    def _compose(self, call: relax.Call) -> relax.Expr:
        source, axes = call.args[0], permute_axes(call)
        inner = self._permuted(source)
        if inner is not None:
            source, first = inner
            axes = tuple(first[a] for a in axes)
        if _is_identity(axes):
            return source
        return relax.op.permute_dims(source, list(axes)) if inner is not None else call

    def _sink(self, call: relax.Call, var: relax.Var) -> Optional[relax.Expr]:
        if not static_shape(call):
            return None
        perm: Optional[tuple[int, ...]] = None
        args: list[Optional[relax.Expr]] = []
        for arg in call.args:
            if not isinstance(arg.ty, relax.TensorType):
                args.append(arg)
                continue
            permuted = self._permuted(arg)
            if permuted is not None and perm in (None, permuted[1]):
                perm = permuted[1]
                args.append(permuted[0])
            else:
                args.append(None)  # a constant, transposed once ``perm`` is known
        if perm is None or not self.uses.cancels(var, perm):
            return None
        inverse = np.argsort(perm)  # the permutation that undoes ``perm``
        for k, arg in enumerate(call.args):
            if args[k] is not None:
                continue
            value = bound_constant(self, arg)
            if value is None or value.ndim > len(perm):
                return None
            if value.ndim == 0:
                args[k] = arg
                continue
            value = np.transpose(value.reshape((1,) * (len(perm) - value.ndim) + value.shape), inverse)
            args[k] = relax.const(np.ascontiguousarray(value), str(value.dtype))
        inner = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
        return relax.op.permute_dims(inner, list(perm))
