"""Vectorizable float32 exp, sigmoid, SiLU, tanh, erf, GELU and softmax for CPU networks.

Why: LLVM has no vector ``exp``, ``tanh`` or ``erf`` of its own. TIR's ``exp`` becomes ``llvm.exp.v8f32``,
which the x86 backend splits into eight calls of libm's ``expf`` when no vector math library is linked
(``sigmoid`` and ``tanh`` are lowered through ``exp``; ``erf`` is a scalar ``erff`` call from the start).
A vectorized sigmoid epilogue then costs ~3 ns an element. TVM's own ``fast_exp``/``fast_erf`` do
vectorize, but ``fast_erf(NaN)`` is 1 and ``fast_exp`` overflows to ``inf`` from x = 88.38, where exp is
still finite up to 88.72; and there is no fast sigmoid at all.

So here each function is written out as float32 arithmetic, selects and integer bit operations, which
LLVM vectorizes on every ISA (SSE to AVX-512, NEON, ...):

* ``exp(x)``: ``2^n * e^r`` with ``n = round(x / ln 2)``, ``r = x - n ln 2`` (ln 2 in two parts, so ``r``
  keeps its precision), ``e^r`` a degree-6 polynomial; ``2^n`` is built from the exponent bits in two halves, so
  results down to the smallest denormal and up to the overflow threshold stay right.
* ``sigmoid(x)``: with ``e = exp(-|x|)``, ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below, so the
  negative tail keeps its relative accuracy (``1 / (1 + exp(-x))`` would flush it to 0 from x = -88).
* ``tanh(x)``: an odd polynomial for |x| < 0.625, ``1 - 2 / (1 + exp(2|x|))`` above, x's sign copied.
* ``erf(x)``: ``x P(x^2) / Q(x^2)`` (degrees 5 and 5) on |x| <= 4, where float32 erf reaches 1.
* ``power(x, c)`` with a constant ``c`` of 2, 3 or 4: products of ``x``; 0.5: ``sqrt``. TIR's ``pow`` is a
  scalar ``powf`` call an element (GPT-2's tanh-GELU cubes ``x`` with ``Pow``: its fused epilogue ran at
  3.6 ns an element on 2 threads, 17 of the tuned build's 73 ms).
* SiLU ``x sigmoid(x)``, GELU ``x (1 + erf(x / sqrt 2)) / 2``, tanh-GELU ``x sigmoid(2 sqrt(2/pi)
  (x + 0.044715 x^3))`` (the same as ``x (1 + tanh(...)) / 2``), softmax and log-softmax over the last
  axis with this ``exp``.

Special values are the exact function's: NaN stays NaN, ``exp(-inf) = 0``, ``exp(inf) = inf`` (and
``inf`` for every x above 88.72), ``sigmoid(±inf) = 1, 0``, ``tanh(±inf) = ±1``, ``erf(±inf) = ±1``,
``silu(-inf) = gelu(-inf) = 0`` (the limit, where the literal ``x * sigmoid(x)`` gives NaN).
The polynomial coefficients were fitted in float64 with numpy (Lawson's iteration for the minimax of the
relative error, rational ``erf`` linearised) and rounded to float32; the errors of the float32 programs,
over every 97th float32 bit pattern and the special values, are in docs/networks.md and checked by
tests/test_fast_math.py. Other dtypes keep the exact operators.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Optional

import tvm
from tvm import relax, te, tirx
from tvm.ir.expr import Expr as PrimExpr  # TVM 0.27 has one Expr class for TIR and Relax

from ..task.te_ops import softmax_stages
from .calls import mutate_relax_functions

logger = logging.getLogger("ansor")

DTYPE = "float32"
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # 9 significant bits: n * _LN2_HI is exact for every n used here
_LN2_LO = -2.1219444005469057e-04  # ln 2 - _LN2_HI
#: e^r = 1 + r + r^2 (c0 + c1 r + ...) on |r| <= ln2 / 2 (relative error 3.1e-9 in float64).
_EXP_COEFS = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304,
              0.001381461275741458)
#: Below this |x|, tanh(x) = x + x^3 (c0 + c1 x^2 + ...) (relative error 4.4e-9); above it, through exp.
_TANH_SMALL = 0.625
_TANH_COEFS = (-0.3333328068256378, 0.13331441581249237, -0.05373971536755562, 0.0206390880048275,
               -0.005704987328499556)
#: erf(x) = x P(x^2) / Q(x^2) on |x| <= _ERF_CLAMP, Q's constant term 1 (relative error 2.5e-8).
_ERF_CLAMP = 4.0
_ERF_P = (1.1283791065216064, 0.19354520738124847, 0.05310177057981491, 0.003883351804688573,
          0.0002845663984771818, 1.9867852643074e-06)
_ERF_Q = (1.0, 0.5048575401306152, 0.11535006016492844, 0.015207266435027122, 0.001185573753900826,
          3.7420231819851324e-05)


def _c(value: float) -> PrimExpr:
    return tirx.const(value, DTYPE)


def _let(value: PrimExpr, body: Callable[[PrimExpr], PrimExpr], dtype: str = DTYPE) -> PrimExpr:
    """``body(v)`` with ``v`` bound to ``value`` once. A TE expression is a tree: without the binding every
    use would copy the whole subtree (exp's reduced argument sits in each step of its polynomial), which
    LLVM merges again but the ComputeDAG would count as FLOPs (380 per sigmoid instead of ~30). An
    expression holding a Let must occur once in a tree (bind it instead): TVM rejects a PrimFunc that binds
    one variable twice."""
    var = tirx.Var("v", dtype)
    return tirx.Let(var, value, body(var))


def _horner(x: PrimExpr, coefs: tuple[float, ...]) -> PrimExpr:
    """``coefs[0] + coefs[1] x + ...``, innermost last (LLVM contracts each step to an FMA where it can)."""
    acc = _c(coefs[-1])
    for coef in reversed(coefs[:-1]):
        acc = acc * x + _c(coef)
    return acc


def _clamp(x: PrimExpr, low: float, high: float) -> PrimExpr:
    """x clamped to [low, high], NaN for NaN: TIR's ``max(c, x)`` is ``x`` for a NaN ``x`` (an ordered
    compare, ``c > x``, then a select), ``max(x, c)`` would be ``c``; the functions below carry NaN this way
    through their integer casts to a NaN result rather than select it back at the end."""
    return tirx.min(_c(high), tirx.max(_c(low), x))


def _pow2(n: PrimExpr) -> PrimExpr:
    """2^n for an int32 n in [-126, 127], from the exponent bits."""
    return tirx.reinterpret(DTYPE, (n + 127) << 23)


def _exp_reduced(xc: PrimExpr, scale: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> PrimExpr:
    """e^xc for an xc bound once and clamped to [-104, 89]: ``scale(e^r, k)`` multiplies e^r by 2^k, with
    k = round(xc / ln 2) and r = xc - k ln 2."""

    def scaled(k: PrimExpr) -> PrimExpr:  # k in [-150, 128]
        n = k.astype(DTYPE)
        return _let(xc - n * _c(_LN2_HI) - n * _c(_LN2_LO), lambda r: scale(
            _c(1.0) + r * (_c(1.0) + r * _horner(r, _EXP_COEFS)), k))

    # round(t) as the truncation of t + 256.5 - 256 (positive: t >= -150.1): SSE2 has no vector floor
    return _let((xc * _c(_LOG2E) + _c(256.5)).astype("int32") - 256, scaled, "int32")


def exp(x: PrimExpr) -> PrimExpr:
    """e^x in float32 (max error in docs/networks.md); NaN, ±inf and overflow as the exact function."""
    # 2^k as two factors 2^h, 2^(k-h), each a normal float: denormal and near-overflow results stay right
    return _let(_clamp(x, -104.0, 89.0), lambda xc: _exp_reduced(  # e^-104: 0; e^89: inf
        xc, lambda p, k: p * _pow2(k >> 1) * _pow2(k - (k >> 1))))


def _exp_nonpositive(a: PrimExpr) -> PrimExpr:
    """e^a for a <= 0, as :func:`exp` to the bit, NaN for NaN, in fewer steps: one clamp; 2^k as 2^(k+64), a
    normal float, then 2^-64 (one rounding into the denormals): SiLU 0.25 -> 0.15 ns an element (Xeon, 2
    threads)."""
    return _let(tirx.max(_c(-104.0), a), lambda ac: _exp_reduced(
        ac, lambda p, k: p * _pow2(k + 64) * _c(2.0 ** -64)))


def sigmoid(x: PrimExpr) -> PrimExpr:
    """1 / (1 + e^-x), as e / (1 + e) with e = e^x for negative x so the tail keeps its precision."""
    return _let(x, lambda xv: _let(_exp_nonpositive(-tirx.abs(xv)), lambda e: (  # e in [0, 1]; NaN for NaN
        tirx.Select(xv >= _c(0.0), _c(1.0), e) / (_c(1.0) + e))))


def tanh(x: PrimExpr) -> PrimExpr:
    """tanh x: an odd polynomial near 0, where ``1 - 2 / (1 + e^2|x|)`` would cancel; exp beyond. Both on
    |x|, x's sign copied last (so tanh(-0) = -0, which ``x + x^3 P`` with P(0) = -1/3 would make +0)."""

    def magnitude(a: PrimExpr) -> PrimExpr:
        small = _let(a * a, lambda x2: a + a * x2 * _horner(x2, _TANH_COEFS))
        big = _c(1.0) - _c(2.0) / (_c(1.0) + exp(a + a))  # 1 for |x| = inf, NaN for NaN
        return tirx.Select(a < _c(_TANH_SMALL), small, big)

    return _let(x, lambda xv: tirx.copysign(_let(tirx.abs(xv), magnitude), xv))


def erf(x: PrimExpr) -> PrimExpr:
    """erf x as a rational function of the clamped x (an odd function: -0 stays -0, -inf gives -1)."""

    def rational(xc: PrimExpr) -> PrimExpr:  # may round past 1 near the clamp: clamped again
        return _let(xc * xc, lambda x2: _clamp(xc * _horner(x2, _ERF_P) / _horner(x2, _ERF_Q), -1.0, 1.0))

    return _let(_clamp(x, -_ERF_CLAMP, _ERF_CLAMP), rational)


def _at_least(x: PrimExpr, low: float) -> PrimExpr:
    """x, or ``low`` below it; NaN stays NaN (unlike a float ``max``). A product ``x * f(x)`` whose factor
    is exactly 0 below ``low`` thus gives 0 at x = -inf, not -inf * 0 = NaN."""
    return tirx.Select(x < _c(low), _c(low), x)


def silu(x: PrimExpr) -> PrimExpr:
    """x sigmoid(x) (SiLU, swish): sigmoid is exactly 0 below x = -104."""
    return _let(x, lambda xv: _at_least(xv, -128.0) * sigmoid(xv))


def gelu(x: PrimExpr) -> PrimExpr:
    """x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, the formula PyTorch and TVM evaluate (erf is -1 below -5.66)."""
    return _let(x, lambda xv: _at_least(xv, -6.0) * (_c(0.5) + _c(0.5) * erf(xv * _c(0.7071067811865476))))


def gelu_tanh(x: PrimExpr) -> PrimExpr:
    """x (1 + tanh(y)) / 2 with y = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2y)."""
    # 2 sqrt(2/pi) = 1.5957691216057308; sigmoid(2y) is exactly 0 below x = -11
    return _let(x, lambda xv: _at_least(xv, -12.0) * sigmoid(
        (xv + _c(0.044715) * xv * xv * xv) * _c(1.5957691216057308)))


#: The element-wise functions, by the name their PrimFunc gets (``fast_<name>``).
ELEMENTWISE: dict[str, Callable[[PrimExpr], PrimExpr]] = {
    "exp": exp, "sigmoid": sigmoid, "tanh": tanh, "erf": erf, "silu": silu, "gelu": gelu, "gelu_tanh": gelu_tanh,
}


def elementwise(x: te.Tensor, name: str) -> te.Tensor:
    """``ELEMENTWISE[name]`` applied to each element of ``x`` (float32)."""
    fn = ELEMENTWISE[name]
    return te.compute(x.shape, lambda *i: fn(x(*i)), name=f"T_fast_{name}")


#: Lanes a softmax row that no vector divides is reduced in (:func:`~ansor.task.te_ops.softmax_stages`):
#: ViT-B/16's 2364 x 197 softmax tuned 128 trials alone, Xeon (AVX-512), 2 threads: 0.19 ms against 0.40.
SOFTMAX_LANES = 16


#: Below this, a softmax's ``x - max`` gives 0, its exp not computed: a masked score (GPT-2's causal mask adds
#: -3.4e38) made exp and the division underflow to denormals, each a microcode assist on Intel (1536 x 128,
#: half masked: 0.87 ms against 0.28; Xeon). e^-80 is below float32's precision next to the row's max term, 1.
SOFTMAX_FLUSH = -80.0


def _flushed_exp(d: PrimExpr) -> PrimExpr:
    """exp(d) for d <= 0 (x - max), as :func:`exp` to the bit, 0 below :data:`SOFTMAX_FLUSH`, NaN for NaN:
    e^d for the d clamped to [SOFTMAX_FLUSH, 0] is a normal float, so 2^k is one factor."""
    low = _c(SOFTMAX_FLUSH)
    return _let(d, lambda dv: tirx.Select(dv < low, _c(0.0), _let(tirx.max(low, dv), lambda dc: _exp_reduced(
        dc, lambda p, k: p * _pow2(k)))))


def softmax(x: te.Tensor) -> te.Tensor:
    """Softmax over the last axis: max, exp(x - max), sum, divide (a row with +inf gives NaN, as exactly);
    terms past :data:`SOFTMAX_FLUSH` are 0."""
    return softmax_stages(x, [f"i{d}" for d in range(len(x.shape))], exp=_flushed_exp, lanes=SOFTMAX_LANES)


def log_softmax(x: te.Tensor) -> te.Tensor:
    """x - max - log(sum exp(x - max)) over the last axis: one scalar log per row, a fast exp per element."""
    n = x.shape[-1]
    k1 = te.reduce_axis((0, n), name="k")
    maxelem = te.compute(x.shape[:-1], lambda *i: te.max(x(*i, k1), axis=k1), name="T_log_softmax_maxelem")
    k2 = te.reduce_axis((0, n), name="k")
    expsum = te.compute(x.shape[:-1], lambda *i: te.sum(exp(x(*i, k2) - maxelem(*i)), axis=k2),
                        name="T_log_softmax_expsum")
    return te.compute(x.shape, lambda *i: x(*i) - maxelem(*i[:-1]) - tirx.log(expsum(*i[:-1])),
                      name="T_log_softmax_norm")


_RELAX_ELEMENTWISE = {"relax.exp": "exp", "relax.sigmoid": "sigmoid", "relax.tanh": "tanh", "relax.erf": "erf",
                      "relax.nn.silu": "silu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh"}
#: Constant exponents ``power`` is written out for as products of its base.
POWER_PRODUCTS = (2.0, 3.0, 4.0)
_RELAX_SOFTMAX = {"relax.nn.softmax": softmax, "relax.nn.log_softmax": log_softmax}


def _float32_tensor(expr: relax.Expr) -> bool:
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == DTYPE


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):
    """Each float32 operator above becomes a ``call_tir`` of its ``fast_<name>`` PrimFunc; so does
    ``multiply(x, sigmoid(x))`` (SiLU as ONNX exports it), which then is one stage, not two."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.bindings: dict = {}  # the function's variables and their values, before any rewrite
        self.counts: Counter[str] = Counter()

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.bindings = _bindings_of(func)
        return super().visit_function_(func)

    def _emit(self, name: str, compute: Callable[[te.Tensor], te.Tensor], arg: relax.Expr) -> relax.Expr:
        self.counts[name] += 1
        return self.builder_.call_te(compute, arg, primfunc_name_hint=f"fast_{name}")

    def _silu_operand(self, call: relax.Call) -> Optional[relax.Expr]:
        """x if ``call`` (not yet visited) is ``x * sigmoid(x)`` or ``sigmoid(x) * x``."""
        if getattr(call.op, "name", "") != "relax.multiply":
            return None
        for a, b in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
            bound = self.bindings.get(b)
            if (isinstance(bound, relax.Call) and getattr(bound.op, "name", "") == "relax.sigmoid"
                    and bound.args[0].same_as(a) and _float32_tensor(a) and _float32_tensor(call)):
                return a
        return None

    def _power(self, x: relax.Expr, exponent: relax.Expr) -> Optional[relax.Expr]:
        """``power(x, exponent)`` as products or ``sqrt`` when the exponent is a constant they express."""
        exponent = self.bindings.get(exponent, exponent)
        if not isinstance(exponent, tvm.ir.expr.Constant):
            return None
        data = exponent.value.numpy()
        value = float(data.reshape(-1)[0]) if data.size == 1 and data.ndim <= x.ty.ndim else None  # no broadcast
        if value not in (0.5, *POWER_PRODUCTS):
            return None
        self.counts["power"] += 1
        if value == 0.5:
            return relax.op.sqrt(x)
        square = self.builder_.emit(relax.op.multiply(x, x))
        return {2.0: square, 3.0: relax.op.multiply(square, x), 4.0: relax.op.multiply(square, square)}[value]

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        x = self._silu_operand(call)
        if x is not None:
            return self._emit("silu", lambda t: elementwise(t, "silu"), self.visit_expr(x))
        call = super().visit_call_(call)
        name = getattr(call.op, "name", "")
        if not call.args or not _float32_tensor(call.args[0]):
            return call
        if name == "relax.power" and _float32_tensor(call):
            product = self._power(call.args[0], call.args[1])
            return call if product is None else product
        if name in _RELAX_ELEMENTWISE:
            fn = _RELAX_ELEMENTWISE[name]
            return self._emit(fn, lambda t: elementwise(t, fn), call.args[0])
        if name in _RELAX_SOFTMAX and int(call.attrs.axis) in (-1, call.args[0].ty.ndim - 1):
            return self._emit(name.rsplit(".", 1)[-1], _RELAX_SOFTMAX[name], call.args[0])
        return call


def _bindings_of(func: relax.Function) -> dict:
    found: dict = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for binding in block.bindings:
                    if isinstance(binding, relax.VarBinding):
                        found[binding.var] = binding.value

    relax.analysis.post_order_visit(func, visit)
    return found


def use_fast_math(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every float32 exp, sigmoid, SiLU, tanh, erf, GELU and last-axis (log-)softmax of its
    Relax functions computed by the vectorizable versions above; bindings left unused are removed."""
    mutator = _FastMath(mod)
    mod = mutate_relax_functions(mutator)
    if mutator.counts:
        logger.info("fast math: %s", ", ".join(f"{name} x{n}" for name, n in sorted(mutator.counts.items())))
    return relax.transform.DeadCodeElimination()(mod)
