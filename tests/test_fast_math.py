"""Fast float32 math (ansor/networks/fast_math.py): error bounds against numpy over the whole float32 range,
special values, vector code without libm calls, and a small network through the CPU pipeline.

Every accuracy test builds and runs a real TVM program (parallel, vectorized) on a target any x86-64 host
runs: the portable ``x86-64`` (SSE2, no FMA) and this host's CPU (FMA where it has it: rounding differs).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from scipy import special
from tvm import relax, te

from ansor.state.compute_dag import ComputeDAG
from ansor.networks import Network, TensorSpec, apply_schedules, build, compare_outputs, extract, run
from ansor.networks import fast_math

PORTABLE = {"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}
HOST = {"kind": "llvm", "num-cores": 2}  # parse_target fills in this machine's CPU
RUN_TARGETS = [pytest.param(PORTABLE, id="x86-64"), pytest.param(HOST, id="host")]

DENORMAL_STEP = 2.0 ** -149


def _limit_at_minus_inf(f):
    """x f(x) evaluated literally is -inf * 0 = NaN at -inf; the function's value there is its limit, 0."""
    return lambda v: np.where(np.isneginf(v), 0.0, f(v))


def _gelu_tanh(v):
    return v * special.expit(2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3))


#: float64 references: numpy and scipy.special
REFERENCES = {
    "exp": np.exp,
    "sigmoid": special.expit,
    "tanh": np.tanh,
    "erf": special.erf,
    "silu": _limit_at_minus_inf(lambda v: v * special.expit(v)),
    "gelu": _limit_at_minus_inf(lambda v: v * 0.5 * special.erfc(-v / np.sqrt(2))),
    "gelu_tanh": _limit_at_minus_inf(_gelu_tanh),
}

#: The documented bounds (docs/networks.md), measured over every 97th float32: ulps from the correctly
#: rounded result, except where the error is at most max(1, |x|) denormal steps (2^-149: results, or in SiLU
#: the sigmoid factor, in the denormal range) and, for the GELUs, for x < 0, where the formula itself cancels;
#: for the GELUs |error| / max(1, |gelu(x)|) everywhere.
MAX_ULPS = {"exp": 1, "sigmoid": 2, "tanh": 1, "erf": 7, "silu": 3, "gelu": 3, "gelu_tanh": 2}
MAX_GELU_SCALED = {"gelu": 1.2e-6, "gelu_tanh": 2e-7}

SPECIALS = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, -1.1754944e-38,
                     88.72283, 88.72284, 88.7229, 89.0, -87.33654, -87.33655, -103.97, -103.98, -104.0, 3.9, 3.93,
                     4.0, -4.0, 5.66, -5.66, 9.0, -9.0, 11.0, -11.0, 1e30, -1e30, 3.4028235e38, -3.4028235e38],
                    dtype=np.float32)


def _sweep(stride: int) -> np.ndarray:
    """Every ``stride``-th float32 bit pattern (all exponents, both signs, denormals, inf, NaN) + specials."""
    bits = np.arange(0, 2 ** 32, stride, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits.view(np.float32), SPECIALS])


def _vector_program(name: str, n: int, target) -> tvm.runtime.Module:
    a = te.placeholder((n,), "float32", name="A")
    b = fast_math.elementwise(a, name)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "main")}))
    (loop,) = sch.get_loops(sch.get_sblock(b.op.name))
    outer, inner = sch.split(loop, [None, 16])
    sch.parallel(outer)
    sch.vectorize(inner)
    return tvm.compile(sch.mod, target=_target(target))


def _target(target) -> tvm.target.Target:
    from ansor.target import parse_target

    return parse_target(dict(target))


def _evaluate(name: str, x: np.ndarray, target) -> np.ndarray:
    n = -(-x.size // 16) * 16
    padded = np.zeros(n, np.float32)
    padded[:x.size] = x
    out = tvm.runtime.tensor(np.empty(n, np.float32))
    _vector_program(name, n, target).jit()["main"](tvm.runtime.tensor(padded), out)
    return out.numpy()[:x.size]


def _ordered(v: np.ndarray) -> np.ndarray:
    """float32 bit patterns as integers in the order of the values (so -0 == +0, FLT_MAX + 1 == inf)."""
    b = v.view(np.int32).astype(np.int64)
    return np.where(b < 0, -(b & 0x7FFFFFFF), b)


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REFERENCES[name](x.astype(np.float64))


def _errors(name: str, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The largest error in ulps (outside the exceptions of ``MAX_ULPS``) and, for the GELUs, scaled."""
    ref = _reference(name, x)
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32)
        denormal_steps = np.abs(y - ref) <= DENORMAL_STEP * np.maximum(1.0, np.abs(x))
    ulps = np.abs(_ordered(y) - _ordered(ref32))
    counted = ~np.isnan(ref) & ~denormal_steps & ((x >= 0) if name.startswith("gelu") else True)
    errors = {"ulps": float(ulps[counted].max(initial=0))}
    if name.startswith("gelu"):
        finite = np.isfinite(ref)
        errors["scaled"] = float((np.abs(y[finite] - ref[finite]) / np.maximum(1.0, np.abs(ref[finite]))).max())
    return errors


@pytest.mark.parametrize("target", RUN_TARGETS)
@pytest.mark.parametrize("name", list(REFERENCES))
def test_error_bound_over_the_float32_range(name, target):
    """2.1 million float32 values spread over every binade, denormals and both signs (docs/networks.md has
    the same measure over 44 million), against float64 numpy/scipy."""
    x = _sweep(2047)
    errors = _errors(name, x, _evaluate(name, x, target))
    assert errors["ulps"] <= MAX_ULPS[name], errors
    if name in MAX_GELU_SCALED:
        assert errors["scaled"] <= MAX_GELU_SCALED[name], errors


@pytest.mark.parametrize("name", list(REFERENCES))
def test_special_values_are_the_exact_functions(name):
    """NaN stays NaN; ±inf, overflow, underflow and signed zeros give what the function gives."""
    y = _evaluate(name, SPECIALS, PORTABLE)
    ref = _reference(name, SPECIALS)
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref), err_msg=f"{name}: NaN where the function is not")
    exact = ~np.isfinite(SPECIALS) | ~np.isfinite(ref32) | (ref32 == 0) | (np.abs(ref32) == 1)
    close = np.abs(_ordered(y) - _ordered(ref32)) <= MAX_ULPS[name]
    assert np.all(close[exact] | np.isnan(ref[exact])), list(zip(SPECIALS[exact & ~close], y[exact & ~close]))
    assert np.all(np.isinf(y) == np.isinf(ref32)), list(zip(SPECIALS, y, ref32))
    zero_in = SPECIALS == 0
    if name in ("tanh", "erf", "silu", "gelu", "gelu_tanh"):  # f(-0) = -0, f(+0) = +0
        np.testing.assert_array_equal(np.signbit(y[zero_in]), np.signbit(SPECIALS[zero_in]))


def test_exp_is_inf_above_the_overflow_threshold_and_finite_below():
    x = np.array([88.72283, np.nextafter(np.float32(88.7228391), np.float32(0)), 88.7229, 100.0, 1e38], np.float32)
    y = _evaluate("exp", x, PORTABLE)
    assert np.isfinite(y[:2]).all() and np.isinf(y[2:]).all(), y


# ------------------------------------------------------------------------------------------------ vector code
def _calls(asm: str) -> set[str]:
    """Functions the assembly calls or tail-calls (x86 ``call``/``jmp``, AArch64 ``bl``/``b``), minus local labels."""
    found = re.findall(r"^\s*(?:call[lq]?|jmp|bl|b)\s+\*?([A-Za-z_][\w.]*)(?:@PLT)?\s*$", asm, re.M)
    return {f for f in found if not f.startswith(".L")}


LIBM = re.compile(r"^(expf?|exp2f?|erff?|tanhf?|floorf?|roundf?|sqrtf?|logf?|powf?|__\w*expf?\w*)$")

ASM_TARGETS = {
    "haswell": {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
    "x86-64": PORTABLE,
    "aarch64": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 2},
}


def _asm(build_fn, target) -> str:
    return build_fn(target).mod.inspect_source("asm")


@pytest.mark.parametrize("isa", list(ASM_TARGETS))
@pytest.mark.parametrize("name", ["exp", "sigmoid", "silu", "tanh", "erf", "gelu", "gelu_tanh"])
def test_fast_functions_compile_to_vector_code_without_libm_calls(name, isa):
    """Compiled only (any host): the vectorized loop calls no libm function on any of the three ISAs."""
    asm = _asm(lambda t: _vector_program(name, 1024, t), ASM_TARGETS[isa])
    libm = {c for c in _calls(asm) if LIBM.match(c)}
    assert not libm, f"{name} on {isa} calls {libm}"
    vector_op = {"haswell": r"\bv(fmadd|fnmadd|fmsub|mul|add)\w*ps\s.*ymm", "x86-64": r"\b(mul|add)ps\s.*xmm",
                 "aarch64": r"\bf(mla|mul|add)\s+v\d+\.4s"}[isa]
    assert re.search(vector_op, asm), f"{name} on {isa}: no packed float arithmetic in the loop"


def test_exact_sigmoid_calls_libm_once_per_lane():
    """Why the fast versions exist: TIR's sigmoid in a vectorized loop is scalar ``expf`` calls."""
    def exact(target):
        a = te.placeholder((1024,), "float32", name="A")
        b = te.compute(a.shape, lambda i: te.sigmoid(a[i]), name="B")
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b]).with_attr("global_symbol", "main")}))
        _, inner = sch.split(sch.get_loops(sch.get_sblock("B"))[0], [None, 8])
        sch.vectorize(inner)
        return tvm.compile(sch.mod, target=_target(target))

    assert "expf" in _calls(_asm(exact, ASM_TARGETS["haswell"]))


def test_hardswish_hardsigmoid_and_rsqrt_vectorize_through_the_pipeline():
    """These need no approximation: legalized (clip = min/max; rsqrt = sqrt and divide) and given the
    default schedule, they are packed instructions with no call at all."""
    x = relax.Var("x", relax.TensorType((8, 256), "float32"))
    bb = relax.BlockBuilder()
    c = lambda v: relax.const(v, "float32")  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():  # ONNX's HardSigmoid and HardSwish, as TVM's importer writes them
            hsig = bb.emit(relax.op.clip(relax.op.add(relax.op.multiply(c(0.2), x), c(0.5)), 0, 1))
            six = relax.op.clip(relax.op.add(x, c(3.0)), 0, 6)
            hswish = bb.emit(relax.op.multiply(x, relax.op.divide(six, c(6.0))))
            norm = bb.emit(relax.op.rsqrt(relax.op.add(relax.op.multiply(x, x), c(1e-5))))
            out = bb.emit_output(relax.Tuple([hsig, hswish, norm]))
        bb.emit_func_output(out)
    net = Network("hard", bb.get(), (TensorSpec("x", (8, 256), "float32"),), (), 8, "")
    target = ASM_TARGETS["haswell"]
    ex = extract(net, target)
    asm = build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target).mod.imports[0].inspect_source("asm")
    assert not {c for c in _calls(asm) if LIBM.match(c)}, _calls(asm)
    for packed in ("vsqrtps", "vmaxps", "vminps"):
        assert re.search(rf"\b{packed}\s.*ymm", asm), packed


# ------------------------------------------------------------------------------------------------ the pass
def test_constant_powers_are_products_without_libm_calls():
    """GPT-2's tanh-GELU cubes x with Pow, a scalar powf call an element (17 of its 73 ms); exponents 2, 3, 4
    become products and 0.5 a sqrt, any other exponent keeps the exact operator."""
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    bb = relax.BlockBuilder()
    c = lambda v: relax.const(v, "float32")  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.power(x, c(e))) for e in (2.0, 3.0, 4.0)]
            outs.append(bb.emit(relax.op.power(relax.op.abs(x), c(0.5))))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    other = fast_math.use_fast_math(tvm.IRModule({"main": _power_of(1.7)})).script()
    assert "R.power" in other  # not a product: exact
    net = Network("powers", mod, (TensorSpec("x", (8, 64), "float32"),), (), 8, "")
    target = ASM_TARGETS["haswell"]
    ex = extract(net, target)
    assert "power" not in " ".join(t.name for t in ex.tasks)
    exe = build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target)
    assert not {f for f in _calls(exe.mod.imports[0].inspect_source("asm")) if LIBM.match(f)}
    inputs = net.random_inputs(0)
    got = run(exe, ex.network, inputs, target)
    v = inputs[0].astype(np.float64)
    for g, want in zip(got, (v ** 2, v ** 3, v ** 4, np.abs(v) ** 0.5)):
        assert np.abs(g - want).max() <= 1e-6 * max(1.0, np.abs(want).max())


def _power_of(exponent: float) -> relax.Function:
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.power(x, relax.const(exponent, "float32")))
        bb.emit_func_output(out)
    return bb.get()["main"]


def test_flops_count_each_operation_once():
    """The expressions bind shared values (Let), so the ComputeDAG counts ~20-40 FLOPs an element, not the
    hundreds a tree that repeats exp's reduced argument in each polynomial step would have."""
    for name in fast_math.ELEMENTWISE:
        a = te.placeholder((64,), "float32", name="A")
        flops = ComputeDAG([a, fast_math.elementwise(a, name)]).flop_ct / 64
        assert 10 <= flops <= 45, (name, flops)


def _se_silu_gelu_network() -> Network:
    """conv 1x1 + bias + SiLU (sigmoid * x, as ONNX exports it), a squeeze-excitation gate (mean, dense,
    nn.silu, dense, sigmoid, multiply), then dense + GELU, dense + tanh-GELU, dense, softmax."""
    shapes = {"w1": (1, 1, 16, 32), "b1": (1, 1, 1, 32), "w2": (32, 8), "w3": (8, 32), "w4": (32, 64), "w5": (64, 48),
              "w6": (48, 10)}
    x = relax.Var("x", relax.TensorType((2, 6, 6, 16), "float32"))
    ws = {k: relax.Var(k, relax.TensorType(s, "float32")) for k, s in shapes.items()}
    op = relax.op
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *ws.values()]):
        with bb.dataflow():
            y = bb.emit(op.add(op.nn.conv2d(x, ws["w1"], data_layout="NHWC", kernel_layout="HWIO"), ws["b1"]))
            y = bb.emit(op.multiply(y, bb.emit(op.sigmoid(y))))
            gate = bb.emit(op.nn.silu(op.matmul(op.mean(y, axis=[1, 2]), ws["w2"])))
            gate = bb.emit(op.sigmoid(op.matmul(gate, ws["w3"])))
            y = bb.emit(op.multiply(y, op.reshape(gate, (2, 1, 1, 32))))
            h = bb.emit(op.nn.gelu(op.matmul(op.mean(y, axis=[1, 2]), ws["w4"])))
            h = bb.emit(op.nn.gelu_tanh(op.matmul(h, ws["w5"])))
            out = bb.emit_output(op.nn.softmax(op.matmul(h, ws["w6"])))
        bb.emit_func_output(out)
    specs = tuple(TensorSpec(k, s, "float32") for k, s in shapes.items())
    rng = np.random.default_rng(0)
    return Network("se-silu-gelu", bb.get(), (TensorSpec("x", (2, 6, 6, 16), "float32"),), specs, 2, "NHWC",
                   param_factory=lambda: {s.name: (rng.standard_normal(s.shape) / np.sqrt(s.shape[-2]))
                                          .astype("float32") for s in specs})


def _numpy_forward(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    x = x.astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    y = np.einsum("nhwc,co->nhwo", x, w["w1"][0, 0]) + w["b1"]
    y = y * special.expit(y)
    gate = y.mean(axis=(1, 2)) @ w["w2"]
    gate = special.expit((gate * special.expit(gate)) @ w["w3"])
    y = y * gate[:, None, None, :]
    h = y.mean(axis=(1, 2)) @ w["w4"]
    h = h * 0.5 * special.erfc(-h / np.sqrt(2)) @ w["w5"]
    h = _gelu_tanh(h) @ w["w6"]
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.slow
def test_network_with_silu_and_gelu_builds_fast_and_matches_numpy():
    net = _se_silu_gelu_network()
    target = ASM_TARGETS["x86-64"]
    ex = extract(net, target)
    names = " ".join(t.name for t in ex.tasks)
    for fused in ("fast_silu", "fast_sigmoid", "fast_gelu", "fast_gelu_tanh", "fast_softmax"):
        assert fused in names, names
    assert "tir_sigmoid" not in names and "erf" not in names.replace("fast_", ""), names
    assert any(t.name.startswith("fused_conv2d_add_fast_silu ") for t in ex.tasks), names  # one stage, fused
    exe = build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target)
    assert not {c for c in _calls(exe.mod.imports[0].inspect_source("asm")) if LIBM.match(c)}
    inputs = net.random_inputs(0)
    got = run(exe, ex.network, inputs, target)[0]
    want = _numpy_forward(inputs[0], net.params)
    assert np.abs(got - want).max() <= 1e-5 + 1e-4 * np.abs(want).max()  # compare_outputs' tolerance
    exact = build(apply_schedules(*_extracted(net, target, fast_math=False), {}, target=target), target)
    assert compare_outputs(ex.network, exe, exact, target).ok


def _extracted(net: Network, target, fast_math: bool):
    ex = extract(net, target, fast_math=fast_math)
    return ex.mod, ex.tasks


def test_fast_math_can_be_switched_off():
    ex = extract(_se_silu_gelu_network(), ASM_TARGETS["x86-64"], fast_math=False)
    names = " ".join(t.name for t in ex.tasks)
    assert "fast_" not in names and "sigmoid" in names, names


def test_other_dtypes_and_axes_keep_the_exact_operators():
    x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    y = relax.Var("y", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.op.nn.softmax(y, axis=0))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    text = fast_math.use_fast_math(bb.get()).script()
    assert "fast_" not in text and "R.exp(x)" in text and "R.nn.softmax(y, axis=0)" in text


def test_exp_log_softmax_erf_and_tanh_through_the_pipeline_match_numpy():
    x = relax.Var("x", relax.TensorType((3, 40), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.exp(x)), bb.emit(relax.op.nn.log_softmax(x)), bb.emit(relax.op.erf(x)),
                    bb.emit(relax.op.tanh(x))]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    net = Network("ops", bb.get(), (TensorSpec("x", (3, 40), "float32"),), (), 3, "")
    ex = extract(net, PORTABLE)
    assert sorted(t.name.split(" ")[0] for t in ex.tasks) == ["fast_erf", "fast_exp", "fast_log_softmax", "fast_tanh"]
    value = np.random.default_rng(1).normal(0, 4, (3, 40)).astype(np.float32)
    got = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=PORTABLE), PORTABLE), ex.network, [value], PORTABLE)
    v = value.astype(np.float64)
    shifted = v - v.max(axis=-1, keepdims=True)
    wants = [np.exp(v), shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)), special.erf(v), np.tanh(v)]
    for g, w in zip(got, wants):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_a_softmax_row_no_vector_divides_reduces_in_lanes_and_matches_numpy():
    x = te.placeholder((3, 37), "float32", name="x")
    dag = ComputeDAG([x, fast_math.softmax(x)])
    assert [s.name for s in dag.stages if s.name.endswith("_lanes")] == ["T_softmax_maxelem_lanes",
                                                                        "T_softmax_expsum_lanes"]
    # A row 16 divides keeps its one-step form as it was, down to its axes' type (its workload key): int64 as
    # a network's shapes
    even = te.placeholder([tvm.tirx.IntImm("int64", d) for d in (3, 32)], "float32", name="x")
    func = te.create_prim_func([even, fast_math.softmax(even)])
    assert not any(s.name.endswith("_lanes") for s in ComputeDAG(func).stages)
    sch = tvm.s_tir.Schedule(func)
    for name in ("T_softmax_maxelem", "T_softmax_expsum"):
        assert {str(iv.var.ty) for iv in sch.get(sch.get_sblock(name)).iter_vars} == {"int64"}
    f = tvm.compile(te.create_prim_func([x, fast_math.softmax(x)]), target="llvm")
    a = np.random.default_rng(0).standard_normal((3, 37)).astype("float32") * 4
    a[1, 33:] = 30.0  # the row's maximum in the masked last vector
    out = tvm.runtime.tensor(np.zeros_like(a))
    f(tvm.runtime.tensor(a), out)
    e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_masked_softmax_gives_exact_zeros_without_denormals():
    """A causal mask's -3.4e38 scores (GPT-2's) give exact zeros, the exp of their clamped difference, so no
    step underflows to a denormal; terms below e^-80 are 0, NaN stays NaN, the rest match numpy."""
    x = te.placeholder((4, 32), "float32", name="x")
    f = tvm.compile(te.create_prim_func([x, fast_math.softmax(x)]), target="llvm")
    a = np.random.default_rng(1).standard_normal((4, 32)).astype("float32")
    a[0, 1:] = np.finfo(np.float32).min  # masked: the row is its first score
    a[1, :16] -= 85.0  # past SOFTMAX_FLUSH from the row's maximum: exp would be ~1e-37, here 0
    a[2, 5] = np.nan
    out = tvm.runtime.tensor(np.zeros_like(a))
    f(tvm.runtime.tensor(a), out)
    got = out.numpy()
    assert got[0, 0] == 1.0 and not got[0, 1:].any()
    assert not got[1, :16].any() and np.isnan(got[2]).all()
    e = np.exp(a[[1, 3]].astype(np.float64) - a[[1, 3]].max(axis=1, keepdims=True))
    np.testing.assert_allclose(got[[1, 3]], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-30)
