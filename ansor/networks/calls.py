"""Swap PrimFuncs of a Relax module for new ones and rewrite every ``call_tir`` of them; the walk every
rewrite of a module's Relax functions shares (:func:`mutate_relax_functions`); which Relax operators are
element-wise (:data:`ELEMENTWISE`, for the rewrites that follow a value through them).

A global variable keeps the type it was created with, so a PrimFunc of other argument shapes (flatten) or
other argument types (packed weights, schedules) cannot be put under the old one: the old function is
deleted, the new one added under a new variable of the same name, and each call site rewritten to call it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import tvm
from tvm import relax, tirx

CALL_TIR = "relax.call_tir"
#: Every call of a PrimFunc by a Relax function: the plain call and its in-place and gradient forms.
CALL_TIR_OPS = (CALL_TIR, "relax.call_tir_inplace", "relax.call_tir_with_grad")

#: Operators that compute each output element from the elements at the same index of their (broadcast)
#: tensor operands; other arguments (``clip``'s bounds) pass unchanged.
ELEMENTWISE = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
    "nn.relu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "negative", "abs", "erf", "clip",
    "nn.silu", "nn.gelu", "nn.gelu_tanh",
))

#: Rewrites one call site: (the block builder, the original call with its arguments already visited,
#: the new function's global variable) -> the expression that replaces the call.
CallRewrite = Callable[[relax.BlockBuilder, relax.Call, tvm.ir.GlobalVar], relax.Expr]


def op_name(expr: Optional[relax.Expr]) -> str:
    """The Relax operator ``expr`` calls (``relax.add``), or "" for anything else."""
    return getattr(expr.op, "name", "") if isinstance(expr, relax.Call) else ""


def called_prim_func(call: relax.Call) -> Optional[str]:
    """The name of the PrimFunc ``call`` calls with ``call_tir`` and a tuple of arguments, else None."""
    if getattr(call.op, "name", "") == CALL_TIR and len(call.args) >= 2 and isinstance(call.args[1], relax.Tuple):
        return call.args[0].name_hint
    return None


def replace_prim_funcs(mod: tvm.IRModule, funcs: Mapping[str, tirx.PrimFunc],
                       rewrite: Callable[[str], CallRewrite]) -> tvm.IRModule:
    """``mod`` with the PrimFunc of each name in ``funcs`` replaced by the given one, and each of its
    ``call_tir`` sites replaced by what ``rewrite(name)`` makes of it; ``mod`` itself is consumed."""
    if not funcs:
        return mod
    for name in funcs:
        del mod[name]
    builder = relax.BlockBuilder(mod)
    new = {name: (builder.add_func(func, name), rewrite(name)) for name, func in funcs.items()}
    return mutate_relax_functions(_RewriteCalls(builder.get(), new))


def mutate_relax_functions(mutator: relax.PyExprMutator) -> tvm.IRModule:
    """The module ``mutator`` was made on, each of its Relax functions replaced by what ``mutator`` makes
    of it (the PrimFuncs it emits on the way are added by its builder)."""
    for gv, func in list(mutator.builder_.get().functions_items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


@relax.expr_functor.mutator
class _RewriteCalls(relax.PyExprMutator):
    """Each ``call_tir`` of a replaced PrimFunc becomes what its rewrite makes of it."""

    def __init__(self, mod: tvm.IRModule, new: dict[str, tuple[tvm.ir.GlobalVar, CallRewrite]]):
        super().__init__(mod)
        self._new = new

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = called_prim_func(call)
        if name not in self._new:
            return call
        gv, rewrite = self._new[name]
        return rewrite(self.builder_, call, gv)
