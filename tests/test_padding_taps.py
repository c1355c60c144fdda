"""Convolutions that mostly read padding: which are cut into regions, and that the network computes the same
outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from tvm import relax

from ansor.networks import Network, TensorSpec, apply_schedules, build, compare_outputs, extract
from ansor.networks.padding_taps import MAX_USEFUL_SHARE_BF16, bands, skip_padding_taps, useful_share
from ansor.networks.prepare import prepare

TARGET = {"kind": "llvm", "num-cores": 2}


def test_bands_follow_the_taps_in_bounds():
    """DeepLabV3's ASPP on a 33x33 map: dilation 24 cuts each dimension in three, dilation 36 leaves only
    the centre tap; a 3x3 convolution with padding 1 on a 7x7 map computes 82 % useful products."""
    b24 = bands(33, 3, 24, 24, 33)
    assert [(b.start, b.stop, b.first, b.last) for b in b24] == [(0, 9, 1, 2), (9, 24, 1, 1), (24, 33, 0, 1)]
    assert useful_share(b24, b24, (3, 3)) == pytest.approx((51 / 99) ** 2)
    b36 = bands(33, 3, 36, 36, 33)
    assert [(b.start, b.stop, b.first, b.last) for b in b36] == [(0, 33, 1, 1)]
    b7 = bands(7, 3, 1, 1, 7)
    assert useful_share(b7, b7, (3, 3)) == pytest.approx((19 / 21) ** 2)


def _dilated_network(shape, dilation, padding, channels=8) -> Network:
    """A dilated 3x3 convolution with bias and ReLU, as DeepLabV3's ASPP branches are."""
    n, h, w, c = shape
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w1 = relax.Var("w1", relax.TensorType((3, 3, c, channels), "float32"))
    b1 = relax.Var("b1", relax.TensorType((1, 1, 1, channels), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w1, b1]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=padding, dilation=dilation, data_layout="NHWC",
                                           kernel_layout="HWIO"))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, b1)))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    specs = (TensorSpec("w1", (3, 3, c, channels), "float32"), TensorSpec("b1", (1, 1, 1, channels), "float32"))
    return Network("dilated", bb.get(), (TensorSpec("x", shape, "float32"),), specs, n, "NHWC",
                   param_factory=lambda: {s.name: rng.standard_normal(s.shape).astype("float32") for s in specs})


@pytest.mark.parametrize("shape,dilation,padding,convs", [
    ((1, 9, 9, 16), 6, (6, 6, 6, 6), 9),  # three bands a dimension
    ((2, 9, 11, 16), (12, 3), (12, 3, 12, 4), 4),  # rows: the centre tap only; columns asymmetric
    ((1, 5, 5, 16), 5, (5, 5, 5, 5), 1),  # the centre tap only: a 1x1 convolution
])
@pytest.mark.slow
def test_network_with_padding_taps_skipped_computes_the_same_outputs(shape, dilation, padding, convs):
    net = _dilated_network(shape, dilation, padding)
    kernels = []

    def visit(expr) -> None:
        if getattr(getattr(expr, "op", None), "name", "") == "relax.nn.conv2d":
            kernels.append([int(d) for d in expr.args[1].ty.shape][:2])

    relax.analysis.post_order_visit(prepare(net).mod["main"], visit)
    assert len(kernels) == convs and all(h * w < 9 for h, w in kernels), kernels
    ex = extract(net, TARGET)
    executable = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    comparison = compare_outputs(ex.network, executable, build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison


def test_convolutions_that_read_their_input_stay_whole():
    x = relax.Var("x", relax.TensorType((1, 33, 33, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((3, 3, 16, 8), "float32")), padding=12,
                                           dilation=12, data_layout="NHWC", kernel_layout="HWIO"))
            out = bb.emit_output(relax.op.nn.conv2d(y, relax.const(np.ones((3, 3, 8, 8), "float32")), padding=1,
                                                    data_layout="NHWC", kernel_layout="HWIO"))
        bb.emit_func_output(out)
    mod = bb.get()
    assert tvm_ffi.structural_equal(skip_padding_taps(mod)["main"], mod["main"])  # 57 % and 97 % useful
    bf16 = skip_padding_taps(mod, MAX_USEFUL_SHARE_BF16)  # bf16's region kernels are half the bytes
    assert not tvm_ffi.structural_equal(bf16["main"], mod["main"])
    assert "R.concat" in str(bf16["main"]) and str(bf16["main"]).count("R.nn.conv2d") == 1 + 9  # 3x3 regions
