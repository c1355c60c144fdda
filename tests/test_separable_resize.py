"""Bilinear resizes in two passes (ansor/networks/separable_resize.py) compute TVM's resize, built and run."""

import numpy as np
import pytest
import tvm
from tvm import relax

from ansor.networks.separable_resize import RESIZE, separable_resizes

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})  # AVX2: any x86 host runs it


def resize_module(shape, size, layout="NHWC", mode="half_pixel", method="linear", permute=False, reads=1):
    """``main(x)``: x resized to ``size``; permuted to NCHW if ``permute``; with ``reads`` readers of the
    resize (a second one adds 1 to it)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.image.resize2d(x, size, layout=layout, method=method,
                                                coordinate_transformation_mode=mode))
            out = bb.emit(relax.op.permute_dims(y, [0, 3, 1, 2])) if permute else y
            if reads == 2:
                out = relax.Tuple([out, bb.emit(relax.op.add(y, relax.const(1.0, "float32")))])
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def run(mod, data):
    exe = tvm.compile(mod, target=TARGET)
    result = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(data))
    return [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]


def ops(mod) -> list[str]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(getattr(getattr(e, "op", None), "name", "")))
    return [f for f in found if f]


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
def test_two_passes_compute_tvms_resize(mode):
    shape = (2, 3, 5, 7)
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    mod = resize_module(shape, (13, 16), "NCHW", mode)
    new = separable_resizes(mod)
    assert RESIZE in ops(mod) and RESIZE not in ops(new)
    want, got = run(mod, data)[0], run(new, data)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # the same operations in the same order


def test_a_resize_permuted_to_nchw_writes_nchw():
    shape = (1, 6, 5, 21)  # a segmentation head's classes, channels last
    data = np.random.default_rng(1).standard_normal(shape).astype("float32")
    mod = resize_module(shape, (48, 40), permute=True)
    new = separable_resizes(mod)
    assert "relax.permute_dims" in ops(mod) and "relax.permute_dims" not in ops(new)
    want, got = run(mod, data)[0], run(new, data)[0]
    assert got.shape == want.shape == (1, 21, 48, 40)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_channels_last_resizes_stay_unless_permuted_to_nchw():
    mod = resize_module((1, 4, 4, 3), (8, 8))
    assert RESIZE in ops(separable_resizes(mod))  # its loads run along the channels already
    mod = resize_module((1, 4, 4, 3), (8, 8), permute=True, reads=2)
    assert RESIZE in ops(separable_resizes(mod))  # another reader wants it channels last


@pytest.mark.parametrize("method,size", [("nearest_neighbor", (8, 8)), ("cubic", (8, 8)), ("linear", (2, 8))])
def test_other_resizes_stay(method, size):
    mod = resize_module((1, 3, 4, 4), size, "NCHW", method=method)
    assert RESIZE in ops(separable_resizes(mod))  # not bilinear, or fewer rows out than in
