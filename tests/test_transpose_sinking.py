"""Transposes moved below element-wise operators cancel against their inverse; the network's outputs do not
change, and a transpose that meets nothing stays one transpose."""

from __future__ import annotations

import numpy as np
from tvm import relax

from ansor.networks import Network, TensorSpec, build, compare_outputs
from ansor.networks.transpose_sinking import sink_transposes

TARGET = {"kind": "llvm", "num-cores": 2}
NHWC, NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
SHAPE = (1, 4, 5, 8)


def _network(body, n_inputs: int = 1) -> Network:
    """A network of NHWC inputs whose dataflow block ``body(bb, inputs)`` emits; it returns the output."""
    xs = [relax.Var(f"x{k}", relax.TensorType(SHAPE, "float32")) for k in range(n_inputs)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, xs))
        bb.emit_func_output(out)
    specs = tuple(TensorSpec(f"x{k}", SHAPE, "float32") for k in range(n_inputs))
    return Network("sinking", bb.get(), specs, (), 1, "NHWC")


def _permutes(mod) -> list[list[int]]:
    found = []

    def visit(expr) -> None:
        if getattr(getattr(expr, "op", None), "name", "") == "relax.permute_dims":
            found.append([int(a) for a in expr.attrs.axes])

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _same_outputs(net: Network, mod) -> None:
    sunk = Network(net.name, mod, net.inputs, (), 1, "NHWC")
    comparison = compare_outputs(sunk, build(mod, TARGET, fused=False), build(net.mod, TARGET, fused=False), TARGET)
    assert comparison.ok, comparison


def test_a_convnext_block_tail_loses_both_transposes():
    """``permute to NCHW -> layer scale -> residual add -> permute to NHWC`` (ConvNeXt's block after its
    linear layer), the residual itself a permute of an NHWC tensor: all in NHWC, no transpose left."""
    scale = np.random.default_rng(0).standard_normal((SHAPE[3], 1, 1)).astype("float32")

    def body(bb, xs):
        y = bb.emit(relax.op.permute_dims(xs[0], NCHW))
        residual = bb.emit(relax.op.permute_dims(xs[1], NCHW))
        scaled = bb.emit(relax.op.multiply(relax.const(scale), y))
        total = bb.emit(relax.op.nn.relu(relax.op.add(scaled, residual)))
        return bb.emit(relax.op.permute_dims(total, NHWC))

    net = _network(body, 2)
    mod = sink_transposes(net.mod)
    assert _permutes(net.mod) == [NCHW, NCHW, NHWC] and _permutes(mod) == []
    _same_outputs(net, mod)


def test_squeeze_excitation_broadcast_sinks():
    """A [1,C,1,1] gate times a [1,C,H,W] map, both permuted the same way (MobileNet-V3's SE blocks)."""

    def body(bb, xs):
        gate = bb.emit(relax.op.sigmoid(relax.op.mean(xs[0], axis=[1, 2], keepdims=True)))
        y = bb.emit(relax.op.multiply(relax.op.permute_dims(gate, NCHW), relax.op.permute_dims(xs[0], NCHW)))
        return bb.emit(relax.op.permute_dims(y, NHWC))

    net = _network(body)
    mod = sink_transposes(net.mod)
    assert _permutes(mod) == []
    _same_outputs(net, mod)


def test_an_operand_in_the_other_layout_stops_the_transpose():
    """Adding an NCHW tensor that is not a transpose would need a transpose of its own: nothing moves."""

    def body(bb, xs):
        y = bb.emit(relax.op.permute_dims(xs[0], NCHW))
        other = bb.emit(relax.op.reshape(xs[1], [SHAPE[0], SHAPE[3], SHAPE[1], SHAPE[2]]))
        return bb.emit(relax.op.add(y, other))

    net = _network(body, 2)
    mod = sink_transposes(net.mod)
    assert _permutes(mod) == [NCHW]
    _same_outputs(net, mod)


def test_consecutive_transposes_become_one():
    """NHWC -> NCHW -> NWHC is one transpose of the input; an identity one disappears."""

    def body(bb, xs):
        y = bb.emit(relax.op.permute_dims(xs[0], [0, 1, 2, 3]))
        z = bb.emit(relax.op.permute_dims(y, NCHW))
        return bb.emit(relax.op.permute_dims(z, [0, 3, 2, 1]))

    net = _network(body)
    mod = sink_transposes(net.mod)
    assert _permutes(mod) == [[0, 2, 1, 3]]
    _same_outputs(net, mod)


def test_a_transpose_nothing_undoes_stays_where_it_was():
    """ViT's query scaling sits between two transposes that do not cancel: moving it would only change
    which operators fuse, so the module is left as it was."""
    scale = np.full((1,), 0.125, "float32")

    def body(bb, xs):
        y = bb.emit(relax.op.permute_dims(xs[0], NCHW))
        scaled = bb.emit(relax.op.multiply(y, relax.const(scale)))
        return bb.emit(relax.op.permute_dims(scaled, [0, 1, 3, 2]))

    net = _network(body)
    ops = [b.value.op.name for b in sink_transposes(net.mod)["main"].body.blocks[0].bindings]
    assert ops == ["relax.permute_dims", "relax.multiply", "relax.permute_dims"]
