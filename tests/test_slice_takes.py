"""A take of a constant index through layout operators becomes a slice of their source (ansor.networks.slice_takes)."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

from ansor.networks.prepare import fold_constants
from ansor.networks.slice_takes import find_slice, slice_takes


def test_find_slice_finds_a_box_in_its_order_and_nothing_else():
    numbers = np.arange(4 * 6).reshape(4, 6)
    assert find_slice(numbers[:, 2:5], (4, 6)) == (1, 2, 5)
    assert find_slice(numbers[1:3], (4, 6)) == (0, 1, 3)
    assert find_slice(numbers[:, 2:5].T, (4, 6)) is None  # the box, transposed: not a slice's order
    assert find_slice(numbers[:, ::2], (4, 6)) is None  # strided


@tvm.script.ir_module
class Attention:
    """PyTorch's split of a fused QKV projection as TVM imports it: a transposed copy, and gathers of indices
    computed from its shape (ONNX's negative-index wrap)."""

    @R.function
    def main(qkv: R.Tensor((5, 1, 24), "float32")):
        with R.dataflow():
            a = R.reshape(qkv, R.shape([5, 1, 3, 8]))
            b = R.expand_dims(a, axis=[0])
            c = R.permute_dims(b, axes=[3, 1, 2, 0, 4])
            d = R.squeeze(c, axis=[3])
            shape = R.shape_to_tensor(R.shape_of(d))
            first = R.take(shape, R.const(0, "int64"), axis=0, mode="wrap")
            wrapped = R.where(R.less(R.const(1, "int64"), R.const(0, "int64")),
                              R.add(R.const(1, "int64"), first), R.const(1, "int64"))
            k = R.take(d, wrapped, axis=0, mode="fast")
            v = R.take(d, R.const(2, "int64"), axis=0)
            out = R.add(R.permute_dims(k, axes=[1, 0, 2]), R.permute_dims(v, axes=[1, 0, 2]))
            R.output(out)
        return out


def _ops(mod: tvm.IRModule) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(getattr(getattr(e, "op", None), "name", "")))
    return names


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_the_gathers_become_slices_of_the_projection_and_compute_the_same():
    sliced = slice_takes(fold_constants(Attention))
    ops = _ops(sliced)
    assert "relax.take" not in ops and "relax.permute_dims" in ops  # the output's own transposes stay
    assert ops.count("relax.strided_slice") == 2 and "relax.squeeze" not in ops  # the copy is gone
    x = np.random.default_rng(0).standard_normal((5, 1, 24)).astype("float32")
    want = x[:, :, 8:16].transpose(1, 0, 2) + x[:, :, 16:24].transpose(1, 0, 2)
    np.testing.assert_array_equal(_run(sliced, x), want)
    np.testing.assert_array_equal(_run(Attention, x), want)
