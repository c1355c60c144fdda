"""The shape computations of torchvision's ViT, Swin and SSDlite exports import, build and compute right.

Each graph is a few nodes built with onnx.helper in the form ``torch.onnx.export`` (opset 17) gives the
model: ViT's ``unflatten`` of the fused QKV projection (a ``Reshape`` whose shape is sliced from ``Shape``
at ends computed by ``Mod``), Swin's window padding (``F.pad`` with pads computed from the feature map's
shape, and its shifted-window mask written by ``ScatterND`` into zeros), and SSDlite's pre- and
post-processing before its thresholds (a ``Resize`` to a computed size, padding to a multiple of the
stride, anchors from ``Range``, boxes clipped by ``Min``/``Max`` with tensor bounds, ``TopK`` with a
computed ``k``). TVM's importer fails on each unfolded graph; ``load_onnx`` imports it, and the default
build of the extracted (prepared, NHWC) module matches ONNX's numpy reference implementation run on the
original graph. What cannot be compiled with static shapes (non-maximum suppression, ``NonZero``) and an
operator TVM lacks are refused in one line naming the operator.
"""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package is not installed (pip install 'ansor[onnx]')")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from ansor.networks import NetworkError, apply_schedules, build, extract, load_onnx, run  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
RNG = np.random.default_rng(0)


def const(name: str, value, dtype=np.int64) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(value, dtype=dtype), name))


def model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "pattern", inputs, outputs, list(initializers))
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def tensor(name: str, shape, elem=TP.FLOAT):
    return h.make_tensor_value_info(name, elem, shape)


def tvm_cannot_import(m: onnx.ModelProto, shapes: dict) -> None:
    from tvm.relax.frontend.onnx import from_onnx
    with pytest.raises(Exception):
        from_onnx(m, shape_dict=shapes, keep_params_in_input=True)


def import_build_and_compare(m: onnx.ModelProto, feeds: dict, tmp_path, rtol=1e-5, atol=1e-5):
    """load_onnx -> extract -> default schedules -> build -> run, against onnx.reference on ``m`` itself."""
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    net = load_onnx(path)
    ex = extract(net, TARGET)
    got = run(build(apply_schedules(ex.mod, ex.tasks, {}, target=TARGET), TARGET), ex.network,
              [feeds[s.name] for s in net.inputs], TARGET)
    want = ReferenceEvaluator(m).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return net


# --------------------------------------------------------------------------------------------- ViT
def vit_unflatten() -> onnx.ModelProto:
    """``F.linear(x, w, b).unflatten(-1, (3, E))`` as exported: shape[:dim] + [3, E] + shape[dim + 1:] with
    ``dim = 2 % 3`` computed by ``Mod`` (torch normalises the dimension in the graph)."""
    tokens, embed = 5, 8
    w = nh.from_array((RNG.standard_normal((embed, 3 * embed)) * 0.3).astype(np.float32), "w_qkv")
    b = nh.from_array(RNG.standard_normal(3 * embed).astype(np.float32), "b_qkv")
    nodes = [
        h.make_node("Transpose", ["x"], ["tokens_first"], perm=[1, 0, 2]),
        h.make_node("MatMul", ["tokens_first", "w_qkv"], ["proj"]),
        h.make_node("Add", ["b_qkv", "proj"], ["qkv"]),
        const("split", [3, embed]), const("dim_in", [2]), const("rank", [3]),
        h.make_node("Mod", ["dim_in", "rank"], ["dim"]),
        h.make_node("Shape", ["qkv"], ["shape"]),
        const("zero", [0]), const("one", [1]), const("end", [I64_MAX]),
        h.make_node("Reshape", ["dim", "one"], ["dim1"]),
        h.make_node("Slice", ["shape", "zero", "dim1"], ["head"]),
        h.make_node("Add", ["dim", "one"], ["after"]),
        h.make_node("Reshape", ["after", "one"], ["after1"]),
        h.make_node("Slice", ["shape", "after1", "end"], ["tail"]),
        h.make_node("Concat", ["head", "split", "tail"], ["new_shape"], axis=0),
        h.make_node("Reshape", ["qkv", "new_shape"], ["unflat"]),
        h.make_node("Transpose", ["unflat"], ["y"], perm=[2, 0, 1, 3]),
    ]
    return model(nodes, [tensor("x", [1, tokens, embed])], [tensor("y", [3, tokens, 1, embed])], [w, b])


def test_vit_unflatten_reshape_imports_and_matches(tmp_path):
    m = vit_unflatten()
    net = import_build_and_compare(m, {"x": RNG.standard_normal((1, 5, 8)).astype(np.float32)}, tmp_path)
    assert net.inputs[0].shape == (1, 5, 8)


# -------------------------------------------------------------------------------------------- Swin
def swin_pad_and_mask(window: int = 4) -> onnx.ModelProto:
    """``F.pad(x, (0, 0, 0, pad_r, 0, pad_b))`` with ``pad_r = (window - W % window) % window`` (NHWC),
    as exported, plus a shifted-window style mask: zeros of the padded shape with a region set by ScatterND."""
    nodes = [
        h.make_node("Shape", ["x"], ["shape"]),
        const("i1", 1), const("i2", 2), const("win", window), const("ax0", [0]),
        h.make_node("Gather", ["shape", "i1"], ["H"], axis=0),
        h.make_node("Gather", ["shape", "i2"], ["W"], axis=0),
    ]
    for side, dim in (("b", "H"), ("r", "W")):
        nodes += [h.make_node("Mod", [dim, "win"], [f"m_{side}"]),
                  h.make_node("Sub", ["win", f"m_{side}"], [f"s_{side}"]),
                  h.make_node("Mod", [f"s_{side}", "win"], [f"pad_{side}"]),
                  h.make_node("Unsqueeze", [f"pad_{side}", "ax0"], [f"pad_{side}1"])]
    nodes += [
        const("z1", [0]), const("rank8", [8]), const("pairs", [-1, 2]), const("flat", [-1]),
        const("rs", [-1]), const("re", [I64_MIN]), const("rstep", [-1]),
        # torch's pad list (last dimension first), then the exporter's reversal into ONNX's begin/end order
        h.make_node("Concat", ["z1", "z1", "z1", "pad_r1", "z1", "pad_b1"], ["torch_pads"], axis=0),
        h.make_node("Shape", ["torch_pads"], ["n_pads"]),
        h.make_node("Sub", ["rank8", "n_pads"], ["n_rest"]),
        h.make_node("ConstantOfShape", ["n_rest"], ["rest"], value=nh.from_array(np.array([0], np.int64))),
        h.make_node("Concat", ["torch_pads", "rest"], ["all_pads"], axis=0),
        h.make_node("Reshape", ["all_pads", "pairs"], ["pad_pairs"]),
        h.make_node("Slice", ["pad_pairs", "rs", "re", "ax0", "rstep"], ["reversed"]),
        h.make_node("Transpose", ["reversed"], ["begin_end"], perm=[1, 0]),
        h.make_node("Reshape", ["begin_end", "flat"], ["pads64"]),
        h.make_node("Cast", ["pads64"], ["pads"], to=TP.INT64),
        h.make_node("Pad", ["x", "pads"], ["padded"], mode="constant"),
        # the mask: zeros(1, Hp, Wp, 1) with its last window row set, as Swin's img_mask[:, h, w, :] = cnt
        h.make_node("Shape", ["padded"], ["pshape"]),
        const("s0", [0]), const("s3", [3]), const("one1", [1]),
        h.make_node("Slice", ["pshape", "s0", "s3"], ["hw"]),
        h.make_node("Concat", ["hw", "one1"], ["mshape"], axis=0),
        h.make_node("ConstantOfShape", ["mshape"], ["zeros"], value=nh.from_array(np.array([0.0], np.float32))),
        const("rows", [[0, r] for r in range(8 - window // 2, 8)]),
        const("cnt", np.full((window // 2, 8, 1), 2.0), np.float32),
        h.make_node("ScatterND", ["zeros", "rows", "cnt"], ["mask"]),
        h.make_node("Add", ["padded", "mask"], ["y"]),
    ]
    return model(nodes, [tensor("x", [1, 7, 6, 3])], [tensor("y", [1, 8, 8, 3])])


def test_swin_computed_pads_and_scattered_mask_import_and_match(tmp_path):
    m = swin_pad_and_mask()
    tvm_cannot_import(m, {"x": [1, 7, 6, 3]})
    x = RNG.standard_normal((1, 7, 6, 3)).astype(np.float32)
    import_build_and_compare(m, {"x": x}, tmp_path)
    want = np.pad(x, [(0, 0), (0, 1), (0, 2), (0, 0)])
    want[:, 6:] += 2.0
    np.testing.assert_allclose(ReferenceEvaluator(m).run(None, {"x": x})[0], want)  # the reference is right


# ----------------------------------------------------------------------------------------- SSDlite
def ssd_dense(size: int = 16, stride: int = 2, channels: int = 8, topk: int = 5) -> onnx.ModelProto:
    """SSDlite up to its thresholds: normalise, resize to a computed size, pad to a multiple of 8, a
    convolution as backbone + head, anchors from Range, boxes clipped by Min/Max, TopK with k = min(n, topk)."""
    feat = size // stride
    anchors_per_cell = channels // 4
    conv_w = nh.from_array((RNG.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "conv_w")
    nodes = [
        const("mean", np.full((3, 1, 1), 0.45), np.float32), const("std", np.full((3, 1, 1), 0.225), np.float32),
        h.make_node("Sub", ["image", "mean"], ["centred"]),
        h.make_node("Div", ["centred", "std"], ["normal"]),
        const("ax0", [0]),
        h.make_node("Unsqueeze", ["normal", "ax0"], ["batch"]),
        # Resize to (size, size): sizes = shape[:2] + [size, size]
        h.make_node("Shape", ["batch"], ["bshape"]),
        const("s0", [0]), const("s2", [2]), const("hw", [size, size]),
        h.make_node("Slice", ["bshape", "s0", "s2"], ["nc"]),
        h.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        h.make_node("Resize", ["batch", "", "", "sizes"], ["resized"], mode="linear",
                    coordinate_transformation_mode="half_pixel"),
        # batch_images: pad to ceil(max(sizes) / 8) * 8 (here from 16 to 16: nothing) + 2 rows for the test
        const("sizes_hw", [[size, size]]), const("eight", 8.0, np.float32), const("extra", 2),
        h.make_node("ReduceMax", ["sizes_hw"], ["longest"], keepdims=0, axes=[0, 1]),
        h.make_node("Cast", ["longest"], ["longest_f"], to=TP.FLOAT),
        h.make_node("Div", ["longest_f", "eight"], ["blocks"]),
        h.make_node("Ceil", ["blocks"], ["blocks_up"]),
        h.make_node("Mul", ["blocks_up", "eight"], ["padded_f"]),
        h.make_node("Cast", ["padded_f"], ["padded_len"], to=TP.INT64),
        h.make_node("Sub", ["padded_len", "longest"], ["pad0"]),
        h.make_node("Add", ["pad0", "extra"], ["pad_h"]),
        h.make_node("Unsqueeze", ["pad_h", "ax0"], ["pad_h1"]),
        const("z6", [0, 0, 0, 0, 0, 0]), const("z1", [0]),
        h.make_node("Concat", ["z6", "pad_h1", "z1"], ["pads"], axis=0),
        h.make_node("Pad", ["resized", "pads"], ["images"]),
        # backbone + head: one stride-2 convolution; its output viewed as (N, -1, 4) box regressions
        h.make_node("Conv", ["images", "conv_w"], ["fmap"], kernel_shape=[3, 3], strides=[stride, stride],
                    pads=[1, 1, 1, 1]),
        h.make_node("Shape", ["fmap"], ["fshape"]),
        const("i0", 0), const("i2", 2), const("i3", 3), const("minus1", [-1]), const("four", [4]),
        h.make_node("Gather", ["fshape", "i0"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        h.make_node("Concat", ["n1", "minus1", "four"], ["box_shape"], axis=0),
        h.make_node("Transpose", ["fmap"], ["fmap_nhwc"], perm=[0, 2, 3, 1]),
        h.make_node("Reshape", ["fmap_nhwc", "box_shape"], ["regression"]),
        # anchors: a grid of cell corners from Range over the feature map's height and width
        h.make_node("Gather", ["fshape", "i2"], ["fh"], axis=0),
        h.make_node("Gather", ["fshape", "i3"], ["fw"], axis=0),
        const("r0", 0), const("r1", 1), const("stride_f", float(stride), np.float32),
        h.make_node("Range", ["r0", "fh", "r1"], ["ys"]),
        h.make_node("Range", ["r0", "fw", "r1"], ["xs"]),
        h.make_node("Cast", ["ys"], ["ys_f"], to=TP.FLOAT),
        h.make_node("Cast", ["xs"], ["xs_f"], to=TP.FLOAT),
        h.make_node("Mul", ["ys_f", "stride_f"], ["ys_px"]),
        h.make_node("Mul", ["xs_f", "stride_f"], ["xs_px"]),
        h.make_node("Unsqueeze", ["fh", "ax0"], ["fh1"]),
        h.make_node("Unsqueeze", ["fw", "ax0"], ["fw1"]),
        h.make_node("Concat", ["fh1", "fw1"], ["grid_shape"], axis=0),
        const("ax1", [1]),
        h.make_node("Unsqueeze", ["ys_px", "ax1"], ["ys_col"]),
        h.make_node("Expand", ["ys_col", "grid_shape"], ["grid_y"]),
        h.make_node("Expand", ["xs_px", "grid_shape"], ["grid_x"]),
        h.make_node("Reshape", ["grid_y", "minus1"], ["cy"]),
        h.make_node("Reshape", ["grid_x", "minus1"], ["cx"]),
        h.make_node("Unsqueeze", ["cx", "ax1"], ["cx1"]),
        h.make_node("Unsqueeze", ["cy", "ax1"], ["cy1"]),
        h.make_node("Concat", ["cx1", "cy1", "cx1", "cy1"], ["corners"], axis=1),
        const("tiles", [anchors_per_cell, 1]),
        h.make_node("Tile", ["corners", "tiles"], ["anchors"]),
        h.make_node("Add", ["regression", "anchors"], ["boxes_raw"]),
        # clip_boxes_to_image with tensor bounds: Max(boxes, 0) then Min(boxes, size)
        const("lo", np.zeros(4), np.float32), const("hi", np.full(4, float(size)), np.float32),
        h.make_node("Max", ["boxes_raw", "lo"], ["boxes_lo"]),
        h.make_node("Min", ["boxes_lo", "hi"], ["boxes"]),
        # scores: the best topk regressions by their first coordinate, k = min(boxes, topk)
        h.make_node("Gather", ["boxes", "i0"], ["first"], axis=2),
        h.make_node("Shape", ["first"], ["first_shape"]),
        const("topk", [topk]),
        h.make_node("Slice", ["first_shape", "ax1", "s2"], ["count"]),
        h.make_node("Min", ["count", "topk"], ["k"]),
        h.make_node("TopK", ["first", "k"], ["best", "best_index"], axis=1),
    ]
    n_boxes = (size + 2) // stride * feat * anchors_per_cell  # the padded height has 2 more rows
    return model(nodes, [tensor("image", [3, 12, 20])],
                 [tensor("boxes", [1, n_boxes, 4]),
                  tensor("best", [1, topk])], [conv_w])


def test_ssd_preprocessing_anchors_clipping_and_topk_import_and_match(tmp_path):
    m = ssd_dense()
    tvm_cannot_import(m, {"image": [3, 12, 20]})
    image = RNG.random((3, 12, 20)).astype(np.float32)
    net = import_build_and_compare(m, {"image": image}, tmp_path)
    assert "stack" not in str(net.mod)  # variadic Min/Max as element-wise minimum/maximum (see onnx_import)


# ---------------------------------------------------------------------------------------- refused
def detector_postprocessing() -> onnx.ModelProto:
    """torchvision's postprocess_detections in small: scores above a threshold (NonZero), then NMS inside an
    If's branch (``batched_nms`` returns early when there are no boxes)."""
    nms_branch = h.make_graph(
        [const("max_out", [10]), const("iou", [0.5], np.float32),
         h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["kept"])],
        "else", [], [tensor("kept", ["k", 3], TP.INT64)])
    empty_branch = h.make_graph([const("none", np.zeros((0, 3)))], "then", [], [tensor("none", [0, 3], TP.INT64)])
    nodes = [
        const("thresh", 0.5, np.float32),
        h.make_node("Greater", ["scores", "thresh"], ["above"]),
        h.make_node("NonZero", ["above"], ["where"]),
        h.make_node("Size", ["where"], ["n"]),
        const("zero", 0),
        h.make_node("Equal", ["n", "zero"], ["none_above"]),
        h.make_node("If", ["none_above"], ["selected"], then_branch=empty_branch, else_branch=nms_branch),
    ]
    return model(nodes, [tensor("boxes", [1, 6, 4]), tensor("scores", [1, 1, 6])],
                 [tensor("selected", ["k", 3], TP.INT64)])


def refusal(m: onnx.ModelProto, tmp_path) -> str:
    path = tmp_path / "refused.onnx"
    onnx.save(m, str(path))
    with pytest.raises(NetworkError) as info:
        load_onnx(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_detector_postprocessing_is_refused_naming_nms_and_nonzero(tmp_path):
    message = refusal(detector_postprocessing(), tmp_path)
    assert "NonMaxSuppression x1" in message and "NonZero x1 (first: " in message
    assert message.index("NonMaxSuppression") < message.index("NonZero")
    assert "backbone and head" in message


def test_operator_tvm_lacks_is_named_in_one_line(tmp_path):
    m = model([h.make_node("Relu", ["x"], ["r"]), h.make_node("Det", ["r"], ["y"])],
              [tensor("x", [2, 3, 3])], [tensor("y", [2])])
    assert "Det" in refusal(m, tmp_path).split("(")[-1]


def test_converter_failure_names_the_operator(tmp_path):
    """Pads computed from the input's values cannot be folded; TVM's reason alone does not say which op."""
    nodes = [h.make_node("ReduceMax", ["n"], ["n_max"], keepdims=1),
             const("z", [0, 0]),
             h.make_node("Concat", ["z", "n_max", "n_max"], ["pads"], axis=0),
             h.make_node("Pad", ["x", "pads"], ["y"])]
    m = model(nodes, [tensor("x", [2, 3]), tensor("n", [1], TP.INT64)], [tensor("y", ["h", "w"])])
    message = refusal(m, tmp_path)
    assert "(Pad: " in message
