"""AMX kernels that keep their tiles (ansor/codegen/amx_tiles.py), on any CPU: the rewrite of sampled AMX programs,
compiled for an explicit AMX target, and the same kernels run with the tile instructions in software
(tests/amx_emulator.c, where a C compiler is installed) against the product computed in numpy."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import random
import shutil
import subprocess
from collections import Counter
from typing import NamedTuple
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import sym
from tvm.tirx import analysis
from tvm import relax
from tvm.script import relax as R

from ansor import codegen
from ansor.codegen import amx_tiles, tile_ir
from ansor.codegen.amx_tiles import keep_tiles_in
from ansor.codegen.tile_ir import TileOp, tile_call
from ansor.measure.check import bf16_tolerance
from ansor.networks import extract
from ansor.networks.bf16 import pack_weight, row_phase_weight
from ansor.networks.default_schedule import default_state
from ansor.relax import as_network
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.sketch.tensor_rules import AMX_STRUCTURE, tiling_structure
from ansor.state.loop_nest import AttachKind
from ansor.state.tensor_intrin import TENSORIZE, BF16Intrin, bf16_bits_to_f32, round_to_bf16
from ansor.task import program
from ansor.task.precision import Precision
from ansor.task.search_task import SearchTask
from test_bf16_network import conv_network

AMX = {"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
M, N, K = 64, 64, 256
EMULATOR = Path(__file__).with_name("amx_emulator.c")


@pytest.fixture(scope="module")
def task():
    return SearchTask.from_workload(f"bf16-matmul-{M}x{N}x{K}", target=tvm.target.Target(AMX))


#: What the LLVM build hook raises once it has the lowered module: LLVM need not compile it.
LOWERED = "lowered: the test has the module"


@contextlib.contextmanager
def captured(compiled: int = 1):
    """The lowered modules TVM hands LLVM (before the rewrite) within the block: LLVM compiles the first
    ``compiled``, the others stop there (its code generation is most of a build)."""
    modules = []
    codegen.install()
    build = tvm.get_global_func(codegen.LLVM_BUILD)

    def grab(mod, target):
        modules.append(mod)
        if len(modules) > compiled:
            raise RuntimeError(LOWERED)
        return build(mod, target)
    tvm_ffi.register_global_func(codegen.LLVM_BUILD, grab, override=True)
    try:
        yield modules
    finally:
        tvm_ffi.register_global_func(codegen.LLVM_BUILD, build, override=True)


def lowered_kernels(task: SearchTask, states) -> list[tvm.IRModule]:
    """The lowered kernels of ``states``; the first compiled to tile code."""
    with captured() as modules:
        for state in states:
            try:
                asm = codegen.compile(program.schedule(task, state), task.target).mod.inspect_source("asm")
                assert all(op in asm for op in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored"))
            except RuntimeError as err:  # TVM passes on what the hook raised
                if LOWERED not in str(err):
                    raise
    assert len(modules) == len(states)
    return modules


@pytest.fixture(scope="module")
def lowered(task):
    """8 sampled AMX programs, and one of them with the loop around its tile products unrolled."""
    amx_sketch = generate_sketches(task)[0]
    assert tiling_structure(BF16Intrin.AMX_TILE_16x16x32) == AMX_STRUCTURE == "SSRSR"
    states = sample_initial_population(task, [amx_sketch], 8, random.Random(0))
    unrolled = states[0].copy()
    [(stage_id, head)] = [(sid, k) for sid, stage in enumerate(unrolled.stages) for k, it in enumerate(stage.iters)
                          if it.annotation.startswith(TENSORIZE)]
    assert unrolled.stages[stage_id].iters[head - 1].kind.name == "REDUCE"  # a reduction loop directly around
    unrolled.annotate(stage_id, head - 1, "unroll")
    return lowered_kernels(task, [*states, unrolled])


def executed(mod: tvm.IRModule) -> Counter:
    """How many times each kind of tile instruction runs (loop extents multiplied; all are unconditional)."""
    runs: Counter = Counter()

    def walk(stmt, times: int) -> None:
        call = tile_call(stmt)
        if call is not None:
            runs[call.op] += times
            return
        if isinstance(stmt, tvm.tirx.For):
            times *= int(stmt.extent)
        for child in tile_ir.children_of(stmt):
            walk(child, times)
    for func in mod.functions.values():
        walk(func.body, 1)
    return runs


def test_the_configuration_is_loaded_once_a_thread_and_accumulators_stay_in_their_tiles(lowered):
    products = M * N * K // (16 * 16 * 32)
    resident = shared = 0
    for mod in lowered:
        before, after = executed(mod), executed(keep_tiles_in(mod))
        assert before == {TileOp.CONFIG: products, TileOp.DOT: products, TileOp.LOAD: 3 * products,
                          TileOp.STORE: products}  # each call self-contained
        assert after[TileOp.DOT] == products
        assert 1 <= after[TileOp.CONFIG] <= products // 4  # once per parallel iteration, before its loops
        # Each store is an accumulator's, paired with its load; the other loads are A and B tiles.
        assert after[TileOp.STORE] <= products and after[TileOp.LOAD] - after[TileOp.STORE] <= 2 * products
        resident += after[TileOp.STORE] < products
        shared += after[TileOp.LOAD] - after[TileOp.STORE] < 2 * products
    assert resident >= len(lowered) // 2, "accumulators stayed in their tiles in few programs"
    assert shared >= 2, "no A or B tile served two accumulators"
    # Unrolled, the loop's stores and reloads of one tile at one place are dropped.
    assert executed(keep_tiles_in(lowered[-1]))[TileOp.STORE] < executed(lowered[-1])[TileOp.STORE]


def test_kernels_without_tile_instructions_are_left_alone():
    task = SearchTask.from_workload("matmul-64", target=tvm.target.Target({**AMX, "mcpu": "skylake-avx512"}))
    with captured() as modules:
        codegen.compile(program.schedule(task, None), task.target)
    assert keep_tiles_in(modules[0]) is modules[0]


def test_a_rewrite_that_fails_leaves_the_kernel_as_placed(lowered, monkeypatch, caplog):
    """A bug in the rewrite costs the kernel its kept tiles, never its build: the calls are correct alone."""
    def broken(self, stmt):
        raise ZeroDivisionError("injected")
    monkeypatch.setattr(amx_tiles._Residency, "stmt", broken)
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert keep_tiles_in(lowered[0]) is lowered[0]
    assert "AMX tile rewrite failed (ZeroDivisionError: injected)" in caplog.text


def tile_op(op: TileOp, *args) -> tvm.tirx.Stmt:
    consts = [tvm.tirx.const(a, "int8") if isinstance(a, int) else a for a in args]
    return tvm.tirx.Evaluate(tvm.tirx.call_llvm_intrin("void", op.value, *consts))


def load(tile: int, buffer, index, stride: int) -> tvm.tirx.Stmt:
    return tile_op(TileOp.LOAD, tile, tvm.tirx.address_of(buffer[index]), tvm.tirx.const(stride, "int64"))


def store(tile: int, buffer, index, stride: int) -> tvm.tirx.Stmt:
    return tile_op(TileOp.STORE, tile, tvm.tirx.address_of(buffer[index]), tvm.tirx.const(stride, "int64"))


def kept_in_order(items: list) -> list:
    """What the accumulator rewrite makes of a run of unrolled blocks, as (op, tiles) in order."""
    out = amx_tiles._Residency().stmt(tvm.tirx.SeqStmt(items))
    return [(c.op, tuple(int(a) for a in c.args if isinstance(a, tvm.tirx.IntImm) and str(a.ty) == "int8"))
            for c in tile_ir.calls_in(out)], out


def test_blocks_are_not_merged_where_that_would_change_the_result():
    """Hand-written runs of the intrinsic's blocks (review cases): a merge that would read an output before it
    is stored, name one tile twice in a product, or use a variable before its Bind is refused."""
    C = tvm.tirx.decl_buffer((4096,), "float32", name="C")
    A, B = (tvm.tirx.decl_buffer((16384,), "uint16", name=n) for n in ("A16", "B16"))
    f, t, u = (tvm.tirx.Var(n, "int32") for n in "ftu")
    dot = tile_op(TileOp.DOT, 0, 1, 2)

    def block(c, a_buffer, a, b_index, binds=()):
        return [*binds, load(0, C, c, 256), load(1, a_buffer, a, 512), load(2, B, b_index, 64), dot,
                store(0, C, c, 256)]
    # Two output tiles side by side sharing their A tile: merged (the case the rewrite is for).
    ops, _ = kept_in_order(block(f * 64, A, f, f * 512) + block(f * 64 + 16, A, f, f * 512 + 32))
    assert [o for o, _ in ops].count(TileOp.LOAD) == 5 and (TileOp.DOT, (1, 2, 4)) in ops
    # Block 1 reads as A the tile block 0 stores: that store must come first.
    ops, _ = kept_in_order(block(f * 0, A, f, f * 512) + block(f * 0 + 2048, C, f * 0, f * 512 + 32))
    assert max(max(tiles, default=0) for _, tiles in ops) <= 2
    # A product whose A and B tiles would be one (the same address): tdpbf16ps faults on that.
    same = [load(0, C, f * 0, 256), load(1, A, f * 0, 512), load(2, A, f * 0, 512), dot, store(0, C, f * 0, 256)]
    ops, _ = kept_in_order(same + block(f * 0 + 2048, A, f * 0, f * 512))
    assert all(len(set(tiles)) == 3 for op, tiles in ops if op is TileOp.DOT)
    # Block 1's leading Bind uses one of block 0's: merged, it would come before its definition.
    first = [load(0, C, f * 64, 256), tvm.tirx.Bind(t, f * 64), load(1, A, t, 512), load(2, B, f * 512, 64), dot,
             store(0, C, f * 64, 256)]
    _, out = kept_in_order(first + block(u, A, t, f * 512 + 32, binds=[tvm.tirx.Bind(u, t + 16)]))
    assert {v.name for v in analysis.undefined_vars(out, [f])} <= {"C", "A16", "B16"}
    # Output tiles provably apart only in one buffer and in bytes: 32 bytes apart in a byte buffer overlap.
    W = tvm.tirx.decl_buffer((65536,), "uint8", name="W")
    at = [tile_call(load(0, W, f * 0 + i, 256)) for i in (0, 32, 64)]
    assert not amx_tiles._disjoint(at[0], at[1], sym.Analyzer()) and amx_tiles._disjoint(at[0], at[2], sym.Analyzer())
    # Output tiles 14 rows of a 256-byte stride apart: apart as tiles of 14 rows, overlapping as tiles of 16.
    below = [tile_call(load(0, C, f * 0 + i, 256)) for i in (0, 14 * 64)]
    assert amx_tiles._disjoint(*below, sym.Analyzer(), rows=14) and not amx_tiles._disjoint(*below, sym.Analyzer())
    view = tvm.tirx.decl_buffer((64, 64), "float32", name="C", data=C.data)
    c0, c1 = (tile_call(x) for x in (load(0, C, f * 0, 256), load(0, view, (f * 0, f * 0 + 16), 256)))
    assert not amx_tiles._disjoint(c0, c1, sym.Analyzer())  # two buffers over one memory: not provably apart


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler to build the tile emulator (tests/amx_emulator.c)")
    lib = tmp_path_factory.mktemp("amx") / "libamx_emulator.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(EMULATOR)], check=True)
    emu = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)  # global: the kernels' calls resolve to it
    emu.ansor_emu_count.restype = ctypes.c_long
    return emu


class Ran(NamedTuple):
    """What the emulator ran since the last :func:`counts`; each store is an accumulator's."""

    configurations: int
    loads: int
    products: int
    stores: int
    errors: int  # instructions on a tile their thread had not configured


def counts(emulator) -> Ran:
    return Ran(*(emulator.ansor_emu_count(i) for i in range(5)))


def emulated(mod: tvm.IRModule) -> tvm.runtime.Module:
    """``mod`` built for this CPU with each tile instruction a call of the emulator's function of its name."""
    def rewrite(stmt):
        call = tile_call(stmt)
        if call is not None:
            name = "ansor_emu_" + call.op.value.rsplit(".", 1)[1]
            return tvm.tirx.Evaluate(tvm.tirx.call_extern("int32", name, *call.args))
        children = tile_ir.children_of(stmt)
        return tile_ir.rebuild(stmt, [rewrite(c) for c in children]) if children else stmt
    host = tvm.target.Target("llvm")
    out = tvm.IRModule({gv: f.with_body(rewrite(f.body)).with_attr("target", host)
                        for gv, f in mod.functions.items()})
    return tvm.get_global_func(codegen.LLVM_BUILD)(out, host)


def run_emulated(emulator, kernel: tvm.IRModule, arrays: list[np.ndarray]) -> tuple[np.ndarray, Ran]:
    """The kernel's output on emulated tiles, and what the emulator ran."""
    args = [tvm.runtime.tensor(x) for x in arrays]
    counts(emulator)
    emulated(kernel)["main"](*args)
    ran = counts(emulator)
    assert ran.errors == 0, "a tile instruction on a tile its thread had not configured"
    return args[-1].numpy(), ran


def test_kept_tiles_compute_the_product_with_tiles_in_software(lowered, emulator):
    """Each kernel after the rewrite (and one as TensorIR placed its calls), run with the tile instructions
    emulated per thread: each computes the bf16 product, no instruction runs on a tile its thread has not
    configured, and the rewritten kernels move fewer configurations and tiles (some with accumulators side by
    side, sharing A or B tiles)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
    want = bf16_bits_to_f32(round_to_bf16(a)).astype(np.float64) @ bf16_bits_to_f32(round_to_bf16(b)).astype(np.float64)
    tol = bf16_tolerance(K)
    products = M * N * K // (16 * 16 * 32)
    arrays = [a, b, np.zeros((M, N), np.float32)]
    merged = 0
    for k, mod in enumerate(lowered):
        runs = []
        for kernel in [mod] * (k == 0) + [keep_tiles_in(mod)]:
            got, ran = run_emulated(emulator, kernel, arrays)
            assert np.abs(got - want).max() <= K * 2.0 ** -24 * 4 * want.max()  # only the fp32 sums differ
            assert np.abs(got - a @ b).max() <= tol.rtol * np.abs(a @ b).max()
            assert ran.products == products
            runs.append(ran)
        if k == 0:  # as TensorIR placed the calls: each self-contained
            assert runs[0] == (products, 3 * products, products, products, 0)
        assert ran.configurations < products and ran.stores <= products
        assert ran.loads - ran.stores <= 2 * products  # A and B tiles: shared, never more
        merged += ran.loads - ran.stores < 2 * products
    assert merged >= 2, "no program with accumulators side by side was run"


@tvm.script.ir_module
class NarrowConvBiasRelu:  # ResNet-50's third stage: rows of 14 pixels, in tiles of 14 rows
    @R.function
    def main(x: R.Tensor((1, 14, 14, 32), "float32"), w: R.Tensor((3, 3, 32, 32), "float32"),
             b: R.Tensor((32,), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.add(R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"), b))
            R.output(y)
        return y


def test_a_convolution_with_its_epilogue_fused_keeps_tiles_and_computes_the_layer(emulator):
    """A 3x3 convolution's AMX programs with bias and ReLU fused, run on emulated tiles before and after the
    rewrite, against its unscheduled program (three reduction loops, the epilogue between output tiles). Rows
    of 14 pixels take tiles of 14 rows, each tile register configured with its operand's shape (the 16-row
    tiles: the matmul above)."""
    layer, intrin = NarrowConvBiasRelu, BF16Intrin.AMX_TILE_14x16x32
    rng = np.random.default_rng(0)
    params = {"w": rng.uniform(-0.5, 0.5, (3, 3, 32, 32)).astype("float32"),
              "b": rng.uniform(-0.5, 0.5, (32,)).astype("float32")}
    ex = extract(as_network(layer, params), AMX, precision=Precision.BF16)
    [task] = [t.task for t in ex.tasks if "bfloat" in t.name]
    fused = generate_sketches(task)[:2]  # AMX tiles, the epilogue under spatial level 1 or 2
    assert all(any(st.compute_at == AttachKind.ITER for st in s.stages) for s in fused)
    assert all(it.annotation == TENSORIZE + intrin.value for s in fused for st in s.stages for it in st.iters
               if it.annotation.startswith(TENSORIZE))
    states = sample_initial_population(task, fused, 4, random.Random(1))
    arrays = program.random_inputs(task)
    want = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                               arrays)[-1]
    for k, mod in enumerate(lowered_kernels(task, states)):
        for kernel in [mod] * (k == 0) + [keep_tiles_in(mod)]:
            got, ran = run_emulated(emulator, kernel, arrays)
            assert np.abs(got - want).max() <= 288 * 2.0 ** -23 * np.abs(want).max()  # the fp32 sums' order
            assert ran.products == 14 * 14 // 14 * 2 * 9  # pixels / the tile's rows, 32 channels / 16, 3 x 3 taps
        assert ran.configurations < ran.products  # kept: once per parallel iteration


def dense_bias_relu(rows: int, k: int, n: int) -> tvm.IRModule:
    """A network of one dense layer, ``[1, rows, k] x [k, n]``, with its bias and ReLU."""
    bb = relax.BlockBuilder()
    x, w, b = (relax.Var(name, relax.TensorType(shape, "float32"))
               for name, shape in (("x", (1, rows, k)), ("w", (k, n)), ("b", (n,))))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        bb.emit_func_output(y)
    return bb.get()


def test_a_dense_layer_of_197_rows_runs_on_tiles_of_its_rows_padded(emulator):
    """No tile's rows divide 197: for an AMX target the layer computes 208 rows (A16's last 11 zero) and
    returns the first 197, its bias and ReLU fused under an output tile too (on the rows it returns); its AMX
    programs, run on emulated tiles, compute the unscheduled program's values."""
    rng = np.random.default_rng(0)
    params = {"w": rng.uniform(-0.5, 0.5, (64, 32)).astype("float32"),
              "b": rng.uniform(-0.5, 0.5, (32,)).astype("float32")}
    ex = extract(as_network(dense_bias_relu(197, 64, 32), params), AMX, precision=Precision.BF16)  # ViT's 197 rows
    [task] = [t.task for t in ex.tasks]
    assert "iters[v_i0:S1, v_i1:S208, v_i2:S32, v_k:R64]" in str(task.compute_dag)
    tile = TENSORIZE + BF16Intrin.AMX_TILE_16x16x32.value
    sketches = [s for s in generate_sketches(task) if any(it.annotation == tile for st in s.stages for it in st.iters)]
    fused = [s for s in sketches if any(st.compute_at == AttachKind.ITER for st in s.stages)]
    assert len(sketches) == 3 and len(fused) == 2  # the epilogue under spatial level 1 or 2, or after
    states = sample_initial_population(task, fused, 3, random.Random(2))
    arrays = program.random_inputs(task)
    want = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                               arrays)[-1]
    assert want.shape == (1, 197, 32)
    for mod in lowered_kernels(task, states):
        got, ran = run_emulated(emulator, keep_tiles_in(mod), arrays)
        assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()  # the fp32 sums' order
        assert ran.products == 208 // 16 * 2 * 2 and ran.configurations < ran.products


#: ResNet's downsampling 3x3 convolution: stride 2, its input in phases along rows for AMX tiles.
StridedConv = conv_network((1, 28, 28, 32), (3, 3, 32, 32), strides=2, padding=1)


def strided_conv(seed: int):
    """StridedConv's task for AMX, its arguments (random input and weight, the weight packed in row phases) and
    numpy's strided convolution of the rounded input and weight."""
    rng = np.random.default_rng(seed)
    x, w = rng.random((1, 28, 28, 32), dtype=np.float32), rng.random((3, 3, 32, 32), dtype=np.float32)
    [task] = [t.task for t in extract(as_network(StridedConv, {"w": w}), AMX, precision=Precision.BF16).tasks]
    arrays = [x, pack_weight(row_phase_weight(w, 2)), np.zeros((1, 14, 14, 32), np.float32)]
    xp = np.pad(bf16_bits_to_f32(round_to_bf16(x)).astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    wb = bf16_bits_to_f32(round_to_bf16(w)).astype(np.float64)
    return task, arrays, sum(xp[:, kh:kh + 28:2, kw:kw + 28:2, :] @ wb[kh, kw] for kh in range(3) for kw in range(3))


def test_a_strided_3x3_convolution_in_phases_computes_the_convolution():
    """The AMX form of a stride-2 3x3 convolution, A16 its input in 2 phases along rows and the taps 3 x (2 x 2)
    (3 of 12 zero), as its unscheduled program runs on this CPU, against numpy."""
    task, arrays, want = strided_conv(7)
    assert "iters[v_b:S1, v_px:S2, v_y:S30, v_x:S15, v_c:S32]" in str(task.compute_dag)
    plain = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                                arrays)[-1]
    assert np.abs(plain - want).max() <= 288 * 2.0 ** -23 * want.max()


def test_a_strided_3x3_convolution_runs_on_tiles_over_its_input_in_phases(emulator):
    """Its rows read every second pixel, no box a tile loads: in phases along rows they are. Its AMX programs, on
    emulated tiles, compute numpy's strided convolution of the bf16-rounded input and weight."""
    task, arrays, want = strided_conv(0)
    tile = TENSORIZE + BF16Intrin.AMX_TILE_14x16x32.value
    sketches = [s for s in generate_sketches(task) if any(it.annotation == tile for st in s.stages for it in st.iters)]
    for mod in lowered_kernels(task, sample_initial_population(task, sketches, 3, random.Random(3))):
        got, ran = run_emulated(emulator, keep_tiles_in(mod), arrays)
        assert np.abs(got - want).max() <= 288 * 2.0 ** -23 * want.max()  # the fp32 sums' order
        assert ran.products == 14 * 2 * 12 and ran.configurations < ran.products  # 14 rows x 2 x 12 taps


def test_the_default_schedule_of_an_amx_target_runs_its_products_on_tiles(emulator):
    """An untuned bf16 layer's default schedule for an AMX target tiles it around AMX's tile product (output
    tiles side by side: 1 x 2 here), whose tiles the rewrite keeps; on emulated tiles it computes the layer."""
    rng = np.random.default_rng(0)
    params = {"w": rng.uniform(-0.5, 0.5, (3, 3, 32, 32)).astype("float32"),
              "b": rng.uniform(-0.5, 0.5, (32,)).astype("float32")}
    [task] = [t.task for t in extract(as_network(NarrowConvBiasRelu, params), AMX, precision=Precision.BF16).tasks]
    state = default_state(task)
    assert [it.annotation for st in state.stages for it in st.iters if it.annotation.startswith(TENSORIZE)] == [
        TENSORIZE + BF16Intrin.AMX_TILE_14x16x32.value]
    arrays = program.random_inputs(task)
    want = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                               arrays)[-1]
    [mod] = lowered_kernels(task, [state])
    got, ran = run_emulated(emulator, keep_tiles_in(mod), arrays)
    assert np.abs(got - want).max() <= 288 * 2.0 ** -23 * np.abs(want).max()
    assert ran.products == 14 * 2 * 9 and ran.stores < ran.products and ran.loads - ran.stores < 2 * ran.products


def test_a_3d_convolution_runs_on_tiles_of_its_rows(emulator):
    """A stride-1 3x3x3 convolution (ResNet3D-18's) takes AMX tiles along its 16-pixel rows; its programs,
    on emulated tiles, compute what its unscheduled program computes on this CPU."""
    conv = conv_network((1, 4, 16, 16, 32), (3, 3, 3, 32, 32), strides=(1, 1, 1), padding=(1, 1, 1))
    params = {"w": np.random.default_rng(1).uniform(-0.5, 0.5, (3, 3, 3, 32, 32)).astype("float32")}
    [task] = [t.task for t in extract(as_network(conv, params), AMX, precision=Precision.BF16).tasks]
    tile = TENSORIZE + BF16Intrin.AMX_TILE_16x16x32.value
    sketches = [s for s in generate_sketches(task) if any(it.annotation == tile for st in s.stages for it in st.iters)]
    arrays = program.random_inputs(task)
    want = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                               arrays)[-1]
    for mod in lowered_kernels(task, sample_initial_population(task, sketches, 2, random.Random(1))):
        got, ran = run_emulated(emulator, keep_tiles_in(mod), arrays)
        assert np.abs(got - want).max() <= 864 * 2.0 ** -23 * np.abs(want).max()  # the fp32 sums' order
        assert ran.products == 4 * 16 * 2 * 27  # rows of 16 pixels x 2 channel groups x 27 taps


@pytest.mark.parametrize("kernel, unfolded", [(7, [32, 38, 16, 32]), (3, [32, 16, 16, 32])])
def test_an_rgb_stem_runs_on_tiles_with_its_taps_unfolded_into_channels(emulator, kernel, unfolded):
    """A stride-2 stem over 3 channels fills no tile's 32-channel reduction; its taps unfolded do: a 7x7
    one's rows of taps (21 values as 32, a 7x1 convolution over the padded rows), a 3x3 one's all (27 as
    32, a 1x1 convolution). Its AMX programs, on emulated tiles, compute numpy's convolution."""
    from ansor.networks.bf16 import unfold_weight
    rng = np.random.default_rng(kernel)
    pad = kernel // 2
    x, w = rng.random((1, 32, 32, 3), dtype=np.float32), rng.random((kernel, kernel, 3, 32), dtype=np.float32)
    net = conv_network((1, 32, 32, 3), (kernel, kernel, 3, 32), strides=2, padding=pad)
    [task] = [t.task for t in extract(as_network(net, {"w": w}), AMX, precision=Precision.BF16).tasks]
    [a16] = [st for st in task.compute_dag.init_state().stages if st.name == "A16"]
    assert [it.extent for it in a16.iters] == [1, *unfolded[1:]]
    taps = kernel if kernel == 7 else kernel * kernel
    arrays = [x, pack_weight(unfold_weight(w, taps)), np.zeros((1, 16, 16, 32), np.float32)]
    xp = np.pad(bf16_bits_to_f32(round_to_bf16(x)).astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    wb = bf16_bits_to_f32(round_to_bf16(w)).astype(np.float64)
    want = sum(xp[:, i:i + 32:2, j:j + 32:2, :] @ wb[i, j] for i in range(kernel) for j in range(kernel))
    tile = TENSORIZE + BF16Intrin.AMX_TILE_16x16x32.value
    sketches = [s for s in generate_sketches(task) if any(it.annotation == tile for st in s.stages for it in st.iters)]
    for mod in lowered_kernels(task, sample_initial_population(task, sketches, 2, random.Random(1))):
        got, ran = run_emulated(emulator, keep_tiles_in(mod), arrays)
        assert np.abs(got - want).max() <= 288 * 2.0 ** -23 * want.max()
        assert ran.products == 16 * 2 * (kernel if kernel == 7 else 1)  # rows x output tiles x tap rows
