"""Winograd F(2x2, 3x3) convolutions: which are rewritten, and that the network computes the same outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from ansor.networks import Network, TensorSpec, apply_schedules, build, compare_outputs, extract
from ansor.networks.winograd import transform_weight, winograd_convs

TARGET = {"kind": "llvm", "num-cores": 2}


def _conv_network(shape=(1, 7, 9, 16), channels=24, padding=(1, 1, 1, 1)) -> Network:
    """A 3x3 stride-1 convolution with bias and ReLU, then a 3x3 stride-2 one (which stays direct)."""
    n, h, w, c = shape
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w1 = relax.Var("w1", relax.TensorType((3, 3, c, channels), "float32"))
    b1 = relax.Var("b1", relax.TensorType((1, 1, 1, channels), "float32"))
    w2 = relax.Var("w2", relax.TensorType((3, 3, channels, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w1, b1, w2]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=padding, data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, b1)))
            z = bb.emit(relax.op.nn.conv2d(y, w2, strides=2, data_layout="NHWC", kernel_layout="HWIO"))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    specs = (TensorSpec("w1", (3, 3, c, channels), "float32"), TensorSpec("b1", (1, 1, 1, channels), "float32"),
             TensorSpec("w2", (3, 3, channels, 8), "float32"))
    return Network("conv", bb.get(), (TensorSpec("x", shape, "float32"),), specs, n, "NHWC",
                   param_factory=lambda: {s.name: (rng.standard_normal(s.shape) * 0.2).astype("float32")
                                          for s in specs})


@pytest.mark.parametrize("shape,padding", [((1, 7, 9, 16), (1, 1, 1, 1)), ((2, 6, 5, 16), (0, 1, 2, 0))])
@pytest.mark.slow
def test_winograd_network_computes_the_same_outputs(shape, padding):
    """Odd and even sizes, asymmetric padding, a batch of 2: the stride-1 convolution becomes the three
    Winograd tasks (epilogue fused into the output transform), the stride-2 one stays, outputs are equal."""
    net = _conv_network(shape, padding=padding)
    ex = extract(net, TARGET)
    names = sorted(t.name for t in ex.tasks)
    assert any(n.startswith("winograd_input ") for n in names), names
    assert any(n.startswith("fused_winograd_output_add_relu ") for n in names), names
    assert any(n.startswith("matmul [16,") and n.endswith(",16]x[16,16,24]") for n in names), names
    assert [n for n in names if "conv2d" in n] == [f"conv2d [{shape[0]},{shape[1] + padding[0] + padding[2] - 2},"
                                                   f"{shape[2] + padding[1] + padding[3] - 2},24]x[3,3,24,8]"]
    executable = build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET)
    comparison = compare_outputs(ex.network, executable, build(net.mod, TARGET, fused=False), TARGET,
                                 reference_network=net)
    assert comparison.ok, comparison


def test_transformed_weight_is_a_constant_of_the_module():
    """``U = G g G^T`` is computed at preparation, not per inference: the product reads a [16, CI, CO]
    constant equal to numpy's transform, and no function of the module reads the 3x3 weight."""
    net = _conv_network()
    ex = extract(net, TARGET)
    w1 = net.params["w1"]
    constants = []
    relax.analysis.post_order_visit(ex.mod["main"], lambda e: constants.append(e.value.numpy())
                                    if isinstance(getattr(e, "value", None), tvm.runtime.Tensor) else None)
    assert any(c.shape == (16, 16, 24) and np.array_equal(c, transform_weight(w1)) for c in constants)
    assert not any(c.shape == w1.shape for c in constants)


@pytest.mark.parametrize("change", ["stride", "groups", "thin", "weight argument", "nchw"])
def test_other_convolutions_stay_direct(change):
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8) if change == "nchw" else (1, 8, 8, 32), "float32"))
    weight = np.zeros((3, 3, 8 if change == "thin" else 16 if change == "groups" else 32, 32), "float32")
    kw = {"data_layout": "NHWC", "kernel_layout": "HWIO", "padding": (1, 1)}
    params = [x]
    if change == "stride":
        kw["strides"] = 2
    elif change == "groups":
        kw["groups"] = 2
    elif change == "thin":
        x = relax.Var("x", relax.TensorType((1, 8, 8, 8), "float32"))
        params = [x]
    elif change == "nchw":
        kw.update(data_layout="NCHW", kernel_layout="OIHW")
        weight = np.zeros((32, 3, 3, 3), "float32")
    w = relax.const(weight)
    if change == "weight argument":
        w = relax.Var("w", relax.TensorType(weight.shape, "float32"))
        params.append(w)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, w, **kw))
        bb.emit_func_output(out)
    mod = bb.get()
    assert tvm_ffi.structural_equal(winograd_convs(mod)["main"], mod["main"])


def test_winograd_can_be_switched_off():
    names = sorted(t.name for t in extract(_conv_network(), TARGET, winograd=False).tasks)
    assert not any("winograd" in n for n in names)
    assert "fused_conv2d_add_relu [1,7,9,16]x[3,3,16,24]" in names, names
