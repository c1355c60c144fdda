"""Row-wise PrimFuncs of any rank become one 2-D task (ansor/networks/flatten.py).

A transformer MLP block as PyTorch exports it for a ViT ([1, tokens, embed]) or a ConvNeXt
([1, H, W, channels]) and the same block on [tokens, embed] (as BERT's exporter writes it) must give the
same matmul tasks, so schedules, database records and cost-model samples of one serve the other; the
build must still compute what ONNX's reference does. Convolutions and transposes keep their loop nests.
"""

import numpy as np
import pytest
import tvm
from tvm import te

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from ansor.log.seeds import signature  # noqa: E402
from ansor.networks import apply_schedules, build, extract, load_onnx, run  # noqa: E402
from ansor.networks.flatten import flatten_func  # noqa: E402
from tvm.s_tir.meta_schedule.arg_info import ArgInfo  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}
EMBED, HIDDEN = 8, 12
RNG = np.random.default_rng(0)
WEIGHTS = {name: (RNG.standard_normal(shape) * 0.3).astype(np.float32)
           for name, shape in (("w1", (EMBED, HIDDEN)), ("b1", (HIDDEN,)), ("w2", (HIDDEN, EMBED)),
                               ("b2", (EMBED,)))}


def mlp_block(shape) -> onnx.ModelProto:
    """``x + fc2(gelu(fc1(x)))`` on ``x`` of ``shape`` (last axis EMBED), GELU with Erf as torch exports it."""
    half, root2, one = (nh.from_array(np.array(v, np.float32), n)
                        for n, v in (("half", 0.5), ("root2", 2 ** 0.5), ("one", 1.0)))
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["p1"]), h.make_node("Add", ["p1", "b1"], ["h1"]),
        h.make_node("Div", ["h1", "root2"], ["s"]), h.make_node("Erf", ["s"], ["e"]),
        h.make_node("Add", ["e", "one"], ["e1"]), h.make_node("Mul", ["h1", "e1"], ["g0"]),
        h.make_node("Mul", ["g0", "half"], ["g"]),
        h.make_node("MatMul", ["g", "w2"], ["p2"]), h.make_node("Add", ["p2", "b2"], ["h2"]),
        h.make_node("Add", ["x", "h2"], ["y"]),
    ]
    inits = [nh.from_array(v, n) for n, v in WEIGHTS.items()] + [half, root2, one]
    io = [h.make_tensor_value_info(n, TP.FLOAT, list(shape)) for n in ("x", "y")]
    graph = h.make_graph(nodes, "mlp", io[:1], io[1:], inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def extracted(m: onnx.ModelProto, tmp_path, name: str):
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    net = load_onnx(path)
    return net, extract(net, TARGET)


@pytest.mark.parametrize("shape", [(1, 6, 5, EMBED), (1, 30, EMBED), (6, 1, 5, EMBED)])
def test_mlp_block_of_any_rank_gives_the_2d_tasks_and_computes_right(shape, tmp_path):
    m = mlp_block(shape)
    net, ex = extracted(m, tmp_path, "block")
    _, twin = extracted(mlp_block((30, EMBED)), tmp_path, "twin")
    matmuls = sorted(t.workload_key for t in ex.tasks if "matmul" in t.name)
    assert len(matmuls) == 2
    assert matmuls == sorted(t.workload_key for t in twin.tasks if "matmul" in t.name)
    assert {signature(t.task) for t in ex.tasks} == {signature(t.task) for t in twin.tasks}

    x = RNG.standard_normal(shape).astype(np.float32)
    got = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET), ex.network, [x], TARGET)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    assert got[0].shape == shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_attention_batch_matmul_merges_its_batch_dimensions(tmp_path):
    """[1, heads, n, d] x [1, heads, d, n]: the two batch dimensions merge, the product stays batched."""
    heads, n, d = 2, 5, 4
    nodes = [h.make_node("MatMul", ["q", "k"], ["y"])]
    io = [h.make_tensor_value_info("q", TP.FLOAT, [1, heads, n, d]),
          h.make_tensor_value_info("k", TP.FLOAT, [1, heads, d, n]),
          h.make_tensor_value_info("y", TP.FLOAT, [1, heads, n, n])]
    m = h.make_model(h.make_graph(nodes, "qk", io[:2], io[2:]), opset_imports=[h.make_opsetid("", 17)])
    net, ex = extracted(m, tmp_path, "qk")
    (task,) = ex.tasks
    assert [list(a.shape) for a in ArgInfo.from_prim_func(task.task.func)] == \
        [[heads, n, d], [heads, d, n], [heads, n, n]]
    q = RNG.standard_normal((1, heads, n, d)).astype(np.float32)
    k = RNG.standard_normal((1, heads, d, n)).astype(np.float32)
    got = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET), ex.network, [q, k], TARGET)
    np.testing.assert_allclose(got[0], q @ k, rtol=1e-5, atol=1e-5)


def _prim_func(*tensors: te.Tensor) -> tvm.tirx.PrimFunc:
    return te.create_prim_func(list(tensors))


def test_convolutions_and_transposes_keep_their_loop_nests():
    """A 1x1 convolution would merge cleanly but has three reduction axes: it stays 4-D, so the schedules
    tuned for convolutions keep applying. A transpose of the leading dimensions cannot merge them."""
    data = te.placeholder((1, 7, 7, 16), name="data")
    weight = te.placeholder((1, 1, 16, 8), name="weight")
    rh, rw, rc = (te.reduce_axis((0, e), name=n) for e, n in ((1, "rh"), (1, "rw"), (16, "rc")))
    conv = te.compute((1, 7, 7, 8), lambda n, y, x, c: te.sum(
        data[n, y + rh, x + rw, rc] * weight[rh, rw, rc, c], axis=[rh, rw, rc]), name="conv2d_nhwc")
    assert flatten_func(_prim_func(data, weight, conv)) is None
    batch = te.placeholder((2, 7, 7, 16), name="batch")
    transposed = te.compute((2, 7, 7, 16), lambda n, x, y, c: batch[n, y, x, c], name="T_transpose")
    assert flatten_func(_prim_func(batch, transposed)) is None
    rk = te.reduce_axis((0, 16), name="rk")
    row_sum = te.compute((1, 7, 7), lambda n, y, x: te.sum(data[n, y, x, rk], axis=rk), name="sum")
    centred = te.compute((1, 7, 7, 16), lambda n, y, x, c: data[n, y, x, c] - row_sum[n, y, x] / 16.0,
                         name="T_subtract")
    merged = flatten_func(_prim_func(data, centred))
    assert [list(a.shape) for a in ArgInfo.from_prim_func(merged)] == [[49, 16], [49, 16]]
