"""The layer classes of ``scripts/bench/bench_layers.py``: a convolution by its kernel and grouping, read from
the names of really extracted tasks (fp32 and bf16 layouts) and from an ONNX graph's nodes, as OpenVINO
names them."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from tvm import relax

from ansor.bench.layers import ClassTimes, compare, onnx_classes, ov_node_class, table, task_class
from ansor.networks import extract
from ansor.relax import as_network
from ansor.task.precision import Precision

PORTABLE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
AVX512_BF16 = {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu", "num-cores": 2}


def layers_network():
    """3x3, 1x1, depthwise 3x3 and grouped 3x3 (8 channels a group) NHWC convolutions, then a dense layer."""
    bb = relax.BlockBuilder()
    shapes = {"x": (1, 14, 14, 32), "w3": (3, 3, 32, 32), "w1": (1, 1, 32, 64), "wd": (3, 3, 1, 64),
              "wg": (3, 3, 8, 64), "fc": (64, 16)}
    args = {n: relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items()}
    conv = relax.op.nn.conv2d
    with bb.function("main", list(args.values())):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(conv(args["x"], args["w3"], padding=1, data_layout="NHWC",
                                              kernel_layout="HWIO")))
            y = bb.emit(relax.op.nn.relu(conv(y, args["w1"], data_layout="NHWC", kernel_layout="HWIO")))
            y = bb.emit(relax.op.nn.relu(conv(y, args["wd"], padding=1, groups=64, data_layout="NHWC",
                                              kernel_layout="HWIO")))
            y = bb.emit(relax.op.nn.relu(conv(y, args["wg"], padding=1, groups=8, data_layout="NHWC",
                                              kernel_layout="HWIO")))
            y = bb.emit(relax.op.mean(y, axis=[1, 2]))
            y = bb.emit_output(relax.op.matmul(y, args["fc"]))
        bb.emit_func_output(y)
    mod = bb.get()
    rng = np.random.default_rng(0)
    params = {v.name: rng.uniform(-0.5, 0.5, [int(d) for d in v.ty.shape.values]).astype("float32")
              for v in mod["main"].params[1:]}
    return as_network(mod, params)


COMMON = ["conv 1x1", "conv 3x3 depthwise", "conv 3x3 grouped", "matmul", "other"]  # other: the mean


@pytest.mark.parametrize("target, precision, classes", [
    (PORTABLE, Precision.FP32, COMMON + ["matmul", "winograd transforms", "winograd transforms"]),  # fp32 3x3: Winograd
    (AVX512_BF16, Precision.BF16, COMMON + ["conv 3x3"])])
def test_extracted_tasks_fall_in_their_kernels_classes(target, precision, classes):
    ex = extract(layers_network(), target, precision=precision)
    assert sorted(task_class(t.name) for t in ex.tasks) == sorted(classes), [t.name for t in ex.tasks]


def test_onnx_nodes_and_openvinos_names_of_them_get_the_same_classes():
    onnx = pytest.importorskip("onnx", reason="the zoo extra's onnx reads the graph")
    from onnx import TensorProto, helper, numpy_helper
    weights = {"w3": (16, 16, 3, 3), "wd": (16, 1, 3, 3), "wg": (16, 4, 3, 3), "w1": (16, 16, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a"], name="/c3/Conv", pads=[1] * 4),
             helper.make_node("Conv", ["a", "wd"], ["b"], name="/dw/Conv", group=16, pads=[1] * 4),
             helper.make_node("Conv", ["b", "wg"], ["c"], name="/g/Conv", group=4, pads=[1] * 4),
             helper.make_node("Conv", ["c", "w1"], ["d"], name="/c1/Conv"),
             helper.make_node("MaxPool", ["d"], ["y"], name="/pool", kernel_shape=[2, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros(s, "float32"), n) for n, s in weights.items()])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(helper.make_model(graph), path)
        classes = onnx_classes(path)
    assert classes == {"/c3/Conv": "conv 3x3", "/dw/Conv": "conv 3x3 depthwise", "/g/Conv": "conv 3x3 grouped",
                       "/c1/Conv": "conv 1x1", "/pool": "pool"}
    assert ov_node_class("/c3/Conv/WithoutBiases", "Convolution", classes) == "conv 3x3"
    assert ov_node_class("/fc/MatMul_fused", "FullyConnected", classes) == "matmul"
    assert ov_node_class("/act", "Eltwise", classes) == "other"


def test_classes_are_medians_over_rounds_with_their_ratio():
    ours = [{"conv 1x1": [4, 2.0], "other": [0, 0.5]}, {"conv 1x1": [4, 3.0]}, {"conv 1x1": [4, 2.2]}]
    theirs = [{"conv 1x1": [4, 2.0]}, {"conv 1x1": [4, 1.0]}, {"conv 1x1": [4, 1.1]}]
    rows = compare(ours, theirs)
    assert rows[0] == ClassTimes("conv 1x1", 4, 2.2, 4, 1.1)
    assert rows[-1].name == "other" and rows[-1].ansor_ms == 0.0
    assert "| conv 1x1 | 4 | 2.200 | 4 | 1.100 | 2.00 |" in table(rows, "OpenVINO")
