"""Convolutions whose output channels fill no whole number of vectors: which are widened, for which vector
width, and that the network computes the same outputs."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from ansor.networks import Network, TensorSpec, apply_schedules, build, compare_outputs, extract
from ansor.networks.channel_padding import pad_output_channels, padded_channels

TARGET = {"kind": "llvm", "num-cores": 2}


def _conv_network(shape, kernel, channels) -> Network:
    """A convolution with bias and ReLU, its weights constants (as :func:`prepare` binds them)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    weight = rng.standard_normal((*kernel, shape[3], channels)).astype("float32")
    bias = rng.standard_normal((1, 1, 1, channels)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=kernel[0] // 2, data_layout="NHWC",
                                           kernel_layout="HWIO"))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, relax.const(bias))))
        bb.emit_func_output(out)
    return Network("conv", bb.get(), (TensorSpec("x", shape, "float32"),), (), shape[0], "NHWC")


def _conv_channels(mod) -> list[int]:
    found = []

    def visit(expr) -> None:
        if getattr(getattr(expr, "op", None), "name", "") == "relax.nn.conv2d":
            found.append(int(expr.args[1].ty.shape[3]))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


@pytest.mark.parametrize("shape,kernel,channels,vector_bytes,widened", [
    ((1, 5, 5, 256), (1, 1), 136, 64, 144),  # 16 float lanes: 136 = 8 x 17 -> 144, 5.9 % more
    ((1, 5, 5, 256), (1, 1), 136, 32, 136),  # 8 lanes divide 136 already
    ((1, 5, 5, 256), (1, 1), 120, 64, 120),  # 120 -> 128 would add 6.7 %
    ((1, 5, 5, 16), (3, 3), 136, 64, 136),  # a reduction of 144: the slice would cost what the vectors gain
    ((1, 3, 3, 256), (1, 1), 136, 64, 136),  # 9 output pixels: bound by reading the weights
])
def test_which_convolutions_are_widened(shape, kernel, channels, vector_bytes, widened):
    mod = pad_output_channels(_conv_network(shape, kernel, channels).mod, vector_bytes)
    assert _conv_channels(mod) == [widened]
    assert [int(d) for d in mod["main"].ret_ty.shape] == [*shape[:3], channels]


def test_padded_channels():
    assert [padded_channels(c, 16) for c in (1000, 1008, 440, 1)] == [1008, 1008, 448, 16]


def test_widened_network_computes_the_same_outputs():
    """Widened for 16-float vectors whatever this CPU has: the program is valid on any."""
    net = _conv_network((1, 6, 5, 256), (3, 3), 136)
    wide = pad_output_channels(net.mod, 64)
    assert _conv_channels(wide) == [144]
    ex = extract(Network("wide", wide, net.inputs, (), 1, "NHWC"), TARGET)
    executable = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    comparison = compare_outputs(ex.network, executable, build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison


@pytest.mark.parametrize("mcpu,widened", [("skylake-avx512", True), ("haswell", False)])
def test_extract_widens_for_the_targets_vector_width(mcpu, widened):
    """1000 channels: 8 x 125, a whole number of AVX2's 8-float vectors, not of AVX-512's 16."""
    ex = extract(_conv_network((1, 13, 13, 512), (1, 1), 1000), {"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert any("x[1,1,512,1008]" in t.name for t in ex.tasks) == widened, [t.name for t in ex.tasks]
