"""Tests for ansor.task.workloads: name parsing, shapes, stage structure, and TVM output vs numpy reference.

Numerical checks compile the untuned PrimFunc for LLVM, so they stay on shapes that run in well under
a second with naive loops; the large registered shapes (C3D, the -b16 variants) are only built, and
their code paths are checked numerically through small variants of the same constructors.
"""

import dataclasses
import itertools
import logging

import numpy as np
import pytest
import tvm
from tvm import te

from ansor.task import workloads as W
from ansor.errors import AnsorError, WorkloadError
from ansor.task.workloads import Workload, get_workload, register_workload, workload_names

PATTERNS = {"matmul-N", "matmul-MxNxK", "matmul-relu-N", "matmul-relu-MxNxK", "bf16-matmul-N", "bf16-matmul-MxNxK",
            "softmax-MxN"}
SUITE = ("C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM")
CONCRETE = [n for n in workload_names() if n not in PATTERNS]

# Written out by hand from the torchvision ResNet-50 (v1.5) definition; the module derives it.
RESNET50_LAYERS = [
    (224, 224, 3, 64, 7, 2, 3),
    (56, 56, 64, 64, 1, 1, 0),
    (56, 56, 64, 64, 3, 1, 1),
    (56, 56, 64, 256, 1, 1, 0),
    (56, 56, 256, 64, 1, 1, 0),
    (56, 56, 256, 128, 1, 1, 0),
    (56, 56, 128, 128, 3, 2, 1),
    (28, 28, 128, 512, 1, 1, 0),
    (56, 56, 256, 512, 1, 2, 0),
    (28, 28, 512, 128, 1, 1, 0),
    (28, 28, 128, 128, 3, 1, 1),
    (28, 28, 512, 256, 1, 1, 0),
    (28, 28, 256, 256, 3, 2, 1),
    (14, 14, 256, 1024, 1, 1, 0),
    (28, 28, 512, 1024, 1, 2, 0),
    (14, 14, 1024, 256, 1, 1, 0),
    (14, 14, 256, 256, 3, 1, 1),
    (14, 14, 1024, 512, 1, 1, 0),
    (14, 14, 512, 512, 3, 2, 1),
    (7, 7, 512, 2048, 1, 1, 0),
    (14, 14, 1024, 2048, 1, 2, 0),
    (7, 7, 2048, 512, 1, 1, 0),
    (7, 7, 512, 512, 3, 1, 1),
]


def _shape(t: te.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _split(tensors: list[te.Tensor]) -> tuple[list[te.Tensor], list[te.Tensor]]:
    n_in = sum(isinstance(t.op, te.PlaceholderOp) for t in tensors)
    assert all(isinstance(t.op, te.PlaceholderOp) for t in tensors[:n_in]), "inputs must come first"
    return tensors[:n_in], tensors[n_in:]


def _block_names(wl: Workload) -> list[str]:
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": wl.prim_func()}))
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _check_numerics(wl: Workload, seed: int = 0) -> None:
    """Run the untuned build on random inputs in [-1, 1) and compare with the numpy reference."""
    inputs, outputs = _split(wl.tensors())
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1.0, 1.0, _shape(t)).astype(np.float32) for t in inputs]
    args = [tvm.runtime.tensor(a) for a in xs]
    args += [tvm.runtime.tensor(np.zeros(_shape(t), np.float32)) for t in outputs]
    mod = tvm.compile(tvm.IRModule({"main": wl.prim_func()}), target="llvm").jit()
    mod["main"](*args)
    expected = wl.reference(xs)
    assert len(expected) == len(outputs)
    for got, want in zip(args[len(xs) :], expected):
        assert want.dtype == np.float32
        # Long float32 reductions cancel: allow an absolute error relative to the output's magnitude.
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4 * scale)


NUMERIC = [
    "matmul-64",
    "matmul-8x8x512",
    "matmul-relu-64",
    "matmul-relu-16x32x48",
    "softmax",
    "softmax-3x17",
    "max-pool2d",
    "conv2d-bias-relu",
    "conv2d-nhwc-small",
    "conv2d-bn-relu",
    "TBS",
    *[f"{op}-b1" for op in SUITE if op != "C3D"],  # C3D-b1 is 13 GFLOP: checked via a small variant
    *[f"nhwc-resnet-50.C{i}" for i in range(len(RESNET50_LAYERS))],
]


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.slow
def test_registered_workload_matches_reference(name):
    _check_numerics(get_workload(name))


SMALL_VARIANTS = [
    W._conv_workload("c3d", 2, (6, 9, 8), 3, 4, 3, 2, 1),
    W._conv_workload("c1d-dil-grp", 2, (20,), 8, 12, 3, 2, 2, dilation=2, groups=4),
    W._conv_workload("c2d-dil-grp", 2, (11, 9), 6, 4, 3, 2, 1, dilation=3, groups=2),
    W._conv_workload("c2d-nopad", 3, (7, 7), 5, 6, 2, 1, 0),
    W._conv_workload("bn-relu", 2, (6, 6), 4, 8, 3, 2, 1, epilogue="bn-relu"),
    W._depthwise_workload("dep-s2", 2, 9, 5, 3, 2, 1),
    W._conv2d_transpose_workload("t2d-k3-p0", 2, 5, 3, 4, 3, 2, 0),
    W._conv2d_transpose_workload("t2d-s3", 1, 4, 2, 3, 4, 3, 1),
    W._conv2d_transpose_workload("t2d-s1", 1, 5, 2, 3, 3, 1, 1),
    W._capsule_workload("cap", 2, 6, 3, 2, 3, 1, 1, cap=2),
    W._norm_workload("nrm", 3, 7, 5),
    W._batch_matmul_workload("gmm", 16, 8, 12, 5),
    W._max_pool_workload("pool-nopad", 2, 8, 3, 2, 2, 0),
    W._tbs_workload("tbs", 2, 3, 10, 4),
]


@pytest.mark.parametrize("wl", SMALL_VARIANTS, ids=lambda wl: wl.name)
def test_small_variants_match_reference(wl):
    """Batch > 1, groups, dilation, odd sizes: the paths the registered shapes do not all exercise."""
    _check_numerics(wl, seed=1)


def test_conv_reference_matches_naive_loops():
    """The conv reference against the textbook definition, so TE and numpy cannot share a mistake."""
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (2, 7, 6, 4))
    w = rng.uniform(-1, 1, (3, 3, 2, 6))  # groups=2: 2 input and 3 output channels per group
    stride, pad, dil, groups = 2, 2, 2, 2
    got = W._conv_ref(x, w, stride, pad, dil, groups)
    xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    want = np.zeros(got.shape)
    for n, h, ww, co in itertools.product(*map(range, got.shape)):
        g = co // 3
        for rh, rw, rc in itertools.product(range(3), range(3), range(2)):
            pixel = xp[n, h * stride + rh * dil, ww * stride + rw * dil, g * 2 + rc]
            want[n, h, ww, co] += pixel * w[rh, rw, rc, co]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", CONCRETE)
def test_every_name_builds(name):
    wl = get_workload(name)
    assert isinstance(wl, Workload) and wl.description
    _split(wl.tensors())
    assert isinstance(wl.prim_func(), tvm.tirx.PrimFunc)


@pytest.mark.parametrize("op", SUITE)
@pytest.mark.parametrize("batch", [1, 16])
def test_suite_output_shapes(op, batch):
    expected = {
        "C1D": (128, 128),
        "C2D": (112, 112, 64),
        "C3D": (8, 112, 112, 64),
        "GMM": (128, 128),
        "GRP": (28, 28, 128),
        "DIL": (109, 109, 64),
        "DEP": (112, 112, 32),
        "T2D": (8, 8, 256),
        "CAP": (8, 8, 4, 4, 32),
        "NRM": (),
    }
    _, outputs = _split(get_workload(f"{op}-b{batch}").tensors())
    assert [_shape(t) for t in outputs] == [(batch, *expected[op])]


def test_suite_input_shapes():
    def in_shapes(name):
        return [_shape(t) for t in _split(get_workload(name).tensors())[0]]

    assert in_shapes("C1D-b1") == [(1, 256, 64), (3, 64, 128)]
    assert in_shapes("C3D-b16") == [(16, 16, 224, 224, 3), (7, 7, 7, 3, 64)]
    assert in_shapes("GMM-b16") == [(16, 128, 128), (16, 128, 128)]
    assert in_shapes("GRP-b1") == [(1, 56, 56, 64), (3, 3, 16, 128)]
    assert in_shapes("DEP-b1") == [(1, 112, 112, 32), (3, 3, 32)]
    assert in_shapes("T2D-b1") == [(1, 4, 4, 512), (4, 4, 512, 256)]
    assert in_shapes("CAP-b1") == [(1, 16, 16, 4, 4, 32), (3, 3, 4, 4, 32, 32)]
    assert in_shapes("NRM-b16") == [(16, 256, 256)]
    assert in_shapes("conv2d-bn-relu") == [(1, 56, 56, 64), (3, 3, 64, 64), (64,), (64,), (64,)]
    assert in_shapes("TBS") == [(1, 128, 12, 64), (1, 128, 12, 64)]


def test_resnet50_layers():
    assert W._resnet50_conv_layers() == RESNET50_LAYERS
    names = [n for n in workload_names() if n.startswith("nhwc-resnet-50.")]
    assert names == [f"nhwc-resnet-50.C{i}" for i in range(23)]

    stem = get_workload("nhwc-resnet-50.C0")
    data, kernel, out = stem.tensors()
    assert (_shape(data), _shape(kernel), _shape(out)) == ((1, 224, 224, 3), (7, 7, 3, 64), (1, 112, 112, 64))
    assert _block_names(stem) == ["pad", "conv"]
    assert _block_names(get_workload("nhwc-resnet-50.C1")) == ["conv"]  # 1x1, no padding stage
    assert "ResNet-50" in stem.description


@pytest.mark.parametrize(
    "name, blocks",
    [
        ("matmul-64", ["C"]),
        ("matmul-relu-64", ["C", "D"]),
        ("softmax", ["T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum", "T_softmax_norm"]),
        ("max-pool2d", ["pad", "pool"]),
        ("conv2d-bias-relu", ["pad", "conv", "bias_add", "relu"]),
        ("conv2d-nhwc-small", ["pad", "conv"]),
        ("conv2d-bn-relu", ["pad", "conv", "bias_add", "bn_mul", "bn_add", "relu"]),
        ("TBS", ["query_T", "key_T", "C", "T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum",
                 "T_softmax_norm"]),
        ("T2D-b1", ["pad", "conv"]),
        ("NRM-b1", ["sqsum", "norm"]),
        ("C1D-b1", ["pad", "conv"]),
    ],
)
def test_stage_structure(name, blocks):
    assert _block_names(get_workload(name)) == blocks


def test_matmul_names_and_axes():
    wl = get_workload("matmul-8x8x512")
    A, B, C = wl.tensors()
    assert (A.op.name, B.op.name, C.op.name) == ("A", "B", "C")
    assert (_shape(A), _shape(B), _shape(C)) == ((8, 512), (512, 8), (8, 8))
    assert [iv.var.name for iv in C.op.axis] == ["i", "j"]
    assert [iv.var.name for iv in C.op.reduce_axis] == ["k"]
    assert wl.description == "matmul M=8 N=8 K=512 float32"
    assert get_workload("matmul-512").description == "matmul M=N=K=512 float32"


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("matmul-64x64x64", "matmul-64"),
        ("matmul-relu-8x8x8", "matmul-relu-8"),
        ("matmul-8x8x512", "matmul-8x8x512"),
        ("ConvLayer", "conv2d-bn-relu"),
        ("softmax", "softmax-4x1024"),
        ("C2D-b1", "C2D-b1"),
    ],
)
def test_canonical_names(alias, canonical):
    assert get_workload(alias).name == canonical


def test_unknown_name_lists_valid_names():
    with pytest.raises(WorkloadError) as err:
        get_workload("no-such-op")
    message = str(err.value)
    for expected in ("no-such-op", "matmul-N", "matmul-MxNxK", "C2D-b1", "nhwc-resnet-50.C0", "TBS"):
        assert expected in message
    assert isinstance(err.value, AnsorError)


@pytest.mark.parametrize(
    "name",
    ["matmul-0", "matmul-abc", "matmul-", "matmul-012", "matmul-4x4", "matmul-2x0x3", "matmul-N",
     "softmax-0x4", "softmax-4", "C2D", "C2D-b2", "nhwc-resnet-50.C23", "", "conv2d-bn-relu-b16"],
)
def test_malformed_names(name):
    with pytest.raises(WorkloadError):
        get_workload(name)


def test_workload_names_lists_everything():
    names = workload_names()
    assert len(names) == len(set(names))
    assert PATTERNS <= set(names)
    expected = {"ConvLayer", "softmax", "conv2d-bn-relu", "TBS", "max-pool2d", "conv2d-bias-relu",
                "conv2d-nhwc-small"} | {f"{op}-b{b}" for op in SUITE for b in (1, 16)}
    assert expected <= set(names)


def test_workload_is_frozen_and_tensors_are_fresh():
    wl = get_workload("matmul-4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        wl.name = "other"
    assert wl.tensors()[0] is not wl.tensors()[0]


def _add_make():
    a = te.placeholder((5, 3), "float32", name="a")
    b = te.placeholder((5, 3), "float32", name="b")
    return [a, b, te.compute((5, 3), lambda i, j: a[i, j] + b[i, j], name="c")]


def test_register_workload(monkeypatch, caplog):
    monkeypatch.setattr(W, "_USER", {})
    register_workload("my-add", _add_make, lambda ins: [ins[0] + ins[1]], "elementwise add 5x3")
    wl = get_workload("my-add")
    assert (wl.name, wl.description) == ("my-add", "elementwise add 5x3")
    assert "my-add" in workload_names()
    _check_numerics(wl)

    with caplog.at_level(logging.WARNING, logger="ansor"):
        register_workload("my-add", _add_make, lambda ins: [ins[0] - ins[1]])
    assert "my-add" in caplog.text
    assert get_workload("my-add").description == ""


@pytest.mark.parametrize(
    "name", ["matmul-7", "matmul-3x4x5", "matmul-relu-2", "softmax-2x2", "ConvLayer", "softmax", "C2D-b1",
             "nhwc-resnet-50.C3", "", "has space", None]
)
def test_register_rejects_builtin_and_bad_names(monkeypatch, name):
    monkeypatch.setattr(W, "_USER", {})
    with pytest.raises(WorkloadError):
        register_workload(name, _add_make, lambda ins: ins)
    assert W._USER == {}


def test_register_rejects_non_callables(monkeypatch):
    monkeypatch.setattr(W, "_USER", {})
    with pytest.raises(WorkloadError):
        register_workload("bad", "not callable", lambda ins: ins)
