"""The CPU's bf16 units as tensor intrinsics: ``vdpbf16ps`` (AVX512_BF16) and ``tdpbf16ps`` (AMX).

TVM's LLVM back end compiles for any x86 CPU on any x86 machine, so the assembly of explicit AVX512_BF16 and
AMX targets is checked everywhere; running those kernels needs the unit, so those tests skip elsewhere. The
intrinsics' descriptions (the math TensorIR matches) are built without them and run on any machine.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import tvm
from tvm import te

from ansor import codegen
from ansor.host_cpu import AmxError, host_cpu, request_amx
from ansor.measure.check import Tolerance, bf16_tolerance
from ansor.target import parse_target
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.state.tensor_intrin import BF16Intrin, bf16_bits_to_f32, bf16_to_f32, register, round_to_bf16
from ansor.task import program
from ansor.task.search_task import SearchTask

M, N, K = 32, 64, 128
AVX512_BF16 = {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu"}
AMX = {"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": "x86_64-linux-gnu"}


def dot_16x2_kernel(tensorize: bool) -> tvm.IRModule:
    """C = A . B with B packed as ``Bp[n // 16, k // 2, n % 16, k % 2]``, the k pairs in vdpbf16ps."""
    a = te.placeholder((M, K), "uint16", name="A")
    bp = te.placeholder((N // 16, K // 2, 16, 2), "uint16", name="Bp")
    k = te.reduce_axis((0, K), name="k")
    c = te.compute((M, N), lambda i, j: te.sum(
        bf16_to_f32(a[i, k]) * bf16_to_f32(bp[j // 16, k // 2, j % 16, k % 2]), axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, bp, c]))
    if tensorize:
        register()
        block = sch.get_sblock("C")
        i, j, kk = sch.get_loops(block)
        jo, ji = sch.split(j, [None, 16])
        ko, ki = sch.split(kk, [None, 2])
        sch.reorder(i, jo, ko, ji, ki)
        sch.decompose_reduction(block, ko)
        sch.tensorize(ji, BF16Intrin.AVX512_DOT_16x2.value)
    return sch.mod


def amx_kernel(tensorize: bool) -> tvm.IRModule:
    """C = A . B with B in k pairs (``Bp[k // 2, n, k % 2]``), in 16 x 16 x 32 AMX tiles."""
    a = te.placeholder((M, K), "uint16", name="A")
    bp = te.placeholder((K // 2, N, 2), "uint16", name="Bp")
    k = te.reduce_axis((0, K), name="k")
    c = te.compute((M, N), lambda i, j: te.sum(bf16_to_f32(a[i, k]) * bf16_to_f32(bp[k // 2, j, k % 2]), axis=k),
                   name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, bp, c]))
    if tensorize:
        register()
        block = sch.get_sblock("C")
        i, j, kk = sch.get_loops(block)
        io, ii = sch.split(i, [None, 16])
        jo, ji = sch.split(j, [None, 16])
        ko, ki = sch.split(kk, [None, 32])
        sch.reorder(io, jo, ko, ii, ji, ki)
        sch.decompose_reduction(block, ko)
        sch.tensorize(ii, BF16Intrin.AMX_TILE_16x16x32.value)
    return sch.mod


def operands(seed: int = 0):
    """Positive fp32 data (as the measurement's inputs), its bf16 bits, and B in both packed layouts."""
    rng = np.random.default_rng(seed)
    a32, b32 = rng.uniform(0.1, 1.0, (M, K)).astype(np.float32), rng.uniform(0.1, 1.0, (K, N)).astype(np.float32)
    a16, b16 = round_to_bf16(a32), round_to_bf16(b32)
    dot_packed = b16.reshape(K // 2, 2, N // 16, 16).transpose(2, 0, 3, 1).copy()
    pair_packed = b16.reshape(K // 2, 2, N).transpose(0, 2, 1).copy()
    return a32, b32, a16, b16, dot_packed, pair_packed


def run(mod: tvm.IRModule, target, a16: np.ndarray, bp: np.ndarray) -> np.ndarray:
    lib = codegen.compile(mod, parse_target(target)).jit()
    c = tvm.runtime.tensor(np.zeros((M, N), np.float32))
    lib["main"](tvm.runtime.tensor(a16), tvm.runtime.tensor(bp), c)
    return c.numpy()


def within(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> bool:
    allowed = tol.rtol * np.abs(want) + tol.scale_atol * np.abs(want).max()
    return bool((np.abs(got.astype(np.float64) - want) <= allowed).all())


# --------------------------------------------------------------------------------------------- bf16 data
def test_rounding_to_bf16_is_to_nearest_even():
    one = np.float32(1.0)
    ulp = 2.0 ** -7  # bf16's spacing at 1.0
    x = np.array([1.0, 1 + ulp / 2, 1 + 1.5 * ulp, 1 + ulp / 2 + 2 ** -20, -2.5, np.inf, -np.inf, np.nan],
                 dtype=np.float32)
    bits = round_to_bf16(x)
    back = bf16_bits_to_f32(bits)
    assert bits[0] == 0x3F80 and back[0] == one
    assert back[1] == 1.0 and back[2] == 1 + 2 * ulp  # ties go to the even neighbour
    assert back[3] == 1 + ulp and back[4] == -2.5
    assert np.isposinf(back[5]) and np.isneginf(back[6]) and np.isnan(back[7])


def test_the_tolerance_is_derived_and_catches_a_one_percent_error():
    """The bound for inputs rounded to bf16 holds for the descriptions' math, and is no licence to be 1 % off."""
    a32, b32, a16, b16, dot_packed, _ = operands()
    got = run(dot_16x2_kernel(tensorize=False), {"kind": "llvm"}, a16, dot_packed)
    exact_bf16 = bf16_bits_to_f32(a16).astype(np.float64) @ bf16_bits_to_f32(b16).astype(np.float64)
    fp32 = a32.astype(np.float64) @ b32.astype(np.float64)
    tol = bf16_tolerance(K)
    assert 3.9e-3 < tol.rtol < 4e-3  # 2u + u^2 with u = 2^-9, plus K * 2^-24
    assert within(got, fp32, tol) and not within(got * 1.01, fp32, tol)
    assert np.abs(got - exact_bf16).max() <= K * 2.0 ** -24 * np.abs(exact_bf16).max()  # only fp32 sums differ
    assert np.abs(got - fp32).max() > 1e-4  # and the inputs really were rounded


def test_amx_description_computes_the_same_product():
    _, _, a16, b16, _, pair_packed = operands(1)
    got = run(amx_kernel(tensorize=False), {"kind": "llvm"}, a16, pair_packed)
    want = bf16_bits_to_f32(a16).astype(np.float64) @ bf16_bits_to_f32(b16).astype(np.float64)
    assert np.abs(got - want).max() <= K * 2.0 ** -24 * np.abs(want).max()


# ----------------------------------------------------------------------------------------- compile only
@pytest.mark.parametrize("mcpu", ["znver4", "sapphirerapids"])
def test_avx512_bf16_kernel_compiles_to_vdpbf16ps(mcpu):
    asm = codegen.compile(dot_16x2_kernel(tensorize=True), tvm.target.Target({**AVX512_BF16, "mcpu": mcpu}))
    text = asm.mod.inspect_source("asm")
    assert "vdpbf16ps" in text and "ansor_vdpbf16ps" not in text


def test_amx_kernel_compiles_to_tile_instructions():
    text = codegen.compile(amx_kernel(tensorize=True), tvm.target.Target(AMX)).mod.inspect_source("asm")
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored"):
        assert instruction in text, instruction


def test_the_placeholder_rewrite_leaves_other_ir_alone():
    ir = "define void @f() {\n  ret void\n}\n"
    assert codegen.bf16_intrinsics(ir) == ir
    call = ("  %7 = tail call <16 x i32> @llvm.x86.avx512.vpdpwssd.512(<16 x i32> %3, <32 x i16> %5, <32 x i16> %6)"
            ", !dbg !9\n")
    out = codegen.bf16_intrinsics(call)
    assert "call <16 x i32> @llvm.x86.avx512.vpdpwssd" not in out and out.count("bitcast <32 x i16>") == 2
    assert "call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %ansor.bf16.1.c, <32 x bfloat>" in out
    assert "%7 = bitcast <16 x float> %ansor.bf16.1.r to <16 x i32>" in out
    assert "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(" in out


def test_a_searched_bf16_program_keeps_its_accumulators_in_registers():
    """The placeholder is a pure LLVM intrinsic: LLVM promotes the accumulators to registers across the
    reduction, so the kernel's vdpbf16ps neither follow a load of their accumulator nor precede its store."""
    task = SearchTask.from_workload("bf16-matmul-512", target=tvm.target.Target(AVX512_BF16))
    state = sample_initial_population(task, generate_sketches(task), 1, random.Random(3))[0]
    asm = codegen.compile(program.schedule(task, state), task.target).mod.inspect_source("asm").splitlines()
    products = [k for k, line in enumerate(asm) if "vdpbf16ps" in line]
    assert len(products) >= 4
    accumulator = lambda line: line.split(",")[-1].strip()  # noqa: E731  AT&T: the destination is last
    for k in products:
        acc = accumulator(asm[k])
        assert not any(acc in asm[j] and ("vmovaps" in asm[j] or "vmovups" in asm[j]) for j in (k - 1, k + 1)), \
            asm[k - 2:k + 3]


# --------------------------------------------------------------------------------- on the unit itself
def test_vdpbf16ps_kernel_runs_where_the_cpu_has_avx512_bf16():
    if "avx512_bf16" not in host_cpu().flags:
        pytest.skip(f"this CPU ({host_cpu().model}) has no AVX512_BF16: the kernel is compile-checked only")
    _, _, a16, b16, dot_packed, _ = operands(2)
    got = run(dot_16x2_kernel(tensorize=True), "host", a16, dot_packed)
    want = bf16_bits_to_f32(a16).astype(np.float64) @ bf16_bits_to_f32(b16).astype(np.float64)
    assert np.abs(got - want).max() <= K * 2.0 ** -24 * np.abs(want).max()


def test_linux_refusing_the_amx_state_is_one_line():
    if {"amx_tile", "amx_bf16"} <= host_cpu().flags:
        pytest.skip("this CPU has AMX: Linux grants the state (the next test runs on it)")
    with pytest.raises(AmxError, match="refused the AMX tile state") as info:
        request_amx()
    assert "\n" not in str(info.value) and "matrix units" in str(info.value)


def test_amx_kernel_runs_where_the_cpu_has_amx():
    if not {"amx_tile", "amx_bf16"} <= host_cpu().flags:
        pytest.skip(f"this CPU ({host_cpu().model}) has no AMX: the kernel is compile-checked only")
    request_amx()
    _, _, a16, b16, _, pair_packed = operands(3)
    got = run(amx_kernel(tensorize=True), "host", a16, pair_packed)
    want = bf16_bits_to_f32(a16).astype(np.float64) @ bf16_bits_to_f32(b16).astype(np.float64)
    assert np.abs(got - want).max() <= K * 2.0 ** -24 * np.abs(want).max()
