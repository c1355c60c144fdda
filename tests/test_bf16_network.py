"""Networks in bf16: convolutions and dense layers take bf16 inputs (weights packed at build time), tiled by
the search around the bf16 dot product; the rest stays fp32.

Every build here is real. On a CPU without AVX512_BF16 the products use the intrinsic's portable form (the
same layouts and loops in fp32 code), so the numerics are checked on any machine; for an AVX512_BF16
target the same tasks are compiled and their assembly holds ``vdpbf16ps``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import ansor
from ansor import codegen
from ansor.arguments import PRECISIONS
from ansor.bench.network_report import ModelReport, result_cells, result_header
from ansor.bench.peers import PeerResult
from ansor.bench.zoo_bench import matches_ort, run_key, zoo_section
from ansor.cli.evaluation import BuildCheck
from ansor.cli.logs import log_name, network_from_log_name, precision_from_log_name
from ansor.host_cpu import MatrixUnit, allow_amx, host_cpu
from ansor.log.records import load_records
from ansor.networks import NetworkError, apply_history_best, apply_schedules, build, compare_outputs, extract
from ansor.networks.bf16 import (
    BF16_BUILD_RTOL, BF16_NOISE_SLACK, BF16_VS_FP32_RTOL, amx_padded_rows, pack_weight, padded_to,
    paired_taps, phase_weight, widened_row,
)
from ansor.networks.default_schedule import default_state
from ansor.networks.evaluate import OutputComparison, run
from ansor.relax import as_network, export_network, tune_tasks
from ansor.sketch.search_space import generate_sketches, sample_initial_population
from ansor.state.loop_nest import AttachKind
from ansor.state.tensor_intrin import BF16_BITS, TENSORIZE, BF16Intrin, bf16_bits_to_f32, round_to_bf16
from ansor.task import program
from ansor.task.precision import Precision

PORTABLE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2: no bf16 unit
AVX512_BF16 = {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
AMX = {"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
BF16 = Precision.BF16


@tvm.script.ir_module
class Dense:
    @R.function
    def main(x: R.Tensor((1, 6, 32), "float32"), w: R.Tensor((32, 48), "float32"), b: R.Tensor((48,), "float32")):
        with R.dataflow():
            y = R.nn.relu(R.add(R.matmul(x, w), b))
            R.output(y)
        return y


def conv_network(x: tuple[int, ...], w: tuple[int, ...], strides, padding=0, groups=1, dilation=1) -> tvm.IRModule:
    """A network that is one NHWC/HWIO (NDHWC/DHWIO for a 5-D ``x``) convolution of its input ``x`` by ``w``."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in (("x", x), ("w", w))]
    conv, data, kernel = (relax.op.nn.conv3d, "NDHWC", "DHWIO") if len(x) == 5 else (relax.op.nn.conv2d, "NHWC",
                                                                                        "HWIO")
    with bb.function("main", args):
        with bb.dataflow():
            y = bb.emit_output(conv(*args, strides=strides, padding=padding, dilation=dilation, groups=groups,
                                    data_layout=data, kernel_layout=kernel))
        bb.emit_func_output(y)
    return bb.get()


Conv = conv_network((1, 9, 9, 4), (3, 3, 4, 16), strides=2, padding=1)


@tvm.script.ir_module
class Small:  # two convolutions and a dense layer in bf16; the classifier (10 outputs) stays fp32
    @R.function
    def main(x: R.Tensor((1, 9, 9, 4), "float32"), w1: R.Tensor((3, 3, 4, 16), "float32"),
             w2: R.Tensor((1, 1, 16, 32), "float32"), fc: R.Tensor((32, 48), "float32"),
             cls: R.Tensor((1200, 10), "float32")):
        with R.dataflow():
            c1 = R.nn.relu(R.nn.conv2d(x, w1, strides=2, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
            c2 = R.nn.conv2d(c1, w2, data_layout="NHWC", kernel_layout="HWIO")
            d = R.nn.gelu(R.matmul(R.reshape(c2, (1, 25, 32)), fc))
            y = R.matmul(R.reshape(d, (1, 1200)), cls)
            R.output(y)
        return y


def params_of(mod, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {v.name: rng.uniform(-0.5, 0.5, [int(d) for d in v.ty.shape.values]).astype("float32")
            for v in mod["main"].params[1:]}


def bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bf16, as float64."""
    return bf16_bits_to_f32(round_to_bf16(x)).astype(np.float64)


def np_conv(v: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """numpy's NHWC convolution of ``v`` by the bf16 values of HWIO ``w``, stride 1, ``pad`` on each side."""
    v = np.pad(v, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    k, n = w.shape[0], v.shape[1] - w.shape[0] + 1
    return sum(v[:, i:i + n, j:j + n, :] @ bf16(w[i, j]) for i in range(k) for j in range(k))


def default_build(mod, params, target, precision=BF16):
    ex = extract(as_network(mod, params), target, precision=precision)
    return ex, build(apply_schedules(ex.mod, ex.tasks, {}, target=target), target)


def tensorized(state) -> bool:
    return any(it.annotation.startswith(TENSORIZE) for st in state.stages for it in st.iters)


def test_weights_are_rounded_and_packed_in_the_dot_products_layout():
    w = np.random.default_rng(0).standard_normal((3, 3, 4, 32)).astype(np.float32)
    packed = pack_weight(w)
    assert packed.dtype == np.uint16 and packed.shape == (2, 3, 3, 2, 16, 2)
    bits = round_to_bf16(w)
    for o, kh, kw, c in [(0, 0, 0, 0), (17, 2, 1, 3), (31, 1, 2, 2)]:
        assert packed[o // 16, kh, kw, c // 2, o % 16, c % 2] == bits[kh, kw, c, o]
    dense = pack_weight(w[0, 0])  # [K=4, N=32]
    assert dense.shape == (2, 2, 16, 2) and dense[1, 1, 5, 0] == bits[0, 0, 2, 16 + 5]


def test_measurement_draws_a_layers_packed_weight_as_bf16_numbers():
    """Its bf16 bits hold values in [0.1, 1): small integers there would be denormals, which vdpbf16ps and
    tdpbf16ps read as zero, so every candidate would fail its check against the fp32-computed reference."""
    ex = extract(as_network(Dense, params_of(Dense)), PORTABLE, precision=BF16)
    [task] = [t.task for t in ex.tasks if "bfloat" in t.name]
    [bits] = [a for a in program.random_inputs(task) if a.dtype == np.uint16]
    values = bf16_bits_to_f32(bits)
    assert values.min() >= 0.099 and values.max() <= 1.0 and len(np.unique(values)) > 8  # 1: rounded up


def test_a_dense_layer_computes_bf16_inputs_with_fp32_sums():
    params = params_of(Dense)
    ex, exe = default_build(Dense, params, PORTABLE)
    [task] = [t for t in ex.tasks if "bfloat" in t.name]
    assert tensorized(default_state(task.task))  # the default schedule computes it with the dot product too
    x = np.random.default_rng(1).uniform(-1, 1, (1, 6, 32)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    want = np.maximum(bf16(x) @ bf16(params["w"]) + params["b"], 0)
    assert np.abs(got - want).max() <= 32 * 2.0 ** -23 * np.abs(want).max()  # only the fp32 sums' order
    exact = np.maximum(x.astype(np.float64) @ params["w"] + params["b"], 0)
    assert np.abs(got - exact).max() > 1e-4  # the inputs were rounded


def test_a_bf16_product_takes_its_epilogue_under_an_output_tile():
    """Dense's bias and ReLU are fused under the product's first or second spatial tile level (two sketches
    beside the unfused one), and every sampled fused program computes what the unscheduled one does."""
    ex = extract(as_network(Dense, params_of(Dense)), PORTABLE, precision=BF16)
    [task] = [t.task for t in ex.tasks if "bfloat" in t.name]
    sketches = generate_sketches(task)
    fused = [s for s in sketches if any(st.compute_at == AttachKind.ITER for st in s.stages)]
    assert len(sketches) == 3 and len(fused) == 2 and all(tensorized(s) for s in sketches)
    assert len({st.attach for s in fused for st in s.stages if st.compute_at == AttachKind.ITER}) == 2  # two levels
    arrays = program.random_inputs(task)
    want = program.run_program(program.build_program(task, None), arrays)[-1]
    states = sample_initial_population(task, fused, 6, random.Random(0))
    assert any(st.compute_at == AttachKind.ITER for s in states for st in s.stages)
    for state in states:
        got = program.run_program(program.build_program(task, state), arrays)[-1]
        assert np.abs(got - want).max() <= 32 * 2.0 ** -23 * np.abs(want).max()  # only the fp32 sums' order


def product_of_two(q: tuple[int, ...], k: tuple[int, ...]) -> tvm.IRModule:
    """A network that is one matmul of its two inputs, as attention's Q K^T and P V."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in (("q", q), ("k", k))]
    with bb.function("main", args):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(*args))
        bb.emit_func_output(y)
    return bb.get()


#: Products of two activations: one that fits the bf16 units as it is, and one (ViT's attention products have 197
#: columns and a reduction of 197) whose odd reduction and 30 columns are padded with zeros, then cut back.
ATTENTION, ODD_ATTENTION = product_of_two((2, 8, 32), (2, 32, 48)), product_of_two((2, 9, 13), (2, 13, 30))


@pytest.mark.parametrize("layer, padded", [(ATTENTION, None), (ODD_ATTENTION, "v_i2:S32, v_k:R14]")])
def test_a_product_of_two_activations_rounds_both_in_the_kernel(layer, padded):
    """The odd one's product runs on operands padded with zeros (14 channels, 32 columns), its output cut back."""
    ex, exe = default_build(layer, {}, PORTABLE)
    [task] = ex.tasks
    assert "bfloat_matmul" in task.name and tensorized(default_state(task.task))
    assert padded is None or padded in str(task.task.compute_dag)
    rng = np.random.default_rng(3)
    q, k = (rng.uniform(-1, 1, [int(d) for d in v.ty.shape.values]).astype(np.float32) for v in layer["main"].params)
    [got] = run(exe, ex.network, [q, k], PORTABLE)
    want = bf16(q) @ bf16(k)
    assert got.shape == want.shape and np.abs(got - want).max() <= 32 * 2.0 ** -23 * np.abs(want).max()
    assert np.abs(got - q.astype(np.float64) @ k).max() > 1e-4


def test_a_strided_padded_convolution_computes_bf16_inputs():
    params = params_of(Conv)
    ex, exe = default_build(Conv, params, PORTABLE)
    assert any("bfloat" in t.name for t in ex.tasks)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 9, 9, 4)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    xp = np.pad(bf16(x), ((0, 0), (1, 1), (1, 1), (0, 0)))
    w = bf16(params["w"])
    want = sum(xp[:, kh:kh + 9:2, kw:kw + 9:2, :] @ w[kh, kw] for kh in range(3) for kw in range(3))
    assert got.shape == want.shape == (1, 5, 5, 16)
    assert np.abs(got - want).max() <= 36 * 2.0 ** -23 * np.abs(want).max()


Downsample = conv_network((1, 28, 28, 32), (1, 1, 32, 64), strides=2)  # ResNet's projection shortcut


def test_a_strided_1x1_convolution_rounds_only_the_pixels_it_reads_into_amx_rows():
    """Its A16 holds the pixels it reads, gathered (14 x 14, not 28 x 28), so that a row of outputs is one
    box of A16: on AMX its programs take tiles of 14 rows; its values are the bf16 product's."""
    params = params_of(Downsample)
    ex, exe = default_build(Downsample, params, PORTABLE)
    [task] = [t.task for t in ex.tasks]
    a16 = str(task.compute_dag).splitlines()[0]
    assert a16.startswith("A16[") and "x[0, 2*v0, 2*v1, v2]" in a16 and "iters[v0:S14, v1:S14, v2:S32]" in a16
    x = np.random.default_rng(4).uniform(-1, 1, (1, 28, 28, 32)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    want = bf16(x)[:, ::2, ::2, :] @ bf16(params["w"][0, 0])
    assert np.abs(got - want).max() <= 32 * 2.0 ** -23 * np.abs(want).max()
    [amx] = [t.task for t in extract(as_network(Downsample, params), AMX, precision=BF16).tasks]
    assert intrinsics_of(generate_sketches(amx)[0]) == [BF16Intrin.AMX_TILE_14x16x32.value]


def test_dense_rows_no_tile_divides_are_padded_for_amx_within_an_eighth():
    assert amx_padded_rows(197) == 208  # 13 tiles of 16, +5.6 %
    assert amx_padded_rows(50) == 56  # 4 tiles of 14, where 64 rows would add 28 %
    assert amx_padded_rows(56) is None and amx_padded_rows(49) is None  # tiles of 14 and 7 divide them
    assert amx_padded_rows(17) is None  # 32 (or 21 in tiles of 7) would add more than an eighth
    assert widened_row(17) == 21 and widened_row(13) == 14  # a convolution's rows: up to a quarter more
    assert widened_row(9) == 0 and widened_row(14) == 0  # 12 would add a third; 14 fits tiles of 14
    assert padded_to(197, 16) == 208 and padded_to(197, 2) == 198 and padded_to(8, 16) is None  # 8 -> 16: +100 %


@pytest.mark.parametrize("k, depth", [(13, 14), (28, 32)])
def test_an_amx_target_pads_a_products_rows_columns_and_reduction_and_cuts_the_output_back(k, depth):
    """For AMX a product of 50 rows (no tile's rows divide them) runs on 56 rows and 32 columns (4 tiles of 14
    rows), zeros past 50 x 30; a reduction of 28 on a tile's 32 channels (ViT's P V: 197 as 224), one of 13
    in k pairs (32 would more than double it); its unscheduled program computes numpy's bf16 product, on this
    CPU."""
    tall = product_of_two((1, 50, k), (1, k, 30))
    [task] = [t.task for t in extract(as_network(tall, {}), AMX, precision=BF16).tasks]
    assert f"v_i1:S56, v_i2:S32, v_k:R{depth}]" in str(task.compute_dag)
    tiles = [s for s in generate_sketches(task) if intrinsics_of(s) == [BF16Intrin.AMX_TILE_14x16x32.value]]
    assert bool(tiles) == (depth == 32)
    rng = np.random.default_rng(6)
    q, k = rng.uniform(0, 1, (1, 50, k)).astype(np.float32), rng.uniform(0, 1, (1, k, 30)).astype(np.float32)
    plain = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                                [q, k, np.zeros((1, 50, 30), np.float32)])[-1]
    want = bf16(q) @ bf16(k)
    assert np.abs(plain - want).max() <= depth * 2.0 ** -23 * want.max()


@pytest.mark.parametrize("ci, depth", [(24, 32), (12, 12)])
def test_an_amx_target_pads_input_channels_to_a_tiles_depth_within_twice_the_products(ci, depth):
    """EfficientNet's 1x1 expansions read 24, 40, 80 or 112 channels, no tile's 32: for AMX 24 are read as 32,
    the rest zero (A16 and weight), and tiles take them; 12 as 32 would be 2.7 times the products and stays
    on vdpbf16ps. The unscheduled program computes numpy's bf16 convolution, on this CPU."""
    net = conv_network((1, 14, 14, ci), (1, 1, ci, 32), strides=1, padding=0)
    params = params_of(net)
    [task] = [t.task for t in extract(as_network(net, params), AMX, precision=BF16).tasks]
    assert f"S{depth}]" in str(task.compute_dag).splitlines()[0]
    tiles = [s for s in generate_sketches(task) if intrinsics_of(s) == [BF16Intrin.AMX_TILE_14x16x32.value]]
    assert bool(tiles) == (depth == 32)
    x = np.random.default_rng(4).uniform(-1, 1, (1, 14, 14, ci)).astype(np.float32)
    shapes = [a.shape for a in program.random_inputs(task)]  # the rows flattened as the network calls it
    wide = np.concatenate([params["w"], np.zeros((1, 1, depth - ci, 32), np.float32)], axis=2)
    plain = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                                [x.reshape(shapes[0]), pack_weight(wide), np.zeros(shapes[2], np.float32)])[-1]
    want = (bf16(x) @ bf16(params["w"][0, 0])).reshape(shapes[2])
    assert np.abs(plain - want).max() <= depth * 2.0 ** -23 * np.abs(want).max()


def dense_network(rows: tuple[int, ...], k: int, n: int) -> tvm.IRModule:
    """A network that is one dense layer (a matmul by a constant weight ``w``) of an input of ``rows``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("rows", [(1, 50), (50, 1)])
def test_a_dense_layers_rows_are_padded_for_amx_in_whichever_leading_dimension_holds_them(rows):
    """ViT's attention projects [197, 1, 768] (sequence first, as torch's MultiheadAttention), its MLP
    [1, 197, 768]: both run on rows padded to tiles (50 as 56), and compute numpy's bf16 product, on this CPU."""
    rng = np.random.default_rng(2)
    x, w = rng.uniform(0, 1, (*rows, 64)).astype(np.float32), rng.uniform(0, 1, (64, 32)).astype(np.float32)
    [task] = [t.task for t in extract(as_network(dense_network(rows, 64, 32), {"w": w}), AMX, precision=BF16).tasks]
    assert "S56" in str(task.compute_dag)
    assert any(intrinsics_of(s) == [BF16Intrin.AMX_TILE_14x16x32.value] for s in generate_sketches(task))
    plain = program.run_program(codegen.compile(program.schedule(task, None), tvm.target.Target("llvm")).jit(),
                                [x, pack_weight(w), np.zeros((*rows, 32), np.float32)])[-1]
    want = bf16(x) @ bf16(w)
    assert np.abs(plain - want).max() <= 64 * 2.0 ** -23 * want.max()


def test_a_network_keeps_fp32_where_the_unit_does_not_fit_and_stays_near_fp32():
    params = params_of(Small)
    ex, exe = default_build(Small, params, PORTABLE)
    names = [t.name for t in ex.tasks]
    assert sum("bfloat_conv2d" in n for n in names) == 2 and sum("bfloat_dense" in n for n in names) == 1, names
    assert any("matmul" in n and "bf" not in n for n in names), names  # the 10-class classifier
    fp32, fp32_exe = default_build(Small, params, PORTABLE, Precision.FP32)
    cmp_ = compare_outputs(ex.network, exe, fp32_exe, PORTABLE, reference_network=fp32.network)
    assert 1e-6 * cmp_.scale < cmp_.max_abs_error <= BF16_BUILD_RTOL * cmp_.scale, cmp_
    assert ex.output_rtol == BF16_BUILD_RTOL and fp32.output_rtol < BF16_BUILD_RTOL


def test_an_avx512_bf16_target_compiles_network_tasks_to_vdpbf16ps():
    ex = extract(as_network(Small, params_of(Small)), AVX512_BF16, precision=BF16)
    for t in [t for t in ex.tasks if "bfloat" in t.name]:
        state = default_state(t.task)
        asm = codegen.compile(program.schedule(t.task, state), t.task.target).mod.inspect_source("asm")
        assert "vdpbf16ps" in asm, t.name


@tvm.script.ir_module
class Stride1:  # a 3x3 convolution whose output rows (32 wide) fill AMX tiles; a stride-2 one reads every other
    @R.function
    def main(x: R.Tensor((1, 32, 32, 32), "float32"), w: R.Tensor((3, 3, 32, 32), "float32"),
             v: R.Tensor((3, 3, 32, 32), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO")
            z = R.nn.conv2d(y, v, strides=2, padding=1, data_layout="NHWC", kernel_layout="HWIO")
            R.output(z)
        return z


def amx_tasks():
    ex = extract(as_network(Stride1, params_of(Stride1)), AMX, precision=BF16)
    return [t.task for t in ex.tasks if "bfloat" in t.name]


def intrinsics_of(state) -> list[str]:
    return [it.annotation[len(TENSORIZE):] for st in state.stages for it in st.iters
            if it.annotation.startswith(TENSORIZE)]


def test_an_amx_target_searches_amx_tiles_where_rows_fill_them():
    """Both convolutions' rows fill 16-row tiles: the stride-2 one's as a box of its input in phases along rows."""
    strided, wide = sorted(amx_tasks(), key=lambda t: t.flop_ct)
    for task in (wide, strided):  # the wide one's epilogue (its output stored as bf16 bits) adds fused sketches
        sketches = {tuple(intrinsics_of(s)) for s in generate_sketches(task)}
        assert sketches == {(BF16Intrin.AMX_TILE_16x16x32.value,), (BF16Intrin.AVX512_DOT_16x2.value,)}
    assert "A16[v_b, v_px, v_y, v_x, v_c]" in str(strided.compute_dag)
    states = sample_initial_population(wide, generate_sketches(wide), 8, random.Random(0))
    amx = [s for s in states if intrinsics_of(s) == [BF16Intrin.AMX_TILE_16x16x32.value]]
    assert amx, "no AMX program sampled"
    asm = codegen.compile(program.schedule(wide, amx[0]), wide.target).mod.inspect_source("asm")
    assert all(op in asm for op in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored")), "no tile instruction"


def test_amx_programs_compute_the_bf16_convolution_where_the_cpu_has_amx():
    [wide, _] = sorted(amx_tasks(), key=lambda t: -t.flop_ct)
    [narrow] = [t.task for t in extract(as_network(Downsample, params_of(Downsample)), AMX, precision=BF16).tasks]
    for task, intrin in [(wide, BF16Intrin.AMX_TILE_16x16x32), (narrow, BF16Intrin.AMX_TILE_14x16x32)]:
        runs_like_the_reference_on_amx(task, sampled_amx(task, intrin, count=3), 288, "AMX programs")  # <= 288 terms


def test_an_export_for_an_amx_target_asks_linux_for_the_tiles_first(tmp_path):
    ex, exe = default_build(Dense, params_of(Dense), AMX)
    export_network(exe, ex.network, tmp_path / "amx", AMX)
    assert json.loads((tmp_path / "amx" / "model.json").read_text())["amx"] is True
    assert "syscall(158, 0x1023, 18)" in (tmp_path / "amx" / "README.md").read_text()  # arch_prctl, XTILEDATA
    ex, exe = default_build(Dense, params_of(Dense), PORTABLE)
    export_network(exe, ex.network, tmp_path / "avx2", PORTABLE)
    assert json.loads((tmp_path / "avx2" / "model.json").read_text())["amx"] is False


def test_bf16_is_for_cpu_targets_and_fp32_is_unchanged():
    with pytest.raises(NetworkError, match="bf16 is for CPU targets"):
        extract(as_network(Dense, params_of(Dense)), "cuda", precision=BF16)
    fp32 = extract(as_network(Small, params_of(Small)), PORTABLE)
    assert not any("bfloat" in t.name for t in fp32.tasks)
    same = extract(as_network(Small, params_of(Small)), PORTABLE, precision=Precision.FP32)
    assert [t.workload_key for t in same.tasks] == [t.workload_key for t in fp32.tasks]


def test_log_names_carry_the_precision():
    assert log_name("resnet-50", 1) == "resnet-50-b1.json"
    assert log_name("resnet-50", 1, "bf16") == "resnet-50-b1-bf16.json"
    assert network_from_log_name("logs/resnet-50-b1-bf16.json") == ("resnet-50", 1)
    assert precision_from_log_name("logs/resnet-50-b1-bf16.json") == "bf16"
    assert precision_from_log_name("logs/resnet-50-b1.json") == "fp32"
    assert precision_from_log_name("bench-work/resnet50-bf16.json") == "bf16"  # the zoo bench's name
    assert log_name("resnet-50", 1, "bf16-stored") == "resnet-50-b1-bf16-stored.json"
    assert network_from_log_name("logs/resnet-50-b1-bf16-stored.json") == ("resnet-50", 1)
    assert precision_from_log_name("logs/resnet-50-b1-bf16-stored.json") == "bf16-stored"
    assert PRECISIONS == tuple(p.value for p in Precision)  # what --precision offers is what there is


def test_builds_apart_beyond_bf16_tolerance_pass_only_as_close_to_fp32_as_the_default():
    # LR-ASPP's figures: its two bf16 builds 2.86 apart (4.3 % of the scale), 19.9 and 19.5 from fp32.
    apart = OutputComparison(2.86, 66.0, BF16_BUILD_RTOL, 1e-5)
    default = OutputComparison(19.5, 66.0, BF16_VS_FP32_RTOL, 1e-5)
    assert not apart.ok
    assert not BuildCheck(apart).ok  # nothing to compare with: a failure
    amplified = BuildCheck(apart, OutputComparison(19.9, 66.0, BF16_VS_FP32_RTOL, 1e-5), default)
    assert amplified.ok and "amplifies rounding" in amplified.summary()
    limit = BF16_NOISE_SLACK * default.max_abs_error
    wrong = BuildCheck(apart, OutputComparison(limit * 1.01, 66.0, BF16_VS_FP32_RTOL, 1e-5), default)
    assert not wrong.ok and "amplifies" not in wrong.summary() and "default bf16 build 19.5" in wrong.summary()
    close = BuildCheck(OutputComparison(0.5, 66.0, BF16_BUILD_RTOL, 1e-5))
    assert close.ok and close.summary().startswith("tuned == default build")


@pytest.mark.slow
def test_tuning_a_bf16_network_measures_checks_and_applies(tmp_path, local_ray):
    """The real search on the bf16 tasks: every candidate measured and checked, the best applied to the
    network, whose output is the default bf16 build's."""
    params = params_of(Small)
    ex, default_exe = default_build(Small, params, PORTABLE)
    log = tmp_path / "small-b1-bf16.json"
    tasks = [t for t in ex.tasks if "bfloat_conv2d" in t.name][:1]  # the strided, padded one: 8 trials
    tune_tasks(tasks, log, 8, options=ansor.TuningOptions(num_measures_per_round=4, cost_model="random",
                                                          pretrained=False))
    records = load_records(log)
    assert len(records) == 8 and all(r.result.ok for r in records), [r.result.error_msg for r in records][:3]
    assert all(tensorized(r.state) for r in records)
    tuned = build(apply_history_best(ex.mod, ex.tasks, log, target=PORTABLE), PORTABLE)
    cmp_ = compare_outputs(ex.network, tuned, default_exe, PORTABLE, rtol=ex.output_rtol)
    assert cmp_.ok, cmp_


def test_a_bf16_benchmark_compares_with_every_runtime_at_its_default_precision():
    peers = [PeerResult("ONNX Runtime", 9.0, 9.0), PeerResult("OpenVINO", 8.0, 8.0),
             PeerResult("OpenVINO (bf16, its default here)", 3.0, 3.0, precision="bf16")]
    fp32 = ModelReport("resnet-50", peers=peers, tuned_ms=6.0)
    bf16 = ModelReport("resnet-50", "bf16", peers=peers, tuned_ms=6.0)
    assert fp32.fastest_peer().name == "OpenVINO" and result_cells(fp32)[1] == pytest.approx(0.75)
    assert bf16.fastest_peer().precision == "bf16" and result_cells(bf16)[1] == pytest.approx(2.0)
    assert "fastest f32 runtime" in result_header("fp32") and "fastest runtime" in result_header("bf16")
    assert zoo_section("AMD EPYC (LLVM znver4)", "bf16") != zoo_section("AMD EPYC (LLVM znver4)", "fp32")
    assert run_key("vit-b-16", "bf16") == "vit-b-16-bf16" and run_key("vit-b-16", "fp32") == "vit-b-16"


def test_a_bf16_benchmark_leaves_out_the_f32_row_of_a_runtime_whose_default_is_bf16():
    """Where OpenVINO's f32 beats its own bf16 default (a bf16 unit slower than the FMA), the user still gets
    the bf16 default: the comparison takes that or another runtime's default, never the f32 row."""
    peers = [PeerResult("ONNX Runtime", 9.0, 9.0), PeerResult("OpenVINO", 4.0, 4.0),
             PeerResult("OpenVINO (bf16, its default here)", 6.0, 6.0, precision="bf16")]
    bf16 = ModelReport("resnet-50", "bf16", peers=peers, tuned_ms=6.0)
    assert bf16.fastest_peer().precision == "bf16" and result_cells(bf16)[1] == pytest.approx(1.0)
    fp32 = ModelReport("resnet-50", peers=peers, tuned_ms=6.0)
    assert fp32.fastest_peer().name == "OpenVINO" and result_cells(fp32)[1] == pytest.approx(1.5)


def test_a_bf16_zoo_row_shows_openvinos_bf16_error_beside_ansors():
    ovino = PeerResult("OpenVINO 2026.4.1 (bf16, its default here)", 3.0, 3.0, precision="bf16")
    report = ModelReport("resnet50", "bf16", peers=[ovino], tuned_ms=6.0, reduced=[(ovino, 4.52e-3)],
                         vs_ort=OutputComparison(3.6e-3, 1.0, BF16_VS_FP32_RTOL, 0.0))
    assert matches_ort(report) == "yes (3.6e-03; OpenVINO 2026.4.1 in bf16: 4.5e-03)"
    report.precision = "fp32"  # an fp32 run leaves OpenVINO's bf16 row out of its ratios and this cell
    assert matches_ort(report) == "yes (3.6e-03)"


NO_UNIT_CASES = [["tune", "--network", "tiny-cnn", "--precision", "bf16", "--n-trials", "4"],
                 ["export", "{log}", "--network", "tiny-cnn", "--out", "{out}"],
                 ["bench", "--precision", "bf16", "--models", "resnet-50", "--minutes", "1"]]


@pytest.fixture(scope="module")
def no_unit_runs(run_main_per_case, tmp_path_factory):
    """Each case through the ``ansor`` command's real main, all in one process (a CPU without the unit)."""
    if "avx512_bf16" in host_cpu().flags:
        pytest.skip("this CPU has AVX512_BF16: --precision bf16 tunes here")
    tmp = tmp_path_factory.mktemp("no-unit")
    log = tmp / "tiny-cnn-b1-bf16.json"  # export reads bf16 from the log's name
    log.write_text("")
    command = tmp / "ansor_command.py"
    command.write_text("from ansor.cli.main import main\n")
    cases = [[a.format(log=log, out=tmp / "out") for a in argv] for argv in NO_UNIT_CASES]
    return run_main_per_case(command, cases, tmp)


@pytest.mark.parametrize("case", range(len(NO_UNIT_CASES)), ids=[argv[0] for argv in NO_UNIT_CASES])
def test_network_bf16_on_a_cpu_without_the_unit_is_one_error_line(case, no_unit_runs):
    code, stderr = no_unit_runs[case]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr
    assert "avx512_bf16" in errors[0] and "Traceback" not in stderr


Stem = conv_network((1, 16, 16, 3), (7, 7, 3, 16), strides=2, padding=3)  # an RGB stem: an odd reduction


@pytest.mark.parametrize("target, channels, pairs", [(PORTABLE, 4, 2), (AMX, 32, 16)], ids=["vdpbf16ps", "amx"])
def test_an_rgb_stem_reads_zero_channels_past_its_three(target, channels, pairs):
    """Its 3 channels are rounded into an A16 of 4, the fourth zero, and the weight packed in 2 k pairs; for
    AMX each row of its 7 taps is unfolded into 32 channels (21 values, then zeros: 16 k pairs), which a
    tile's 32-channel reduction takes (test_amx_tiles runs it)."""
    [extracted] = extract(as_network(Stem, params_of(Stem)), target, precision=BF16).tasks
    task = extracted.task
    assert "bfloat_conv2d" in extracted.name
    a16 = str(task.compute_dag).splitlines()[0]
    assert a16.startswith("A16[") and a16.rstrip().endswith(f":S{channels}]"), a16
    values = 3 if target is PORTABLE else 21  # x read only below channel 3; the taps row's values only
    assert f"< T.int64({values})" in program.schedule(task, None)["main"].script()
    [packed] = [a for a in program.random_inputs(task) if a.dtype == np.uint16]
    assert packed.shape[-3:] == (pairs, 16, 2)


def test_an_rgb_stem_computes_the_bf16_product_of_its_three_channels():
    params = params_of(Stem)
    ex, exe = default_build(Stem, params, PORTABLE)
    x = np.random.default_rng(7).uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    xp, w = np.pad(bf16(x), ((0, 0), (3, 3), (3, 3), (0, 0))), bf16(params["w"])
    want = sum(xp[:, kh:kh + 16:2, kw:kw + 16:2, :] @ w[kh, kw] for kh in range(7) for kw in range(7))
    assert got.shape == want.shape == (1, 8, 8, 16)
    assert np.abs(got - want).max() <= 196 * 2.0 ** -23 * np.abs(want).max()


def bottleneck(residual: bool) -> tvm.IRModule:
    """A 3x3 convolution and ReLU, then a 1x1 convolution of their output ``y`` (plus ``y`` with ``residual``)."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32"))
            for name, shape in (("x", (1, 6, 6, 4)), ("w1", (3, 3, 4, 16)), ("w2", (1, 1, 16, 16)))]
    nhwc = {"data_layout": "NHWC", "kernel_layout": "HWIO"}
    with bb.function("main", args):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(args[0], args[1], padding=1, **nhwc)))
            z = bb.emit(relax.op.nn.conv2d(y, args[2], **nhwc))
            out = bb.emit_output(relax.op.add(z, y) if residual else z)
        bb.emit_func_output(out)
    return bb.get()


def test_an_activation_only_bf16_products_read_is_stored_as_bf16_bits():
    """The 3x3 layer's epilogue rounds its output to bf16 bits and the 1x1 layer reads them as its A16; where
    a residual add also reads them, they stay fp32 and the 1x1 layer rounds them at its load."""
    mod, params = bottleneck(residual=False), params_of(bottleneck(residual=False))
    first, second = sorted((t for t in extract(as_network(mod, params), PORTABLE, precision=BF16).tasks),
                           key=lambda t: -t.task.flop_ct)
    assert first.name.startswith("fused_bfloat_conv2d_relu_bf_bits"), first.name
    assert program.arg_specs(first.task)[-1][1] == BF16_BITS  # its output
    assert "A16" not in str(second.task.compute_dag) and "bf_bits" not in second.name
    assert [dtype for _, dtype in program.arg_specs(second.task)] == [BF16_BITS, BF16_BITS, "float32"]
    ex, exe = default_build(mod, params, PORTABLE)
    x = np.random.default_rng(5).uniform(-1, 1, (1, 6, 6, 4)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    y = np.maximum(np_conv(bf16(x), params["w1"], 1), 0)
    want = bf16(y) @ bf16(params["w2"][0, 0])
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()
    assert np.abs(got - y @ params["w2"][0, 0]).max() > 1e-4  # y was rounded

    kept = extract(as_network(bottleneck(residual=True), params), PORTABLE, precision=BF16).tasks
    assert not any("bf_bits" in t.name for t in kept) and all("A16" in str(t.task.compute_dag) for t in kept)


def test_a_residual_blocks_output_is_stored_as_bits_for_its_add_too_in_bf16_stored():
    """In bf16-stored the 3x3 layer's output, which the 1x1 layer and a residual add read, is stored as bits:
    the add decodes them in the 1x1 layer's epilogue, so it adds the rounded values (OpenVINO's storage)."""
    mod = bottleneck(residual=True)
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE, Precision.BF16_STORED)
    first, second = sorted(ex.tasks, key=lambda t: -t.task.flop_ct)
    assert first.name.startswith("fused_bfloat_conv2d_relu_bf_bits"), first.name
    assert "bf_decode" in second.name, second.name
    assert [dtype for _, dtype in program.arg_specs(second.task)] == [BF16_BITS, BF16_BITS, "float32"]
    x = np.random.default_rng(5).uniform(-1, 1, (1, 6, 6, 4)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    y = np.maximum(np_conv(bf16(x), params["w1"], 1), 0)
    want = bf16(y) @ bf16(params["w2"][0, 0]) + bf16(y)
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()
    fp32_residual = bf16(y) @ bf16(params["w2"][0, 0]) + y  # what bf16 computes
    assert np.abs(got - fp32_residual).max() > 100 * np.abs(got - want).max()


def dense_block() -> tvm.IRModule:
    """DenseNet's pattern: a pooled activation and a convolution of it concatenated, then a batch norm's scale
    and shift and a ReLU, then a 1x1 convolution."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32"))
            for name, shape in (("x", (1, 9, 9, 16)), ("w0", (3, 3, 16, 16)), ("w1", (3, 3, 16, 16)),
                                ("s", (32,)), ("t", (32,)), ("w2", (1, 1, 32, 16)))]
    x, w0, w1, scale, shift, w2 = args
    op, nhwc = relax.op, {"data_layout": "NHWC", "kernel_layout": "HWIO"}
    with bb.function("main", args):
        with bb.dataflow():
            c0 = bb.emit(op.nn.relu(op.nn.conv2d(x, w0, padding=1, **nhwc)))
            p = bb.emit(op.nn.avg_pool2d(c0, pool_size=2, strides=1, layout="NHWC"))
            f = bb.emit(op.nn.relu(op.nn.conv2d(p, w1, padding=1, **nhwc)))
            bn = bb.emit(op.nn.relu(op.add(op.multiply(op.concat([p, f], axis=3), scale), shift)))
            out = bb.emit_output(op.nn.conv2d(bn, w2, **nhwc))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("precision", [BF16, Precision.BF16_STORED])
def test_a_dense_blocks_concatenation_is_stored_as_bits_only_in_bf16_stored(precision):
    """bf16 keeps the concatenation, which a batch norm reads, in fp32 (and the pooling and convolution it
    joins); bf16-stored rounds the pooling's and the convolution's outputs, and the batch norm's kernel
    concatenates and decodes the bits. Both store the batch norm's ReLU for the last convolution."""
    mod = dense_block()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE, precision)
    dtypes = {t.name.split(" ")[0]: [d for _, d in program.arg_specs(t.task)] for t in ex.tasks}
    stored = precision is Precision.BF16_STORED
    bits_out = {name: d[-1] == BF16_BITS for name, d in dtypes.items()}
    assert [b for n, b in bits_out.items() if "avg_pool2d" in n] == [stored], dtypes
    assert any("multiply_add_relu" in n and b for n, b in bits_out.items()), dtypes
    x = np.random.default_rng(5).uniform(-1, 1, (1, 9, 9, 16)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)

    keep = bf16 if stored else (lambda v: v)
    c0 = np.maximum(np_conv(bf16(x), params["w0"], 1), 0)
    p = (c0[:, :8, :8] + c0[:, 1:, :8] + c0[:, :8, 1:] + c0[:, 1:, 1:]) / 4
    f = np.maximum(np_conv(bf16(p), params["w1"], 1), 0)
    bn = np.maximum(np.concatenate([keep(p), keep(f)], 3) * params["s"] + params["t"], 0)
    want = np_conv(bf16(bn), params["w2"], 0)
    assert got.shape == want.shape == (1, 8, 8, 16)
    off = np.abs(got - want) > 64 * 2.0 ** -23 * np.abs(want).max()  # a sum's order may flip a rounding
    assert off.mean() < 0.02 and np.abs(got - want).max() <= 2.0 ** -8 * np.abs(want).max()


def test_an_element_wise_activation_only_products_read_is_stored_as_bits():
    """A batch norm's scale and shift and a ReLU before a convolution (DenseNet's order) round their output
    into bits in their own kernel; the convolution reads the bits and computes what it computed before."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32"))
            for name, shape in (("x", (1, 6, 6, 16)), ("s", (16,)), ("t", (16,)), ("w", (1, 1, 16, 16)))]
    with bb.function("main", args):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.multiply(args[0], args[1]), args[2])))
            out = bb.emit_output(relax.op.nn.conv2d(a, args[3], data_layout="NHWC", kernel_layout="HWIO"))
        bb.emit_func_output(out)
    mod = bb.get()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    dtypes = {t.name.split(" ")[0]: [d for _, d in program.arg_specs(t.task)] for t in ex.tasks}
    assert dtypes["fused_multiply_add_relu_bf_bits"][-1] == BF16_BITS, dtypes
    assert dtypes["bfloat_conv2d"][0] == BF16_BITS, dtypes
    x = np.random.default_rng(5).uniform(-1, 1, (1, 6, 6, 16)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    want = bf16(np.maximum(x * params["s"] + params["t"], 0)) @ bf16(params["w"][0, 0])
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()


def test_a_gelu_hidden_layer_between_two_dense_layers_is_stored_as_bf16_bits():
    """GELU as ONNX exports it reads its input twice (``h * 0.5 * (1 + erf(h / sqrt 2))``): both reads are in
    the chain that fuses into the first dense layer, so its output is stored as bits for the second."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    w1, w2 = (relax.Var(name, relax.TensorType(shape, "float32"))
              for name, shape in (("w1", (32, 64)), ("w2", (64, 32))))
    op = relax.op
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            h = bb.emit(op.matmul(x, w1))
            erf = bb.emit(op.erf(op.divide(h, relax.const(1.4142135, "float32"))))
            g = bb.emit(op.multiply(op.multiply(h, relax.const(0.5, "float32")),
                                    op.add(erf, relax.const(1.0, "float32"))))
            out = bb.emit_output(op.matmul(g, w2))
        bb.emit_func_output(out)
    mod = bb.get()
    tasks = extract(as_network(mod, params_of(mod)), PORTABLE, precision=BF16).tasks
    [first] = [t for t in tasks if "bf_bits" in t.name]
    assert "erf" in first.name and program.arg_specs(first.task)[-1][1] == BF16_BITS
    [second] = [t for t in tasks if t is not first and "bfloat_dense" in t.name]
    assert program.arg_specs(second.task)[0][1] == BF16_BITS and "A16" not in str(second.task.compute_dag)


def inverted_residual(channels: int = 16, hidden: int = 32) -> tvm.IRModule:
    """MobileNet-V2's block: a 1x1 expansion and ReLU6, a 3x3 depthwise convolution and ReLU6, a 1x1
    projection and the identity shortcut."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in (
        ("x", (1, 8, 8, channels)), ("w1", (1, 1, channels, hidden)), ("wd", (3, 3, 1, hidden)),
        ("w2", (1, 1, hidden, channels)))]
    nhwc, op = {"data_layout": "NHWC", "kernel_layout": "HWIO"}, relax.op
    with bb.function("main", args):
        with bb.dataflow():
            e = bb.emit(op.clip(op.nn.conv2d(args[0], args[1], **nhwc), 0, 6))
            d = bb.emit(op.clip(op.nn.conv2d(e, args[2], padding=1, groups=hidden, **nhwc), 0, 6))
            out = bb.emit_output(op.add(op.nn.conv2d(d, args[3], **nhwc), args[0]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_depthwise_convolution_rounds_its_inputs_and_the_bits_around_it_are_stored():
    """No dot product fits a depthwise convolution, so it multiplies bf16 inputs in fp32 FMA; the expansion's
    output, which only it reads, and its own, which only the projection reads, are stored as bf16 bits."""
    mod = inverted_residual()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    dtypes = {t.name.split(" ")[0]: [d for _, d in program.arg_specs(t.task)] for t in ex.tasks}
    assert dtypes == {"fused_bfloat_conv2d_tir_clip_bf_bits": ["float32", BF16_BITS, BF16_BITS],
                      "fused_bfloat_group_conv2d_tir_clip_bf_bits": [BF16_BITS, "float32", BF16_BITS],
                      "fused_bfloat_conv2d_add": [BF16_BITS, BF16_BITS, "float32", "float32"]}, dtypes
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 8, 16)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    e = np.pad(bf16(np.clip(bf16(x) @ bf16(params["w1"][0, 0]), 0, 6)), ((0, 0), (1, 1), (1, 1), (0, 0)))
    wd = bf16(params["wd"])
    d = np.clip(sum(e[:, i:i + 8, j:j + 8, :] * wd[i, j, 0] for i in range(3) for j in range(3)), 0, 6)
    want = bf16(d) @ bf16(params["w2"][0, 0]) + x
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()
    assert np.abs(got - (d @ params["w2"][0, 0] + x)).max() > 1e-4  # d was rounded


def inception_block() -> tvm.IRModule:
    """GoogLeNet's pattern: a stem convolution and ReLU, a max pooling, two branches (a 1x1 convolution and a
    3x3 one) concatenated, then a max pooling branch beside a 1x1 convolution, the two concatenated again as
    the output."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in (
        ("x", (1, 12, 12, 4)), ("w0", (3, 3, 4, 16)), ("w1", (1, 1, 16, 16)), ("w3", (3, 3, 16, 16)),
        ("w4", (1, 1, 32, 16)))]
    nhwc, op = {"data_layout": "NHWC", "kernel_layout": "HWIO"}, relax.op
    pool = {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1), "layout": "NHWC"}
    with bb.function("main", args):
        with bb.dataflow():
            stem = bb.emit(op.nn.relu(op.nn.conv2d(args[0], args[1], padding=1, **nhwc)))
            p = bb.emit(op.nn.max_pool2d(stem, ceil_mode=True, **pool))
            a = bb.emit(op.nn.relu(op.nn.conv2d(p, args[2], **nhwc)))
            b = bb.emit(op.nn.relu(op.nn.conv2d(p, args[3], padding=1, **nhwc)))
            cat = bb.emit(op.concat([a, b], axis=3))
            q = bb.emit(op.nn.max_pool2d(cat, pool_size=(3, 3), strides=(1, 1), padding=(1, 1), layout="NHWC"))
            out = bb.emit_output(op.concat([op.nn.relu(op.nn.conv2d(cat, args[4], **nhwc)), q], axis=3))
        bb.emit_func_output(out)
    return bb.get()


def test_concatenations_and_max_poolings_between_bf16_products_run_on_the_bits():
    """The stem's output, which a max pooling reads, and the branches' outputs, which a concatenation reads,
    are stored as bits; the pooling and the concatenation run on them, and every product reads the bits it
    rounded at its load before: the output is the fp32 computation with each product's inputs rounded. The
    last pooling's output is the network's, so it and the concatenation it reads stay fp32."""
    mod = inception_block()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    dtypes = {t.name.split(" ")[0]: [d for _, d in program.arg_specs(t.task)] for t in ex.tasks}
    assert dtypes["max_pool2d_bits"] == [BF16_BITS, BF16_BITS], dtypes
    assert dtypes["fused_bfloat_conv2d_relu_bf_bits"][-1] == BF16_BITS  # the stem (and the branches) store bits
    pools = sorted(name for name in dtypes if "pool" in name)
    assert pools == ["max_pool2d", "max_pool2d_bits"], pools  # the last one reads the fp32 concatenation
    x = np.random.default_rng(5).uniform(-1, 1, (1, 12, 12, 4)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)

    def max_pool(v, stride, out):
        v = np.pad(v, ((0, 0), (1, 2), (1, 2), (0, 0)), constant_values=-np.inf)
        return np.max([v[:, i:i + stride * out:stride, j:j + stride * out:stride, :]
                       for i in range(3) for j in range(3)], axis=0)

    stem = np.maximum(np_conv(bf16(x), params["w0"], 1), 0)
    p = max_pool(bf16(stem), 2, 7)  # ceil_mode: 7 rows, the last window past the padding
    cat = np.concatenate([np.maximum(np_conv(p, params["w1"], 0), 0), np.maximum(np_conv(p, params["w3"], 1), 0)], 3)
    want = np.concatenate([np.maximum(np_conv(bf16(cat), params["w4"], 0), 0), max_pool(cat, 1, 7)], 3)
    assert got.shape == want.shape == (1, 7, 7, 48)
    # Sums in another order may round a branch's element to its bf16 neighbour, which the last layer carries
    off = np.abs(got - want) > 64 * 2.0 ** -23 * np.abs(want).max()
    assert off.mean() < 0.02 and np.abs(got - want).max() <= 2.0 ** -8 * np.abs(want).max()


def narrow_layers() -> tvm.IRModule:
    """A 3x3 convolution of 24 output channels, then a dense layer of 40: neither fills whole 16-lane products."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32"))
            for name, shape in (("x", (1, 8, 8, 16)), ("w", (3, 3, 16, 24)), ("fc", (24, 40)), ("b", (40,)))]
    op = relax.op
    with bb.function("main", args):
        with bb.dataflow():
            c = bb.emit(op.nn.relu(op.nn.conv2d(args[0], args[1], padding=1, data_layout="NHWC", kernel_layout="HWIO")))
            out = bb.emit_output(op.add(op.matmul(op.reshape(c, (64, 24)), args[2]), args[3]))
        bb.emit_func_output(out)
    return bb.get()


def test_layers_of_output_channels_no_16_divide_compute_zero_channels_and_cut_them():
    """24 and 40 channels are computed as 32 and 48 in bf16 (zero weights) and cut back in the same PrimFunc:
    numpy's bf16 products; for a target with AVX512_BF16 both compile to vdpbf16ps."""
    mod = narrow_layers()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    names = sorted(t.name for t in ex.tasks)
    assert names == ["fused_bfloat_conv2d_relu [1,8,8,16]x[2,3,3,8,16,2]",
                     "fused_bfloat_dense_add [64,24]x[3,12,16,2]"], names
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 8, 16)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    c = np.maximum(np_conv(bf16(x), params["w"], 1), 0)
    want = bf16(c).reshape(64, 24) @ bf16(params["fc"]) + params["b"]
    assert got.shape == want.shape == (64, 40)
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()
    for t in extract(as_network(mod, params), AVX512_BF16, precision=BF16).tasks:
        asm = codegen.compile(program.schedule(t.task, default_state(t.task)), t.task.target).mod.inspect_source("asm")
        assert "vdpbf16ps" in asm, t.name


def test_bf16_pads_a_classifiers_channels_in_its_product_not_by_fp32s_slice():
    """On AVX-512 fp32 widens a 1000-channel convolution to 1008 and slices after it (channel_padding); in
    bf16 the product computes 1008 channels and cuts them itself, so no slice is left in the network."""
    mod = conv_network((1, 4, 4, 512), (1, 1, 512, 1000), strides=1)
    params = params_of(mod)
    fp32 = [t.name for t in extract(as_network(mod, params), AVX512_BF16, precision=Precision.FP32).tasks]
    bf = extract(as_network(mod, params), AVX512_BF16, precision=BF16).tasks
    assert any("strided_slice" in n for n in fp32), fp32
    assert [t.name for t in bf] == ["bfloat_conv2d [16,512]x[63,1,1,256,16,2]"], [t.name for t in bf]
    assert program.arg_specs(bf[0].task)[-1][0] == (16, 1000)  # the 1x1 layer flattened to a product of pixels


def grouped_layers(size: int = 6) -> tvm.IRModule:
    """RegNet's grouped 3x3 convolution (5 groups of 8 channels), then a 1x1 one of 2 groups (20 -> 16 channels
    each), then one of 4-channel groups, on ``size`` x ``size`` pixels."""
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in (
        ("x", (1, size, size, 40)), ("w1", (3, 3, 8, 40)), ("w2", (1, 1, 20, 32)), ("w3", (3, 3, 4, 32)))]
    nhwc, op = {"data_layout": "NHWC", "kernel_layout": "HWIO"}, relax.op
    with bb.function("main", args):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(op.nn.conv2d(args[0], args[1], padding=1, groups=5, **nhwc)))
            b = bb.emit(op.nn.conv2d(a, args[2], groups=2, **nhwc))
            out = bb.emit_output(op.nn.conv2d(b, args[3], padding=1, groups=8, **nhwc))
        bb.emit_func_output(out)
    return bb.get()


def grouped_conv(x: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """numpy's NHWC/HWIO grouped convolution of ``x`` (padded already) by ``w``, stride 1."""
    kh, kw, ci, co = w.shape
    h, wd = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    return np.concatenate([sum(
        x[:, i:i + h, j:j + wd, g * ci:(g + 1) * ci] @ w[i, j, :, g * co // groups:(g + 1) * co // groups]
        for i in range(kh) for j in range(kw)) for g in range(groups)], axis=-1)


def test_groups_that_tile_16_channels_are_dot_products_of_block_diagonal_weights():
    """Groups of 8 and of 16 channels become 16-channel products whose weight is zero outside each channel's
    group (40 channels as 48: the zero channels read zero inputs); groups of 4 would compute 4x their products
    and stay fp32 FMA on rounded inputs. Numerics: numpy's bf16 products; vdpbf16ps for AVX512_BF16."""
    mod = grouped_layers()
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    names = sorted(t.name.split(" ")[0] for t in ex.tasks)
    assert names == ["bfloat_group_conv2d", "fused_bfloat_group_conv2d_bf_bits",
                     "fused_bfloat_group_conv2d_relu_bf_bits"], names
    dags = {t.name.split(" ")[0]: str(t.task.compute_dag) for t in ex.tasks}
    fma = [name for name, dag in dags.items() if "group_conv_bf16" in dag]
    assert fma == ["bfloat_group_conv2d"], fma  # the 4-channel groups; the two others are conv_bf16 products
    assert all("conv_bf16" in dag for name, dag in dags.items() if name not in fma)
    x = np.random.default_rng(5).uniform(-1, 1, (1, 6, 6, 40)).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    a = np.maximum(grouped_conv(np.pad(bf16(x), pad), bf16(params["w1"]), 5), 0)
    b = grouped_conv(bf16(a), bf16(params["w2"]), 2)
    want = grouped_conv(np.pad(bf16(b), pad), bf16(params["w3"]), 8)
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()
    for t in extract(as_network(mod, params), AVX512_BF16, precision=BF16).tasks:
        if "group_conv_bf16" not in str(t.task.compute_dag):
            asm = codegen.compile(program.schedule(t.task, default_state(t.task)), t.task.target).mod
            assert "vdpbf16ps" in asm.inspect_source("asm"), t.name


def sampled_amx(task, intrin: BF16Intrin, sketches=None, count: int = 2) -> list:
    """Up to ``count`` of 8 sampled programs of ``task`` built around ``intrin`` (at least one)."""
    states = sample_initial_population(task, sketches or generate_sketches(task), 8, random.Random(0))
    chosen = [s for s in states if intrinsics_of(s) == [intrin.value]][:count]
    assert chosen, f"no {intrin.value} program sampled"
    return chosen


def runs_like_the_reference_on_amx(task, states, terms: int, form: str) -> None:
    """Skip (compile-checked only) on a CPU without AMX; else each state computes the task's unscheduled
    program's output within ``terms`` fp32 roundings."""
    if MatrixUnit.AMX not in host_cpu().matrix_units:
        pytest.skip(f"this CPU ({host_cpu().model}) has no AMX: {form} is compile-checked only")
    allow_amx()
    arrays = program.random_inputs(task)
    want = program.run_program(program.build_program(task, None), arrays)[-1]
    for state in states:
        got = program.run_program(program.build_program(task, state), arrays)[-1]
        assert np.abs(got - want).max() <= terms * 2.0 ** -23 * np.abs(want).max()


def test_an_amx_target_computes_16_channel_groups_with_two_taps_in_a_tile_row():
    """On an AMX target a stride-1 grouped convolution of 16-channel blocks reads each two taps of a row as a
    tile row's 32 channels (its weight's taps in pairs, the third's partner zero) and searches tile programs;
    where no tile's rows divide its output rows it keeps the dot products' form. Numerics where the CPU has AMX."""
    blocks = np.random.default_rng(1).standard_normal((3, 3, 16, 32)).astype(np.float32)
    pairs = paired_taps(blocks)
    assert pairs.shape == (3, 2, 32, 32)
    assert np.array_equal(pairs[:, 1, 16:], np.zeros((3, 16, 32)))  # the partner of the third tap
    assert np.array_equal(pairs[:, :, :16], blocks[:, 0::2]) and np.array_equal(pairs[:, 0, 16:], blocks[:, 1])
    mod = grouped_layers(8)
    params = params_of(mod)
    ex = extract(as_network(mod, params), AMX, precision=BF16)
    [task] = [t.task for t in ex.tasks if "relu" in t.name]  # the groups of 8: 5 groups as 3 blocks of 16
    assert ((3, 3, 2, 16, 16, 2), BF16_BITS) in program.arg_specs(task)
    sketches = generate_sketches(task)
    assert {tuple(intrinsics_of(s)) for s in sketches} == {(BF16Intrin.AMX_TILE_8x16x32.value,),
                                                           (BF16Intrin.AVX512_DOT_16x2.value,)}
    amx = sampled_amx(task, BF16Intrin.AMX_TILE_8x16x32, sketches)
    asm = codegen.compile(program.schedule(task, amx[0]), task.target).mod.inspect_source("asm")
    assert "tdpbf16ps" in asm
    narrow = extract(as_network(grouped_layers(), params), AMX, precision=BF16).tasks  # 6-pixel rows: no tile
    assert any(((3, 3, 3, 8, 16, 2), BF16_BITS) in program.arg_specs(t.task) for t in narrow)
    runs_like_the_reference_on_amx(task, amx, 96, "the paired form")  # 72 useful terms of 96
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 8, 40)).astype(np.float32)
    [got] = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=AMX), AMX), ex.network, [x], AMX)
    pad = ((0, 0), (1, 1), (1, 1), (0, 0))
    a = np.maximum(grouped_conv(np.pad(bf16(x), pad), bf16(params["w1"]), 5), 0)
    b = grouped_conv(bf16(a), bf16(params["w2"]), 2)
    want = grouped_conv(np.pad(bf16(b), pad), bf16(params["w3"]), 8)
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()


def test_an_amx_target_computes_a_strided_grouped_convolution_in_phases_with_taps_paired():
    """A stride-2 grouped 3x3 convolution of groups of 8 on an AMX target: its weight in 2 x 2 phases of 2 x 2
    taps, each phase row's two taps side by side in a tile row's 32 channels; tile programs searched, and
    numerics where the CPU has AMX (the stride-1 output, every second pixel)."""
    weight = np.random.default_rng(2).standard_normal((3, 3, 16, 32)).astype(np.float32)
    phases = phase_weight(weight, [2, 2])  # [qy, py, qx, px, K, CO]
    pairs = paired_taps(phases, axis=2)
    assert pairs.shape == (2, 2, 1, 2, 32, 32)
    assert np.array_equal(pairs[:, :, 0, :, :16], phases[:, :, 0]) and np.array_equal(pairs[:, :, 0, :, 16:],
                                                                                       phases[:, :, 1])
    mod = conv_network((1, 16, 16, 32), (3, 3, 8, 32), strides=2, padding=1, groups=4)
    params = params_of(mod)
    ex = extract(as_network(mod, params), AMX, precision=BF16)
    [task] = [t.task for t in ex.tasks]
    assert ((2, 2, 2, 1, 2, 16, 16, 2), BF16_BITS) in program.arg_specs(task)
    sketches = generate_sketches(task)
    assert (BF16Intrin.AMX_TILE_8x16x32.value,) in {tuple(intrinsics_of(s)) for s in sketches}
    amx = sampled_amx(task, BF16Intrin.AMX_TILE_8x16x32, sketches)
    runs_like_the_reference_on_amx(task, amx, 128, "the phased pairs")  # 72 useful terms of 128
    x = np.random.default_rng(5).uniform(-1, 1, (1, 16, 16, 32)).astype(np.float32)
    [got] = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=AMX), AMX), ex.network, [x], AMX)
    full = grouped_conv(np.pad(bf16(x), ((0, 0), (1, 1), (1, 1), (0, 0))), bf16(params["w"]), 4)
    want = full[:, ::2, ::2]
    assert np.abs(got - want).max() <= 64 * 2.0 ** -23 * np.abs(want).max()


# Output rows no tile divides, on AMX: (input, weight, strides, padding, the rows computed, the tile's rows).
WIDENED = {"3x3": ((1, 13, 13, 32), (3, 3, 32, 32), 1, 1, 14, 14),  # SqueezeNet's 13 as 14
           "1x7": ((1, 17, 17, 32), (1, 7, 32, 32), 1, (0, 3), 400, 16),  # Inception's: flat, 17 x 23 as 400
           "7x1": ((1, 17, 17, 32), (7, 1, 32, 32), 1, (3, 0), 304, 16),  # flat, 17 x 17 as 304
           "strided": ((1, 35, 35, 32), (3, 3, 32, 32), 2, 0, 21, 7),  # 35 to 17, in row phases, as 21
           "stem": ((1, 35, 35, 3), (3, 3, 3, 16), 2, 0, 21, 7),  # RGB taps unfolded, 17 as 21
           "1x1": ((1, 13, 13, 32), (1, 1, 32, 32), 1, 0, 176, 16)}  # 169 pixels as 176 rows


def conv2d_reference(x: np.ndarray, w: np.ndarray, strides, padding) -> np.ndarray:
    """NHWC/HWIO convolution in float64: :func:`conv3d_reference` over a unit depth."""
    strides, padding = (strides, strides) if np.isscalar(strides) else strides, np.broadcast_to(padding, 2)
    return conv3d_reference(x[:, None], w[None], (1, *strides), (0, *padding))[:, 0]


@pytest.mark.parametrize("case", WIDENED)
def test_an_amx_target_widens_rows_no_tile_divides_with_zero_columns(case):
    """A convolution on AMX whose output rows no tile divides computes them wider (its input padded with zero
    columns on the right more; a strided one in phases) in tiles and cuts its output back; a 1x1 one pads its
    pixels, as a dense layer its rows, and a stride-1 one runs over its flattened image where that takes fewer
    tiles (Inception's 1x7 and 7x1 kernels: 25 and 19 tiles of 16 where 51 of 7 took a widened row). Numerics
    where the CPU has AMX."""
    x_shape, w_shape, strides, padding, rows, tile = WIDENED[case]
    mod = conv_network(x_shape, w_shape, strides=strides, padding=padding)
    params = params_of(mod)
    ex = extract(as_network(mod, params), AMX, precision=BF16)
    [task] = [t.task for t in ex.tasks]
    assert "conv_bf16_unpadded" in str(task.compute_dag) and f"S{rows}," in str(task.compute_dag)
    intrin = BF16Intrin[f"AMX_TILE_{tile}x16x32"]
    amx = sampled_amx(task, intrin)
    runs_like_the_reference_on_amx(task, amx, 2 * np.prod(w_shape[:3]), f"the widened {case} rows")
    x = np.random.default_rng(3).uniform(-1, 1, x_shape).astype(np.float32)
    [got] = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=AMX), AMX), ex.network, [x], AMX)
    want = conv2d_reference(bf16(x), bf16(params["w"]), strides, padding)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 2 * np.prod(w_shape[:3]) * 2.0 ** -23 * np.abs(want).max()


def test_a_dilated_convolutions_rows_are_widened_by_its_output_width():
    """DeepLabV3's ASPP: a 3x3 convolution of dilation 2 over 13-pixel rows computes 14 (its padded input is
    17 wide, its output 13, as for its taps spread), and its output is the convolution's."""
    mod = conv_network((1, 13, 13, 32), (3, 3, 32, 32), strides=1, padding=2, dilation=2)
    params = params_of(mod)
    ex = extract(as_network(mod, params), AMX, precision=BF16)
    [task] = [t.task for t in ex.tasks]
    assert "S14," in str(task.compute_dag)
    amx = sampled_amx(task, BF16Intrin.AMX_TILE_14x16x32)
    runs_like_the_reference_on_amx(task, amx, 288, "the widened dilated rows")
    x = np.random.default_rng(4).uniform(-1, 1, (1, 13, 13, 32)).astype(np.float32)
    [got] = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=AMX), AMX), ex.network, [x], AMX)
    spread = np.zeros((5, 5, 32, 32), np.float32)
    spread[::2, ::2] = params["w"]
    want = conv2d_reference(bf16(x), bf16(spread), 1, 2)
    assert got.shape == want.shape == (1, 13, 13, 32)
    assert np.abs(got - want).max() <= 288 * 2.0 ** -23 * np.abs(want).max()


# A video network's stem: 3 input channels (read as 4), 3x7x7 taps, strides 1x2x2, padding 1x3x3 (R(2+1)D's
# and ResNet3D-18's), and one of its 3x3x3 convolutions of stride 2.
CONV3D = {"stem": ((1, 4, 12, 12, 3), (3, 7, 7, 3, 16), (1, 2, 2), (1, 3, 3)),
          "strided": ((1, 4, 6, 6, 16), (3, 3, 3, 16, 32), (2, 2, 2), (1, 1, 1))}


def conv3d_reference(x: np.ndarray, w: np.ndarray, strides, padding) -> np.ndarray:
    """NDHWC/DHWIO convolution in float64, a sum over the taps of strided slices times the tap's weight."""
    xp = np.pad(x.astype(np.float64), ((0, 0), *((p, p) for p in padding), (0, 0)))
    out = [(xp.shape[1 + i] - k) // s + 1 for i, (k, s) in enumerate(zip(w.shape[:3], strides))]
    return sum(xp[:, d:d + strides[0] * out[0]:strides[0], y:y + strides[1] * out[1]:strides[1],
                  z:z + strides[2] * out[2]:strides[2], :] @ w[d, y, z].astype(np.float64)
               for d, y, z in np.ndindex(*w.shape[:3]))


@pytest.mark.parametrize("case", CONV3D)
def test_a_3d_convolution_computes_bf16_inputs_with_fp32_sums(case):
    """ResNet3D-18's convolutions take the bf16 dot product as 2-D ones do: a depth tap more in the product
    and in its packed weight."""
    x_shape, w_shape, strides, padding = CONV3D[case]
    mod = conv_network(x_shape, w_shape, strides, padding)
    params = params_of(mod)
    ex, exe = default_build(mod, params, PORTABLE)
    assert [t.name for t in ex.tasks if "bfloat_conv3d" in t.name], [t.name for t in ex.tasks]
    x = np.random.default_rng(5).uniform(-1, 1, x_shape).astype(np.float32)
    [got] = run(exe, ex.network, [x], PORTABLE)
    want = conv3d_reference(bf16(x), bf16(params["w"]), strides, padding)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= np.prod(w_shape[:4]) * 2.0 ** -23 * np.abs(want).max()
    assert np.abs(got - conv3d_reference(x, params["w"], strides, padding)).max() > 1e-4  # bf16's inputs
    [task] = [t.task for t in extract(as_network(mod, params), AVX512_BF16, precision=BF16).tasks
              if "bfloat_conv3d" in t.name]
    asm = codegen.compile(program.schedule(task, default_state(task)), task.target).mod.inspect_source("asm")
    assert "vdpbf16ps" in asm


# The same two on AMX, with rows of 8 outputs (a tile's 8 rows): the stem's rows of 7 taps unfolded into A16's
# channels (21 values as 32), the strided one's input in two phases along its rows.
CONV3D_AMX = {"stem": ((1, 2, 6, 16, 3), (3, 7, 7, 3, 16), (1, 2, 2), (1, 3, 3), (1, 3, 7, 1, 16, 16, 2)),
              "strided": ((1, 3, 4, 16, 32), (3, 3, 3, 32, 32), (2, 2, 2), (1, 1, 1), (2, 3, 3, 2, 2, 16, 16, 2))}


@pytest.mark.parametrize("case", CONV3D_AMX)
def test_an_amx_target_computes_3d_stems_and_strided_3d_convolutions_in_tiles(case):
    """On an AMX target ResNet3D-18's stem reads each row of taps as one tile row's channels and its strided
    3x3x3 convolutions read their input in phases along rows: tile programs are searched (the assembly holds
    ``tdpbf16ps``), and where the CPU has AMX they compute the bf16 convolution."""
    x_shape, w_shape, strides, padding, packed = CONV3D_AMX[case]
    mod = conv_network(x_shape, w_shape, strides, padding)
    params = params_of(mod)
    ex = extract(as_network(mod, params), AMX, precision=BF16)
    [task] = [t.task for t in ex.tasks if "bfloat_conv3d" in t.name]
    assert (packed, BF16_BITS) in program.arg_specs(task)
    amx = sampled_amx(task, BF16Intrin.AMX_TILE_8x16x32)
    assert "tdpbf16ps" in codegen.compile(program.schedule(task, amx[0]), task.target).mod.inspect_source("asm")
    runs_like_the_reference_on_amx(task, amx, 2 * np.prod(w_shape[:4]), f"the 3-D {case} form")
    x = np.random.default_rng(6).uniform(-1, 1, x_shape).astype(np.float32)
    [got] = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=AMX), AMX), ex.network, [x], AMX)
    want = conv3d_reference(bf16(x), bf16(params["w"]), strides, padding)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= np.prod(w_shape[:4]) * 2.0 ** -23 * np.abs(want).max()
